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

from jaren_jobs.backend import JobsSession, Missed, Scope, SettleAnswer, StoreBackend
from jaren_jobs.codec import check_text
from jaren_jobs.core import fence
from jaren_jobs.core.commands import (
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
from jaren_jobs.core.history import prepare_failure_with, prepare_snoozing
from jaren_jobs.core.policy import backoff_seconds, is_lease_lost, lease_ms
from jaren_jobs.core.settle import (
    SNOOZE,
    Completion,
    SettleBatch,
    Settlement,
    Snoozing,
    due_at_once,
)
from jaren_jobs.engine.admin import JobAdmin
from jaren_jobs.engine.checkpoints import CheckpointStore
from jaren_jobs.engine.hub import EngineHub
from jaren_jobs.engine.waiting import WaitPlan, plan_wait
from jaren_jobs.errors import DuplicateJob, JobSettled, LeaseLost, LeaseRequired
from jaren_jobs.observe import hooks
from jaren_jobs.records import ClaimedJob, Job, Lease, NewJob
from jaren_jobs.runtime import ResolvedRuntime, check_positive_int
from jaren_jobs.signals import SignalLike

if TYPE_CHECKING:
    from jaren_jobs.cursor import Cursor

__all__ = ["ClaimRequest", "EngineHub", "Failure", "JobEngine", "backoff_seconds", "is_lease_lost"]


class JobEngine(JobAdmin):
    """The queue over one store, reached through one session (root or transaction).

    Each call checks its arguments (``core.commands``), makes ONE session
    call, and interprets the answer (``core.fence`` names a refusal). The
    operator's calls (errors, counts, cancel, requeue, sweep) are
    :class:`~jaren_jobs.engine.admin.JobAdmin`'s.
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
        """``enqueue``: see :meth:`jaren_jobs.Jobs.enqueue`, which documents it."""
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
        """``enqueue_many``: see :meth:`jaren_jobs.Jobs.enqueue_many`, which documents it."""
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
        """``claim``: see :meth:`jaren_jobs.Jobs.claim`, which documents it."""
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

    def claim_checked(self, request: ClaimRequest, limit: int) -> list[ClaimedJob]:
        """``claim_many`` of a request checked once (:meth:`claim_request`): a worker's
        own claims, repeated at every poll, skip checking the same arguments again."""
        return self._session.claim(request, limit, "claim_many()")

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
        batch = SettleBatch((item,))
        answer = self._session.settle(batch, what)
        settled = self._settled(answer.settled[0], item.lease, what, answer.now)
        self._woken(batch, answer)
        return settled

    def complete(self, lease: Lease, result: Any = None) -> bool:
        """``complete``: see :meth:`jaren_jobs.Jobs.complete`, which documents it."""
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
        """``fail``: see :meth:`jaren_jobs.Jobs.fail`, which documents it."""
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
        """``snooze``: see :meth:`jaren_jobs.Jobs.snooze`, which documents it."""
        return self._settle_one(prepare_snoozing(lease, delay_seconds), SNOOZE)

    def wait(
        self,
        id: str,
        *,
        timeout_seconds: float | None = None,
        signal: SignalLike | None = None,
    ) -> Job:
        """``wait``: see :meth:`jaren_jobs.Jobs.wait`, which documents it."""
        plan = self.wait_plan(id, timeout_seconds, signal)
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
        """``page``: see :meth:`jaren_jobs.Jobs.page`, which documents it."""
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

    # ------------------------------------------------------------ what the library needs
    #
    # Of an engine view, the worker, group commit, checkpoint stores and the facade
    # (``Jobs``, which has an engine) need more than SPEC §3's calls: its session,
    # runtime and scopes, batched settlement. Not public: ``store.jobs`` is a ``Jobs``.

    @property
    def session(self) -> JobsSession:
        """The session under this view (checkpoint stores and test helpers reach it)."""
        return self._session

    @property
    def hub(self) -> EngineHub:
        """The store's in-process state this view shares (wake-ups, local attempts)."""
        return self._hub

    @property
    def store_backend(self) -> StoreBackend:
        """The open database under this view (the worker checks it is open, and its bound)."""
        return self._session.store_backend

    @property
    def runtime(self) -> ResolvedRuntime:
        """The runtime (clock, random, ids) this view reads."""
        return self._runtime

    @property
    def settled_wake(self) -> Callable[[], None]:
        """What wakes the store's ``wait()``ers once a settlement commits."""
        return self._hub.settled

    def root_scope(self) -> Scope:
        """The root scope of this view's store (the worker's tracked scopes wrap it).

        A worker created through ``tx.jobs`` still works at the root: it never joins
        an application transaction's fate.
        """
        return self._session.store_backend.root_session(self._runtime).scope

    def rescoped(self, scope: Scope) -> JobEngine:
        """The same engine over another scope of the same store (a worker's tracked views)."""
        return JobEngine(self._session.rescoped(scope), self._hub)

    def settle(self, batch: SettleBatch, what: str) -> SettleAnswer:
        """Settle ``batch`` as one unit of work (see :mod:`jaren_jobs.core.settle`)."""
        answer = self._session.settle(batch, what)
        self._woken(batch, answer)
        return answer

    def settle_within(self, batch: SettleBatch, now: int, what: str) -> SettleAnswer:
        """:meth:`settle`'s statements, for callers already inside a write, fenced at
        ``now``."""
        answer = self._session.settle_within(batch, now, what)
        self._woken(batch, answer)
        return answer

    def _woken(self, batch: SettleBatch, answer: SettleAnswer) -> None:
        """Once the batch commits: this process's waiters read again; a snooze wakes
        workers."""
        written = [
            item for item, got in zip(batch.settlements, answer.settled, strict=True) if got is True
        ]
        ended = any(
            cancelled_by_mark(got, item.lease)
            for item, got in zip(batch.settlements, answer.settled, strict=True)
        )
        if ended or any(not isinstance(item, Snoozing) for item in written):
            self._session.after_commit(self._hub.settled)
        if any(due_at_once(item) for item in written):
            self._session.after_commit(self._hub.wake)  # claimable again now

    def wait_plan(self, id: object, timeout_seconds: object, signal: object) -> WaitPlan:
        """``wait()``'s checked arguments and refusals before it waits (sync and async)."""
        return plan_wait(
            self._session,
            self._hub,
            self._runtime,
            id=id,
            timeout_seconds=timeout_seconds,
            signal=signal,
        )

    def claim_request(
        self,
        kinds: Iterable[str],
        *,
        owner: str,
        lease_seconds: float | None = None,
        queues: Iterable[str] | None = None,
    ) -> ClaimRequest:
        """Checked claim arguments, for a worker's repeated claims in its settle batches."""
        return claim_request(
            self._defaults, kinds, owner, lease_seconds, "claim_many()", queues=queues
        )

    def prepare_failure(
        self,
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
            self._defaults,
            lease,
            error,
            retry=retry,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
            what=what,
        )

    def enqueue_tick(
        self,
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
        prepared = self._prepare(
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
        (job,) = self._session.insert_jobs((prepared,), one_by_one=True, what=what)
        self._session.after_commit(self._hub.wake)
        return job


def cancelled_by_mark(answer: bool | Missed, lease: Lease) -> bool:
    """Whether a settlement's answer is the ``cancelled`` row it wrote (a failure or snooze
    of a job ``cancel(id, force=True)`` marked): a write that ended the job all the same."""
    return (
        isinstance(answer, Missed)
        and answer.row is not None
        and answer.row.state == "cancelled"
        and fence.settled_by(answer.row, lease)
    )
