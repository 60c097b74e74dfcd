"""The thread worker: :class:`Worker`, its lifecycle, and the wiring of its parts.

The parts, each owning its state (they share the worker's one lock, given to each):

* :class:`~jaren_jobs.worker.tracking.Tracker` — steps, attempts and database calls
  under way; the halt and the bar;
* :class:`~jaren_jobs.worker.claims.ClaimBook` — held jobs, the loops' queues, pacing;
* :class:`~jaren_jobs.worker.settler.Settler` — the settling thread (group commit);
* :class:`~jaren_jobs.worker.running.AttemptRunner` — begin, call and end attempts;
* :class:`~jaren_jobs.worker.renewals.Renewer` — lease renewals and their scheduler;
* :class:`~jaren_jobs.worker.loops.Loops` — the loop threads and one step;
* :class:`~jaren_jobs.worker.ticks.Ticks` — periodic ticks;
* :class:`~jaren_jobs.worker.outcomes.Observers` and
  :class:`~jaren_jobs.worker.stats.Stats` — observers and counters.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from jaren_jobs.engine.engine import EngineHub, JobEngine
from jaren_jobs.engine.group_commit import SettlementBatcher
from jaren_jobs.errors import JobsError
from jaren_jobs.periodic import Periodic, Ticker
from jaren_jobs.records import ClaimedJob, Lease, Outcome, StopOutcome, WorkerStats
from jaren_jobs.runtime import check_seconds
from jaren_jobs.worker.attempt import Handler, stopping_reason
from jaren_jobs.worker.claims import ClaimBook
from jaren_jobs.worker.loops import Loops
from jaren_jobs.worker.outcomes import Observers
from jaren_jobs.worker.renewals import RenewalScheduler, Renewer
from jaren_jobs.worker.running import AttemptRunner
from jaren_jobs.worker.settler import SETTLING_LANES, Settler
from jaren_jobs.worker.stats import Stats
from jaren_jobs.worker.ticks import Ticks
from jaren_jobs.worker.tracking import Tracker

__all__ = ["Worker", "WorkerHost"]

_worker_numbers = itertools.count(1)
_log = logging.getLogger("jaren_jobs.worker")

# how long stop() waits, once the grace period is over, for handlers whose
# tasks it cancelled to raise and be handed back, before it bars them
_HAND_BACK_SECONDS = 1.0


class WorkerHost(Protocol):
    """What a worker built for an AsyncWorker asks of it (given at construction)."""

    def run_queue(self, jobs: list[ClaimedJob]) -> bool | None:
        """Run a loop's queue on the event loop; None to leave it to the loop's thread, else
        whether the run ended on a top-up that found nothing."""
        ...

    def renewal_scheduler(self, renewer: Renewer) -> RenewalScheduler:
        """The scheduler of the worker's renewals (a task on the event loop)."""
        ...

    def grace_ended(self) -> None:
        """stop()'s grace period ended with attempts running: cancel the handlers' tasks."""
        ...


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
        host: WorkerHost | None = None,
    ) -> None:
        self._hub = hub
        #: the queues this worker claims from (``None``: every queue)
        self.queues = queues
        self._backend = engine.store_backend
        self._kinds = sorted(handlers)
        self.owner = owner
        self.concurrency = concurrency
        self.poll_seconds = poll_seconds
        self.lease_seconds = lease_seconds
        self.renew = renew
        self.stop_grace_seconds = stop_grace_seconds
        self._host = host
        self._name = name = f"jaren_jobs-worker-{next(_worker_numbers)}"
        self._started = False
        self._stopped = False
        self._active = False
        self._stop_lock = threading.Lock()

        # the one lock every part shares, given to each
        self._lock = lock = threading.Lock()
        tracker = self._tracker = Tracker(owner, lock, threading.Condition(lock))
        tracker.on_halt = self._on_halt
        stats = self._stats = Stats(lock)
        observers = self._observers = Observers(tracker, on_outcome, on_renewal, on_idle)
        # the worker's own engine views: root-gated and tracked, even when the worker
        # was created through tx.jobs (a worker never joins an application
        # transaction's fate); claims abort at the halt, the rest at the bar
        claims_view = engine.rescoped(tracker.scope(engine.root_scope(), tracker.halt.signal))
        control = engine.rescoped(tracker.scope(engine.root_scope(), tracker.bar.signal))
        # settlements of concurrent loops share one transaction (group commit), two
        # at once where the database can write two (settler.py says why)
        settlements = SettlementBatcher(control, min(SETTLING_LANES, self._backend.writers))
        claims = self._claims = ClaimBook(
            engine=claims_view,
            control=control,
            hub=hub,
            tracker=tracker,
            stats=stats,
            settlements=settlements,
            kinds=self._kinds,
            lease_seconds=lease_seconds,
            queues=queues,
            concurrency=concurrency,
        )
        renewer = self._renewer = Renewer(
            tracker=tracker,
            claims=claims,
            stats=stats,
            observers=observers,
            control=control,
            lease_seconds=lease_seconds,
            name=name,
            scheduler=None if host is None else host.renewal_scheduler,
        )
        runner = self._runner = AttemptRunner(
            handlers=handlers,
            control=control,
            hub=hub,
            tracker=tracker,
            claims=claims,
            stats=stats,
            observers=observers,
            renewer=renewer,
            renew=renew,
        )
        settler = self._settler = Settler(
            owner=owner,
            name=name,
            lock=lock,
            tracker=tracker,
            claims=claims,
            stats=stats,
            settlements=settlements,
            now_ms=hub.runtime.now_ms,
            end=runner.end,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
            # an AsyncWorker's queue runs share the event loop's thread: each runs its
            # queue in a burst and posts its settlements in a burst, so a top-up riding
            # with them waited for all of them, and the other lane sat idle. Alone, it
            # comes back in a fraction of the time (+15-45% jobs/s, measured); a
            # thread worker's loops post steadily and gain nothing from it, and four
            # processes sharing the server lost up to a fifth to the extra commits
            claims_apart=host is not None,
        )
        claims.refill = settler.refill
        self._loops = Loops(
            name=name,
            concurrency=concurrency,
            poll_seconds=poll_seconds,
            tracker=tracker,
            claims=claims,
            runner=runner,
            settler=settler,
            stats=stats,
            observers=observers,
            host=None if host is None else host.run_queue,
        )
        # periodic schedules: their ticks, enqueued by a thread of their own
        self._ticks = Ticks(
            Ticker(periodic, hub.runtime.now_ms) if periodic else None,
            claims_view,
            tracker.halt.signal,
            owner=owner,
            name=name,
            poll_seconds=poll_seconds,
        )

    # ---------------------------------------------------------------- the parts, read-only

    @property
    def tracker(self) -> Tracker:
        """Steps, attempts and database calls under way (for the asyncio worker)."""
        return self._tracker

    @property
    def claims(self) -> ClaimBook:
        """The held jobs and the loops' queues (for the asyncio worker)."""
        return self._claims

    @property
    def runner(self) -> AttemptRunner:
        """Begins, calls and ends attempts (for the asyncio worker)."""
        return self._runner

    @property
    def settler(self) -> Settler:
        """The settling thread (for the asyncio worker)."""
        return self._settler

    @property
    def renewer(self) -> Renewer:
        """Lease renewals (for the asyncio worker)."""
        return self._renewer

    @property
    def loops(self) -> Loops:
        """The loop threads and one step of claim → run → settle."""
        return self._loops

    @property
    def observers(self) -> Observers:
        """The observers the worker was created with."""
        return self._observers

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
        return self._started and not self._tracker.halt.aborted

    @property
    def interrupted(self) -> BaseException | None:
        """The ``KeyboardInterrupt``/``SystemExit`` that halted the worker (handler or observer)."""
        return self._tracker.interrupted

    def stats(self) -> WorkerStats:
        """The counters at this instant.

        ``claims`` counts attempts started; ``in_flight`` the started ones
        without an outcome yet (running, or returned and waiting for their
        settlement's commit).
        """
        with self._lock:
            return self._stats.snapshot(len(self._tracker.attempts))

    def leases(self) -> list[Lease]:
        """The leases this worker holds now, newest first (a renewal makes a lease newest).

        Those of jobs a loop leased with its batch and has not started yet
        are included: the worker holds them all the same.
        """
        with self._lock:
            held = [(a.lease_seq, a.lease) for a in self._tracker.attempts.values()]
            # leased with a loop's batch and not started yet: held all the same
            held.extend(self._claims.held_leases())
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
        self._settler.start()  # before any loop runs: loops post only once it exists
        with self._lock:
            # a stop() racing this start() must not leave a waker behind
            if not self._stopped:
                with self._hub.lock:
                    self._hub.wakers.add(self._loops.wake)
                    self._hub.renewers.add(self._renewer.renew_soon)
        self._loops.start()
        self._ticks.start()
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
        if self._tracker.halt.aborted:
            return False
        self._backend.check_open("run_once()")
        self._activate()
        try:
            self._ticks.enqueue_due()
        except JobsError:
            # as a failed claim is: logged, and the step goes on (the ticks
            # stay due for the next call)
            _log.exception("jaren_jobs: worker %r: enqueueing periodic ticks failed", self.owner)
        ran = self._loops.step()
        local = self._tracker.local
        interrupt: BaseException | None = getattr(local, "interrupt", None)
        if interrupt is not None:  # an observer's, met in this thread: every outcome is out
            local.interrupt = None
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
            tracker = self._tracker
            with self._lock:
                first = not self._stopped
                self._stopped = True
            if first:
                with self._hub.lock:
                    self._hub.wakers.discard(self._loops.wake)
                    self._hub.renewers.discard(self._renewer.renew_soon)
                tracker.halt.abort(stopping_reason(self.owner, "stop() was called"))
                with tracker.cond:
                    tracker.cond.notify_all()
                # the halt woke it; an enqueue under way ends within the gate's bound
                self._ticks.join(max(self._backend.wait_seconds, 1.0))
            undrained = tracker.drain(time.monotonic() + grace)
            if first and undrained and self._host is not None:
                # AsyncWorker: the handlers' tasks are cancelled now, BEFORE the
                # bar, so each raises at once and is handed back (SPEC §12)
                # instead of being barred and spending its attempt
                self._host.grace_ended()
                # (StopOutcome still counts them: they did not finish within the grace)
                tracker.drain(time.monotonic() + _HAND_BACK_SECONDS)
            if first:
                self._claims.release_unstarted()
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
            own = current in self._loops.threads or current.ident in self._tracker.stepping
        return (
            own
            or current is self._renewer.scheduler.thread
            or current in self._settler.threads
            or current is self._ticks.thread
        )

    def _on_halt(self) -> None:
        # halted from inside (a closed store, an interrupt): no more wake-ups
        with self._hub.lock:
            self._hub.wakers.discard(self._loops.wake)

    def _activate(self) -> None:
        with self._lock:
            if self._active or self._stopped:
                return
            self._active = True
        with self._hub.lock:
            self._hub.workers.add(self)
        if self.renew:
            self._renewer.scheduler.start()

    def _quiesce(self) -> None:
        tracker = self._tracker
        # 1. bar: no new worker-started operation; abandon queued ones
        tracker.bar_all()
        bound = max(self._backend.wait_seconds, 1.0)
        # 2. no timer armed: the scheduler exits (a renewal it is running is
        #    tracked I/O, so it ends within the gate's bound)
        if not self._renewer.scheduler.stop(bound):
            _log.error("jaren_jobs: worker %r: the renewal scheduler did not exit", self.owner)
        # 3. the settling thread exits once what was posted has its outcome
        self._settler.close(bound)
        # 4. no worker-started database operation still running
        still = tracker.wait_io(time.monotonic() + bound)
        if still:
            _log.error(
                "jaren_jobs: worker %r: %d database operation(s) still running after %.1fs",
                self.owner,
                still,
                bound,
            )
        with self._lock:
            idle_threads = self._loops.idle_threads()
        with self._hub.lock:
            self._hub.workers.discard(self)
        # loops with no attempt exit at once (they were woken); a loop still
        # running an undrained handler is left to finish on its own
        for thread in idle_threads:
            if thread is not threading.current_thread():
                thread.join(1.0)
