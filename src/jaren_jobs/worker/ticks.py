"""Periodic ticks: the worker's ticker thread, and run_once()'s check (SPEC §12)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from jaren_jobs.errors import JobsError

if TYPE_CHECKING:
    from jaren_jobs.worker.threaded import Worker

_log = logging.getLogger("jaren_jobs.worker")


def _start_ticker(self: Worker) -> None:
    """A started worker with schedules gets one thread that enqueues their ticks.

    A thread of its own, not a loop's idle time: a loop kept busy by a
    stream of jobs would otherwise hold ticks back for as long as it stays busy.
    """
    if self._ticker is None:
        return
    thread = threading.Thread(target=self._tick_loop, name=f"{self._name}-ticks", daemon=True)
    self._ticker_thread = thread
    thread.start()


def _tick_loop(self: Worker) -> None:
    ticker = self._ticker
    assert ticker is not None
    halt = self._halt.signal
    while not halt.aborted:
        wait = self.poll_seconds
        try:
            self._enqueue_ticks()
            # the runtime clock may be a test's, or jump (NTP, a suspended
            # host): the poll interval bounds each wait so a jump is seen,
            # and a wait is a clock read, no database work
            wait = min(ticker.seconds_until_due(), self.poll_seconds)
        except JobsError:
            if halt.aborted:
                break  # the stop's own refusal
            _log.exception(
                "jaren_jobs: worker %r: enqueueing periodic ticks failed; trying again in %.3gs",
                self.owner,
                wait,
            )
        except Exception:  # a bug must not end the thread silently
            _log.exception("jaren_jobs: worker %r: the ticker raised", self.owner)
        halt.wait(wait)


def _enqueue_ticks(self: Worker) -> None:
    """Enqueue the ticks due at the runtime clock's now (a no-op without schedules)."""
    if self._ticker is not None:
        self._ticker.enqueue_due(self._claims)


def _join_ticker(self: Worker, bound: float) -> None:
    thread = self._ticker_thread
    if thread is not None and thread is not threading.current_thread():
        thread.join(bound)
        if thread.is_alive():
            _log.error("jaren_jobs: worker %r: the ticker thread did not exit", self.owner)
