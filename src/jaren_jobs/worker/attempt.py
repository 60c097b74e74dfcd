"""Attempts: what one owns, the context its handler gets, running it, and the loops."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jaren_jobs.checkpoints import CheckpointStore
from jaren_jobs.core.fence import FenceRow
from jaren_jobs.engine import JobEngine, runtime_of, session_of, settled_wake_of
from jaren_jobs.errors import (
    CancelRequested,
    LeaseLost,
    StorageError,
    StoreClosed,
    describe_error,
)
from jaren_jobs.observe import hooks
from jaren_jobs.records import (
    ClaimedJob,
    CorruptJson,
    Lease,
    Outcome,
)
from jaren_jobs.signals import CancelScope, Signal

from .pacing import _Batch, ahead, averaged

if TYPE_CHECKING:
    from .threaded import Worker

_log = logging.getLogger("jaren_jobs.worker")


# the WorkerStats counter each outcome counts in
_COUNTERS = {
    "completed": "completions",
    "failed": "failures",
    "cancelled": "cancellations",
    "lost": "lost_settlements",
    "snoozed": "snoozes",
}


class WorkerStopped(StoreClosed):
    """The worker was stopped: this attempt may no longer reach the database through it.

    Raised by ``ctx.checkpoints`` calls (and by the worker's own settlement)
    once :meth:`Worker.stop` has barred an attempt it could not drain. The
    attempt's lease is left to expire; the job is then re-claimed. It is also
    the ``reason`` of ``ctx.signal`` when the worker stops. A subclass of
    :class:`~jaren_jobs.StoreClosed` (JD2091): the store is closed *to this
    attempt*.
    """


class JobContext:
    """What a handler gets besides the payload: ``handler(payload, ctx)``.

    * ``job``: the :class:`~jaren_jobs.ClaimedJob` (its ``lease`` is the
      claim's; :attr:`lease` follows renewals);
    * ``checkpoints``: the attempt's :class:`~jaren_jobs.CheckpointStore`,
      always using the attempt's *current* lease;
    * ``signal``: aborted when the worker stops, when the job is cancelled
      through ``cancel(id, lease=...)`` or stopped by ``cancel(id,
      force=True)`` (reason :class:`~jaren_jobs.CancelRequested`: raise
      and the job ends cancelled; return and it is done), or when the lease
      is lost — wind up promptly when it fires (``ctx.signal.wait(t)``
      blocks until it does).
    """

    __slots__ = ("_attempt", "_checkpoints", "_engine", "job", "owner", "signal")

    def __init__(self, attempt: _Attempt, engine: JobEngine, signal: Signal, owner: str) -> None:
        self._attempt = attempt
        self._engine = engine
        self._checkpoints: CheckpointStore | None = None
        self.job: ClaimedJob = attempt.claimed
        self.signal = signal
        self.owner = owner

    @property
    def checkpoints(self) -> CheckpointStore:
        """The attempt's checkpoint store (built on first use: most handlers never need one)."""
        if self._checkpoints is None:
            self._checkpoints = _AttemptCheckpoints(self._engine, self._attempt)
        return self._checkpoints

    @property
    def lease(self) -> Lease:
        """The attempt's current lease (a renewal replaces it)."""
        return self._attempt.lease

    def __repr__(self) -> str:
        return f"<jaren_jobs.JobContext job={self.job.id!r} kind={self.job.kind!r}>"


# what create_worker runs per kind: handler(payload, ctx) -> result
Handler = Callable[[Any, JobContext], Any]


class _Attempt:
    """Everything one in-flight attempt owns."""

    __slots__ = (
        "cancel_requested",
        "cancelled",
        "claimed",
        "ended",
        "error",
        "key",
        "lease",
        "lease_lock",
        "lease_seq",
        "lost",
        "lost_row",
        "observed",
        "renew_at",
        "scope",
    )

    def __init__(self, claimed: ClaimedJob, key: int, lease_seq: int) -> None:
        self.claimed = claimed
        self.key = key
        self.lease = claimed.lease
        self.lease_seq = lease_seq  # order of the current lease's issue, for leases()
        # serialises renewals with settlements and checkpoint calls: a call
        # that read the lease just before a renewal committed would otherwise
        # be refused as superseded by its own attempt
        self.lease_lock = threading.Lock()
        self.scope = CancelScope()
        self.cancelled = False
        # cancel(id, force=True) marked the job: the signal aborted, and a
        # failure (or snooze) of this attempt settles it cancelled
        self.cancel_requested = False
        self.lost: LeaseLost | None = None
        # the fence row the renewal that found the lease lost met: how the job
        # ended, should this very attempt have settled it (a handler using its lease)
        self.lost_row: FenceRow | None = None
        self.ended = False  # no renewal once set
        self.renew_at = 0.0  # time.monotonic() when the lease is next renewed
        # what the handler raised (or what failed it instead): its traceback is logged
        self.error: BaseException | None = None
        self.observed: Any = None  # the observers' states (jaren_jobs.observe), if any

    @property
    def job_id(self) -> str:
        return self.claimed.id

    def cancel(self, reason: Any) -> None:
        if isinstance(reason, CancelRequested):
            # cancel(id, force=True): nothing is settled yet; the attempt
            # winds up and settles the job itself (a completion still stands)
            if self.cancel_requested:
                return
            self.cancel_requested = True
            _log.info(
                "jaren_jobs: job %r (kind %r) attempt %d: cancel(id, force=True) asked it "
                "to stop; its signal aborts",
                self.claimed.id,
                self.claimed.kind,
                self.lease.attempt,
            )
            self.scope.abort(reason)
            return
        # the engine's cancel(id, lease=...) committed; this attempt's
        # outcome is a cancellation, whatever its handler does next
        self.cancelled = True
        self.scope.abort(reason)


# an attempt whose handler returned: (attempt, the exception it raised, its result)
_Ran = tuple[_Attempt, Exception | None, Any]


class _Held:
    """A job leased for a loop and not started yet; a cancel with its lease reaches it here."""

    __slots__ = ("abort", "at", "attempt", "cancelled", "forced", "job", "seq")

    def __init__(self, job: ClaimedJob, seq: int, at: float) -> None:
        self.job = job
        self.seq = seq  # order of the lease's issue, for leases()
        self.at = at  # time.monotonic() of the claim
        self.cancelled = False  # cancel(id, lease=...) committed before it started
        self.attempt: _Attempt | None = None  # once started
        # cancel(id, force=True) before it started: it starts, and its attempt
        # settles the job cancelled without running the handler
        self.forced: CancelRequested | None = None
        self.abort: Callable[[Any], None] | None = None  # what the hub holds for it


class _AttemptCheckpoints(CheckpointStore):
    """``ctx.checkpoints``: the attempt's current lease, never racing a renewal."""

    def __init__(self, engine: JobEngine, attempt: _Attempt) -> None:
        super().__init__(
            session_of(engine),
            runtime_of(engine).now_ms,
            attempt.job_id,
            lambda: attempt.lease,
            settled_wake_of(engine),
        )
        self._attempt = attempt

    def load(self, run_id: str) -> dict[str, Any] | None:
        with self._attempt.lease_lock:
            return super().load(run_id)

    def save(self, run_id: str, node_id: str, value: Any) -> None:
        with self._attempt.lease_lock:
            super().save(run_id, node_id, value)
        if self._attempt.observed is not None:  # SPEC §17: DAG nodes as span events
            hooks.checkpoint_saved(self._attempt.observed, self._attempt.claimed, node_id)

    def complete(self, run_id: str, result: Any = None) -> bool:
        with self._attempt.lease_lock:
            return super().complete(run_id, result)


def _gone(held: _Held | None) -> bool:
    """A held job a cancel with its lease settled: its lease is nothing to hand back."""
    return held is not None and held.cancelled


def _run_one(self: Worker, claimed: ClaimedJob) -> None:
    """run_once(): one job, run and settled in this thread."""
    attempt = self._begin(claimed)
    if attempt is None:
        return  # cancelled before it started
    ran: list[_Ran] = []
    try:
        outcome = self._call(attempt, ran)
    except BaseException as exc:
        # only a handler's KeyboardInterrupt/SystemExit gets here
        self._end(attempt, self._abandon(attempt, exc))
        raise
    if outcome is not None:
        self._end(attempt, outcome)
    else:
        self._settle_all(ran)


def _run_queue(self: Worker, jobs: list[ClaimedJob]) -> None:
    """A started worker's loop: run its queue of leased jobs one after another.

    Each returned attempt goes to the settling thread at once, which
    commits it (with whatever else is ready) while the loop runs the next
    job, and tops the queue up in the same transaction. The first job
    runs even if the worker is stopping (its claim was under way); a job
    not started when the worker halts, or that has waited past the time
    budget (it sat behind a job far slower than the average), is handed
    back unstarted, with the rest: no attempt is spent.
    """
    ran: list[_Ran] = []
    rest: list[ClaimedJob] = []
    batch = _Batch(jobs)
    with self._lock:
        self._batches.add(batch)
    first = True
    try:
        while True:
            if not first and self._halt.aborted:
                break
            claimed = batch.take()
            if claimed is None:
                if batch.stalled or self._halt.aborted:
                    break
                # nothing ahead and nothing on its way: ask for the next
                # job, in the transaction of the last one's settlement
                if not batch.refill and not self._top_up(batch, idle=True):
                    break
                if batch.wait_refill():
                    continue
                break
            if not first and self._waited_too_long(claimed):
                rest.append(claimed)
                self._ramp = 0  # a slow job hid among fast ones: start small again
                break
            first = False
            attempt = self._begin(claimed)
            if attempt is None:
                continue  # cancelled before it started
            self._top_up(batch)  # the next jobs come while this one runs
            try:
                outcome = self._call(attempt, ran)
            except BaseException as exc:
                # only a handler's KeyboardInterrupt/SystemExit gets here
                self._end(attempt, self._abandon(attempt, exc))
                raise
            finally:
                batch.returned()
            if outcome is not None:
                self._end(attempt, outcome)
            else:
                self._post(ran.pop())
        if batch.stalled:
            self._ramp = 0
    finally:
        # a top-up still on its way is handed back with the rest
        rest += batch.close()
        with self._lock:
            self._batches.discard(batch)
        self._hand_back(rest)


def _call(self: Worker, attempt: _Attempt, ran: list[_Ran]) -> Outcome | None:
    """Run the handler; its result joins ``ran``. An outcome when it cannot run at all."""
    claimed = attempt.claimed
    if self._barred:
        # a claim that landed while stop() quiesced: it could never
        # settle, so its handler does not start at all
        return self._outcome(
            attempt,
            "lost",
            code=WorkerStopped.code,
            reason="the worker stopped before this attempt could run; its lease will "
            "expire and the job will be re-claimed",
        )
    if attempt.cancelled:
        # cancel(id, lease=...) committed between the take and now
        return self._outcome(attempt, "cancelled", reason="cancelled before its handler ran")
    if attempt.cancel_requested:
        # cancel(id, force=True) before the handler ran: it never runs; the
        # settlement (a failure of a marked job) cancels the job
        reason = attempt.scope.signal.reason
        error = reason if isinstance(reason, Exception) else RuntimeError(str(reason))
        attempt.error = error
        ran.append((attempt, error, None))
        return None
    started = time.perf_counter()
    try:
        # inside the try: a lookup that raises fails this attempt, it is
        # not an interrupt of the worker
        handler = self._handlers[claimed.kind]
        ctx = JobContext(attempt, self._control, attempt.scope.signal, self.owner)
        if isinstance(claimed.payload, CorruptJson):
            # a row written outside the library: the handler could only
            # misread it, so the attempt fails (and dead-letters after
            # its attempts) with an error that names the row
            raise StorageError(
                f"job {claimed.id!r} holds a payload that is not JSON "
                f"({claimed.payload.error}); it was written outside jaren_jobs — "
                "fix the row and requeue the job, or cancel it",
                job_id=claimed.id,
            )
        if attempt.observed is None:
            result = handler(claimed.payload, ctx)
        else:  # SPEC §17: the attempt's span is current while its handler runs
            result = hooks.call(attempt.observed, handler, claimed.payload, ctx)
    except Exception as exc:
        attempt.error = exc
        ran.append((attempt, exc, None))
    else:
        ran.append((attempt, None, result))
    finally:
        spent = time.perf_counter() - started
        self._spent = averaged(self._spent, spent)
    return None


def _begin(self: Worker, claimed: ClaimedJob) -> _Attempt | None:
    """Start the attempt of a held job; None if a cancel with its lease came first."""
    with self._lock:
        held = self._held.pop(id(claimed), None)
        if held is not None and held.cancelled:
            attempt = None  # never started: no attempt, no outcome
        else:
            self._counts["claims"] += 1
            attempt = _Attempt(claimed, next(self._attempt_keys), next(self._lease_seqs))
            first = not self._attempts
            self._attempts[attempt.key] = attempt
            if held is not None:
                held.attempt = attempt  # a cancel arriving through held.abort reaches it
    if attempt is None:
        self._forget([held])
        return None
    with self._hub.lock:
        self._hub.local_attempts[claimed.id] = attempt.cancel
    if held is not None and held.forced is not None:
        attempt.cancel(held.forced)
    if hooks.observers:  # SPEC §17: a consumer span, the start delay
        attempt.observed = hooks.attempt_started(claimed, runtime_of(self._control).now_ms())
    halt = self._halt.signal
    if halt.aborted:  # else _abort_attempts, a callback of the halt, reaches it
        attempt.scope.abort(halt.reason)
    if self.renew:
        # a lease taken with a batch has been running since the claim
        attempt.renew_at = (time.monotonic() if held is None else held.at) + self._renew_every
        if first:
            self._renewals.wake()
    return attempt


def _abort_attempts(self: Worker) -> None:
    """The halt fired: every running attempt's signal aborts with its reason."""
    reason = self._halt.signal.reason
    with self._lock:
        attempts = list(self._attempts.values())
    for attempt in attempts:
        attempt.scope.abort(reason)


def _end(self: Worker, attempt: _Attempt, outcome: Outcome) -> None:
    attempt.ended = True
    with self._hub.lock:
        if self._hub.local_attempts.get(attempt.job_id) == attempt.cancel:
            del self._hub.local_attempts[attempt.job_id]
    counter = _COUNTERS[outcome.outcome]
    with self._lock:
        self._attempts.pop(attempt.key, None)
        self._counts[counter] += 1
    # logged here, once per attempt, before the observer sees it
    self._log_outcome(attempt, outcome)
    if attempt.observed is not None:  # SPEC §17
        hooks.attempt_ended(attempt.observed, attempt.claimed, outcome, attempt.error)
    self._notify("on_outcome", self._on_outcome, outcome)


def _abandon(self: Worker, attempt: _Attempt, exc: BaseException) -> Outcome:
    """A handler raised KeyboardInterrupt/SystemExit: settle nothing, halt the worker."""
    with attempt.lease_lock:
        attempt.ended = True
    self._interrupted = exc
    _log.error(
        "jaren_jobs: worker %r: the handler of job %r raised %s; the worker stops "
        "claiming and the attempt is left unsettled (its lease expires and the job is "
        "re-claimed). Call stop() or close the store to finish shutting down.",
        self.owner,
        attempt.job_id,
        type(exc).__name__,
        exc_info=exc,
    )
    self._halt_for(self._stopping_reason(f"a handler raised {type(exc).__name__}"))
    return self._outcome(
        attempt,
        "lost",
        phase="failure",
        reason=f"{describe_error(exc)} (the handler interrupted the worker; the attempt "
        "was left for lease-expiry recovery)",
    )


def _wake(self: Worker) -> None:
    with self._cond:
        self._counts["wakes"] += 1
        self._wake_generation += 1
        self._cond.notify_all()


def _loop(self: Worker) -> None:
    try:
        while not self._halt.aborted:
            # read before the claim: a wake that lands while it runs is not lost
            generation = self._wake_generation
            began = time.monotonic()
            try:
                ran = self._step(chain=True)
            except Exception:  # a worker bug must not end the loop silently
                _log.exception("jaren_jobs: worker %r: a loop step raised", self.owner)
                ran = False
            if not ran:
                self._idle(began, generation)
    except BaseException as exc:
        # only a handler's KeyboardInterrupt/SystemExit gets here; it was
        # logged and halted the worker. Let it leave the thread.
        if self._interrupted is not exc:  # pragma: no cover - defensive
            _log.error("jaren_jobs: worker %r loop ended by %r", self.owner, exc)
        raise


def _idle(self: Worker, began: float, generation: int) -> None:
    """Sleep until the next poll is due or an in-process enqueue wakes the loop.

    Polls are ``poll_seconds`` apart from start to start, so the time the
    empty claim took does not stretch the interval (a job enqueued by
    another process waits at most about one interval).
    """
    with self._cond:
        if self._halt.aborted:
            return
        self._counts["polls"] += 1
    self._notify("on_idle", self._on_idle)
    end = began + self.poll_seconds
    with self._cond:
        while not self._halt.aborted and generation == self._wake_generation:
            left = end - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)


def _step(self: Worker, *, chain: bool = False) -> bool:
    me = threading.get_ident()
    with self._cond:
        if self._halt.aborted:
            return False
        self._busy += 1
        self._stepping.add(me)
    try:
        looping = chain and self._settler is not None
        jobs = self._claim(1 + self._ahead() if looping else 1)
        if not jobs:
            return False
        if looping:
            self._run_queue(jobs)
        else:
            self._run_one(jobs[0])
        return True
    finally:
        with self._cond:
            self._busy -= 1
            self._stepping.discard(me)
            self._cond.notify_all()


def _ahead(self: Worker) -> int:
    """How many leased jobs a loop holds beyond the one it runs.

    As many as it can start within the horizon, by the handlers' measured
    running time (a moving average), grown by doubling, and never more
    than ``_MAX_AHEAD``: a job held ahead is a lease no other worker can
    take, and one a SIGKILL spends an attempt of.
    """
    return ahead(self._spent, self._horizon, self._ramp)
