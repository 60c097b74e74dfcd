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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .core.commands import ClaimRequest, PreparedJob
from .core.fence import FenceRow
from .core.settle import SettleBatch
from .records import ClaimedJob, Counts, Job, Lease
from .signals import SignalLike

if TYPE_CHECKING:
    from .cursor import Cursor

__all__ = ["JobsSession", "Missed", "SettleAnswer"]

T = TypeVar("T")


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


class JobsSession(Protocol):
    """What the engine needs of a database, for one scope."""

    def rescoped(self, scope: Any) -> JobsSession:
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

    def settled_by(self, lease: Lease, what: str) -> Job | None: ...

    def count_jobs(self, what: str) -> Counts: ...

    def claim(self, request: ClaimRequest, limit: int, what: str) -> list[ClaimedJob]: ...

    def renew(self, lease: Lease, lease_ms: int, what: str) -> Lease | Missed: ...

    def cancel_queued(
        self, job_id: str, what: str, signal: SignalLike | None
    ) -> bool | FenceRow | None: ...

    def cancel_leased(
        self, lease: Lease, what: str, signal: SignalLike | None
    ) -> bool | Missed: ...

    def requeue(
        self, job_id: str, *, drop_checkpoints: bool, what: str, signal: SignalLike | None
    ) -> bool | FenceRow | None: ...

    def sweep(
        self, horizon_ms: int, limit: int | None, what: str, signal: SignalLike | None
    ) -> int: ...

    def page(
        self,
        *,
        state: object,
        kind: object,
        after: object,
        limit: object,
        signal: SignalLike | None,
        deadline: datetime | None,
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
