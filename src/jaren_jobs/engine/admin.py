"""Administration: the operator's calls of ``store.jobs``, checked and answered.

:class:`JobAdmin` holds them: a job's error history, the counts, ``cancel``
(with a lease, or forced), ``requeue`` and ``sweep``. It is the base of
:class:`~jaren_jobs.engine.engine.JobEngine`, which keeps the queue's own path
(enqueue, claim, the fence). Each call checks its arguments, makes ONE
session call, and names the answer (a live lease is
:class:`~jaren_jobs.LeaseRequired`, anything else that did not move is
:class:`~jaren_jobs.JobSettled`). After the commit, a cancel aborts this
process's attempt of the job through the hub, and wakes ``wait()``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from jaren_jobs.backend import JobsSession, Missed
from jaren_jobs.codec import check_aware, check_text, datetime_from_ms, ms_from_datetime
from jaren_jobs.core import fence
from jaren_jobs.core.commands import check_id, check_queue, check_sweep_states, require_lease
from jaren_jobs.core.fence import FenceRow, moved_or_refused
from jaren_jobs.core.history import error_records
from jaren_jobs.engine.hub import EngineHub
from jaren_jobs.errors import CancelRequested, JobSettled, LeaseRequired, UnknownJob
from jaren_jobs.records import Counts, DueCounts, JobError, Lease, SettledBuckets
from jaren_jobs.runtime import ResolvedRuntime, check_positive_int, check_seconds
from jaren_jobs.signals import SignalLike, check_deadline_arg, check_signal_arg, refuse_if_cancelled

__all__ = ["MAX_BUCKETS", "JobAdmin", "cancel_job", "requeue_job", "run_now_job"]

#: the most buckets one settled_buckets() call may ask for
MAX_BUCKETS = 10_000


class JobAdmin:
    """The operator's calls of ``store.jobs`` and ``tx.jobs`` (SPEC §3, §13, §14).

    Not made on its own: :class:`~jaren_jobs.engine.engine.JobEngine` derives from it,
    and its ``__init__`` sets what these calls read.
    """

    _session: JobsSession
    _hub: EngineHub
    _runtime: ResolvedRuntime

    # ------------------------------------------------------------ reads

    def errors(self, id: str) -> list[JobError]:
        """``errors``: see :meth:`jaren_jobs.Jobs.errors`, which documents it."""
        what = "errors()"
        if not isinstance(id, str):
            raise TypeError(f"{what}: id must be a str, got {type(id).__name__}")
        check_text(id, f"{what}: id")
        rows = self._session.job_errors(id, what)
        if rows is None:
            raise UnknownJob(f"{what}: no job has id {id!r} (never enqueued, or swept)", job_id=id)
        return error_records(rows)

    def counts(self, *, queue: str | None = None) -> Counts:
        """``counts``: see :meth:`jaren_jobs.Jobs.counts`, which documents it."""
        what = "counts()"
        if queue is None:
            return self._session.count_jobs(what)
        return self._session.count_jobs(what, check_queue(queue, f"{what}: queue"))

    def due_counts(self, *, queue: str | None = None) -> DueCounts:
        """``due_counts``: see :meth:`jaren_jobs.Jobs.due_counts`, which documents it."""
        what = "due_counts()"
        checked = None if queue is None else check_queue(queue, f"{what}: queue")
        pr, ps, fr, fs, expired, oldest = self._session.count_due(
            self._runtime.now_ms(), what, checked
        )
        return DueCounts(pr, ps, fr, fs, expired, oldest_ready_at=datetime_from_ms(oldest))

    def queues(self, *, limit: int = 100) -> list[str]:
        """``queues``: see :meth:`jaren_jobs.Jobs.queues`, which documents it."""
        what = "queues()"
        return self._session.live_queues(check_positive_int(limit, f"{what}: limit"), what)

    def settled_buckets(
        self, *, since: datetime, bucket_seconds: float, buckets: int, limit: int = 10_000
    ) -> SettledBuckets:
        """``settled_buckets``: see :meth:`jaren_jobs.Jobs.settled_buckets`, which documents it."""
        what = "settled_buckets()"
        start = ms_from_datetime(check_aware(since, f"{what}: since"))
        width = check_seconds(bucket_seconds, f"{what}: bucket_seconds")
        count = check_positive_int(buckets, f"{what}: buckets")
        most = check_positive_int(limit, f"{what}: limit")
        bucket_ms = max(1, round(width * 1000))
        if count > MAX_BUCKETS:
            raise ValueError(f"{what}: buckets must be at most {MAX_BUCKETS}, got {count}")
        rows = self._session.count_settled(start, start + count * bucket_ms, bucket_ms, most, what)
        series: dict[str, list[int]] = {s: [0] * count for s in ("done", "dead", "cancelled")}
        for state, index, jobs in rows:
            series[state][index] += jobs
        return SettledBuckets(
            since=since,
            bucket_seconds=bucket_ms / 1000,
            done=tuple(series["done"]),
            dead=tuple(series["dead"]),
            cancelled=tuple(series["cancelled"]),
            truncated=frozenset(s for s, counts in series.items() if sum(counts) >= most),
        )

    # ------------------------------------------------------------ administration

    def cancel(
        self,
        id: str,
        *,
        lease: Lease | None = None,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        force: bool = False,
    ) -> bool:
        """``cancel``: see :meth:`jaren_jobs.Jobs.cancel`, which documents it."""
        return cancel_job(
            self._session,
            self._hub,
            self._runtime,
            id,
            lease=lease,
            signal=signal,
            deadline=deadline,
            force=force,
        )

    def requeue(
        self,
        id: str,
        *,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        drop_checkpoints: bool = False,
        reset_attempts: bool = False,
    ) -> bool:
        """``requeue``: see :meth:`jaren_jobs.Jobs.requeue`, which documents it."""
        return requeue_job(
            self._session,
            self._hub,
            self._runtime,
            id,
            signal=signal,
            deadline=deadline,
            drop_checkpoints=drop_checkpoints,
            reset_attempts=reset_attempts,
        )

    def run_now(
        self,
        id: str,
        *,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
    ) -> bool:
        """``run_now``: see :meth:`jaren_jobs.Jobs.run_now`, which documents it."""
        return run_now_job(
            self._session, self._hub, self._runtime, id, signal=signal, deadline=deadline
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
        """``sweep``: see :meth:`jaren_jobs.Jobs.sweep`, which documents it."""
        what = "sweep()"
        horizon = ms_from_datetime(check_aware(settled_before, f"{what}: settled_before"))
        bound = -1 if limit is None else check_positive_int(limit, f"{what}: limit")
        only = check_sweep_states(states, what)
        sig = check_signal_arg(signal, what)
        dl = check_deadline_arg(deadline, what)
        refuse_if_cancelled(sig, dl, self._runtime.now(), what)
        return self._session.sweep(horizon, None if limit is None else bound, what, sig, only)


def cancel_job(
    session: JobsSession,
    hub: EngineHub,
    runtime: ResolvedRuntime,
    id: object,
    *,
    lease: Lease | None,
    signal: SignalLike | None,
    deadline: datetime | None,
    force: object,
) -> bool:
    """``store.jobs.cancel`` (see :meth:`JobAdmin.cancel`)."""
    what = "cancel()"
    job_id = check_id(id, f"{what}: id")
    if not isinstance(force, bool):
        raise TypeError(f"{what}: force must be a bool, got {type(force).__name__}")
    if force and lease is not None:
        raise ValueError(
            f"{what}: force=True cancels without a lease; pass either lease= (the "
            "holder's own cancel) or force=True, not both"
        )
    current = None if lease is None else require_lease(lease, what)
    if current is not None and current.job_id != job_id:
        raise LeaseRequired(
            f"{what}: the lease given belongs to job {current.job_id!r}, not {job_id!r}; "
            "pass the lease of the job being cancelled",
            job_id=job_id,
            lease_job_id=current.job_id,
        )
    sig = check_signal_arg(signal, what)
    dl = check_deadline_arg(deadline, what)
    refuse_if_cancelled(sig, dl, runtime.now(), what)

    if force:
        return _cancel_forced(session, hub, job_id, what, sig)
    if current is None:
        moved = moved_or_refused(
            session.cancel_queued(job_id, what, sig),
            job_id,
            what,
            unchanged="cancelled",
            leased="is claimed — cancelling a claimed job takes the lease its attempt holds "
            "(cancel(id, lease=...)), so no stranger settles another's work; stop it with "
            "cancel(id, force=True), or wait for it to settle",
            settled="already settled",
        )
        if moved:
            session.after_commit(hub.settled)
        return moved
    leased = session.cancel_leased(current, what, sig)
    if isinstance(leased, Missed):
        refused = fence.refusal(leased.row, current, runtime.now_ms(), what)
        if refused is not None:
            raise refused
        return False  # this attempt already settled it
    reason = JobSettled(
        f"job {job_id!r} was cancelled; this attempt no longer speaks for it",
        job_id=job_id,
        cancelled=True,
    )
    session.after_commit(lambda: hub.abort_local(job_id, reason))
    session.after_commit(hub.settled)
    return True


def _cancel_forced(
    session: JobsSession, hub: EngineHub, job_id: str, what: str, sig: SignalLike | None
) -> bool:
    """``cancel(id, force=True)``: cancelled now, marked (the holder is told), or refused."""
    answer = session.cancel_forced(job_id, what, sig)
    if answer == "cancelled":
        # an attempt of this process whose lease ran out no longer speaks for it
        settled = JobSettled(
            f"job {job_id!r} was cancelled; this attempt no longer speaks for it",
            job_id=job_id,
            cancelled=True,
        )
        session.after_commit(lambda: hub.abort_local(job_id, settled))
        session.after_commit(hub.settled)
        return True
    if answer == "marked":
        reason = CancelRequested(
            f"job {job_id!r} was cancelled by cancel(id, force=True): wind up; the job "
            "ends cancelled unless this attempt completes first",
            job_id=job_id,
        )
        session.after_commit(lambda: hub.abort_local(job_id, reason))
        return True
    if isinstance(answer, FenceRow) and answer.state == "leased":
        return False  # marked already: this call asked nothing new
    return moved_or_refused(
        answer,
        job_id,
        what,
        unchanged="cancelled",
        leased="is leased",  # not reached: a live lease is marked
        settled="already settled",
    )


def requeue_job(
    session: JobsSession,
    hub: EngineHub,
    runtime: ResolvedRuntime,
    id: object,
    *,
    signal: SignalLike | None,
    deadline: datetime | None,
    drop_checkpoints: object,
    reset_attempts: bool,
) -> bool:
    """``store.jobs.requeue`` (see :meth:`JobAdmin.requeue`)."""
    what = "requeue()"
    job_id = check_id(id, f"{what}: id")
    if not isinstance(drop_checkpoints, bool):
        raise TypeError(
            f"{what}: drop_checkpoints must be a bool, got {type(drop_checkpoints).__name__}"
        )
    if not isinstance(reset_attempts, bool):
        raise TypeError(
            f"{what}: reset_attempts must be a bool, got {type(reset_attempts).__name__}"
        )
    sig = check_signal_arg(signal, what)
    dl = check_deadline_arg(deadline, what)
    refuse_if_cancelled(sig, dl, runtime.now(), what)

    answer = session.requeue(
        job_id,
        drop_checkpoints=drop_checkpoints,
        reset_attempts=reset_attempts,
        what=what,
        signal=sig,
    )
    if answer is True:
        session.after_commit(hub.wake)
        return True
    return moved_or_refused(
        answer,
        job_id,
        what,
        unchanged="pending",
        leased="holds a live lease — requeue is not a steal; cancel the attempt with its "
        "lease, or wait for the lease to expire",
        settled="a completed job is not re-run; enqueue new work under a new id",
    )


def run_now_job(
    session: JobsSession,
    hub: EngineHub,
    runtime: ResolvedRuntime,
    id: object,
    *,
    signal: SignalLike | None,
    deadline: datetime | None,
) -> bool:
    """``store.jobs.run_now`` (see :meth:`JobAdmin.run_now`)."""
    what = "run_now()"
    job_id = check_id(id, f"{what}: id")
    sig = check_signal_arg(signal, what)
    dl = check_deadline_arg(deadline, what)
    refuse_if_cancelled(sig, dl, runtime.now(), what)
    answer = session.run_now(job_id, what, sig)
    if answer is True:
        session.after_commit(hub.wake)
        return True
    if isinstance(answer, FenceRow) and answer.state in ("pending", "failed"):
        return False  # due already: the next claim takes it
    return moved_or_refused(
        answer,
        job_id,
        what,
        unchanged="pending",  # not reached: answered above
        leased="is claimed — an attempt holds it, or its lease ran out and the next claim "
        "takes it up; run now is for a queued job waiting on its run_at",
        settled="run now moves a queued job; a dead or cancelled one is run again with requeue()",
    )
