"""The loops: ``concurrency`` threads of claim → run → settle, idle between empty claims."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from jaren_jobs.records import ClaimedJob
from jaren_jobs.worker.attempt import Ran
from jaren_jobs.worker.claims import ClaimBook
from jaren_jobs.worker.outcomes import Observers
from jaren_jobs.worker.pacing import Batch
from jaren_jobs.worker.queue_run import ThreadSteps, run_queue
from jaren_jobs.worker.running import AttemptRunner
from jaren_jobs.worker.settler import Settler
from jaren_jobs.worker.stats import Stats
from jaren_jobs.worker.tracking import Tracker

__all__ = ["Loops"]

_log = logging.getLogger("jaren_jobs.worker")

# a queue run the worker's host takes over (an AsyncWorker's, on its event loop):
# None to leave the jobs to the thread; else whether the run ended on a top-up that
# found nothing (as run_queue's answer)
QueueHost = Callable[[list[ClaimedJob]], bool | None]

# what one step of a loop came to
_NONE, _RAN, _DRY = 0, 1, 2  # nothing claimed; ran; ran until a top-up found nothing


class Loops:
    """The loop threads of one worker, and one step of claim → run → settle."""

    def __init__(
        self,
        *,
        name: str,
        concurrency: int,
        poll_seconds: float,
        tracker: Tracker,
        claims: ClaimBook,
        runner: AttemptRunner,
        settler: Settler,
        stats: Stats,
        observers: Observers,
        host: QueueHost | None,
    ) -> None:
        self._name = name
        self._concurrency = concurrency
        self._poll = poll_seconds
        self._tracker = tracker
        self._claims = claims
        self._runner = runner
        self._settler = settler
        self._stats = stats
        self._observers = observers
        self._host = host
        self._steps = ThreadSteps(runner, settler)
        self._generation = 0  # wake-ups so far: a wake during a claim is not lost
        # the one idle loop whose timer polls for the worker (its thread id), if any:
        # the other idle loops sleep until a wake (at concurrency 4, a quarter of the polls)
        self._poller: int | None = None
        # what idle loops sleep on (the worker's lock): only a wake or the halt rouses
        # them, not every step's or settlement's notice on the tracker's condition
        self._asleep = threading.Condition(tracker.lock)
        tracker.halt.signal.add_callback(self._halted)
        #: the loop threads, once started
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        threads = [
            threading.Thread(target=self._loop, name=f"{self._name}-loop-{i}", daemon=True)
            for i in range(1, self._concurrency + 1)
        ]
        with self._tracker.lock:
            self.threads.extend(threads)
        for thread in threads:
            thread.start()

    def wake(self) -> None:
        """An in-process enqueue: every idle loop claims again now."""
        self._rouse(counted=True)

    def _rouse(self, *, counted: bool) -> None:
        with self._asleep:
            if counted:
                self._stats.add("wakes")
            self._generation += 1
            self._asleep.notify_all()

    def _halted(self) -> None:
        with self._asleep:
            self._asleep.notify_all()

    def idle_threads(self) -> list[threading.Thread]:
        """The loop threads not inside a step (the caller holds the worker's lock)."""
        return [t for t in self.threads if t.ident not in self._tracker.stepping]

    def _loop(self) -> None:
        tracker = self._tracker
        idle = polled = False
        try:
            while not tracker.halt.aborted:
                # read before the claim: a wake that lands while it runs is not lost
                generation = self._generation
                began = time.monotonic()
                try:
                    came_to = self._step(chain=True, idle=idle, polled=polled)
                except Exception:  # a worker bug must not end the loop silently
                    _log.exception("jaren_jobs: worker %r: a loop step raised", tracker.owner)
                    came_to = _NONE
                # a queue run whose last top-up found nothing has polled already: the
                # loop sleeps now rather than claim again at once to find nothing (a
                # wake since `generation` was read still makes it claim at once)
                idle = came_to != _RAN
                polled = idle and self._idle(began, generation)
        except BaseException as exc:
            # only a handler's KeyboardInterrupt/SystemExit gets here; it was
            # logged and halted the worker. Let it leave the thread.
            if tracker.interrupted is not exc:  # pragma: no cover - defensive
                _log.error("jaren_jobs: worker %r loop ended by %r", tracker.owner, exc)
            raise

    def _idle(self, began: float, generation: int) -> bool:
        """Sleep until the next poll is due or a wake-up comes; True when it is the poll.

        One idle loop polls for the worker: polls are ``poll_seconds`` apart
        from start to start, so the time the empty claim took does not
        stretch the interval (a job another process made due waits at most
        about one interval). The other idle loops sleep until a wake: an
        enqueue in this process, a notification from another, or a poll that
        found work (:meth:`step`).
        """
        tracker = self._tracker
        with tracker.cond:
            if tracker.halt.aborted:
                return False
            self._stats.add("polls")
        self._observers.notify("on_idle", self._observers.on_idle)
        end = began + self._poll
        me = threading.get_ident()
        asleep = self._asleep
        with asleep:
            try:
                while not tracker.halt.aborted and generation == self._generation:
                    if self._poller is not None and self._poller != me:
                        asleep.wait()  # the poller rouses us if it finds work
                        continue
                    self._poller = me
                    left = end - time.monotonic()
                    if left <= 0:
                        return True
                    asleep.wait(left)
                return False
            finally:
                if self._poller == me:
                    self._poller = None

    def step(self) -> bool:
        """run_once(): claim one job and run it; whether there was one."""
        return self._step() != _NONE

    def _step(self, *, chain: bool = False, idle: bool = False, polled: bool = False) -> int:
        """Claim and run: a queue of jobs (a started worker's loop, ``chain``), or one.

        A loop coming out of ``idle`` claims one job, the cheapest claim (the
        next come with the first one's settlement): what it was woken for
        starts soonest. A ``polled`` claim that found work wakes the other
        idle loops, which slept through the poll: more may be due.
        """
        tracker = self._tracker
        if not tracker.enter_step():
            return _NONE
        try:
            looping = chain and bool(self._settler.threads)
            jobs = self._claims.claim(1 + self._claims.ahead() if looping and not idle else 1)
            if not jobs:
                return _NONE
            if polled:
                self._rouse(counted=False)
            if looping:
                return _DRY if self.run_queue(jobs) else _RAN
            else:
                self.run_one(jobs[0])
            return _RAN
        finally:
            tracker.leave_step()

    def run_one(self, claimed: ClaimedJob) -> None:
        """run_once(): one job, run and settled in this thread."""
        runner = self._runner
        attempt = runner.begin(claimed)
        if attempt is None:
            return  # cancelled before it started
        ran: list[Ran] = []
        try:
            outcome = runner.call(attempt, ran)
        except BaseException as exc:
            # only a handler's KeyboardInterrupt/SystemExit gets here
            runner.end(attempt, runner.abandon(attempt, exc))
            raise
        if outcome is not None:
            runner.end(attempt, outcome)
        else:
            self._settler.settle_all(ran)

    def run_queue(self, jobs: list[ClaimedJob]) -> bool:
        """A started worker's loop: its queue of leased jobs (see :func:`run_queue`);
        True when it ended on a top-up that found nothing."""
        if self._host is not None:
            hosted = self._host(jobs)
            if hosted is not None:
                return hosted
        claims = self._claims
        batch = Batch(jobs)
        rest: list[ClaimedJob] = []
        claims.add_batch(batch)
        try:
            return run_queue(
                self._steps,
                batch,
                rest,
                claims=claims,
                runner=self._runner,
                halt=self._tracker.halt.signal,
            )
        finally:
            # a top-up still on its way is handed back with the rest
            rest += batch.close()
            claims.discard_batch(batch)
            claims.hand_back(rest)
