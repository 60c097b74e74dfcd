"""The tracker: what a worker has under way (steps, attempts, database calls), its halt
and its bar — what ``stop()`` waits out and then refuses."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from jaren_jobs.backend import Scope
from jaren_jobs.errors import GateRefused, JobsError
from jaren_jobs.signals import CancelScope, Signal, SignalLike
from jaren_jobs.worker.attempt import Attempt, stopped_error

__all__ = ["TrackedScope", "Tracker"]

T = TypeVar("T")


class Tracker:
    """Steps, attempts and database calls under way; the halt (stop claiming) and the bar
    (no database call at all). Its fields are guarded by the worker's one lock, given
    with the condition over it."""

    def __init__(self, owner: str, lock: threading.Lock, cond: threading.Condition) -> None:
        self.owner = owner
        self.lock = lock
        self.cond = cond  # over ``lock``: steps, I/O and the loops' idle waits share it
        # halt: stop claiming (stop() began, or an interrupt); bar: no more
        # database operations at all (stop() finished draining)
        self.halt = CancelScope()
        self.bar = CancelScope()
        self.attempts: dict[int, Attempt] = {}  # started and without an outcome, by key
        self.busy = 0  # steps and posted attempts under way (stop() drains them)
        self.io = 0  # tracked database operations under way
        self.stepping: set[int] = set()  # ident of each thread inside a step
        self.barred = False
        #: the KeyboardInterrupt/SystemExit that halted the worker (handler or observer)
        self.interrupted: BaseException | None = None
        self.local = threading.local()  # an observer's interrupt, for run_once() to re-raise
        self.on_halt: Callable[[], None] = lambda: None  # wired by the worker
        # one subscription for every attempt: an attempt registers before it
        # checks the halt, so each is aborted either by this or by its start
        self.halt.signal.add_callback(self._abort_attempts)

    # ---------------------------------------------------------------- database calls

    def scope(self, inner: Scope, signal: Signal) -> TrackedScope:
        """``inner`` (a root scope), each call counted here and given ``signal``."""
        return TrackedScope(inner, self, signal)

    def track(self, what: str) -> None:
        with self.lock:
            if self.barred:
                raise stopped_error(self.owner, what)
            self.io += 1

    def untrack(self) -> None:
        with self.cond:
            self.io -= 1
            if self.io == 0:
                self.cond.notify_all()

    # ---------------------------------------------------------------- steps and attempts

    def enter_step(self) -> bool:
        """A step begins in this thread; False (and nothing counted) once halted."""
        with self.cond:
            if self.halt.aborted:
                return False
            self.busy += 1
            self.stepping.add(threading.get_ident())
            return True

    def leave_step(self) -> None:
        with self.cond:
            self.busy -= 1
            self.stepping.discard(threading.get_ident())
            self.cond.notify_all()

    def _abort_attempts(self) -> None:
        """The halt fired: every running attempt's signal aborts with its reason."""
        reason = self.halt.signal.reason
        with self.lock:
            attempts = list(self.attempts.values())
        for attempt in attempts:
            attempt.scope.abort(reason)

    def halt_for(self, reason: JobsError) -> None:
        self.halt.abort(reason)
        self.on_halt()
        with self.cond:
            self.cond.notify_all()

    def drain(self, deadline: float) -> int:
        """Wait until no step or posted attempt is under way, or ``deadline``; how many are."""
        with self.cond:
            while self.busy > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return self.busy

    def bar_all(self) -> None:
        """No worker-started database call from now on; queued ones are abandoned."""
        with self.cond:
            self.barred = True
        self.bar.abort(stopped_error(self.owner, "the worker stopped"))

    def wait_io(self, deadline: float) -> int:
        """Wait until no tracked database call runs, or ``deadline``; how many still run."""
        with self.cond:
            while self.io > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            return self.io


class TrackedScope:
    """A root scope whose every call is counted for quiescence and barred after stop.

    It wraps the store's own root scope (whatever the database), adding the
    worker's signal to each call and naming a call the stop abandoned.
    """

    root = True

    def __init__(self, inner: Scope, tracker: Tracker, signal: Signal) -> None:
        self._inner = inner
        self._tracker = tracker
        self._signal = signal

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        tracker = self._tracker
        tracker.track(what)
        try:
            return self._inner.write(fn, what, signal or self._signal)
        except GateRefused as exc:
            self._stopped(exc)
            raise
        finally:
            tracker.untrack()

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        tracker = self._tracker
        tracker.track(what)
        try:
            return self._inner.read(fn, what, signal or self._signal)
        except GateRefused as exc:
            self._stopped(exc)
            raise
        finally:
            tracker.untrack()

    def read_consistent(self, fn: Callable[[], T], what: str) -> T:
        tracker = self._tracker
        tracker.track(what)
        try:
            return self._inner.read_consistent(fn, what)
        except GateRefused as exc:
            self._stopped(exc)
            raise
        finally:
            tracker.untrack()

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._inner.after_commit(callback)

    def _stopped(self, exc: GateRefused) -> None:
        # a queued call the stop abandoned is the stop working: say so by name
        if self._signal.aborted and exc.details.get("reason") == "aborted":
            raise stopped_error(self._tracker.owner, exc.message) from exc
