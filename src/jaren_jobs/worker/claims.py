"""The claim book: jobs leased for the loops, held until they start, and handed back.

It owns what a worker holds without running it — the held jobs (a cancel with
their lease reaches them here), each loop's queue, and the pacing that decides
how many a loop holds ahead — and the claims that lease them.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

from jaren_jobs.core.settle import SettleBatch
from jaren_jobs.engine.engine import JobEngine
from jaren_jobs.engine.group_commit import SettlementBatcher
from jaren_jobs.engine.hub import EngineHub
from jaren_jobs.errors import CancelRequested, JobsError, StoreClosed
from jaren_jobs.records import ClaimedJob, Lease
from jaren_jobs.worker.attempt import Held, WorkerStopped, gone
from jaren_jobs.worker.pacing import HORIZON_SECONDS, Batch, ahead, averaged, loop_cap, ramped
from jaren_jobs.worker.stats import Stats
from jaren_jobs.worker.tracking import Tracker

__all__ = ["ClaimBook"]

_log = logging.getLogger("jaren_jobs.worker")


class ClaimBook:
    """Held jobs, the loops' queues, pacing and the claim request of one worker.

    Its fields are guarded by the worker's one lock (the tracker's). ``refill`` (the
    settler's) is wired after both exist: a top-up is leased in the settling thread's
    next write.
    """

    def __init__(
        self,
        *,
        engine: JobEngine,
        control: JobEngine,
        hub: EngineHub,
        tracker: Tracker,
        stats: Stats,
        settlements: SettlementBatcher,
        kinds: list[str],
        lease_seconds: float,
        queues: tuple[str, ...] | None,
        concurrency: int,
    ) -> None:
        self._engine = engine  # the tracked, halt-aborted view claims run through
        self._hub = hub
        self._tracker = tracker
        self._lock = tracker.lock
        self._stats = stats
        self._settlements = settlements
        self._kinds = kinds
        self._owner = tracker.owner
        self._lease_seconds = lease_seconds
        self._queues = queues
        #: what a top-up leases, in the settling thread's transaction
        self.request = control.claim_request(
            kinds, owner=self._owner, lease_seconds=lease_seconds, queues=queues
        )
        self.refill: Callable[[Batch], bool] = lambda batch: False  # the settler's, wired
        #: order of issue of every lease held, for leases() (drawn under the worker's lock)
        self.seqs = itertools.count(1)
        self.held: dict[int, Held] = {}  # leased and not started yet, by id(job)
        self.batches: set[Batch] = set()  # each looping loop's queue
        self._horizon = min(lease_seconds / 10, HORIZON_SECONDS)
        self.budget = 4 * self._horizon  # past it, a batch hands back what it has not started
        self._spent: float | None = None  # moving average of a handler's running time
        self._ramp = 0  # the jobs held ahead grow by doubling, up to the loop's cap
        self._cap = loop_cap(concurrency)

    # ---------------------------------------------------------------- pacing

    def ahead(self) -> int:
        """How many leased jobs a loop holds beyond the one it runs.

        As many as it can start within the horizon, by the handlers' measured
        running time (a moving average), grown by doubling, and never more
        than the loop's share of the worker's look-ahead (``pacing.loop_cap``):
        a job held ahead is a lease no other worker can take, and one a
        SIGKILL spends an attempt of.
        """
        return ahead(self._spent, self._horizon, self._ramp, self._cap)

    @property
    def spent(self) -> float | None:
        return self._spent

    def measured(self, spent: float) -> None:
        """A handler ran for ``spent`` seconds: into the moving average."""
        self._spent = averaged(self._spent, spent)

    def remeasured(self, before: float | None, spent: float) -> None:
        """The average as it was ``before`` a call that measured none of the handler's
        time (an async handler comes back unawaited), with ``spent`` instead."""
        self._spent = averaged(before, spent)

    def slow_start(self) -> None:
        """A slow job hid among fast ones (or a batch stalled): hold few ahead again."""
        self._ramp = 0

    # ---------------------------------------------------------------- claims

    def claim(self, limit: int) -> list[ClaimedJob]:
        """A step's first claim, in a transaction of its own (the idle check may answer it)."""
        try:
            jobs = self._engine.claim_checked(self.request, limit)
        except WorkerStopped:
            return []  # the stop abandoned it: not an error
        except StoreClosed as exc:
            _log.error("jaren_jobs: worker %r: the store is closed; halting (%s)", self._owner, exc)
            self._tracker.halt_for(exc)
            return []
        except JobsError as exc:
            self._stats.add_locked("claim_errors")
            _log.warning(
                "jaren_jobs: worker %r: claim failed, retrying at the next poll: %s",
                self._owner,
                exc,
            )
            return []
        self.hold(jobs)
        return jobs

    def hold(self, jobs: list[ClaimedJob]) -> None:
        """Record leases taken but not started: leases() lists them, a cancel reaches them."""
        if not jobs:
            return
        at = time.monotonic()
        aborts: list[tuple[str, Callable[[Any], None]]] = []
        with self._lock:
            for job in jobs:
                held = Held(job, next(self.seqs), at)
                held.abort = abort = functools.partial(self.cancel_unstarted, held)
                self.held[id(job)] = held
                aborts.append((job.id, abort))
        with self._hub.lock:
            self._hub.local_attempts.update(aborts)

    def cancel_unstarted(self, held: Held, reason: Any) -> None:
        """cancel(id, lease=...) committed for a job leased with a batch."""
        with self._lock:
            attempt = held.attempt
            if attempt is None:
                if isinstance(reason, CancelRequested):
                    held.forced = reason  # it starts, and settles the job cancelled
                else:
                    held.cancelled = True  # its handler never starts
                return
        attempt.cancel(reason)  # it started meanwhile: its signal aborts

    def held_leases(self) -> list[tuple[int, Lease]]:
        """(order of issue, lease) of every job held and not cancelled (the caller holds
        the worker's lock)."""
        return [(h.seq, h.job.lease) for h in self.held.values() if not h.cancelled]

    def held_waiting(self, job_id: str) -> list[Held]:
        """The held jobs of ``job_id`` not started nor cancelled (the caller holds the lock)."""
        return [
            h
            for h in self.held.values()
            if h.job.id == job_id and h.attempt is None and not h.cancelled
        ]

    # ---------------------------------------------------------------- the loops' queues

    def top_up(self, batch: Batch, *, idle: bool = False) -> bool:
        """Ask the settling thread to lease more jobs for ``batch`` in its next write.

        While a job runs, the queue is topped up to ``ahead()`` unstarted
        jobs; a loop that ran its queue dry (``idle``) asks for one more, to
        run at once. Whether a top-up is now on its way.
        """
        ahead = self.ahead()
        want = ahead + 1 if idle else ahead
        if want == 0 or (not idle and batch.unstarted() >= want):
            return False
        if not batch.ask(want):
            return False
        if not self.refill(batch):
            batch.topped_up([])
            return False
        # each top-up that was not overrun lets the loop hold one more ahead
        self._ramp = ramped(self._ramp, self._cap)
        return True

    def waited_too_long(self, job: ClaimedJob) -> bool:
        with self._lock:
            held = self.held.get(id(job))
        return held is not None and time.monotonic() - held.at > self.budget

    def take_back_stalled(self, now: float) -> None:
        """The renewal thread: hand back the unstarted jobs of batches stuck behind a slow job."""
        with self._lock:
            batches = list(self.batches)
        rest = [job for batch in batches for job in batch.take_stalled(now, self.budget)]
        if rest:
            self._ramp = 0
            self.hand_back(rest)

    def add_batch(self, batch: Batch) -> None:
        with self._lock:
            self.batches.add(batch)

    def discard_batch(self, batch: Batch) -> None:
        with self._lock:
            self.batches.discard(batch)

    # ---------------------------------------------------------------- hand-back

    def release_unstarted(self) -> None:
        """Hand back every loop's unstarted jobs (a loop stuck in a handler cannot)."""
        with self._lock:
            batches = list(self.batches)
        self.hand_back([job for batch in batches for job in batch.take_rest()])

    def hand_back(self, jobs: list[ClaimedJob]) -> None:
        """Release leased, never-started jobs in a transaction of their own: no attempt spent."""
        if not jobs:
            return
        with self._lock:
            helds = [self.held.pop(id(job), None) for job in jobs]
        # a job cancelled with its lease is not leased any more: nothing to release
        leases = [job.lease for job, held in zip(jobs, helds, strict=True) if not gone(held)]
        if leases:
            failed = self._settlements.submit(SettleBatch(releases=tuple(leases))).release_error
            if failed is not None:  # their leases expire instead
                _log.warning(
                    "jaren_jobs: worker %r: handing back %d unstarted job(s) failed; their "
                    "leases will expire: %s",
                    self._owner,
                    len(leases),
                    failed,
                )
            else:
                # claimable again: a loop (of this worker or another) that went
                # idle while they were held must not sleep through them
                self._hub.wake()
        # only now: a cancel that committed before the release must still find them
        self.forget(helds)

    def forget(self, helds: list[Held | None]) -> None:
        with self._hub.lock:
            local = self._hub.local_attempts
            for held in helds:
                if held is not None:
                    if local.get(held.job.id) is held.abort:
                        del local[held.job.id]
                    held.abort = None  # its partial refers back to it: break the cycle
