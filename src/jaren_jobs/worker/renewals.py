"""Lease renewals: the renewer (what one renewal does) and the thread that runs them when due."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from jaren_jobs.backend import Missed, Renewal
from jaren_jobs.core.fence import renewal_refusal
from jaren_jobs.core.policy import lease_ms
from jaren_jobs.engine.engine import JobEngine
from jaren_jobs.errors import (
    CancelRequested,
    JobsError,
    StoreClosed,
)
from jaren_jobs.records import Lease
from jaren_jobs.worker.attempt import Attempt
from jaren_jobs.worker.claims import ClaimBook
from jaren_jobs.worker.outcomes import Observers
from jaren_jobs.worker.stats import Stats
from jaren_jobs.worker.tracking import Tracker

__all__ = ["RENEW", "RenewalScheduler", "RenewalThread", "Renewer"]

_log = logging.getLogger("jaren_jobs.worker")

RENEW = "renew()"  # what a renewal's refusals and errors name, as engine.renew()'s do


class RenewalScheduler(Protocol):
    """What a worker asks of its renewal scheduler: this module's thread, or an
    AsyncWorker's task on its loop (jaren_jobs.aio.renewals)."""

    @property
    def thread(self) -> threading.Thread | None: ...

    def start(self) -> None: ...

    def wake(self) -> None: ...

    def stop(self, timeout_seconds: float) -> bool: ...


class RenewalThread:
    """One thread renewing every running attempt's lease when it falls due.

    Every attempt of a worker renews on the same period, so rather than one
    timer per attempt the thread wakes every quarter period while attempts
    are in flight, and renews those whose ``renew_at`` has passed (a renewal
    is at most a quarter period late, well inside the lease's remaining two
    thirds). Starting an attempt costs one assignment, not a timer.
    """

    def __init__(
        self,
        name: str,
        renew: Callable[[Attempt], None],
        due: Callable[[float], list[Attempt]],
        busy: Callable[[], bool],
        tick_seconds: float,
    ) -> None:
        self._name = name
        self._renew = renew
        self._due = due  # the attempts whose renewal has fallen due by then
        self._busy = busy  # whether any attempt is in flight
        self._tick = tick_seconds
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def start(self) -> None:
        with self._cond:
            if self._thread is not None or self._stopped:
                return
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """An attempt started while none was in flight: the thread starts ticking."""
        with self._cond:
            self._cond.notify()

    def stop(self, timeout_seconds: float) -> bool:
        """Disarm every renewal and join the thread; False if it did not exit in time."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout_seconds)
        return not thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                # idle: sleep until an attempt starts (wake() is called under
                # this lock after the attempt is registered: no lost wake-up)
                self._cond.wait(self._tick if self._busy() else None)
                if self._stopped:
                    return
            for attempt in self._due(time.monotonic()):
                with self._cond:
                    if self._stopped:
                        return
                try:
                    self._renew(attempt)
                except Exception:  # a bug here must not end every other renewal
                    _log.exception("jaren_jobs: a lease renewal raised unexpectedly")


class Renewer:
    """What one renewal of an attempt's lease does, for the renewal thread here and an
    AsyncWorker's renewal task (jaren_jobs.aio.renewals).

    The steps of one renewal: :meth:`renewable` and :meth:`answered` run under the
    attempt's ``lease_lock`` with the renewal's write between them, :meth:`renewed`
    after it is released; :meth:`failed` keeps the lease when the write met an error.
    """

    def __init__(
        self,
        *,
        tracker: Tracker,
        claims: ClaimBook,
        stats: Stats,
        observers: Observers,
        control: JobEngine,
        lease_seconds: float,
        name: str,
        scheduler: Callable[[Renewer], RenewalScheduler] | None = None,
    ) -> None:
        self._tracker = tracker
        self._lock = tracker.lock
        self._claims = claims
        self._stats = stats
        self._observers = observers
        self._control = control
        self._owner = tracker.owner
        #: the worker's name (its threads' names start with it)
        self.name = name
        self.lease_seconds = lease_seconds
        self.every = lease_seconds / 3  # a lease is renewed when a third of it has passed
        #: the scheduler that runs renewals: a thread, or an AsyncWorker's task
        self.scheduler: RenewalScheduler = (
            RenewalThread(
                f"{name}-renewals", self.renew, self.due_with_stalls, self.busy, self.every / 4
            )
            if scheduler is None
            else scheduler(self)
        )

    @property
    def owner(self) -> str:
        return self._owner

    def busy(self) -> bool:
        """Whether any attempt is in flight."""
        return bool(self._tracker.attempts)

    def running(self) -> list[Attempt]:
        """The attempts in flight now."""
        with self._lock:
            return list(self._tracker.attempts.values())

    def has_batches(self) -> bool:
        """Whether any loop holds a queue (whose jobs a stall may take back)."""
        return bool(self._claims.batches)

    def take_back_stalled(self, now: float) -> None:
        """Hand back the unstarted jobs of batches stuck behind a slow job."""
        self._claims.take_back_stalled(now)

    def due_with_stalls(self, now: float) -> list[Attempt]:
        """The renewal thread's tick: stalled batches handed back, then the due attempts."""
        if self._claims.batches:
            self._claims.take_back_stalled(now)
        return self.due(now)

    def due(self, now: float) -> list[Attempt]:
        """The running attempts whose renewal has fallen due by ``now``."""
        with self._lock:
            return [
                attempt
                for attempt in self._tracker.attempts.values()
                if attempt.renew_at <= now and not attempt.ended and attempt.lost is None
            ]

    def renew(self, attempt: Attempt) -> None:
        """Renew ``attempt``'s lease in this thread."""
        with attempt.lease_lock:
            lease = self.renewable(attempt)
            if lease is None:
                return
            try:
                # the session's answer, not engine.renew()'s raise: a refusal
                # keeps the fence row it met, which decides the outcome later
                # (this attempt may have settled the job itself), with no re-read
                answer = self._control.session.renew(lease, lease_ms(self.lease_seconds), RENEW)
            except StoreClosed:
                return  # stopping (or closed): no more renewals
            except JobsError as exc:
                self.failed(attempt, exc)
                return
            fresh = self.answered(attempt, lease, answer)
        if fresh is not None:
            self.renewed(attempt, fresh)

    def renewable(self, attempt: Attempt) -> Lease | None:
        """The lease to renew (the caller holds ``attempt.lease_lock``); None if it ended."""
        if attempt.ended or attempt.lost is not None:
            return None
        return attempt.lease

    def failed(self, attempt: Attempt, exc: JobsError) -> None:
        """The renewal met a storage error (a busy database, a gate timeout): the current
        lease stays in force and the next tick tries again."""
        _log.warning(
            "jaren_jobs: worker %r: renewing the lease on job %r failed; retrying: %s",
            self._owner,
            attempt.job_id,
            exc,
        )
        attempt.renew_at = time.monotonic() + self.every

    def answered(self, attempt: Attempt, lease: Lease, answer: Renewal | Missed) -> Renewal | None:
        """The renewal's answer applied to the attempt (under its lease_lock): the
        renewal, or None if a fence refusal proved the lease lost."""
        if isinstance(answer, Missed):
            # only the fence's refusals prove the attempt no longer holds
            # the job: abort its signal; it may never settle
            now = self._control.runtime.now_ms()
            refused = renewal_refusal(answer.row, lease, now, RENEW)
            attempt.lost, attempt.lost_row = refused, answer.row
            attempt.scope.abort(refused)
            _log.warning(
                "jaren_jobs: worker %r lost the lease on job %r: %s",
                self._owner,
                attempt.job_id,
                refused,
            )
            return None
        attempt.lease = answer.lease
        attempt.renew_at = time.monotonic() + self.every
        with self._lock:
            attempt.lease_seq = next(self._claims.seqs)
            self._stats.add("renewals")
        return answer

    def renewed(self, attempt: Attempt, answer: Renewal) -> None:
        """After a renewal (lease_lock released): a forced cancel it read back, the observer."""
        if answer.cancel_requested and not attempt.cancel_requested:
            # cancel(id, force=True) in another process marked the job: the
            # renewal read the mark back, so this attempt winds up now
            attempt.cancel(
                CancelRequested(
                    f"job {attempt.job_id!r} was cancelled by cancel(id, force=True) (seen "
                    "at its lease renewal): wind up; the job ends cancelled unless this "
                    "attempt completes first",
                    job_id=attempt.job_id,
                )
            )
        self._observers.notify("on_renewal", self._observers.on_renewal, answer.lease)

    def renew_soon(self, job_id: str) -> None:
        """Another process marked ``job_id`` (PostgreSQL's NOTIFY): renew its lease now, if
        held.

        Only a renewal falling due early: the renewal statement is what reads the
        mark, so a notification names no attempt and proves nothing by itself.
        """
        with self._lock:
            held = [
                a for a in self._tracker.attempts.values() if a.job_id == job_id and not a.ended
            ]
            for attempt in held:
                attempt.renew_at = 0.0
            ahead = self._claims.held_waiting(job_id)
        for waiting in ahead:
            # a job leased ahead and not started: its handler never starts. The notice is
            # enough here: only cancel(id, force=True) sends it, with the commit of a mark
            # on a leased row, and while this worker's lease on the job lives no other
            # attempt's lease can be the one marked (a marked lease that ran out ends the
            # job cancelled, never claimed again)
            self._claims.cancel_unstarted(
                waiting,
                CancelRequested(
                    f"job {job_id!r} was cancelled by cancel(id, force=True) in another "
                    "process before its handler started: it never runs, and the job ends "
                    "cancelled",
                    job_id=job_id,
                ),
            )
        if held:
            self.scheduler.wake()
