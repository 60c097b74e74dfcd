"""Claims and hand-back: leasing jobs for the loops, and releasing those never started."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from jaren_jobs.core.settle import SettleBatch
from jaren_jobs.errors import (
    CancelRequested,
    JobsError,
    StoreClosed,
)
from jaren_jobs.records import (
    ClaimedJob,
)
from jaren_jobs.worker.attempt import WorkerStopped, _gone, _Held
from jaren_jobs.worker.pacing import _Batch, ramped

if TYPE_CHECKING:
    from jaren_jobs.worker.threaded import Worker

_log = logging.getLogger("jaren_jobs.worker")


def _release_unstarted(self: Worker) -> None:
    """Hand back every loop's unstarted jobs (a loop stuck in a handler cannot)."""
    with self._lock:
        batches = list(self._batches)
    self._hand_back([job for batch in batches for job in batch.take_rest()])


def _hand_back(self: Worker, jobs: list[ClaimedJob]) -> None:
    """Release leased, never-started jobs in a transaction of their own: no attempt spent."""
    if not jobs:
        return
    with self._lock:
        helds = [self._held.pop(id(job), None) for job in jobs]
    # a job cancelled with its lease is not leased any more: nothing to release
    leases = [job.lease for job, held in zip(jobs, helds, strict=True) if not _gone(held)]
    if leases:
        failed = self._settlements.submit(SettleBatch(releases=tuple(leases))).release_error
        if failed is not None:  # their leases expire instead
            _log.warning(
                "jaren_jobs: worker %r: handing back %d unstarted job(s) failed; their "
                "leases will expire: %s",
                self.owner,
                len(leases),
                failed,
            )
        else:
            # claimable again: a loop (of this worker or another) that went
            # idle while they were held must not sleep through them
            self._hub.wake()
    # only now: a cancel that committed before the release must still find them
    self._forget(helds)


def _forget(self: Worker, helds: list[_Held | None]) -> None:
    with self._hub.lock:
        local = self._hub.local_attempts
        for held in helds:
            if held is not None and local.get(held.job.id) is held.abort:
                del local[held.job.id]


def _claim(self: Worker, limit: int) -> list[ClaimedJob]:
    """A step's first claim, in a transaction of its own (the idle check may answer it)."""
    try:
        jobs = self._claims.claim_many(
            self._kinds,
            owner=self.owner,
            limit=limit,
            lease_seconds=self.lease_seconds,
            queues=self.queues,
        )
    except WorkerStopped:
        return []  # the stop abandoned it: not an error
    except StoreClosed as exc:
        _log.error("jaren_jobs: worker %r: the store is closed; halting (%s)", self.owner, exc)
        self._halt_for(exc)
        return []
    except JobsError as exc:
        with self._lock:
            self._counts["claim_errors"] += 1
        _log.warning(
            "jaren_jobs: worker %r: claim failed, retrying at the next poll: %s",
            self.owner,
            exc,
        )
        return []
    self._hold(jobs)
    return jobs


def _hold(self: Worker, jobs: list[ClaimedJob]) -> None:
    """Record leases taken but not started: leases() lists them, a cancel reaches them."""
    if not jobs:
        return
    at = time.monotonic()
    aborts: list[tuple[str, Callable[[Any], None]]] = []
    with self._lock:
        for job in jobs:
            held = _Held(job, next(self._lease_seqs), at)
            held.abort = abort = functools.partial(self._cancel_unstarted, held)
            self._held[id(job)] = held
            aborts.append((job.id, abort))
    with self._hub.lock:
        self._hub.local_attempts.update(aborts)


def _cancel_unstarted(self: Worker, held: _Held, reason: Any) -> None:
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


def _top_up(self: Worker, batch: _Batch, *, idle: bool = False) -> bool:
    """Ask the settling thread to lease more jobs for ``batch`` in its next write.

    While a job runs, the queue is topped up to ``_ahead()`` unstarted
    jobs; a loop that ran its queue dry (``idle``) asks for one more, to
    run at once. Whether a top-up is now on its way.
    """
    ahead = self._ahead()
    want = ahead + 1 if idle else ahead
    if want == 0 or (not idle and batch.unstarted() >= want):
        return False
    if not batch.ask(want):
        return False
    with self._lock:
        refused = self._settler_done or self._halt.aborted
        if not refused:
            self._refills.append(batch)
            if self._settler_waiting:
                self._posting.notify()
    if refused:
        batch.topped_up([])
        return False
    # each top-up that was not overrun lets the loop hold one more ahead
    self._ramp = ramped(self._ramp)
    return True


def _waited_too_long(self: Worker, job: ClaimedJob) -> bool:
    with self._lock:
        held = self._held.get(id(job))
    return held is not None and time.monotonic() - held.at > self._budget


def _take_back_stalled(self: Worker, now: float) -> None:
    """The renewal thread: hand back the unstarted jobs of batches stuck behind a slow job."""
    with self._lock:
        batches = list(self._batches)
    rest = [job for batch in batches for job in batch.take_stalled(now, self._budget)]
    if rest:
        self._ramp = 0
        self._hand_back(rest)
