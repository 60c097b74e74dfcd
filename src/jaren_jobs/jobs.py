"""``store.jobs`` and ``tx.jobs``: :class:`Jobs`, the queue's public face.

A ``Jobs`` *has* an engine (:class:`~jaren_jobs.engine.engine.JobEngine`: the
fenced calls over one session) and answers SPEC §3's calls through it; workers
are built over that engine. What the library needs of an engine beyond §3 (its
session, runtime, scopes, batched settlement) stays on the engine, off this face.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from jaren_jobs.backend import JobsSession
from jaren_jobs.cursor import Cursor
from jaren_jobs.engine.checkpoints import CheckpointStore
from jaren_jobs.engine.engine import JobEngine
from jaren_jobs.engine.hub import EngineHub
from jaren_jobs.periodic import Periodic
from jaren_jobs.records import (
    ClaimedJob,
    Counts,
    DueCounts,
    Job,
    JobError,
    Lease,
    NewJob,
    Outcome,
    SettledBuckets,
)
from jaren_jobs.signals import SignalLike
from jaren_jobs.worker import Handler, Worker, WorkerHost, create_worker

__all__ = ["Jobs", "engine_of", "worker_for_host"]


class Jobs:
    """``store.jobs`` and ``tx.jobs``: the queue over one store (SPEC §3, §7, §13).

    Every call is the engine's: it checks its arguments, makes one call of the
    database, and names a refusal by the fence (SPEC §4).
    """

    __slots__ = ("_engine",)

    def __init__(self, session: JobsSession, hub: EngineHub) -> None:
        self._engine = JobEngine(session, hub)

    def __repr__(self) -> str:
        return f"<jaren_jobs.Jobs over {self._engine.store_backend.name}>"

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
        return self._engine.enqueue(
            kind,
            payload,
            id=id,
            run_at=run_at,
            delay_seconds=delay_seconds,
            max_attempts=max_attempts,
            priority=priority,
            queue=queue,
            unique_key=unique_key,
        )

    def enqueue_many(self, jobs: Iterable[NewJob]) -> list[Job]:
        """Add many jobs in one transaction: all of them, or (on any refusal) none.

        Refuses exactly as :meth:`enqueue` would for each item (naming the
        item), an id named twice in the batch, and an id that exists
        (:class:`DuplicateJob`, for the first such item in order). Each item
        with a ``unique_key`` is deduplicated on its own, as :meth:`enqueue`
        does: its place in the answer holds the job that holds the key (for
        two items of one key, the first one's job).
        """
        return self._engine.enqueue_many(jobs)

    def get(self, id: str) -> Job | None:
        """The job with this id, or ``None``."""
        return self._engine.get(id)

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
        return self._engine.claim(kinds, owner=owner, lease_seconds=lease_seconds, queues=queues)

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
        return self._engine.claim_many(
            kinds, owner=owner, limit=limit, lease_seconds=lease_seconds, queues=queues
        )

    def renew(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease:
        """A new lease (new token, later expiry, same generation and attempt); fenced."""
        return self._engine.renew(lease, lease_seconds=lease_seconds)

    def complete(self, lease: Lease, result: Any = None) -> bool:
        """Mark the job done with ``result``; fenced, idempotent for the same attempt.

        A result JSON cannot carry is ``TypeError`` before any write; text in
        it that cannot be encoded (a lone surrogate) is ``ValueError``.
        """
        return self._engine.complete(lease, result)

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
        return self._engine.fail(
            lease,
            error,
            retry=retry,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
        )

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
        return self._engine.snooze(lease, delay_seconds)

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
        return self._engine.wait(id, timeout_seconds=timeout_seconds, signal=signal)

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
        return self._engine.page(
            state=state,
            kind=kind,
            after=after,
            limit=limit,
            signal=signal,
            deadline=deadline,
            queue=queue,
            order=order,
        )

    def checkpoints_for(self, claimed: ClaimedJob) -> CheckpointStore:
        """The checkpoint store bound to this claimed attempt (SPEC §6)."""
        return self._engine.checkpoints_for(claimed)

    def errors(self, id: str) -> list[JobError]:
        """The job's error history (SPEC §13): one entry per failed attempt, oldest first.

        Each :class:`~jaren_jobs.JobError` holds the attempt's number, when it
        failed, the ``last_error`` text it left and the formatted traceback of
        the exception that failed it (``None`` for a failure given as text).
        Kept until the job is swept; an id no job has is
        :class:`~jaren_jobs.UnknownJob`, as for
        :meth:`~jaren_jobs.engine.engine.JobEngine.wait`.
        """
        return self._engine.errors(id)

    def counts(self, *, queue: str | None = None) -> Counts:
        """Jobs per state, and pending + failed jobs per kind, from one snapshot.

        ``queue``: only that queue's jobs (``None``: every queue).
        """
        return self._engine.counts(queue=queue)

    def due_counts(self, *, queue: str | None = None) -> DueCounts:
        """The queued jobs split at the runtime clock's now: ready (``run_at`` passed) or
        scheduled later, and how many leases have run out (SPEC §14's ``counts``).

        ``queue``: only that queue's jobs (``None``: every queue). An
        operator's read: one statement over the queued and leased jobs.
        """
        return self._engine.due_counts(queue=queue)

    def cancel(
        self,
        id: str,
        *,
        lease: Lease | None = None,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        force: bool = False,
    ) -> bool:
        """Cancel a job.

        Queued (pending/failed): cancelled in one write, no lease needed.
        Claimed: needs the current lease (:class:`LeaseRequired` otherwise,
        even when that lease has expired) and is fenced; an in-flight attempt
        of this process is aborted through its signal. ``True`` when this
        call cancelled it; ``False`` when it already was cancelled, or the
        lease's own attempt already settled it. Unknown or settled:
        :class:`JobSettled`.

        ``force=True`` (SPEC §13; no lease, so not with ``lease=``) also
        stops a running job: a job no live attempt holds (queued, or leased
        with a lease that ran out) is cancelled at once; a live-leased one is
        *marked* and the call answers ``True``: the attempt holding it sees
        ``ctx.signal`` abort (:class:`~jaren_jobs.CancelRequested`) — at
        once in this process, by its next renewal in another (sooner through
        PostgreSQL's NOTIFY) — and its worker settles it ``cancelled``. An
        attempt that completes first stands (``done``); a failure or snooze
        of a marked job cancels it (no retry). If the holder never settles,
        the job is ``cancelled`` when its lease expires, never re-claimed. A
        second forced cancel while the mark stands answers ``False`` (already
        asked); done, dead or unknown is :class:`JobSettled`.
        """
        return self._engine.cancel(id, lease=lease, signal=signal, deadline=deadline, force=force)

    def requeue(
        self,
        id: str,
        *,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        drop_checkpoints: bool = False,
        reset_attempts: bool = False,
    ) -> bool:
        """Return a failed, dead, cancelled or lease-expired job to pending, now.

        Attempt history is kept: the job's ``attempts`` count goes on from
        where it stood, unless ``reset_attempts=True`` starts it over at 0, so
        a dead job gets its full ``max_attempts`` again. Either way the lease
        generation keeps growing, so no lease of an earlier attempt can settle
        the job again. A live lease is :class:`LeaseRequired` (requeue is not a
        steal); done or unknown is :class:`JobSettled`; ``False`` when it
        already is pending (its attempts are then left as they are).
        ``drop_checkpoints=True`` also deletes the job's checkpoints in the
        same transaction (a pending job's too), so a DAG run starts over
        instead of resuming: the way out of a ``RunMismatch``. A refusal
        deletes nothing.
        """
        return self._engine.requeue(
            id,
            signal=signal,
            deadline=deadline,
            drop_checkpoints=drop_checkpoints,
            reset_attempts=reset_attempts,
        )

    def sweep(
        self,
        *,
        settled_before: datetime,
        limit: int | None = None,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        states: Iterable[str] | None = None,
    ) -> int:
        """Delete settled jobs last changed before the horizon, oldest first, with checkpoints.

        ``states``: only jobs in these settled states (some of ``done``,
        ``dead``, ``cancelled``; ``None``: all three), e.g. ``["done"]`` to
        keep the dead letters. One transaction; returns how many jobs were deleted.
        """
        return self._engine.sweep(
            settled_before=settled_before,
            limit=limit,
            signal=signal,
            deadline=deadline,
            states=states,
        )

    def queues(self, *, limit: int = 100) -> list[str]:
        """The queues that hold live jobs — queued (pending or failed) or leased —
        sorted, at most ``limit`` of them (an int ≥ 1).

        A queue whose jobs are all settled is not among them. An operator's read
        (the dashboard's per-queue table): one statement that seeks each queue in
        an index of the queued jobs and reads the few leased rows, never every job.
        """
        return self._engine.queues(limit=limit)

    def settled_buckets(
        self, *, since: datetime, bucket_seconds: float, buckets: int, limit: int = 10_000
    ) -> SettledBuckets:
        """How many jobs settled (done, dead, cancelled) in each of ``buckets`` buckets of
        ``bucket_seconds`` from ``since``, by their last change: a throughput chart.

        At most ``limit`` jobs are read per state, the most recent first, so the
        cost is bounded whatever the queue's rate; a state that reached it is in
        ``truncated`` (its older buckets may fall short). An operator's read: one
        statement over an index of the settled jobs, never the table. Swept jobs
        are not counted, nor a requeued one (it is no longer settled).
        """
        return self._engine.settled_buckets(
            since=since, bucket_seconds=bucket_seconds, buckets=buckets, limit=limit
        )

    def run_now(
        self,
        id: str,
        *,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
    ) -> bool:
        """Make a queued job due now: one waiting on its ``run_at`` (a delay, a schedule)
        or on a retry's backoff.

        A pending or failed job whose ``run_at`` is still ahead gets ``run_at``
        = now, in one write guarded on that state (a claim that took it first
        wins, and this call then refuses); nothing else changes (attempts,
        error, priority) and workers are woken. ``True`` when this call moved
        it; ``False`` when it was due already. A claimed job (running, or
        with a lease that ran out, which the next claim takes up) is
        :class:`LeaseRequired`; done, dead, cancelled or unknown is
        :class:`JobSettled` (a dead or cancelled job is run again with
        :meth:`requeue`).
        """
        return self._engine.run_now(id, signal=signal, deadline=deadline)

    def create_worker(
        self,
        handlers: Mapping[str, Handler],
        *,
        concurrency: int = 1,
        poll_seconds: float | None = None,
        lease_seconds: float | None = None,
        owner: str | None = None,
        renew: bool = True,
        on_outcome: Callable[[Outcome], Any] | None = None,
        backoff_base_seconds: float | None = None,
        backoff_cap_seconds: float | None = None,
        stop_grace_seconds: float | None = None,
        on_renewal: Callable[[Lease], Any] | None = None,
        on_idle: Callable[[], Any] | None = None,
        periodic: Sequence[Periodic] | None = None,
        queues: Iterable[str] | None = None,
    ) -> Worker:
        """A worker running ``handlers`` over this store, not started (SPEC §7).

        Its own database calls are root-scoped and tracked even when it is
        created through ``tx.jobs``: a worker never joins a transaction's fate.
        ``periodic``: :class:`~jaren_jobs.Periodic` schedules whose ticks it
        enqueues (SPEC §12).
        """
        return worker_for_host(
            self,
            handlers,
            None,
            concurrency=concurrency,
            poll_seconds=poll_seconds,
            lease_seconds=lease_seconds,
            owner=owner,
            renew=renew,
            on_outcome=on_outcome,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
            stop_grace_seconds=stop_grace_seconds,
            on_renewal=on_renewal,
            on_idle=on_idle,
            periodic=periodic,
            queues=queues,
        )


# The library's own ways in, kept off the face (which shows SPEC §3's calls only).


def engine_of(jobs: Jobs) -> JobEngine:
    """The engine under ``jobs`` (for the library's own parts: workers, tests)."""
    return jobs._engine


def worker_for_host(
    jobs: Jobs, handlers: Mapping[str, Handler], host: WorkerHost | None, **options: Any
) -> Worker:
    """:meth:`Jobs.create_worker` for a host: an AsyncWorker builds its thread worker here,
    giving itself as the host of its queue runs, renewals and grace end."""
    engine = jobs._engine
    # other processes' enqueues wake it too, where the database can say so
    backend = engine.store_backend
    backend.wake_on_commits(engine.hub.wake)
    # another process's cancel(id, force=True) of a job it holds: renew it now
    backend.wake_on_cancel_requests(engine.hub.cancel_requested)
    return create_worker(engine, engine.hub, handlers, host=host, **options)
