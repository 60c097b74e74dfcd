"""The thread runtime: :class:`Worker`, its loops, lifecycle and observers."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from jaren_jobs.engine.engine import (
    EngineHub,
    JobEngine,
    claim_request_for,
    rescoped,
    root_scope_of,
    store_backend_of,
)
from jaren_jobs.engine.group_commit import SettlementBatcher
from jaren_jobs.errors import JobsError
from jaren_jobs.periodic import Periodic, Ticker
from jaren_jobs.records import (
    Lease,
    Outcome,
    StopOutcome,
    WorkerStats,
)
from jaren_jobs.runtime import check_seconds
from jaren_jobs.signals import CancelScope
from jaren_jobs.worker import attempt, claims, outcomes, renewals, settler, ticks, tracking
from jaren_jobs.worker.attempt import Handler, WorkerStopped, _Attempt, _Held
from jaren_jobs.worker.pacing import _HORIZON_SECONDS, _Batch
from jaren_jobs.worker.renewals import RenewalScheduler, _Renewals
from jaren_jobs.worker.settler import _Entry
from jaren_jobs.worker.tracking import _TrackedScope

_worker_numbers = itertools.count(1)
_log = logging.getLogger("jaren_jobs.worker")

# how long stop() waits, once the grace period is over, for handlers whose
# tasks it cancelled to raise and be handed back, before it bars them
_HAND_BACK_SECONDS = 1.0


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
        periodic: tuple[Periodic, ...] = (),
        queues: tuple[str, ...] | None = None,
    ) -> None:
        self._hub = hub
        #: the queues this worker claims from (``None``: every queue)
        self.queues = queues
        self._backend = store_backend_of(engine)
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
        self._claims_scope = _TrackedScope(root_scope_of(engine), self, self._halt.signal)
        self._control_scope = _TrackedScope(root_scope_of(engine), self, self._bar.signal)
        # the worker's own engine views: root-gated and tracked, even when
        # the worker was created through tx.jobs (a worker never joins an
        # application transaction's fate)
        self._claims = rescoped(engine, self._claims_scope)
        self._control = rescoped(engine, self._control_scope)
        # settlements of concurrent loops share one transaction (group commit)
        self._settlements = SettlementBatcher(self._control)
        self._claim_request = claim_request_for(
            self._control, self._kinds, owner=owner, lease_seconds=lease_seconds, queues=queues
        )
        self._renewals: RenewalScheduler = _Renewals(
            f"{self._name}-renewals",
            self._renew_attempt,
            self._renewals_due,
            lambda: bool(self._attempts),
            self._renew_every / 4,
        )

        # periodic schedules: their ticks, enqueued by a thread of their own
        self._ticker = Ticker(periodic, hub.runtime.now_ms) if periodic else None
        self._ticker_thread: threading.Thread | None = None

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
        # called once when stop()'s grace period ends with attempts still running,
        # before they are barred (AsyncWorker cancels its handlers' tasks here)
        self._on_grace_end: Callable[[], None] | None = None
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
                "snoozes",
            ),
            0,
        )

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
            self._backend.check_open("start()")
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
                    self._hub.renewers.add(self._renew_soon)
            self._threads.extend(threads)
        for thread in threads:
            thread.start()
        self._start_ticker()
        _log.info(
            "jaren_jobs: worker %r started: concurrency %d, kinds %s, queues %s, lease %gs",
            self.owner,
            self.concurrency,
            self._kinds,
            "all" if self.queues is None else list(self.queues),
            self.lease_seconds,
        )
        return self

    def run_once(self) -> bool:
        """One step in the calling thread: claim → run → settle.

        First it enqueues the periodic ticks due at the runtime clock's now
        (so a test's clock drives the schedules). Returns True when it ran
        a job, False when nothing was claimable (or the claim failed, or the
        worker is stopping). A handler's
        ``KeyboardInterrupt``/``SystemExit`` propagates to the caller after
        the worker halts (see :meth:`stop`).
        """
        if self._halt.aborted:
            return False
        self._backend.check_open("run_once()")
        self._activate()
        try:
            self._enqueue_ticks()
        except JobsError:
            # as a failed claim is: logged, and the step goes on (the ticks
            # stay due for the next call)
            _log.exception("jaren_jobs: worker %r: enqueueing periodic ticks failed", self.owner)
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
                    self._hub.renewers.discard(self._renew_soon)
                self._halt.abort(self._stopping_reason("stop() was called"))
                with self._cond:
                    self._cond.notify_all()
                # the halt woke it; an enqueue under way ends within the gate's bound
                self._join_ticker(max(self._backend.wait_seconds, 1.0))
            deadline = time.monotonic() + grace
            with self._cond:
                while self._busy > 0:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                undrained = self._busy
            if first and undrained and self._on_grace_end is not None:
                # AsyncWorker: the handlers' tasks are cancelled now, BEFORE the
                # bar, so each raises at once and is handed back (SPEC §12)
                # instead of being barred and spending its attempt
                self._on_grace_end()
                # (StopOutcome still counts them: they did not finish within the grace)
                settle_by = time.monotonic() + _HAND_BACK_SECONDS
                with self._cond:
                    while self._busy > 0:
                        left = settle_by - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(left)
            if first:
                self._release_unstarted()
                self._quiesce()
            outcome = StopOutcome(drained=undrained == 0, in_flight=undrained)
            if first:
                # once per worker: a repeated stop() only reports again
                _log.info(
                    "jaren_jobs: worker %r stopped: %s (grace %gs)%s",
                    self.owner,
                    outcome,
                    grace,
                    ""
                    if outcome.drained
                    else f"; {undrained} attempt(s) did not finish within the grace period",
                )
            return outcome

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

    def _is_own_thread(self) -> bool:
        current = threading.current_thread()
        with self._lock:
            # a loop thread, or any thread inside run_once() (its handler or observer)
            own = current in self._threads or current.ident in self._stepping
        return (
            own
            or current is self._renewals.thread
            or current is self._settler
            or current is self._ticker_thread
        )

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

    # The rest of the worker lives in the modules beside this one, as plain
    # functions of the worker bound here as its methods.

    # attempt.py: attempts and loops
    _wake = attempt._wake
    _loop = attempt._loop
    _idle = attempt._idle
    _step = attempt._step
    _ahead = attempt._ahead
    _run_one = attempt._run_one
    _run_queue = attempt._run_queue
    _call = attempt._call
    _begin = attempt._begin
    _abort_attempts = attempt._abort_attempts
    _end = attempt._end
    _abandon = attempt._abandon

    # claims.py: claims and hand-back
    _release_unstarted = claims._release_unstarted
    _hand_back = claims._hand_back
    _forget = claims._forget
    _claim = claims._claim
    _hold = claims._hold
    _cancel_unstarted = claims._cancel_unstarted
    _top_up = claims._top_up
    _waited_too_long = claims._waited_too_long
    _take_back_stalled = claims._take_back_stalled

    # settler.py: the settling thread
    _settle_all = settler._settle_all
    _submit = settler._submit
    _settle_entries = settler._settle_entries
    _to_retry = settler._to_retry
    _post = settler._post
    _enter_posted = settler._enter_posted
    _wait_for_room = settler._wait_for_room
    _settle_posted = settler._settle_posted
    _settle_cycle = settler._settle_cycle
    _prepare = settler._prepare
    _failure = settler._failure

    # outcomes.py: outcome decisions and observers
    _notify = outcomes._notify
    _observer_interrupted = outcomes._observer_interrupted
    _refused = outcomes._refused
    _finish = outcomes._finish
    _written = outcomes._written
    _failed = outcomes._failed
    _lost = outcomes._lost
    _truth = outcomes._truth
    _snoozed = outcomes._snoozed
    _outcome = outcomes._outcome
    _log_outcome = outcomes._log_outcome

    # renewals.py: renewals
    _renewals_due = renewals._renewals_due
    _renew_attempt = renewals._renew_attempt
    _renew_soon = renewals._renew_soon

    # ticks.py: periodic ticks
    _start_ticker = ticks._start_ticker
    _tick_loop = ticks._tick_loop
    _enqueue_ticks = ticks._enqueue_ticks
    _join_ticker = ticks._join_ticker

    # tracking.py: operation tracking, activation and quiescence
    _activate = tracking._activate
    _quiesce = tracking._quiesce
    _halt_for = tracking._halt_for
    _tracked = tracking._tracked
    _track = tracking._track
    _untrack = tracking._untrack
