"""Running attempts: an attempt begins, its handler is called, it ends with one outcome."""

from __future__ import annotations

import itertools
import logging
import time

from jaren_jobs.engine.engine import JobEngine
from jaren_jobs.engine.hub import EngineHub
from jaren_jobs.errors import StorageError, describe_error
from jaren_jobs.observe import hooks
from jaren_jobs.records import ClaimedJob, CorruptJson, Outcome
from jaren_jobs.worker.attempt import (
    Attempt,
    Handler,
    JobContext,
    Ran,
    WorkerStopped,
    stopping_reason,
)
from jaren_jobs.worker.claims import ClaimBook
from jaren_jobs.worker.outcomes import Observers, log_outcome, outcome_of
from jaren_jobs.worker.renewals import Renewer
from jaren_jobs.worker.stats import COUNTER_OF, Stats
from jaren_jobs.worker.tracking import Tracker

__all__ = ["AttemptRunner"]

_log = logging.getLogger("jaren_jobs.worker")


class AttemptRunner:
    """Begins, calls and ends the attempts of one worker: its handlers, each attempt's
    registration (where a cancel finds it) and its one outcome."""

    def __init__(
        self,
        *,
        handlers: dict[str, Handler],
        control: JobEngine,
        hub: EngineHub,
        tracker: Tracker,
        claims: ClaimBook,
        stats: Stats,
        observers: Observers,
        renewer: Renewer,
        renew: bool,
    ) -> None:
        #: the handlers by kind (a lookup that raises fails the attempt)
        self.handlers = handlers
        self._control = control
        self._hub = hub
        self._tracker = tracker
        self._lock = tracker.lock
        self._claims = claims
        self._stats = stats
        self._observers = observers
        self._renewer = renewer
        self._renew = renew
        self._owner = tracker.owner
        self._keys = itertools.count(1)
        # the containers begin() and end() touch per attempt, looked up once (the
        # parts own them and never replace them)
        self._held = claims.held
        self._seqs = claims.seqs
        self._attempts = tracker.attempts
        self._counts = stats.counts
        self._halt = tracker.halt.signal
        self._hub_lock = hub.lock
        self._local = hub.local_attempts

    def begin(self, claimed: ClaimedJob) -> Attempt | None:
        """Start the attempt of a held job; None if a cancel with its lease came first."""
        with self._lock:
            held = self._held.pop(id(claimed), None)
            if held is not None and held.cancelled:
                attempt = None  # never started: no attempt, no outcome
            else:
                self._counts["claims"] += 1
                attempt = Attempt(claimed, next(self._keys), next(self._seqs))
                attempts = self._attempts
                first = not attempts
                attempts[attempt.key] = attempt
                if held is not None:
                    held.attempt = attempt  # a cancel arriving through held.abort reaches it
        if attempt is None:
            self._claims.forget([held])
            return None
        with self._hub_lock:
            self._local[claimed.id] = attempt.cancel
        if held is not None:
            held.abort = None  # the hub holds the attempt's now; no cycle left to collect
            if held.forced is not None:
                attempt.cancel(held.forced)
        if hooks.observers:  # SPEC §17: a consumer span, the start delay
            attempt.observed = hooks.attempt_started(claimed, self._control.runtime.now_ms())
        halt = self._halt
        if halt.aborted:  # else the tracker's callback of the halt reaches it
            attempt.scope.abort(halt.reason)
        renewer = self._renewer
        if self._renew:
            # a lease taken with a batch has been running since the claim
            attempt.renew_at = (time.monotonic() if held is None else held.at) + renewer.every
            if first:
                renewer.scheduler.wake()
        return attempt

    def call(self, attempt: Attempt, ran: list[Ran]) -> Outcome | None:
        """Run the handler; its result joins ``ran``. An outcome when it cannot run at all."""
        claimed = attempt.claimed
        if self._tracker.barred:
            # a claim that landed while stop() quiesced: it could never
            # settle, so its handler does not start at all
            return outcome_of(
                attempt,
                "lost",
                code=WorkerStopped.code,
                reason="the worker stopped before this attempt could run; its lease will "
                "expire and the job will be re-claimed",
            )
        if attempt.cancelled:
            # cancel(id, lease=...) committed between the take and now
            return outcome_of(attempt, "cancelled", reason="cancelled before its handler ran")
        if attempt.cancel_requested:
            # cancel(id, force=True) before the handler ran: it never runs; the
            # settlement (a failure of a marked job) cancels the job
            reason = attempt.scope.signal.reason
            error = reason if isinstance(reason, Exception) else RuntimeError(str(reason))
            attempt.error = error
            ran.append((attempt, error, None))
            return None
        started = time.perf_counter()
        try:
            # inside the try: a lookup that raises fails this attempt, it is
            # not an interrupt of the worker
            handler = self.handlers[claimed.kind]
            ctx = JobContext(attempt, self._control, attempt.scope.signal, self._owner)
            if isinstance(claimed.payload, CorruptJson):
                # a row written outside the library: the handler could only
                # misread it, so the attempt fails (and dead-letters after
                # its attempts) with an error that names the row
                raise StorageError(
                    f"job {claimed.id!r} holds a payload that is not JSON "
                    f"({claimed.payload.error}); it was written outside jaren_jobs — "
                    "fix the row and requeue the job, or cancel it",
                    job_id=claimed.id,
                )
            if attempt.observed is None:
                result = handler(claimed.payload, ctx)
            else:  # SPEC §17: the attempt's span is current while its handler runs
                result = hooks.call(attempt.observed, handler, claimed.payload, ctx)
        except Exception as exc:
            attempt.error = exc
            ran.append((attempt, exc, None))
        else:
            ran.append((attempt, None, result))
        finally:
            self._claims.measured(time.perf_counter() - started)
        return None

    def end(self, attempt: Attempt, outcome: Outcome) -> None:
        """The attempt's one outcome: counted, logged, traced, and seen by the observer."""
        attempt.ended = True
        local = self._local
        with self._hub_lock:
            if local.get(attempt.job_id) == attempt.cancel:
                del local[attempt.job_id]
        counter = COUNTER_OF[outcome.outcome]
        with self._lock:
            self._attempts.pop(attempt.key, None)
            self._counts[counter] += 1
        # logged here, once per attempt, before the observers hear of it
        log_outcome(self._owner, attempt, outcome)
        if attempt.observed is not None:  # SPEC §17
            hooks.attempt_ended(attempt.observed, attempt.claimed, outcome, attempt.error)
        observers = self._observers
        if observers.on_outcome is not None:
            observers.notify("on_outcome", observers.on_outcome, outcome)

    def abandon(self, attempt: Attempt, exc: BaseException) -> Outcome:
        """A handler raised KeyboardInterrupt/SystemExit: settle nothing, halt the worker."""
        with attempt.lease_lock:
            attempt.ended = True
        self._tracker.interrupted = exc
        _log.error(
            "jaren_jobs: worker %r: the handler of job %r raised %s; the worker stops "
            "claiming and the attempt is left unsettled (its lease expires and the job is "
            "re-claimed). Call stop() or close the store to finish shutting down.",
            self._owner,
            attempt.job_id,
            type(exc).__name__,
            exc_info=exc,
        )
        why = f"a handler raised {type(exc).__name__}"
        self._tracker.halt_for(stopping_reason(self._owner, why))
        return outcome_of(
            attempt,
            "lost",
            phase="failure",
            reason=f"{describe_error(exc)} (the handler interrupted the worker; the attempt "
            "was left for lease-expiry recovery)",
        )
