"""Batch pacing: how many jobs a loop holds ahead, and the queue it holds them in."""

from __future__ import annotations

import threading
import time
from collections import deque

from jaren_jobs.records import (
    ClaimedJob,
)

# the most jobs a loop holds leased beyond the one it runs: a SIGKILL spends
# the attempt of each (their leases expire; the claim counted them). 63, so that
# a claim of one more than that (a loop's step, a drained queue's top-up) stays
# within the 64 a PostgreSQL claim mints in one statement and pipelines
MAX_AHEAD = 63

# the most jobs a whole worker holds ahead, shared by its loops (each loop may
# still hold MIN_AHEAD): the look-ahead a SIGKILL can spend, whatever the
# concurrency. Measured: a commit carries what the loops hold, and under
# durability FULL a worker of fast jobs runs at the rate of its commits
WORKER_AHEAD = 128

# what a loop may always hold ahead, however many loops share WORKER_AHEAD
MIN_AHEAD = 8


def loop_cap(concurrency: int) -> int:
    """The most jobs one of ``concurrency`` loops holds ahead (see ``WORKER_AHEAD``)."""
    return max(MIN_AHEAD, min(MAX_AHEAD, WORKER_AHEAD // max(1, concurrency)))


# how long a leased job may wait for its loop, at most (and never more than a
# tenth of the lease): a loop's batch is what it can start within this
HORIZON_SECONDS = 0.02


def ahead(spent: float | None, horizon: float, ramp: int, cap: int) -> int:
    """How many jobs a loop may hold beyond the one it runs (see ``ClaimBook.ahead``).

    As many as start within ``horizon`` at the handlers' average running
    time ``spent`` (``None``: nothing measured yet, none), at most ``ramp``
    (which grows by doubling) and never more than ``cap`` (the loop's share
    of the worker's look-ahead, ``loop_cap``).
    """
    if spent is None:
        return 0
    fits = int(horizon / max(spent, 1e-6))
    return max(0, min(cap, fits, ramp))


def ramped(ramp: int, cap: int) -> int:
    """The ramp after a top-up that was not overrun: one more ahead, by doubling."""
    return min(max(1, ramp * 2), cap)


def averaged(previous: float | None, spent: float) -> float:
    """The moving average of a handler's running time, after one more run."""
    return spent if previous is None else previous + (spent - previous) / 4


class Batch:
    """A loop's queue of leased, unstarted jobs.

    The loop takes them one at a time; the settling thread tops the queue up
    (in its next transaction) while the loop runs the current job; the
    renewal thread may take the rest back when the current job runs long.
    """

    __slots__ = ("cond", "dry", "jobs", "refill", "running", "stalled", "started", "want")

    def __init__(self, jobs: list[ClaimedJob]) -> None:
        self.jobs: deque[ClaimedJob] = deque(jobs)
        self.cond = threading.Condition()
        self.stalled = False  # the renewal thread took the rest back
        self.running = False  # one of its jobs is running now
        self.started = time.monotonic()  # when the job running now started
        self.refill = False  # a top-up is on its way from the settling thread
        self.want = 0  # the top-up fills the queue up to this many unstarted jobs
        self.dry = False  # the last top-up's claim found nothing to lease

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
            self.refill, self.want, self.dry = True, want, False
            return True

    def topped_up(self, jobs: list[ClaimedJob], *, dry: bool = False) -> None:
        """The top-up's answer: ``dry`` when its claim ran and found nothing."""
        with self.cond:
            self.jobs.extend(jobs)
            self.refill, self.dry = False, dry
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
