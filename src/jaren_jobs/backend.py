"""The seam between the engine and a database (internal; users pick one via ``open_store``).

Every engine operation is *prepare (pure, ``core.commands``) → one session
call → interpret (pure, ``core.fence``)*. A session is one scope of one
store — the root (each call its own transaction, behind the store's gate)
or an application transaction (each call a savepoint inside it) — and each
of its unit-of-work calls is whole or not at all. A session answers data,
never a refusal: a fenced write that matched nothing answers :class:`Missed`
with the job's fence row, and the engine names the refusal.

The ``settle_within`` call runs the same statements for a caller that is already
inside one of the session's writes (group commit).

Above the sessions sits the store-level seam, what ``Store``, ``Transaction``
and the worker need of an open database whatever it is: a
:class:`StoreBackend` (lifecycle, the root session, the application's
connection) and the :class:`AppTransaction` it opens for
``store.transaction()`` (the application's SQL, savepoints, commit). A
:class:`Scope` is how a session reaches its database — the root (each call a
unit of work of its own) or an open transaction — and the worker wraps the
root one to count and bar its calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeVar

from jaren_jobs.core.commands import ClaimRequest, PageFilters, PreparedJob
from jaren_jobs.core.fence import FenceRow
from jaren_jobs.core.settle import SettleBatch
from jaren_jobs.errors import StorageError
from jaren_jobs.records import ClaimedJob, Counts, Job, Lease
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike

if TYPE_CHECKING:
    from jaren_jobs.cursor import Cursor

__all__ = [
    "AppParams",
    "AppTransaction",
    "ErrorRow",
    "ForcedAnswer",
    "JobsSession",
    "Missed",
    "Renewal",
    "Rows",
    "Scope",
    "SettleAnswer",
    "StoreBackend",
]

T = TypeVar("T")

AppParams = Sequence[Any] | Mapping[str, Any]
#: one error history entry as a backend reads it: attempt, at (epoch ms), error, traceback
ErrorRow = tuple[int, int, str, str | None]
#: ``due_counts()`` as a backend reads it: pending ready, pending scheduled, failed
#: ready, failed scheduled, leases run out, and the earliest ready run_at (epoch ms)
DueRow = tuple[int, int, int, int, int, int | None]


#: what ``cancel_forced`` did: ``"cancelled"`` (no live attempt held the job),
#: ``"marked"`` (a live attempt holds it: marked for cancellation), else the
#: job's fence row (``None``: no such job) that says why it did neither
ForcedAnswer = Literal["cancelled", "marked"] | FenceRow | None


class Renewal(NamedTuple):
    """A renewal that held: the new lease, and whether ``cancel(id, force=True)``
    marked the job (the renewal statement reads the mark back: no extra poll)."""

    lease: Lease
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class Missed:
    """A fenced write matched nothing; ``row`` is the job's fence row (``None``: no job)."""

    row: FenceRow | None


@dataclass(frozen=True, slots=True)
class SettleAnswer:
    """What a :class:`~jaren_jobs.core.settle.SettleBatch` wrote.

    Per settlement, in order: ``True`` (written) or :class:`Missed`; how many
    released leases were still held; per claim, the jobs it leased (claim
    order). ``now`` is the instant the settlements were fenced at: a missed
    one's refusal is named at it.
    """

    settled: tuple[bool | Missed, ...]
    released: int
    claimed: tuple[list[ClaimedJob], ...]
    now: int


class Scope(Protocol):
    """How a session reaches its database: the root, or inside an open transaction."""

    @property
    def root(self) -> bool:
        """True for the root (each call its own unit of work), False inside a transaction."""
        ...

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T: ...

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T: ...

    def read_consistent(self, fn: Callable[[], T], what: str) -> T:
        """A multi-statement read from one snapshot."""
        ...

    def after_commit(self, callback: Callable[[], None]) -> None: ...


class JobsSession(Protocol):
    """What the engine needs of a database, for one scope."""

    @property
    def scope(self) -> Scope: ...

    @property
    def store_backend(self) -> StoreBackend:
        """The open database this session belongs to."""
        ...

    def rescoped(self, scope: Scope) -> JobsSession:
        """The same store over another scope of it (a worker's tracked views)."""
        ...

    # ---- units of work: each call is one transaction (root) or savepoint (tx)

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T: ...

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T: ...

    def after_commit(self, callback: Callable[[], None]) -> None: ...

    def insert_jobs(
        self, prepared: Sequence[PreparedJob], *, one_by_one: bool, what: str
    ) -> list[Job]: ...

    def get_job(self, job_id: str, what: str) -> Job | None: ...

    def job_errors(self, job_id: str, what: str) -> list[ErrorRow] | None:
        """The job's error history, oldest first; ``None`` when no job has this id."""
        ...

    def count_jobs(self, what: str, queue: str | None = None) -> Counts: ...

    def count_due(self, now: int, what: str, queue: str | None = None) -> DueRow:
        """Pending ready/scheduled, failed ready/scheduled, leases run out, at ``now``;
        and the earliest ready run_at (epoch ms, ``None`` when none is ready)."""
        ...

    def queue_gauges(self, now: int, what: str) -> list[tuple[Any, ...]]:
        """Per (queue, effective state): ``(queue, state, jobs, earliest ready run_at (epoch
        ms) or None, expired unmarked leases)``, in one statement (SPEC §17's gauges)."""
        ...

    def live_queues(self, limit: int, what: str) -> list[str]:
        """The queues of the queued (pending, failed) and leased jobs, sorted, at most
        ``limit``."""
        ...

    def count_settled(
        self, since: int, until: int, bucket: int, limit: int, what: str
    ) -> list[tuple[str, int, int]]:
        """``(state, bucket index, jobs)`` of the settled states in ``[since, until)`` (ms),
        at most ``limit`` read per state, the most recent first."""
        ...

    def claim(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]: ...

    def renew(self, lease: Lease, lease_ms: int, what: str) -> Renewal | Missed: ...

    def cancel_queued(
        self, job_id: str, what: str, signal: SignalLike | None
    ) -> bool | FenceRow | None: ...

    def cancel_leased(
        self, lease: Lease, what: str, signal: SignalLike | None
    ) -> bool | Missed: ...

    def cancel_forced(self, job_id: str, what: str, signal: SignalLike | None) -> ForcedAnswer:
        """``cancel(id, force=True)``: cancel a job no live attempt holds, or mark a live one
        (PostgreSQL also sends the cancel NOTIFY, naming the job, with the commit)."""
        ...

    def requeue(
        self,
        job_id: str,
        *,
        drop_checkpoints: bool,
        reset_attempts: bool = False,
        what: str,
        signal: SignalLike | None,
    ) -> bool | FenceRow | None: ...

    def run_now(self, job_id: str, what: str, signal: SignalLike | None) -> bool | FenceRow | None:
        """``run_now(id)``: a pending or failed job whose ``run_at`` is still ahead is due now
        (``True``); otherwise the row as it stands (``None``: no such job)."""
        ...

    def sweep(
        self,
        horizon_ms: int,
        limit: int | None,
        what: str,
        signal: SignalLike | None,
        states: tuple[str, ...] = (),
    ) -> int:
        """Delete settled jobs (of ``states`` only, when given) changed before the horizon."""
        ...

    def page(
        self, filters: PageFilters, *, signal: SignalLike | None, deadline: datetime | None
    ) -> Cursor[Job]: ...

    # ---- settling: one batch, one unit of work (a lone complete() is a batch of one)

    def settle(self, batch: SettleBatch, what: str) -> SettleAnswer: ...

    def settle_within(self, batch: SettleBatch, now: int, what: str) -> SettleAnswer:
        """:meth:`settle`'s statements, inside a write the caller holds, fenced at ``now``."""
        ...

    # ---- checkpoints (SPEC §6)

    def load_checkpoints(
        self, run_id: str, generation: int, what: str
    ) -> list[tuple[str, str]]: ...

    def save_checkpoint(
        self, lease: Lease, run_id: str, node_id: str, value: str, what: str
    ) -> bool | Missed: ...

    def complete_run(self, lease: Lease, run_id: str, result: str, what: str) -> bool | Missed: ...


# ---------------------------------------------------------------- store level


class Rows:
    """The result of ``tx.execute``: the driver's cursor, its errors translated.

    ``translate`` turns one of the driver's exceptions into the
    :class:`~jaren_jobs.errors.StorageError` to raise (saying whether the
    failure ended the transaction); anything else passes through.
    """

    def __init__(
        self,
        cursor: Any,
        driver_error: type[BaseException] | tuple[type[BaseException], ...],
        translate: Callable[[BaseException], Exception],
    ) -> None:
        self._cursor = cursor
        self._driver_error = driver_error
        self._translate = translate

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except self._driver_error as exc:
            # a row's step can fail and end the transaction too (a trigger)
            raise self._translate(exc) from exc

    def fetchone(self) -> Any:
        return self._call(self._cursor.fetchone)

    def fetchall(self) -> list[Any]:
        return list(self._call(self._cursor.fetchall))

    def fetchmany(self, size: int = 1) -> list[Any]:
        return list(self._call(lambda: self._cursor.fetchmany(size)))

    def __iter__(self) -> Iterator[Any]:
        while True:
            row = self.fetchone()
            if row is None:
                return
            yield row

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def lastrowid(self) -> int | None:
        return getattr(self._cursor, "lastrowid", None)

    @property
    def description(self) -> Any:
        return self._cursor.description


class TransactionState(Protocol):
    """What an :class:`AppTransaction` needs of the ``Transaction`` it serves."""

    def check_active(self, what: str) -> None: ...

    def explain(self, error: StorageError) -> StorageError: ...

    def after_commit(self, callback: Callable[[], None]) -> None: ...


class AppTransaction(Protocol):
    """One open ``store.transaction()`` on the database: it holds the store's
    connection (its gate, or a connection taken from the pool) until
    :meth:`release`."""

    def session(self, transaction: TransactionState, runtime: ResolvedRuntime) -> JobsSession:
        """The session ``tx.jobs`` runs on: every write a savepoint inside this transaction."""
        ...

    def execute(
        self,
        statement: str,
        parameters: AppParams | Iterable[AppParams],
        *,
        many: bool,
        what: str,
        transaction: TransactionState,
    ) -> Rows:
        """The application's own statement, handed to the driver as it is."""
        ...

    def ended_by_database(self) -> bool:
        """Whether the database ended (rolled back, or aborted) the transaction under us."""
        ...

    @property
    def gate(self) -> object:
        """The store's gate, a place of which this transaction holds until it ends (its
        identity is what a caller needs: see :func:`jaren_jobs.gate.held_by_context`)."""
        ...

    @property
    def ended_message(self) -> str:
        """How a failed statement's error explains that it ended the transaction."""
        ...

    @property
    def aborted_text(self) -> str:
        """Who ended the transaction and what can do so (``TransactionAborted``'s message)."""
        ...

    def savepoint(self, name: str, what: str) -> None: ...

    def release_savepoint(self, name: str, what: str) -> None: ...

    def rollback_to_savepoint(self, name: str, what: str) -> None: ...

    def commit(self, what: str) -> None: ...

    def rollback_quietly(self) -> None: ...

    def release(self) -> None:
        """Give the connection back (the gate, or the pool); the last call on a handle."""
        ...


class StoreBackend(Protocol):
    """One open database under a ``Store``: what the store and its workers need of it."""

    @property
    def name(self) -> str:
        """``"sqlite"`` or ``"postgres"`` (``store.backend``)."""
        ...

    @property
    def closed(self) -> bool: ...

    @property
    def forked(self) -> bool:
        """True in a child of ``os.fork()``: the connection is the parent's."""
        ...

    @property
    def wait_seconds(self) -> float:
        """How long a call may wait for the store's connection (``gate_timeout_seconds``)."""
        ...

    @property
    def writers(self) -> int:
        """How many transactions of this store can write at once: 1 on SQLite (one
        writer per file), the pool's size on PostgreSQL (1 on the application's
        connection)."""
        ...

    def check_open(self, what: str) -> None:
        """Raise ``StoreClosed`` if the store is closed (or inherited through fork)."""
        ...

    def root_session(self, runtime: ResolvedRuntime) -> JobsSession:
        """The session ``store.jobs`` runs on: each write a transaction of its own."""
        ...

    def connection(self) -> Any:
        """The connection ``store.connection`` hands out."""
        ...

    def in_my_transaction(self) -> bool:
        """Whether the calling thread holds this store's open ``store.transaction()``."""
        ...

    def begin(self, what: str) -> AppTransaction:
        """Open ``store.transaction()`` (waits for the connection, as bounded)."""
        ...

    def join(self, what: str) -> AppTransaction:
        """Take the connection for ``store.join_transaction()``: the application's open
        transaction, which the handle never commits (``StorageError`` when none is open)."""
        ...

    def wake_on_commits(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when another process commits work (PostgreSQL: LISTEN); may do nothing."""
        ...

    def wake_on_cancel_requests(self, wake: Callable[[str], None]) -> None:
        """Call ``wake(job_id)`` when another process marks a running job for cancellation
        (PostgreSQL: LISTEN); may do nothing (the holder's renewal reads the mark anyway)."""
        ...

    def wake_on_settlements(self, wake: Callable[[], None]) -> bool:
        """Call ``wake`` when another process commits a settlement (PostgreSQL: LISTEN).

        ``True`` when such wake-ups will come; ``False`` when the caller must
        poll for them (SQLite; a store without a listener).
        """
        ...

    def close(self) -> None:
        """Close the database once the workers have stopped (waits for calls in flight)."""
        ...
