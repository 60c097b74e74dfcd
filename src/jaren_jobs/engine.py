"""The fenced job engine: ``store.jobs`` and ``tx.jobs``.

Every settling statement (renew, complete, fail, leased cancel, checkpoint
save) is guarded by the fence — the token one claim minted and a lease still
valid now — never by the owner. Execution is at-least-once; settlement is
exactly-once against the store. A guard that matches nothing is never a
silent ``False``: the row says which refusal applies (JD2065/66/67), except
when the same attempt already settled it, which is idempotent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .admin import JobAdmin
from .backend import JobsSession, Missed, Scope, SettleAnswer, StoreBackend
from .checkpoints import CheckpointStore
from .codec import check_text
from .core import fence
from .core.commands import (
    ClaimRequest,
    Failure,
    PreparedJob,
    check_lease_seconds,
    check_page,
    claim_request,
    prepare_complete,
    prepare_job,
    require_lease,
)
from .core.policy import backoff_seconds, is_lease_lost, lease_ms
from .core.settle import SNOOZE, Completion, SettleBatch, Settlement, Snoozing
from .errors import (
    DuplicateJob,
    JobSettled,
    LeaseLost,
    LeaseRequired,
)
from .history import prepare_failure_with, prepare_snoozing
from .hub import EngineHub
from .observe import hooks
from .records import ClaimedJob, Job, Lease, NewJob
from .runtime import ResolvedRuntime, check_positive_int
from .signals import SignalLike
from .waiting import WaitPlan, plan_wait

if TYPE_CHECKING:
    from .cursor import Cursor

__all__ = ["ClaimRequest", "EngineHub", "Failure", "JobEngine", "backoff_seconds", "is_lease_lost"]


class JobEngine(JobAdmin):
    """The queue over one store, reached through one session (root or transaction).

    Each call checks its arguments (``core.commands``), makes ONE session
    call, and interprets the answer (``core.fence`` names a refusal). The
    operator's calls (errors, counts, cancel, requeue, sweep) are
    :class:`~jaren_jobs.admin.JobAdmin`'s.
    """

    def __init__(self, session: JobsSession, hub: EngineHub) -> None:
        self._session = session
        self._hub = hub
        self._runtime = hub.runtime
        self._defaults = hub.defaults

    # ------------------------------------------------------------ enqueue

    def _prepare(self, kind: object, payload: Any, **checked: Any) -> PreparedJob:
        return prepare_job(self._defaults, kind, payload, **checked)

    def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        id: str | None = None,
        run_at: datetime | None = None,
        delay_seconds: float | None = None,
        max_attempts: int | None = None,
        priority: int = 0,
        queue: str = "default",
        unique_key: str | None = None,
    ) -> Job:
        """Add one job; wakes in-process workers once it is committed.

        ``queue`` names the queue the job belongs to (a non-empty str).
        With a ``unique_key``: while a job with that key is pending, failed or
        leased, nothing is written and that job is returned (check
        ``job.id``); once it is done, dead or cancelled the key is free.

        Refuses (nothing written): a non-JSON payload (``TypeError`` /
        ``ValueError``), an empty or non-str kind, queue or unique_key, a bad
        ``max_attempts``, ``priority``, ``run_at`` or ``delay_seconds``, and
        an id that exists (:class:`DuplicateJob`).
        """
        what = "enqueue()"
        prepared = self._prepare(
            kind,
            payload,
            job_id=id,
            run_at=run_at,
            delay_seconds=delay_seconds,
            max_attempts=max_attempts,
            priority=priority,
            queue=queue,
            unique_key=unique_key,
            what=what,
        )
        items: Sequence[PreparedJob] = (prepared,)
        sends = None
        if hooks.observers:  # SPEC §17: a producer span, its context stored with the job
            items, sends = hooks.sending(items)
        (job,) = self._session.insert_jobs(items, one_by_one=True, what=what)
        self._session.after_commit(self._hub.wake)
        if sends is not None:
            sends.sent((job,), self._session.after_commit)
        return job

    def enqueue_many(self, jobs: Iterable[NewJob]) -> list[Job]:
        """Add many jobs in one transaction: all of them, or (on any refusal) none.

        Refuses exactly as :meth:`enqueue` would for each item (naming the
        item), an id named twice in the batch, and an id that exists
        (:class:`DuplicateJob`, for the first such item in order). Each item
        with a ``unique_key`` is deduplicated on its own, as :meth:`enqueue`
        does: its place in the answer holds the job that holds the key (for
        two items of one key, the first one's job).
        """
        what = "enqueue_many()"
        if isinstance(jobs, (str, bytes, Mapping)):
            raise TypeError(f"{what} takes an iterable of NewJob")
        batch = list(jobs)
        prepared: list[PreparedJob] = []
        prepare = self._prepare
        named = False  # an item with an id came before
        minted_after_named = False  # an item without one followed it
        for index, new in enumerate(batch):
            if not isinstance(new, NewJob):
                raise TypeError(
                    f"{what}: item {index} is a {type(new).__name__}, expected jaren_jobs.NewJob"
                )
            item = prepare(
                new.kind,
                new.payload,
                job_id=new.id,
                run_at=new.run_at,
                delay_seconds=new.delay_seconds,
                max_attempts=new.max_attempts,
                priority=new.priority,
                queue=new.queue,
                unique_key=new.unique_key,
                what=f"{what}: item {index}",
            )
            prepared.append(item)
            if item.id is not None:
                named = True
            elif named:
                minted_after_named = True
        ids = [p.id for p in prepared if p.id is not None]
        if len(ids) != len(set(ids)):
            seen: set[str] = set()
            dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
            raise DuplicateJob(f"{what}: the batch names id {dup!r} twice", job_id=dup)
        if not prepared:
            return []
        # One by one when a minted id follows a named one: a taken id then
        # stops the batch before any later id is minted, so the runtime's
        # uuid() is drawn exactly as often as one-by-one enqueues would draw it.
        items: Sequence[PreparedJob] = prepared
        sends = None
        if hooks.observers:  # SPEC §17: a producer span, its context stored with the jobs
            items, sends = hooks.sending(items)
        created = self._session.insert_jobs(items, one_by_one=minted_after_named, what=what)
        self._session.after_commit(self._hub.wake)
        if sends is not None:
            sends.sent(created, self._session.after_commit)
        return created

    # ------------------------------------------------------------ reads

    def get(self, id: str) -> Job | None:
        """The job with this id, or ``None``."""
        if not isinstance(id, str):
            raise TypeError(f"get(): id must be a str, got {type(id).__name__}")
        check_text(id, "get(): id")
        if "\x00" in id:
            # no job can have it (enqueue refuses it): a ValueError on both databases,
            # never a driver's refusal on one and None on the other
            raise ValueError("get(): id must not contain a NUL character")
        return self._session.get_job(id, "get()")

    # ------------------------------------------------------------ claims

    def claim(
        self,
        kinds: Iterable[str],
        *,
        owner: str,
        lease_seconds: float | None = None,
        queues: Iterable[str] | None = None,
    ) -> ClaimedJob | None:
        """Lease the next claimable job of these kinds, or ``None``.

        Claimable: pending, failed, or leased with an expired lease (how a
        crashed worker's job is rescued), with ``run_at`` passed; highest
        priority first, then ``run_at``, ``created_at``, ``id``. The claim
        mints the lease: a fresh token, generation + 1, attempts + 1.
        ``queues`` (an iterable of queue names; ``None``: every queue) claims
        only from those.
        """
        what = "claim()"
        request = claim_request(self._defaults, kinds, owner, lease_seconds, what, queues=queues)
        claimed = self._session.claim(request, 1, what)
        return claimed[0] if claimed else None

    def claim_many(
        self,
        kinds: Iterable[str],
        *,
        owner: str,
        limit: int,
        lease_seconds: float | None = None,
        queues: Iterable[str] | None = None,
    ) -> list[ClaimedJob]:
        """Lease up to ``limit`` jobs in one transaction, in claim order (of ``queues``)."""
        what = "claim_many()"
        request = claim_request(self._defaults, kinds, owner, lease_seconds, what, queues=queues)
        count = check_positive_int(limit, f"{what}: limit")
        return self._session.claim(request, count, what)

    # ------------------------------------------------------------ the fence

    def _require_lease(self, lease: object, what: str) -> Lease:
        return require_lease(lease, what)

    def renew(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease:
        """A new lease (new token, later expiry, same generation and attempt); fenced."""
        what = "renew()"
        current = self._require_lease(lease, what)
        seconds = check_lease_seconds(self._defaults, lease_seconds, what)
        answer = self._session.renew(current, lease_ms(seconds), what)
        if not isinstance(answer, Missed):
            return answer.lease
        refusal = self._refused(answer, current, what)
        # a settled job cannot be renewed, whoever settled it
        raise refusal or JobSettled(
            f"{what} refused: job {current.job_id!r} is already settled (by this attempt)",
            job_id=current.job_id,
        )

    def _refused(
        self, missed: Missed, lease: Lease, what: str, now: int | None = None
    ) -> LeaseLost | None:
        """The refusal a missed fenced write earns; ``None`` when idempotent."""
        at = self._runtime.now_ms() if now is None else now
        return fence.refusal(missed.row, lease, at, what)

    def _settled(
        self, answer: bool | Missed, lease: Lease, what: str, now: int | None = None
    ) -> bool:
        """A settling call's answer: ``True``, or the refusal raised."""
        if isinstance(answer, Missed):
            refusal = self._refused(answer, lease, what, now)
            if refusal is not None:
                raise refusal
        return True  # written, or this same attempt already settled it: idempotent

    def _settle_one(self, item: Settlement, what: str) -> bool:
        """A lone settlement: a batch of one."""
        answer = self._session.settle(SettleBatch((item,)), what)
        got = answer.settled[0]
        settled = self._settled(got, item.lease, what, answer.now)
        if got is True:
            self._session.after_commit(
                self._hub.wake if isinstance(item, Snoozing) else self._hub.settled
            )
        elif cancelled_by_mark(got, item.lease):
            self._session.after_commit(self._hub.settled)
        return settled

    def complete(self, lease: Lease, result: Any = None) -> bool:
        """Mark the job done with ``result``; fenced, idempotent for the same attempt.

        A result JSON cannot carry is ``TypeError`` before any write; text in
        it that cannot be encoded (a lone surrogate) is ``ValueError``.
        """
        what = "complete()"
        current, text = prepare_complete(lease, result, what)
        return self._settle_one(Completion(current, text), what)

    def fail(
        self,
        lease: Lease,
        error: object,
        *,
        retry: bool = True,
        backoff_base_seconds: float | None = None,
        backoff_cap_seconds: float | None = None,
    ) -> bool:
        """Fail this attempt: retry after a jittered backoff, or dead-letter.

        Dead-letters when ``attempts >= max_attempts`` or ``retry=False``.
        ``last_error`` records a readable description of ``error``.
        """
        what = "fail()"
        failure = prepare_failure_with(
            self._defaults,
            lease,
            error,
            retry=retry,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
            what=what,
        )
        return self._settle_one(failure, what)

    def snooze(self, lease: Lease, delay_seconds: float) -> bool:
        """Put the job back to pending at ``now + delay_seconds`` without spending the attempt.

        Fenced like :meth:`complete` (SPEC §12): the job's ``attempts`` go
        back to what they were before this lease's claim, the lease is
        cleared and the generation kept, so this lease (and any older one)
        settles nothing afterwards. A repeat by the same attempt is
        idempotent (``True``). ``delay_seconds`` is a finite number >= 0 (a
        bool is refused). What a handler does by raising
        :class:`~jaren_jobs.Snooze`.
        """
        return self._settle_one(prepare_snoozing(lease, delay_seconds), SNOOZE)

    def wait(
        self,
        id: str,
        *,
        timeout_seconds: float | None = None,
        signal: SignalLike | None = None,
    ) -> Job:
        """Block until the job is done, dead or cancelled, wherever it runs; return it.

        Woken at once by a settlement in this process, by PostgreSQL's
        ``NOTIFY`` from another process, else by a short bounded poll.
        ``timeout_seconds`` (finite, >= 0; ``None``: no bound) is measured in
        real time: past it, :class:`~jaren_jobs.DeadlinePassed`. An aborted
        ``signal`` (already, or while waiting) is
        :class:`~jaren_jobs.OperationCancelled`; an id no job has is
        :class:`~jaren_jobs.UnknownJob`. Refused inside ``store.transaction()``
        (:class:`~jaren_jobs.GateRefused`): the transaction holds the
        connection, so no other settlement could ever be seen from it.
        """
        plan = wait_plan(self, id, timeout_seconds, signal)
        event = threading.Event()
        plan.start(event.set)
        try:
            while True:
                event.clear()
                job = plan.verdict(self._session.get_job(plan.job_id, plan.what))
                if job is not None:
                    return job
                event.wait(plan.pause())
        finally:
            plan.stop()

    # ------------------------------------------------------------ surfaces built elsewhere

    def page(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        after: str | None = None,
        limit: int = 100,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        queue: str | None = None,
        order: str = "id",
    ) -> Cursor[Job]:
        """A keyset cursor over jobs (see :mod:`jaren_jobs.cursor`); ``queue`` filters.

        ``order="id"`` (the default) walks by id; ``order="newest"`` walks
        newest first by ``updated_at`` (ties by id, descending), where
        ``after`` is the id of the job to continue past (it must exist).
        """
        filters = check_page(
            state=state,
            kind=kind,
            after=after,
            limit=limit,
            queue=queue,
            order=order,
            what="page()",
        )
        return self._session.page(filters, signal=signal, deadline=deadline)

    def checkpoints_for(self, claimed: ClaimedJob) -> CheckpointStore:
        """The checkpoint store bound to this claimed attempt (SPEC §6)."""

        if not isinstance(claimed, ClaimedJob):
            raise LeaseRequired(
                "checkpoints_for() takes the ClaimedJob a claim returned (it carries the lease), "
                f"got {type(claimed).__name__}",
                given=type(claimed).__name__,
            )
        return CheckpointStore(
            self._session,
            self._runtime.now_ms,
            claimed.id,
            lambda: claimed.lease,
            self._hub.settled,
        )


# ---------------------------------------------------------------- internals
#
# What the worker and group commit need of an engine, kept off ``store.jobs``
# (whose public names are SPEC §3's): functions of this module, not methods.


def enqueue_tick(
    engine: JobEngine,
    kind: str,
    payload: Any,
    *,
    id: str,
    run_at: datetime,
    max_attempts: int | None,
    priority: int,
    queue: str,
) -> Job:
    """``enqueue`` of a periodic tick: its ``run_at`` stays the tick even when
    the tick is enqueued after it (SPEC §12), where a plain past ``run_at``
    runs at the enqueue's now."""
    what = "enqueue()"
    prepared = engine._prepare(
        kind,
        payload,
        job_id=id,
        run_at=run_at,
        delay_seconds=None,
        max_attempts=max_attempts,
        priority=priority,
        queue=queue,
        unique_key=None,
        what=what,
    )._replace(exact_run_at=True)
    (job,) = engine._session.insert_jobs((prepared,), one_by_one=True, what=what)
    engine._session.after_commit(engine._hub.wake)
    return job


def session_of(engine: JobEngine) -> JobsSession:
    """The session under an engine view (checkpoint stores and test helpers reach it so)."""
    return engine._session


def store_backend_of(engine: JobEngine) -> StoreBackend:
    """The open database under an engine view (the worker checks it is open, and its bound)."""
    return engine._session.store_backend


def root_scope_of(engine: JobEngine) -> Scope:
    """The root scope of an engine's store (the worker's tracked scopes wrap it).

    A worker created through ``tx.jobs`` still works at the root: it never joins
    an application transaction's fate.
    """
    return engine._session.store_backend.root_session(
        engine._runtime, engine._hub.idle_claims
    ).scope


def settled_wake_of(engine: JobEngine) -> Callable[[], None]:
    """What wakes the store's ``wait()``ers once a settlement commits (checkpoint stores)."""
    return engine._hub.settled


def runtime_of(engine: JobEngine) -> ResolvedRuntime:
    """The runtime (clock, random, ids) an engine view reads."""
    return engine._runtime


def rescoped(engine: JobEngine, scope: Scope) -> JobEngine:
    """The same engine over another scope of the same store (a worker's tracked views)."""
    return JobEngine(engine._session.rescoped(scope), engine._hub)


def settle(engine: JobEngine, batch: SettleBatch, what: str) -> SettleAnswer:
    """Settle ``batch`` as one unit of work (see :mod:`jaren_jobs.core.settle`)."""
    answer = engine._session.settle(batch, what)
    _woken(engine, batch, answer)
    return answer


def settle_within(engine: JobEngine, batch: SettleBatch, now: int, what: str) -> SettleAnswer:
    """:func:`settle`'s statements, for callers already inside a write, fenced at ``now``."""
    answer = engine._session.settle_within(batch, now, what)
    _woken(engine, batch, answer)
    return answer


def _woken(engine: JobEngine, batch: SettleBatch, answer: SettleAnswer) -> None:
    """Once the batch commits: this process's waiters read again; a snooze wakes workers."""
    written = [
        item for item, got in zip(batch.settlements, answer.settled, strict=True) if got is True
    ]
    ended = any(
        cancelled_by_mark(got, item.lease)
        for item, got in zip(batch.settlements, answer.settled, strict=True)
    )
    if ended or any(not isinstance(item, Snoozing) for item in written):
        engine._session.after_commit(engine._hub.settled)
    if any(isinstance(item, Snoozing) and item.delay_ms <= 0 for item in written):
        engine._session.after_commit(engine._hub.wake)  # claimable again now


def cancelled_by_mark(answer: bool | Missed, lease: Lease) -> bool:
    """Whether a settlement's answer is the ``cancelled`` row it wrote (a failure or snooze
    of a job ``cancel(id, force=True)`` marked): a write that ended the job all the same."""
    return (
        isinstance(answer, Missed)
        and answer.row is not None
        and answer.row.state == "cancelled"
        and fence.settled_by(answer.row, lease)
    )


def wait_plan(engine: JobEngine, id: object, timeout_seconds: object, signal: object) -> WaitPlan:
    """``wait()``'s checked arguments and refusals before it waits (sync and async alike)."""
    return plan_wait(
        engine._session,
        engine._hub,
        engine._runtime,
        id=id,
        timeout_seconds=timeout_seconds,
        signal=signal,
    )


def claim_request_for(
    engine: JobEngine,
    kinds: Iterable[str],
    *,
    owner: str,
    lease_seconds: float | None = None,
    queues: Iterable[str] | None = None,
) -> ClaimRequest:
    """Checked claim arguments, for a worker's repeated claims inside its settle batches."""
    return claim_request(
        engine._defaults, kinds, owner, lease_seconds, "claim_many()", queues=queues
    )


def prepare_failure(
    engine: JobEngine,
    lease: object,
    error: object,
    *,
    retry: object,
    backoff_base_seconds: float | None,
    backoff_cap_seconds: float | None,
    what: str,
) -> Failure:
    """A failure's checks before any write, with the engine's defaults (group commit)."""
    return prepare_failure_with(
        engine._defaults,
        lease,
        error,
        retry=retry,
        backoff_base_seconds=backoff_base_seconds,
        backoff_cap_seconds=backoff_cap_seconds,
        what=what,
    )
