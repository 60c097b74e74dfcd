"""The thread-based worker (SPEC §7): claim → run → settle, on ``concurrency`` loops.

Shape of one worker:

* ``concurrency`` loop threads, each running a queue of leased jobs one
  after another, and sleeping on a condition variable between empty claims
  until the poll interval passes or an in-process enqueue wakes it. A loop
  holds at most a few jobs beyond the one it runs: as many as the handlers'
  measured running time lets it start within a short horizon, never more
  than ``_MAX_AHEAD`` (see ``_ahead``), since each is a lease no other
  worker can take and an attempt a SIGKILL spends;
* ONE settling thread: each returned attempt is posted to it, and it commits
  whatever was posted while it wrote last, in one transaction (through a
  :class:`~jaren_jobs.batcher.SettlementBatcher`, so each settlement is
  fenced on its own and answered only after the commit). The same
  transaction tops up the loops' queues, and writes again a settlement
  whose last write only timed out waiting, while its lease holds;
* ONE renewal thread, which wakes every quarter of the renewal period while
  attempts are in flight and renews the leases that have fallen due;
* every database operation the worker itself starts (claims, renewals,
  settlements, the handlers' checkpoint stores) runs through a tracked root
  scope, so :meth:`Worker.stop` can bar new ones and wait out the running
  ones: when ``stop()`` returns, nothing the worker started still touches
  the store.

Jobs a loop leased and did not start (the worker is stopping, or a slow job
overran the batch's time budget) are handed back with a fenced release that
spends no attempt; one cancelled with its lease before it started never
starts. :meth:`Worker.run_once` works on one job, synchronously.

Each attempt has exactly one :class:`~jaren_jobs.records.Outcome`:
``completed``, ``failed``, ``cancelled`` or ``lost``.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Literal, TypeVar

from .backends.sqlite.connection import Database, RootScope
from .batcher import Settled, SettlementBatcher
from .checkpoints import CheckpointStore
from .codec import check_text, ms_from_datetime
from .core.settle import Completion, SettleBatch, Settlement
from .engine import ClaimRequest, EngineHub, JobEngine
from .errors import (
    GateRefused,
    JobsError,
    JobSettled,
    LeaseLost,
    StorageError,
    StoreClosed,
    describe_error,
)
from .records import (
    ClaimedJob,
    CorruptJson,
    Lease,
    Outcome,
    OutcomeName,
    StopOutcome,
    WorkerStats,
    assemble,
)
from .runtime import check_positive_int, check_seconds
from .signals import CancelScope, Signal, SignalLike

__all__ = ["Handler", "JobContext", "Worker", "WorkerStopped", "create_worker"]

T = TypeVar("T")
Handler = Callable[[Any, "JobContext"], Any]
Phase = Literal["completion", "failure"]

_log = logging.getLogger("jaren_jobs")
_worker_numbers = itertools.count(1)

# the most jobs a loop holds leased beyond the one it runs: a SIGKILL spends
# the attempt of each (their leases expire; the claim counted them)
_MAX_AHEAD = 8
# the most returned attempts waiting for the settling thread; past it, loops wait
_POSTED_LIMIT = 256
# how long a leased job may wait for its loop, at most (and never more than a
# tenth of the lease): a loop's batch is what it can start within this
_HORIZON_SECONDS = 0.02
# the pause before a settlement that met a transient error is written again
# (doubling from the first, up to the last), for as long as its lease holds
_RETRY_FIRST_SECONDS = 0.01
_RETRY_MOST_SECONDS = 1.0

_COUNTERS = {
    "completed": "completions",
    "failed": "failures",
    "cancelled": "cancellations",
    "lost": "lost_settlements",
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
      through ``cancel(id, lease=...)``, or when the lease is lost — wind up
      promptly when it fires (``ctx.signal.wait(t)`` blocks until it does).
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


class _Attempt:
    """Everything one in-flight attempt owns."""

    __slots__ = (
        "cancelled",
        "claimed",
        "ended",
        "key",
        "lease",
        "lease_lock",
        "lease_seq",
        "lost",
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
        self.lost: LeaseLost | None = None
        self.ended = False  # no renewal once set
        self.renew_at = 0.0  # time.monotonic() when the lease is next renewed

    @property
    def job_id(self) -> str:
        return self.claimed.id

    def cancel(self, reason: Any) -> None:
        # the engine's cancel(id, lease=...) committed; this attempt's
        # outcome is a cancellation, whatever its handler does next
        self.cancelled = True
        self.scope.abort(reason)


# an attempt whose handler returned: (attempt, the exception it raised, its result)
_Ran = tuple[_Attempt, Exception | None, Any]


class _Held:
    """A job leased for a loop and not started yet; a cancel with its lease reaches it here."""

    __slots__ = ("abort", "at", "attempt", "cancelled", "job", "seq")

    def __init__(self, job: ClaimedJob, seq: int, at: float) -> None:
        self.job = job
        self.seq = seq  # order of the lease's issue, for leases()
        self.at = at  # time.monotonic() of the claim
        self.cancelled = False  # cancel(id, lease=...) committed before it started
        self.attempt: _Attempt | None = None  # once started
        self.abort: Callable[[Any], None] | None = None  # what the hub holds for it


class _Batch:
    """A loop's queue of leased, unstarted jobs.

    The loop takes them one at a time; the settling thread tops the queue up
    (in its next transaction) while the loop runs the current job; the
    renewal thread may take the rest back when the current job runs long.
    """

    __slots__ = ("cond", "jobs", "refill", "running", "stalled", "started", "want")

    def __init__(self, jobs: list[ClaimedJob]) -> None:
        self.jobs: deque[ClaimedJob] = deque(jobs)
        self.cond = threading.Condition()
        self.stalled = False  # the renewal thread took the rest back
        self.running = False  # one of its jobs is running now
        self.started = time.monotonic()  # when the job running now started
        self.refill = False  # a top-up is on its way from the settling thread
        self.want = 0  # the top-up fills the queue up to this many unstarted jobs

    def take(self) -> ClaimedJob | None:
        with self.cond:
            if not self.jobs:
                return None
            self.running = True
            self.started = time.monotonic()
            return self.jobs.popleft()

    def returned(self) -> None:
        with self.cond:
            self.running = False

    def take_rest(self) -> list[ClaimedJob]:
        with self.cond:
            rest = list(self.jobs)
            self.jobs.clear()
            return rest

    def take_stalled(self, now: float, budget: float) -> list[ClaimedJob]:
        """The unstarted jobs, if the running one has overrun ``budget``; else nothing."""
        with self.cond:
            if not (self.jobs and self.running and now - self.started > budget):
                return []
            self.stalled = True
            rest = list(self.jobs)
            self.jobs.clear()
            return rest

    def unstarted(self) -> int:
        with self.cond:
            return len(self.jobs)

    def ask(self, want: int) -> bool:
        """Mark a top-up to ``want`` unstarted jobs as asked for; False if one is under way."""
        with self.cond:
            if self.refill or self.stalled:
                return False
            self.refill, self.want = True, want
            return True

    def topped_up(self, jobs: list[ClaimedJob]) -> None:
        with self.cond:
            self.jobs.extend(jobs)
            self.refill = False
            self.cond.notify_all()

    def wait_refill(self) -> bool:
        """Wait for the top-up under way (if any); whether the queue has a job now."""
        with self.cond:
            while self.refill and not self.jobs:
                self.cond.wait()
            return bool(self.jobs)

    def close(self) -> list[ClaimedJob]:
        """The loop leaves: wait out any top-up under way, and take what is left."""
        with self.cond:
            while self.refill:
                self.cond.wait()
            rest = list(self.jobs)
            self.jobs.clear()
            return rest


class _Entry:
    """One returned attempt on its way to an outcome: its settlement, or the outcome at once."""

    __slots__ = ("attempt", "error", "item", "met", "outcome", "retry_at", "tries", "wrote")

    def __init__(self, attempt: _Attempt, error: Exception | None) -> None:
        self.attempt = attempt
        self.error = error  # what the attempt is failed with (None: it completes)
        self.item: Settlement | None = None
        # its last write's answer: the refusal or error it met (None: it
        # holds), and whether that write wrote it (False: already settled)
        self.met: BaseException | None = None
        self.wrote = False
        self.outcome: Outcome | None = None  # decided without a write (cancelled, lost)
        self.tries = 0  # writes of its settlement that met a transient error
        self.retry_at = 0.0  # time.monotonic() of its next write, once one failed


class _AttemptCheckpoints(CheckpointStore):
    """``ctx.checkpoints``: the attempt's current lease, never racing a renewal."""

    def __init__(self, engine: JobEngine, attempt: _Attempt) -> None:
        super().__init__(engine, attempt.job_id, lambda: attempt.lease)
        self._attempt = attempt

    def load(self, run_id: str) -> dict[str, Any] | None:
        with self._attempt.lease_lock:
            return super().load(run_id)

    def save(self, run_id: str, node_id: str, value: Any) -> None:
        with self._attempt.lease_lock:
            super().save(run_id, node_id, value)

    def complete(self, run_id: str, result: Any = None) -> bool:
        with self._attempt.lease_lock:
            return super().complete(run_id, result)


class _TrackedScope(RootScope):
    """A root scope whose every call is counted for quiescence and barred after stop."""

    def __init__(self, db: Database, worker: Worker, signal: Signal) -> None:
        super().__init__(db)
        self._worker = worker
        self._signal = signal

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        worker = self._worker
        worker._track(what)
        try:
            return RootScope.write(self, fn, what, signal or self._signal)
        except GateRefused as exc:
            self._stopped(exc)
            raise
        finally:
            worker._untrack()

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        worker = self._worker
        worker._track(what)
        try:
            return RootScope.read(self, fn, what, signal or self._signal)
        except GateRefused as exc:
            self._stopped(exc)
            raise
        finally:
            worker._untrack()

    def read_consistent(self, fn: Callable[[], T], what: str) -> T:
        with self._worker._tracked(what):
            return self._refusing(lambda: super(_TrackedScope, self).read_consistent(fn, what))

    def _stopped(self, exc: GateRefused) -> None:
        # a queued call the stop abandoned is the stop working: say so by name
        if self._signal.aborted and exc.details.get("reason") == "aborted":
            raise self._worker._stopped_error(exc.message) from exc

    def _refusing(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except GateRefused as exc:
            # a queued call the stop abandoned is the stop working: say so by name
            if self._signal.aborted and exc.details.get("reason") == "aborted":
                raise self._worker._stopped_error(exc.message) from exc
            raise


class _Renewals:
    """One thread renewing every running attempt's lease when it falls due.

    Every attempt of a worker renews on the same period, so rather than one
    timer per attempt the thread wakes every quarter period while attempts
    are in flight, and renews those whose ``renew_at`` has passed (a renewal
    is at most a quarter period late, well inside the lease's remaining two
    thirds). Starting an attempt costs one assignment, not a timer.
    """

    def __init__(
        self,
        name: str,
        renew: Callable[[_Attempt], None],
        due: Callable[[float], list[_Attempt]],
        busy: Callable[[], bool],
        tick_seconds: float,
    ) -> None:
        self._name = name
        self._renew = renew
        self._due = due  # the attempts whose renewal has fallen due by then
        self._busy = busy  # whether any attempt is in flight
        self._tick = tick_seconds
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def start(self) -> None:
        with self._cond:
            if self._thread is not None or self._stopped:
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """An attempt started while none was in flight: the thread starts ticking."""
        with self._cond:
            self._cond.notify()

    def stop(self, timeout_seconds: float) -> bool:
        """Disarm every renewal and join the thread; False if it did not exit in time."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout_seconds)
        return not thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                # idle: sleep until an attempt starts (wake() is called under
                # this lock after the attempt is registered: no lost wake-up)
                self._cond.wait(self._tick if self._busy() else None)
                if self._stopped:
                    return
            for attempt in self._due(time.monotonic()):
                with self._cond:
                    if self._stopped:
                        return
                try:
                    self._renew(attempt)
                except Exception:  # a bug here must not end every other renewal
                    _log.exception("jaren_jobs: a lease renewal raised unexpectedly")


class Worker:
    """``concurrency`` loops of claim → run → settle over one store. See SPEC §7.

    Create one with ``store.jobs.create_worker(handlers, ...)``; :meth:`start`
    it, or drive it with :meth:`run_once`; :meth:`stop` it (or close the
    store). A stopped worker does not restart: create a new one.
    """

    def __init__(
        self,
        engine: JobEngine,
        hub: EngineHub,
        handlers: dict[str, Handler],
        *,
        concurrency: int,
        poll_seconds: float,
        lease_seconds: float,
        owner: str,
        renew: bool,
        on_outcome: Callable[[Outcome], Any] | None,
        on_renewal: Callable[[Lease], Any] | None,
        on_idle: Callable[[], Any] | None,
        backoff_base_seconds: float | None,
        backoff_cap_seconds: float | None,
        stop_grace_seconds: float,
    ) -> None:
        self._hub = hub
        self._db = engine.db
        self._handlers = handlers
        self._kinds = sorted(handlers)
        self.owner = owner
        self.concurrency = concurrency
        self.poll_seconds = poll_seconds
        self.lease_seconds = lease_seconds
        self.renew = renew
        self.stop_grace_seconds = stop_grace_seconds
        self._renew_every = lease_seconds / 3
        self._on_outcome = on_outcome
        self._on_renewal = on_renewal
        self._on_idle = on_idle
        self._backoff_base = backoff_base_seconds
        self._backoff_cap = backoff_cap_seconds

        number = next(_worker_numbers)
        self._name = f"jaren_jobs-worker-{number}"
        # halt: stop claiming (stop() began, or an interrupt); bar: no more
        # database operations at all (stop() finished draining)
        self._halt = CancelScope()
        self._bar = CancelScope()
        # one subscription for every attempt: an attempt registers before it
        # checks the halt, so each is aborted either by this or by _begin
        self._halt.signal.add_callback(self._abort_attempts)
        self._claims_scope = _TrackedScope(self._db, self, self._halt.signal)
        self._control_scope = _TrackedScope(self._db, self, self._bar.signal)
        # the worker's own engine views: root-gated and tracked, even when
        # the worker was created through tx.jobs (a worker never joins an
        # application transaction's fate)
        self._claims = engine.rescoped(self._claims_scope)
        self._control = engine.rescoped(self._control_scope)
        # settlements of concurrent loops share one transaction (group commit)
        self._settlements = SettlementBatcher(self._control)
        self._claim_request = self._control.claim_request(
            self._kinds, owner=owner, lease_seconds=lease_seconds
        )
        self._renewals = _Renewals(
            f"{self._name}-renewals",
            self._renew_attempt,
            self._renewals_due,
            lambda: bool(self._attempts),
            self._renew_every / 4,
        )

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._stop_lock = threading.Lock()
        self._lease_seqs = itertools.count(1)
        self._attempt_keys = itertools.count(1)
        self._attempts: dict[int, _Attempt] = {}
        # leased and not started yet, by id(job)
        self._held: dict[int, _Held] = {}
        self._horizon = min(lease_seconds / 10, _HORIZON_SECONDS)
        self._budget = 4 * self._horizon  # past it, a batch hands back what it has not started
        self._spent: float | None = None  # moving average of a handler's running time
        self._ramp = 0  # the jobs held ahead grow by doubling, up to _MAX_AHEAD
        self._batches: set[_Batch] = set()  # each looping loop's queue
        # returned attempts the loops posted for the settling thread
        self._posted: list[_Entry] = []
        self._refills: list[_Batch] = []  # queues to top up in the settling thread's next write
        self._retrying: list[_Entry] = []  # posted settlements that met a transient error
        self._posting = threading.Condition(self._lock)
        self._room = threading.Condition(self._lock)  # loops waiting for the settling thread
        self._settler: threading.Thread | None = None
        self._settler_waiting = False
        self._settler_done = False
        self._threads: list[threading.Thread] = []
        self._stepping: set[int] = set()  # ident of each thread inside a step
        self._active = False
        self._started = False
        self._stopped = False
        self._barred = False
        self._busy = 0  # steps under way: claims and attempts
        self._io = 0  # tracked database operations under way
        self._wake_generation = 0
        self._interrupted: BaseException | None = None
        self._local = threading.local()  # an observer's interrupt, for run_once() to re-raise
        self._counts = dict.fromkeys(
            (
                "claims",
                "completions",
                "failures",
                "polls",
                "wakes",
                "claim_errors",
                "cancellations",
                "renewals",
                "lost_settlements",
            ),
            0,
        )

    # ------------------------------------------------------------ public surface

    @property
    def name(self) -> str:
        """The worker's name; its threads are named ``<name>-loop-N`` and ``<name>-renewals``."""
        return self._name

    @property
    def kinds(self) -> list[str]:
        """The job kinds this worker claims (its handlers' keys, sorted)."""
        return list(self._kinds)

    @property
    def running(self) -> bool:
        """True between :meth:`start` and the first :meth:`stop` (or an interrupt)."""
        return self._started and not self._halt.aborted

    @property
    def interrupted(self) -> BaseException | None:
        """The ``KeyboardInterrupt``/``SystemExit`` that halted the worker (handler or observer)."""
        return self._interrupted

    def stats(self) -> WorkerStats:
        """The counters at this instant.

        ``claims`` counts attempts started; ``in_flight`` the started ones
        without an outcome yet (running, or returned and waiting for their
        settlement's commit).
        """
        with self._lock:
            return WorkerStats(**self._counts, in_flight=len(self._attempts))

    def leases(self) -> list[Lease]:
        """The leases this worker holds now, newest first (a renewal makes a lease newest).

        Those of jobs a loop leased with its batch and has not started yet
        are included: the worker holds them all the same.
        """
        with self._lock:
            held = [(a.lease_seq, a.lease) for a in self._attempts.values()]
            # leased with a loop's batch and not started yet: held all the same
            held.extend((h.seq, h.job.lease) for h in self._held.values() if not h.cancelled)
        held.sort(key=lambda entry: entry[0], reverse=True)
        return [lease for _, lease in held]

    def start(self) -> Worker:
        """Start the loop threads (and the renewal scheduler). Returns the worker.

        ``RuntimeError`` if already started, or stopped (a stopped worker does
        not restart); ``StoreClosed`` if the store is closed.
        """
        with self._lock:
            if self._stopped:
                raise RuntimeError("this worker was stopped; a stopped worker does not restart")
            if self._started:
                raise RuntimeError("this worker is already started")
            self._db.check_open("start()")
            self._started = True
        self._activate()
        threads = [
            threading.Thread(target=self._loop, name=f"{self._name}-loop-{i}", daemon=True)
            for i in range(1, self.concurrency + 1)
        ]
        settler = threading.Thread(
            target=self._settle_posted, name=f"{self._name}-settler", daemon=True
        )
        settler.start()
        self._settler = settler  # before any loop runs: loops post only once it exists
        with self._lock:
            # a stop() racing this start() must not leave a waker behind
            if not self._stopped:
                with self._hub.lock:
                    self._hub.wakers.add(self._wake)
            self._threads.extend(threads)
        for thread in threads:
            thread.start()
        return self

    def run_once(self) -> bool:
        """One step in the calling thread: claim → run → settle.

        Returns True when it ran a job, False when nothing was claimable (or
        the claim failed, or the worker is stopping). A handler's
        ``KeyboardInterrupt``/``SystemExit`` propagates to the caller after
        the worker halts (see :meth:`stop`).
        """
        if self._halt.aborted:
            return False
        self._db.check_open("run_once()")
        self._activate()
        ran = self._step()
        interrupt: BaseException | None = getattr(self._local, "interrupt", None)
        if interrupt is not None:  # an observer's, met in this thread: every outcome is out
            self._local.interrupt = None
            raise interrupt
        return ran

    def stop(self, grace_seconds: float | None = None) -> StopOutcome:
        """Stop claiming, drain for up to ``grace_seconds``, then quiesce.

        The contract:

        * idempotent, and safe before :meth:`start`;
        * every running handler's ``ctx.signal`` aborts (reason:
          :class:`WorkerStopped`), idle loops wake, queued claims are abandoned;
        * handlers are waited for up to the grace period (default: the
          worker's ``stop_grace_seconds``, else the store's); an attempt still
          running then is *barred*: it can no longer reach the database
          through the worker (its ``ctx.checkpoints`` calls and its settlement
          raise :class:`WorkerStopped`), its lease expires and the job is
          re-claimed; when its handler finally returns, its outcome is ``lost``;
        * quiescence is unconditional: when ``stop()`` returns, the renewal
          scheduler has exited (no timer armed) and no database operation the
          worker started is running, so the caller may close the store.

        Returns ``StopOutcome(drained, in_flight)``: whether every attempt
        finished within the grace period, and how many did not. Calling it
        from one of this worker's own threads is a ``RuntimeError``.
        """
        grace = (
            self.stop_grace_seconds
            if grace_seconds is None
            else check_seconds(grace_seconds, "stop(): grace_seconds", allow_zero=True)
        )
        if self._is_own_thread():
            raise RuntimeError(
                "stop() was called from one of this worker's own threads (a handler or an "
                "observer), which stop() would wait for; return from the handler instead, "
                "or call stop() from another thread"
            )
        with self._stop_lock:
            with self._cond:
                first = not self._stopped
                self._stopped = True
            if first:
                with self._hub.lock:
                    self._hub.wakers.discard(self._wake)
                self._halt.abort(self._stopping_reason("stop() was called"))
                with self._cond:
                    self._cond.notify_all()
            deadline = time.monotonic() + grace
            with self._cond:
                while self._busy > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                undrained = self._busy
            if first:
                self._release_unstarted()
                self._quiesce()
            return StopOutcome(drained=undrained == 0, in_flight=undrained)

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else ("running" if self.running else "idle")
        return f"<jaren_jobs.Worker {self.owner!r} kinds={self._kinds} {state}>"

    # ------------------------------------------------------------ lifecycle internals

    def _activate(self) -> None:
        with self._lock:
            if self._active or self._stopped:
                return
            self._active = True
        with self._hub.lock:
            self._hub.workers.add(self)
        if self.renew:
            self._renewals.start()

    def _is_own_thread(self) -> bool:
        current = threading.current_thread()
        with self._lock:
            # a loop thread, or any thread inside run_once() (its handler or observer)
            own = current in self._threads or current.ident in self._stepping
        return own or current is self._renewals.thread or current is self._settler

    def _stopped_error(self, what: str) -> WorkerStopped:
        return WorkerStopped(
            f"{what}: worker {self.owner!r} was stopped, and this attempt may no longer reach "
            "the database through it; its lease will expire and the job will be re-claimed",
            owner=self.owner,
        )

    def _stopping_reason(self, why: str) -> WorkerStopped:
        # the signal's reason while draining: the attempt may still settle
        return WorkerStopped(
            f"worker {self.owner!r} is stopping ({why}): wind up now; an attempt that "
            "returns within the stop's grace period still settles",
            owner=self.owner,
        )

    def _release_unstarted(self) -> None:
        """Hand back every loop's unstarted jobs (a loop stuck in a handler cannot)."""
        with self._lock:
            batches = list(self._batches)
        self._hand_back([job for batch in batches for job in batch.take_rest()])

    def _hand_back(self, jobs: list[ClaimedJob]) -> None:
        """Release leased, never-started jobs in a transaction of their own: no attempt spent."""
        if not jobs:
            return
        with self._lock:
            helds = [self._held.pop(id(job), None) for job in jobs]
        # a job cancelled with its lease is not leased any more: nothing to release
        leases = [job.lease for job, held in zip(jobs, helds, strict=True) if not _gone(held)]
        if leases:
            failed = self._settlements.submit(SettleBatch(releases=tuple(leases))).release_error
            if failed is not None:  # their leases expire instead
                _log.warning(
                    "jaren_jobs: worker %r: handing back %d unstarted job(s) failed; their "
                    "leases will expire: %s",
                    self.owner,
                    len(leases),
                    failed,
                )
            else:
                # claimable again: a loop (of this worker or another) that went
                # idle while they were held must not sleep through them
                self._hub.wake()
        # only now: a cancel that committed before the release must still find them
        self._forget(helds)

    def _forget(self, helds: list[_Held | None]) -> None:
        with self._hub.lock:
            local = self._hub.local_attempts
            for held in helds:
                if held is not None and local.get(held.job.id) is held.abort:
                    del local[held.job.id]

    def _quiesce(self) -> None:
        # 1. bar: no new worker-started operation; abandon queued ones
        with self._cond:
            self._barred = True
        self._bar.abort(self._stopped_error("the worker stopped"))
        bound = max(self._db.gate.timeout_seconds, 1.0)
        # 2. no timer armed: the scheduler exits (a renewal it is running is
        #    tracked I/O, so it ends within the gate's bound)
        if not self._renewals.stop(bound):
            _log.error("jaren_jobs: worker %r: the renewal scheduler did not exit", self.owner)
        # 3. the settling thread exits once what was posted has its outcome
        #    (a settlement the bar refused is a lost outcome, at once)
        with self._lock:
            self._settler_done = True
            self._posting.notify_all()
            self._room.notify_all()
        settler = self._settler
        if settler is not None and settler is not threading.current_thread():
            settler.join(bound)
            if settler.is_alive():
                _log.error("jaren_jobs: worker %r: the settling thread did not exit", self.owner)
        # 4. no worker-started database operation still running
        deadline = time.monotonic() + bound
        with self._cond:
            while self._io > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    _log.error(
                        "jaren_jobs: worker %r: %d database operation(s) still running after %.1fs",
                        self.owner,
                        self._io,
                        bound,
                    )
                    break
                self._cond.wait(left)
            idle_threads = [t for t in self._threads if t.ident not in self._stepping]
        with self._hub.lock:
            self._hub.workers.discard(self)
        # loops with no attempt exit at once (they were woken); a loop still
        # running an undrained handler is left to finish on its own
        for thread in idle_threads:
            if thread is not threading.current_thread():
                thread.join(1.0)

    @contextmanager
    def _tracked(self, what: str) -> Iterator[None]:
        self._track(what)
        try:
            yield
        finally:
            self._untrack()

    def _track(self, what: str) -> None:
        with self._lock:
            if self._barred:
                raise self._stopped_error(what)
            self._io += 1

    def _untrack(self) -> None:
        with self._cond:
            self._io -= 1
            if self._io == 0:
                self._cond.notify_all()

    def _halt_for(self, reason: JobsError) -> None:
        self._halt.abort(reason)
        with self._hub.lock:
            self._hub.wakers.discard(self._wake)
        with self._cond:
            self._cond.notify_all()

    # ------------------------------------------------------------ loops

    def _wake(self) -> None:
        with self._cond:
            self._counts["wakes"] += 1
            self._wake_generation += 1
            self._cond.notify_all()

    def _loop(self) -> None:
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

    def _idle(self, began: float, generation: int) -> None:
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

    def _step(self, *, chain: bool = False) -> bool:
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

    def _ahead(self) -> int:
        """How many leased jobs a loop holds beyond the one it runs.

        As many as it can start within the horizon, by the handlers' measured
        running time (a moving average), grown by doubling, and never more
        than ``_MAX_AHEAD``: a job held ahead is a lease no other worker can
        take, and one a SIGKILL spends an attempt of.
        """
        spent = self._spent
        if spent is None:
            return 0
        fits = int(self._horizon / max(spent, 1e-6))
        return max(0, min(_MAX_AHEAD, fits, self._ramp))

    def _claim(self, limit: int) -> list[ClaimedJob]:
        """A step's first claim, in a transaction of its own (the idle check may answer it)."""
        try:
            jobs = self._claims.claim_many(
                self._kinds, owner=self.owner, limit=limit, lease_seconds=self.lease_seconds
            )
        except WorkerStopped:
            return []  # the stop abandoned it: not an error
        except StoreClosed as exc:
            _log.error("jaren_jobs: worker %r: the store is closed; halting (%s)", self.owner, exc)
            self._halt_for(exc)
            return []
        except JobsError as exc:
            with self._lock:
                self._counts["claim_errors"] += 1
            _log.warning(
                "jaren_jobs: worker %r: claim failed, retrying at the next poll: %s",
                self.owner,
                exc,
            )
            return []
        self._hold(jobs)
        return jobs

    def _hold(self, jobs: list[ClaimedJob]) -> None:
        """Record leases taken but not started: leases() lists them, a cancel reaches them."""
        if not jobs:
            return
        at = time.monotonic()
        aborts: list[tuple[str, Callable[[Any], None]]] = []
        with self._lock:
            for job in jobs:
                held = _Held(job, next(self._lease_seqs), at)
                held.abort = abort = functools.partial(self._cancel_unstarted, held)
                self._held[id(job)] = held
                aborts.append((job.id, abort))
        with self._hub.lock:
            self._hub.local_attempts.update(aborts)

    def _cancel_unstarted(self, held: _Held, reason: Any) -> None:
        """cancel(id, lease=...) committed for a job leased with a batch."""
        with self._lock:
            attempt = held.attempt
            if attempt is None:
                held.cancelled = True  # its handler never starts
                return
        attempt.cancel(reason)  # it started meanwhile: its signal aborts

    # ------------------------------------------------------------ attempts

    def _run_one(self, claimed: ClaimedJob) -> None:
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

    def _run_queue(self, jobs: list[ClaimedJob]) -> None:
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

    def _top_up(self, batch: _Batch, *, idle: bool = False) -> bool:
        """Ask the settling thread to lease more jobs for ``batch`` in its next write.

        While a job runs, the queue is topped up to ``_ahead()`` unstarted
        jobs; a loop that ran its queue dry (``idle``) asks for one more, to
        run at once. Whether a top-up is now on its way.
        """
        ahead = self._ahead()
        want = ahead + 1 if idle else ahead
        if want == 0 or (not idle and batch.unstarted() >= want):
            return False
        if not batch.ask(want):
            return False
        with self._lock:
            refused = self._settler_done or self._halt.aborted
            if not refused:
                self._refills.append(batch)
                if self._settler_waiting:
                    self._posting.notify()
        if refused:
            batch.topped_up([])
            return False
        # each top-up that was not overrun lets the loop hold one more ahead
        self._ramp = min(max(1, self._ramp * 2), _MAX_AHEAD)
        return True

    def _waited_too_long(self, job: ClaimedJob) -> bool:
        with self._lock:
            held = self._held.get(id(job))
        return held is not None and time.monotonic() - held.at > self._budget

    def _take_back_stalled(self, now: float) -> None:
        """The renewal thread: hand back the unstarted jobs of batches stuck behind a slow job."""
        with self._lock:
            batches = list(self._batches)
        rest = [job for batch in batches for job in batch.take_stalled(now, self._budget)]
        if rest:
            self._ramp = 0
            self._hand_back(rest)

    def _call(self, attempt: _Attempt, ran: list[_Ran]) -> Outcome | None:
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
            result = handler(claimed.payload, ctx)
        except Exception as exc:
            ran.append((attempt, exc, None))
        else:
            ran.append((attempt, None, result))
        finally:
            spent = time.perf_counter() - started
            previous = self._spent
            self._spent = spent if previous is None else previous + (spent - previous) / 4
        return None

    def _begin(self, claimed: ClaimedJob) -> _Attempt | None:
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
        halt = self._halt.signal
        if halt.aborted:  # else _abort_attempts, a callback of the halt, reaches it
            attempt.scope.abort(halt.reason)
        if self.renew:
            # a lease taken with a batch has been running since the claim
            attempt.renew_at = (time.monotonic() if held is None else held.at) + self._renew_every
            if first:
                self._renewals.wake()
        return attempt

    def _abort_attempts(self) -> None:
        """The halt fired: every running attempt's signal aborts with its reason."""
        reason = self._halt.signal.reason
        with self._lock:
            attempts = list(self._attempts.values())
        for attempt in attempts:
            attempt.scope.abort(reason)

    def _end(self, attempt: _Attempt, outcome: Outcome) -> None:
        attempt.ended = True
        with self._hub.lock:
            if self._hub.local_attempts.get(attempt.job_id) == attempt.cancel:
                del self._hub.local_attempts[attempt.job_id]
        counter = _COUNTERS[outcome.outcome]
        with self._lock:
            self._attempts.pop(attempt.key, None)
            self._counts[counter] += 1
        self._notify("on_outcome", self._on_outcome, outcome)

    def _abandon(self, attempt: _Attempt, exc: BaseException) -> Outcome:
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

    # ------------------------------------------------------------ settling

    def _settle_all(self, ran: list[_Ran]) -> None:
        """Settle ``ran`` in one group, in this thread (run_once)."""
        entries: list[_Entry] = []
        try:
            for attempt, error, result in ran:
                entries.append(self._prepare(attempt, error, result))
        finally:
            for attempt, _, _ in ran[len(entries) :]:  # interrupted while preparing
                self._end(attempt, _interrupted(self, attempt))
        self._settle_entries(entries)

    def _submit(
        self, entries: Sequence[_Entry], claims: Sequence[tuple[ClaimRequest, int]] = ()
    ) -> Settled:
        """Write the entries' settlements (and ``claims``) as one batch; each keeps its answer."""
        settling = [entry for entry in entries if entry.item is not None]
        batch = SettleBatch(
            tuple(e.item for e in settling if e.item is not None), (), tuple(claims)
        )
        settled = self._settlements.submit(batch)
        for index, entry in enumerate(settling):
            entry.met, entry.wrote = settled.error(index), settled.wrote[index]
        return settled

    def _settle_entries(
        self,
        entries: list[_Entry],
        claims: Sequence[tuple[ClaimRequest, int]] = (),
        *,
        defer: list[_Entry] | None = None,
        committed: Callable[[Settled | None], None] | None = None,
    ) -> None:
        """One batch for the entries' settlements (and ``claims``); then each outcome.

        Each attempt gets exactly one outcome, reported only after the commit
        that made its settlement durable. ``committed`` runs once the batch's
        write is over (with its answer; ``None`` if it was interrupted),
        before any outcome is reported. A settlement that met
        a transient error (not a fence refusal: a locked database, a gate
        timeout) is written again while its lease holds: joined to ``defer``
        (the settling thread writes it with a later group), or, without
        ``defer``, retried here.
        """
        settled: set[int] = set()  # id() of the entries ended (or deferred)
        try:
            answer: Settled | None = None
            try:
                if claims or any(entry.item is not None for entry in entries):
                    answer = self._submit(entries, claims)
            finally:
                if committed is not None:
                    committed(answer)
            pending = entries
            while pending:
                again: list[_Entry] = []
                for entry in pending:
                    if entry.outcome is None and self._to_retry(entry):
                        if defer is None:
                            again.append(entry)
                        else:
                            settled.add(id(entry))
                            defer.append(entry)
                        continue
                    outcome = entry.outcome or self._finish(entry)
                    settled.add(id(entry))
                    self._end(entry.attempt, outcome)
                if again:
                    # run_once(), or a handler that outlived stop(): wait here
                    pause = min(e.retry_at for e in again) - time.monotonic()
                    self._bar.signal.wait(max(0.0, pause))
                    self._submit(again)
                pending = again
        finally:
            # interrupted inside the worker's own bookkeeping: every attempt
            # still ends exactly once
            for entry in entries:
                if id(entry) not in settled:
                    self._end(entry.attempt, _interrupted(self, entry.attempt))

    def _to_retry(self, entry: _Entry) -> bool:
        """Whether the entry's settlement only met a wait, and its lease still holds.

        A write that timed out waiting (for the gate, behind a long
        application transaction; for SQLite's write lock, held by another
        connection) says nothing about the settlement: it is written again
        for as long as the lease would let it land, rather than turning a
        success into a failure. Any other error keeps its meaning (see
        :meth:`_finish`). Schedules the next write.
        """
        item = entry.item
        exc = None if item is None else entry.met
        if exc is None or not _is_wait(exc):
            return False
        attempt = entry.attempt
        if ms_from_datetime(attempt.lease.expires_at) <= self._hub.runtime.now_ms():
            return False  # too late: the fence would refuse it anyway
        if entry.tries == 0:
            assert item is not None
            doing = "completing" if isinstance(item, Completion) else "recording the failure of"
            _log.warning(
                "jaren_jobs: worker %r: %s job %r failed (%s); retrying while its lease holds",
                self.owner,
                doing,
                attempt.job_id,
                exc,
            )
        pause = min(_RETRY_FIRST_SECONDS * 2**entry.tries, _RETRY_MOST_SECONDS)
        entry.tries += 1
        entry.retry_at = time.monotonic() + pause
        return True

    # ------------------------------------------------------------ the settling thread

    def _post(self, ran: _Ran) -> None:
        """Queue a returned attempt for the settling thread; stop() drains it like a step."""
        entry = self._prepare(*ran)
        with self._lock:
            if not self._settler_done:
                self._busy += 1
                self._posted.append(entry)
                if self._settler_waiting:
                    self._posting.notify()
                # back-pressure: loops that outrun the settling thread wait for
                # it, so the attempts that ran but are not settled stay bounded
                # (and none waits long enough for its lease to run out)
                while (
                    len(self._posted) + len(self._retrying) >= _POSTED_LIMIT
                    and not self._settler_done
                ):
                    self._room.wait()
                return
        # a handler that outlived stop(): its settlement is refused here, by name
        self._settle_entries([entry])

    def _settle_posted(self) -> None:
        """The settling thread: commit what the loops posted, as one group each time.

        The same transaction leases the jobs that top up the loops' queues,
        and writes again the settlements whose last write met a transient
        error, once their pause is over.
        """
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    # once stop() is quiescing, no pause: the bar refuses them at once
                    due = [e for e in self._retrying if self._settler_done or e.retry_at <= now]
                    if self._posted or self._refills or due:
                        break
                    if self._settler_done and not self._retrying:
                        return
                    wait = min((e.retry_at for e in self._retrying), default=None)
                    self._settler_waiting = True
                    self._posting.wait(None if wait is None else max(0.0, wait - now))
                    self._settler_waiting = False
                entries, self._posted = self._posted, []
                refills, self._refills = self._refills, []
                if due:
                    self._retrying = [e for e in self._retrying if e not in due]
                self._room.notify_all()
            settling = due + entries
            deferred: list[_Entry] = []
            try:
                self._settle_cycle(settling, refills, deferred)
            except Exception:  # a worker bug must not end the settling thread silently
                _log.exception("jaren_jobs: worker %r: settling raised", self.owner)
            finally:
                with self._cond:
                    self._retrying.extend(deferred)
                    self._busy -= len(settling) - len(deferred)
                    self._cond.notify_all()

    def _settle_cycle(
        self, entries: list[_Entry], refills: list[_Batch], deferred: list[_Entry]
    ) -> None:
        """One write of the settling thread: the entries, and the loops' top-ups."""
        asked: list[tuple[_Batch, int]] = []  # each loop asking, and how many jobs
        waiting = list(refills)  # loops not answered yet

        def answer(batch: _Batch, jobs: list[ClaimedJob]) -> None:
            self._hold(jobs)
            waiting.remove(batch)
            batch.topped_up(jobs)

        def deliver(settled: Settled | None) -> None:
            # before any outcome is reported: the loops wait for these
            back: list[ClaimedJob] = []
            for index, (batch, _) in enumerate(asked):
                claimed = settled.claimed[index] if settled is not None else None
                if not isinstance(claimed, list):
                    with self._lock:
                        self._counts["claim_errors"] += 1
                    _log.warning(
                        "jaren_jobs: worker %r: claim failed, retrying later: %s",
                        self.owner,
                        claimed or "interrupted",
                    )
                    claimed = []
                jobs = claimed
                if jobs and self._halt.aborted:  # stopping: back to the queue
                    back, jobs = back + jobs, []
                answer(batch, jobs)
            self._hand_back(back)

        try:
            for batch in refills:
                count = batch.want - batch.unstarted()
                if count <= 0 or self._halt.aborted:
                    answer(batch, [])
                    continue
                asked.append((batch, count))
            claims = [(self._claim_request, count) for _, count in asked]
            self._settle_entries(entries, claims, defer=deferred, committed=deliver)
        finally:
            # a loop waiting for its top-up must never wait forever
            for batch in list(waiting):
                waiting.remove(batch)
                batch.topped_up([])

    def _prepare(self, attempt: _Attempt, error: Exception | None, result: Any) -> _Entry:
        """The attempt's settlement, checked in this thread; or its outcome if none is due."""
        entry = _Entry(attempt, error)
        with attempt.lease_lock:
            attempt.ended = True  # no renewal from here on
            if attempt.cancelled:
                entry.outcome = self._outcome(attempt, "cancelled", reason="cancelled")
                return entry
            if attempt.lost is not None:
                phase: Phase = "completion" if error is None else "failure"
                entry.outcome = self._lost(attempt, phase, attempt.lost)
                return entry
            lease = attempt.lease
        if error is None:
            if inspect.iscoroutine(result):
                result.close()
                error = TypeError(
                    f"the handler of kind {attempt.claimed.kind!r} returned a coroutine; "
                    "jaren_jobs handlers are plain functions (run the coroutine with "
                    "asyncio.run() inside the handler)"
                )
            else:
                try:
                    entry.item = self._settlements.completion(lease, result)
                    return entry
                except (TypeError, ValueError) as exc:  # a result JSON cannot carry or encode
                    error = exc
        entry.error = error
        entry.item = self._failure(lease, error)
        return entry

    def _failure(self, lease: Lease, error: BaseException) -> Settlement:
        return self._settlements.failure(
            lease,
            error,
            retry=_retryable(error),
            backoff_base_seconds=self._backoff_base,
            backoff_cap_seconds=self._backoff_cap,
        )

    def _refused(self, attempt: _Attempt, phase: Phase, exc: BaseException) -> Outcome | None:
        """A settlement the fence refused, or the stop barred: the attempt is lost."""
        if isinstance(exc, LeaseLost):
            return self._lost(attempt, phase, exc)
        if isinstance(exc, StoreClosed):
            return self._outcome(
                attempt, "lost", phase=phase, code=exc.code, reason=describe_error(exc)
            )
        return None

    def _finish(self, entry: _Entry) -> Outcome:
        """The outcome of a committed (or refused) settlement."""
        attempt, item = entry.attempt, entry.item
        assert item is not None
        exc = entry.met
        if isinstance(item, Completion):
            if exc is None:
                return self._written(attempt, "completed", entry.wrote)
            refused = self._refused(attempt, "completion", exc)
            if refused is not None:
                return refused
            _log.warning(
                "jaren_jobs: worker %r: completing job %r failed; failing the attempt instead: %s",
                self.owner,
                attempt.job_id,
                exc,
            )
            entry.error = exc if isinstance(exc, Exception) else RuntimeError(str(exc))
            entry.item = self._failure(item.lease, entry.error)
            self._submit([entry])
            exc = entry.met
        error = entry.error
        assert error is not None
        if exc is None:
            if not entry.wrote:
                return self._truth(attempt) or self._failed(attempt, error)
            return self._failed(attempt, error)
        refused = self._refused(attempt, "failure", exc)
        if refused is not None:
            return refused
        # not recorded; the lease expires and the job is re-claimed
        _log.warning(
            "jaren_jobs: worker %r: recording the failure of job %r failed (%s); its "
            "lease will expire and it will be re-claimed",
            self.owner,
            attempt.job_id,
            exc,
        )
        return self._failed(attempt, error)

    def _written(self, attempt: _Attempt, outcome: OutcomeName, wrote: bool) -> Outcome:
        # True from a settlement that wrote nothing means THIS attempt had
        # already settled the row: by ctx.checkpoints.complete, by the handler
        # calling the engine with ctx.lease, or by cancel(id, lease=...) whose
        # abort has not reached us yet. The row says which.
        if not wrote:
            truth = self._truth(attempt)
            if truth is not None:
                return truth
        return self._outcome(attempt, outcome)

    def _failed(self, attempt: _Attempt, error: BaseException) -> Outcome:
        return self._outcome(
            attempt,
            "failed",
            phase=None,
            code=error.code if isinstance(error, JobsError) else None,
            reason=describe_error(error),
        )

    def _lost(self, attempt: _Attempt, phase: Phase, error: LeaseLost) -> Outcome:
        if isinstance(error, JobSettled):
            # "not leased" may be this attempt's own settlement (a cancel with
            # its lease, a handler that settled through ctx.lease): ask the row
            truth = self._truth(attempt)
            if truth is not None:
                return truth
        return self._outcome(
            attempt, "lost", phase=phase, code=error.code, reason=describe_error(error)
        )

    def _truth(self, attempt: _Attempt) -> Outcome | None:
        """The outcome the row records for this attempt, if it records one."""
        try:
            job = self._control.settled_by(attempt.lease)
        except JobsError:
            return None
        if job is None:
            return None  # not settled, or settled by another attempt
        if job.state == "done":
            return self._outcome(attempt, "completed")
        if job.state == "cancelled":
            return self._outcome(attempt, "cancelled", reason="cancelled")
        if job.state in ("failed", "dead"):
            return self._outcome(attempt, "failed", reason=job.last_error)
        return None

    def _outcome(
        self,
        attempt: _Attempt,
        outcome: OutcomeName,
        *,
        phase: Phase | None = None,
        code: str | None = None,
        reason: str | None = None,
    ) -> Outcome:
        lease = attempt.lease
        # one per attempt: built without the frozen dataclass's __init__ (assemble)
        return assemble(
            Outcome,
            {
                "outcome": outcome,
                "job_id": lease.job_id,
                "kind": attempt.claimed.kind,
                "attempt": lease.attempt,
                "generation": lease.generation,
                "phase": phase,
                "code": code,
                "reason": reason,
            },
        )

    # ------------------------------------------------------------ renewals

    def _renewals_due(self, now: float) -> list[_Attempt]:
        if self._batches:
            self._take_back_stalled(now)
        with self._lock:
            return [
                attempt
                for attempt in self._attempts.values()
                if attempt.renew_at <= now and not attempt.ended and attempt.lost is None
            ]

    def _renew_attempt(self, attempt: _Attempt) -> None:
        with attempt.lease_lock:
            if attempt.ended or attempt.lost is not None:
                return
            try:
                fresh = self._control.renew(attempt.lease, lease_seconds=self.lease_seconds)
            except LeaseLost as exc:
                # only the fence's refusals prove the attempt no longer holds
                # the job: abort its signal; it may never settle
                attempt.lost = exc
                attempt.scope.abort(exc)
                _log.info(
                    "jaren_jobs: worker %r lost the lease on job %r: %s",
                    self.owner,
                    attempt.job_id,
                    exc,
                )
                return
            except StoreClosed:
                return  # stopping (or closed): no more renewals
            except JobsError as exc:
                # a busy database, a gate timeout: the current lease stays in
                # force and the next tick tries again
                _log.warning(
                    "jaren_jobs: worker %r: renewing the lease on job %r failed; retrying: %s",
                    self.owner,
                    attempt.job_id,
                    exc,
                )
                attempt.renew_at = time.monotonic() + self._renew_every
                return
            attempt.lease = fresh
            attempt.renew_at = time.monotonic() + self._renew_every
            with self._lock:
                attempt.lease_seq = next(self._lease_seqs)
                self._counts["renewals"] += 1
        self._notify("on_renewal", self._on_renewal, fresh)

    # ------------------------------------------------------------ observers

    def _notify(self, name: str, observer: Callable[..., Any] | None, *args: Any) -> None:
        if observer is None:
            return
        try:
            observer(*args)
        except Exception:  # an observer's failure never affects the worker
            _log.exception(
                "jaren_jobs: worker %r: the %s observer raised; ignored", self.owner, name
            )
        except BaseException as exc:
            # never out of this thread: it may be the settling thread, whose
            # death would leave every posted attempt without an outcome
            self._observer_interrupted(name, exc)

    def _observer_interrupted(self, name: str, exc: BaseException) -> None:
        """An observer raised KeyboardInterrupt/SystemExit (or another BaseException): halt."""
        if self._interrupted is None:
            self._interrupted = exc
        _log.error(
            "jaren_jobs: worker %r: the %s observer raised %s; the worker stops claiming, "
            "and every attempt under way still settles and gets its outcome. Call stop() or "
            "close the store to finish shutting down.",
            self.owner,
            name,
            type(exc).__name__,
            exc_info=exc,
        )
        self._halt_for(self._stopping_reason(f"the {name} observer raised {type(exc).__name__}"))
        # run_once() re-raises it in its caller's thread once its step is done
        self._local.interrupt = exc


def _interrupted(worker: Worker, attempt: _Attempt) -> Outcome:
    return worker._outcome(attempt, "lost", phase="failure", reason="the attempt was interrupted")


def _is_wait(exc: BaseException) -> bool:
    """A write that gave up waiting: for the store's gate, or for SQLite's lock."""
    if isinstance(exc, GateRefused):
        return exc.details.get("reason") == "timeout"
    if isinstance(exc, StorageError):
        return str(exc.details.get("sqlite_error", "")).startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
    return False


def _gone(held: _Held | None) -> bool:
    """A held job a cancel with its lease settled: its lease is nothing to hand back."""
    return held is not None and held.cancelled


def _retryable(error: BaseException) -> bool:
    """False when the error says no retry can cure it (``retryable = False``, e.g. RunMismatch)."""
    try:
        return getattr(error, "retryable", True) is not False
    except Exception:  # a hostile __getattr__ must not break settlement
        return True


def _check_handlers(handlers: object) -> dict[str, Handler]:
    if not isinstance(handlers, Mapping):
        raise TypeError(
            "create_worker(): handlers must be a mapping of job kind to handler(payload, ctx), "
            f"got {type(handlers).__name__}"
        )
    if not handlers:
        raise ValueError("create_worker(): handlers must name at least one job kind")
    checked: dict[str, Handler] = {}
    for kind, handler in handlers.items():
        if not isinstance(kind, str):
            raise TypeError(
                f"create_worker(): each handlers key is a job kind (str), got "
                f"{type(kind).__name__} {kind!r}"
            )
        if kind == "":
            raise ValueError("create_worker(): a job kind must be a non-empty string")
        check_text(kind, "create_worker(): job kind")
        if not callable(handler):
            raise TypeError(
                f"create_worker(): the handler for kind {kind!r} must be callable as "
                f"handler(payload, ctx), got {type(handler).__name__}"
            )
        _check_handler_shape(kind, handler)
        checked[kind] = handler
    return checked


def _check_handler_shape(kind: str, handler: Callable[..., Any]) -> None:
    """Refuse a handler that can only fail at run time: ``async def``, or the wrong arity."""
    if _is_async(handler):
        raise TypeError(
            f"create_worker(): the handler for kind {kind!r} is an async def function; this "
            "worker calls handlers on threads as plain functions, handler(payload, ctx) "
            "(run the coroutine with asyncio.run() inside a plain handler)"
        )
    try:
        signature = inspect.signature(handler)
    except Exception:  # some builtins cannot be inspected: take them on trust
        return
    try:
        signature.bind(None, None)
    except TypeError as exc:
        raise TypeError(
            f"create_worker(): the handler for kind {kind!r} cannot be called as "
            f"handler(payload, ctx): its signature is {signature} ({exc})"
        ) from None


def _is_async(handler: object) -> bool:
    """Whether calling ``handler`` gives a coroutine or async generator, not a result."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    if inspect.iscoroutinefunction(handler) or inspect.isasyncgenfunction(handler):
        return True
    if inspect.isroutine(handler) or inspect.isclass(handler):
        return False
    call = type(handler).__call__  # a callable object
    return inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)


def _check_callable(value: object, what: str) -> Any:
    if value is not None and not callable(value):
        raise TypeError(
            f"create_worker(): {what} must be callable or None, got {type(value).__name__}"
        )
    return value


def create_worker(
    engine: JobEngine,
    hub: EngineHub,
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
) -> Worker:
    """Build a :class:`Worker` (``store.jobs.create_worker`` calls this). Not started.

    ``poll_seconds``, ``lease_seconds``, the backoff and ``stop_grace_seconds``
    default to the store's :class:`~jaren_jobs.Defaults`; ``owner`` to a fresh
    id from the runtime. ``on_outcome(Outcome)`` sees every attempt's one
    outcome; ``on_renewal(Lease)`` every successful renewal; ``on_idle()``
    every time a loop finds nothing to claim and goes idle. Observers that
    raise are logged (logger ``jaren_jobs``) and otherwise ignored.
    Mistakes are ``TypeError``/``ValueError``.
    """
    checked = _check_handlers(handlers)
    loops = check_positive_int(concurrency, "create_worker(): concurrency")
    defaults = hub.defaults
    poll = (
        defaults.poll_seconds
        if poll_seconds is None
        else check_seconds(poll_seconds, "create_worker(): poll_seconds")
    )
    lease = (
        defaults.lease_seconds
        if lease_seconds is None
        else check_seconds(lease_seconds, "create_worker(): lease_seconds")
    )
    base = (
        None
        if backoff_base_seconds is None
        else check_seconds(backoff_base_seconds, "create_worker(): backoff_base_seconds")
    )
    cap = (
        None
        if backoff_cap_seconds is None
        else check_seconds(backoff_cap_seconds, "create_worker(): backoff_cap_seconds")
    )
    grace = (
        defaults.stop_grace_seconds
        if stop_grace_seconds is None
        else check_seconds(
            stop_grace_seconds, "create_worker(): stop_grace_seconds", allow_zero=True
        )
    )
    if owner is None:
        owner = hub.runtime.uuid()
    elif not isinstance(owner, str):
        raise TypeError(f"create_worker(): owner must be a str, got {type(owner).__name__}")
    elif owner == "":
        raise ValueError("create_worker(): owner must be a non-empty string")
    check_text(owner, "create_worker(): owner")
    if not isinstance(renew, bool):
        raise TypeError(f"create_worker(): renew must be a bool, got {type(renew).__name__}")
    return Worker(
        engine,
        hub,
        checked,
        concurrency=loops,
        poll_seconds=poll,
        lease_seconds=lease,
        owner=owner,
        renew=renew,
        on_outcome=_check_callable(on_outcome, "on_outcome"),
        on_renewal=_check_callable(on_renewal, "on_renewal"),
        on_idle=_check_callable(on_idle, "on_idle"),
        backoff_base_seconds=base,
        backoff_cap_seconds=cap,
        stop_grace_seconds=grace,
    )
