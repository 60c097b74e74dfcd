"""Operation tracking and quiescence: the worker's database calls, counted and barred."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from jaren_jobs.backend import Scope
from jaren_jobs.errors import (
    GateRefused,
    JobsError,
)
from jaren_jobs.signals import Signal, SignalLike

if TYPE_CHECKING:
    from jaren_jobs.worker.threaded import Worker

_log = logging.getLogger("jaren_jobs.worker")
T = TypeVar("T")


class _TrackedScope:
    """A root scope whose every call is counted for quiescence and barred after stop.

    It wraps the store's own root scope (whatever the database), adding the
    worker's signal to each call and naming a call the stop abandoned.
    """

    root = True

    def __init__(self, inner: Scope, worker: Worker, signal: Signal) -> None:
        self._inner = inner
        self._worker = worker
        self._signal = signal

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        worker = self._worker
        worker._track(what)
        try:
            return self._inner.write(fn, what, signal or self._signal)
        except GateRefused as exc:
            self._stopped(exc)
            raise
        finally:
            worker._untrack()

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        worker = self._worker
        worker._track(what)
        try:
            return self._inner.read(fn, what, signal or self._signal)
        except GateRefused as exc:
            self._stopped(exc)
            raise
        finally:
            worker._untrack()

    def read_consistent(self, fn: Callable[[], T], what: str) -> T:
        worker = self._worker
        worker._track(what)
        try:
            return self._inner.read_consistent(fn, what)
        except GateRefused as exc:
            self._stopped(exc)
            raise
        finally:
            worker._untrack()

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._inner.after_commit(callback)

    def _stopped(self, exc: GateRefused) -> None:
        # a queued call the stop abandoned is the stop working: say so by name
        if self._signal.aborted and exc.details.get("reason") == "aborted":
            raise self._worker._stopped_error(exc.message) from exc


@contextmanager
def _tracked(self: Worker, what: str) -> Iterator[None]:
    self._track(what)
    try:
        yield
    finally:
        self._untrack()


def _track(self: Worker, what: str) -> None:
    with self._lock:
        if self._barred:
            raise self._stopped_error(what)
        self._io += 1


def _untrack(self: Worker) -> None:
    with self._cond:
        self._io -= 1
        if self._io == 0:
            self._cond.notify_all()


def _activate(self: Worker) -> None:
    with self._lock:
        if self._active or self._stopped:
            return
        self._active = True
    with self._hub.lock:
        self._hub.workers.add(self)
    if self.renew:
        self._renewals.start()


def _quiesce(self: Worker) -> None:
    # 1. bar: no new worker-started operation; abandon queued ones
    with self._cond:
        self._barred = True
    self._bar.abort(self._stopped_error("the worker stopped"))
    bound = max(self._backend.wait_seconds, 1.0)
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


def _halt_for(self: Worker, reason: JobsError) -> None:
    self._halt.abort(reason)
    with self._hub.lock:
        self._hub.wakers.discard(self._wake)
    with self._cond:
        self._cond.notify_all()
