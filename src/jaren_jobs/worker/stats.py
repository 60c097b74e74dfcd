"""A worker's counters: one small object, read whole by ``stats()``."""

from __future__ import annotations

import threading

from jaren_jobs.records import WorkerStats

__all__ = ["COUNTER_OF", "Stats"]

# the WorkerStats counter each outcome counts in
COUNTER_OF = {
    "completed": "completions",
    "failed": "failures",
    "cancelled": "cancellations",
    "lost": "lost_settlements",
    "snoozed": "snoozes",
}

_NAMES = (
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
)


class Stats:
    """The counters of one worker, guarded by the worker's one lock (given, not owned).

    :meth:`add` is called with that lock held (most counts change beside other state
    under it); :meth:`add_locked` takes it.
    """

    __slots__ = ("_lock", "counts")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        #: the counters by name (the hot paths add to it directly, holding the lock)
        self.counts = dict.fromkeys(_NAMES, 0)

    def add(self, name: str, count: int = 1) -> None:
        """Count ``name`` (the caller holds the worker's lock)."""
        self.counts[name] += count

    def add_locked(self, name: str, count: int = 1) -> None:
        with self._lock:
            self.counts[name] += count

    def snapshot(self, in_flight: int) -> WorkerStats:
        """The counters now (the caller holds the worker's lock)."""
        return WorkerStats(**self.counts, in_flight=in_flight)
