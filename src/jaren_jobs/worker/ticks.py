"""Periodic ticks: a worker's ticker thread, and run_once()'s check (SPEC §12)."""

from __future__ import annotations

import logging
import threading

from jaren_jobs.engine.engine import JobEngine
from jaren_jobs.errors import JobsError
from jaren_jobs.periodic import Ticker
from jaren_jobs.signals import Signal

__all__ = ["Ticks"]

_log = logging.getLogger("jaren_jobs.worker")


class Ticks:
    """The ticks of a worker's schedules, enqueued through its tracked engine view."""

    def __init__(
        self,
        ticker: Ticker | None,
        engine: JobEngine,
        halt: Signal,
        *,
        owner: str,
        name: str,
        poll_seconds: float,
    ) -> None:
        self._ticker = ticker
        self._engine = engine
        self._halt = halt
        self._owner = owner
        self._name = name
        self._poll = poll_seconds
        #: the ticker thread, once started (a worker with schedules only)
        self.thread: threading.Thread | None = None

    def enqueue_due(self) -> None:
        """Enqueue the ticks due at the runtime clock's now (a no-op without schedules)."""
        if self._ticker is not None:
            self._ticker.enqueue_due(self._engine)

    def start(self) -> None:
        """A started worker with schedules gets one thread that enqueues their ticks.

        A thread of its own, not a loop's idle time: a loop kept busy by a
        stream of jobs would otherwise hold ticks back for as long as it stays busy.
        """
        if self._ticker is None:
            return
        thread = threading.Thread(target=self._run, name=f"{self._name}-ticks", daemon=True)
        self.thread = thread
        thread.start()

    def _run(self) -> None:
        ticker = self._ticker
        assert ticker is not None
        halt = self._halt
        while not halt.aborted:
            wait = self._poll
            try:
                self.enqueue_due()
                # the runtime clock may be a test's, or jump (NTP, a suspended
                # host): the poll interval bounds each wait so a jump is seen,
                # and a wait is a clock read, no database work
                wait = min(ticker.seconds_until_due(), self._poll)
            except JobsError:
                if halt.aborted:
                    break  # the stop's own refusal
                _log.exception(
                    "jaren_jobs: worker %r: enqueueing periodic ticks failed; trying again in "
                    "%.3gs",
                    self._owner,
                    wait,
                )
            except Exception:  # a bug must not end the thread silently
                _log.exception("jaren_jobs: worker %r: the ticker raised", self._owner)
            halt.wait(wait)

    def join(self, bound: float) -> None:
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(bound)
            if thread.is_alive():
                _log.error("jaren_jobs: worker %r: the ticker thread did not exit", self._owner)
