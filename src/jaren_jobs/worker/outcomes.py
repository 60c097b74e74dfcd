"""Outcome decisions: from a settlement's answer to the attempt's one outcome.

Pure functions of (attempt, entry, fence row): the answer (written, a refusal,
or the fence row a write that wrote nothing met) decides; nothing here reads
the row again. Then the observers, which hear each outcome once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

from jaren_jobs.core.fence import FenceRow, settled_by
from jaren_jobs.core.policy import failure_transition
from jaren_jobs.core.settle import Completion, Settlement, Snoozing
from jaren_jobs.errors import (
    GateRefused,
    JobsError,
    JobSettled,
    LeaseLost,
    StorageError,
    StoreClosed,
    describe_error,
)
from jaren_jobs.records import (
    Outcome,
    OutcomeName,
    assemble,
)
from jaren_jobs.worker.attempt import Attempt, WorkerStopped, stopping_reason
from jaren_jobs.worker.tracking import Tracker

_log = logging.getLogger("jaren_jobs.worker")


Phase = Literal["completion", "failure", "snooze"]


class Entry:
    """One returned attempt on its way to an outcome: its settlement, or the outcome at once."""

    __slots__ = (
        "attempt",
        "error",
        "item",
        "met",
        "outcome",
        "retry_at",
        "row",
        "tries",
        "wrote",
    )

    def __init__(self, attempt: Attempt, error: Exception | None) -> None:
        self.attempt = attempt
        self.error = error  # what the attempt is failed with (None: it completes)
        self.item: Settlement | None = None
        # its last write's answer: the refusal or error it met (None: it
        # holds), and whether that write wrote it (False: already settled)
        self.met: BaseException | None = None
        self.wrote = False
        # the fence row its last write met when it wrote nothing: how the job
        # ended, for the outcome (None: it wrote, or the write failed)
        self.row: FenceRow | None = None
        self.outcome: Outcome | None = None  # decided without a write (cancelled, lost)
        self.tries = 0  # writes of its settlement that met a transient error
        self.retry_at = 0.0  # time.monotonic() of its next write, once one failed


def refusal_outcome(
    attempt: Attempt,
    phase: Phase,
    exc: BaseException,
    row: FenceRow | None = None,
) -> Outcome | None:
    """A settlement the fence refused, or the stop barred: the attempt is lost."""
    if isinstance(exc, LeaseLost):
        return lost(attempt, phase, exc, row)
    if isinstance(exc, StoreClosed):
        return outcome_of(attempt, "lost", phase=phase, code=exc.code, reason=describe_error(exc))
    return None


def finish(owner: str, entry: Entry, refail: Callable[[Entry], None]) -> Outcome:
    """The outcome of a committed (or refused) settlement.

    A completion the store could not write (not refused: an error) fails the attempt
    instead: ``refail`` writes the entry's failure, and its answer decides.
    """
    attempt, item = entry.attempt, entry.item
    assert item is not None
    exc = entry.met
    if isinstance(item, Snoozing):
        return snoozed(owner, entry, item)
    if isinstance(item, Completion):
        if exc is None:
            return written(attempt, "completed", entry.row)
        refused = refusal_outcome(attempt, "completion", exc, entry.row)
        if refused is not None:
            return refused
        _log.warning(
            "jaren_jobs: worker %r: completing job %r failed; failing the attempt instead: %s",
            owner,
            attempt.job_id,
            exc,
        )
        entry.error = exc if isinstance(exc, Exception) else RuntimeError(str(exc))
        attempt.error = entry.error
        refail(entry)
        exc = entry.met
    error = entry.error
    assert error is not None
    if exc is None and entry.wrote and attempt.cancel_requested:
        # the failure of a job cancel(id, force=True) marked: the store cancelled it
        return outcome_of(attempt, "cancelled", reason="cancelled by cancel(id, force=True)")
    if exc is None:
        if not entry.wrote:
            return recorded(attempt, entry.row) or failed(attempt, error)
        return failed(attempt, error)
    refused = refusal_outcome(attempt, "failure", exc, entry.row)
    if refused is not None:
        return refused
    # not recorded; the lease expires and the job is re-claimed
    _log.warning(
        "jaren_jobs: worker %r: recording the failure of job %r failed (%s); its "
        "lease will expire and it will be re-claimed",
        owner,
        attempt.job_id,
        exc,
    )
    return failed(attempt, error)


def snoozed(owner: str, entry: Entry, item: Snoozing) -> Outcome:
    """The outcome of a snooze (or a stop hand-back): ``"snoozed"``, or ``"lost"``."""
    attempt, exc = entry.attempt, entry.met
    reason = (
        "handed back: the worker stopped while the handler ran; pending again now, "
        "the attempt not spent"
        if item.stopping
        else f"snoozed for {item.delay_ms} ms; the attempt not spent"
    )
    if exc is None:
        truth = recorded(attempt, entry.row)
        if truth is not None and truth.outcome != "snoozed":
            return truth  # this attempt had settled the job otherwise already
        # a hand-back names why, as a stop's lost attempt does (JD2091)
        code = WorkerStopped.code if item.stopping else None
        return outcome_of(attempt, "snoozed", code=code, reason=reason)
    refused = refusal_outcome(attempt, "snooze", exc, entry.row)
    if refused is not None:
        return refused
    # not recorded: the lease expires and the job is re-claimed (an attempt spent)
    _log.warning(
        "jaren_jobs: worker %r: snoozing job %r failed (%s); its lease will expire and "
        "it will be re-claimed",
        owner,
        attempt.job_id,
        exc,
    )
    return outcome_of(
        attempt,
        "lost",
        phase="snooze",
        code=exc.code if isinstance(exc, JobsError) else None,
        reason=describe_error(exc),
    )


def written(attempt: Attempt, outcome: OutcomeName, row: FenceRow | None) -> Outcome:
    # True from a settlement that wrote nothing (``row``: the fence row it
    # met) means THIS attempt had already settled the row: by
    # ctx.checkpoints.complete, by the handler calling the engine with
    # ctx.lease, or by cancel(id, lease=...) whose abort has not reached us
    # yet. The row says which.
    truth = recorded(attempt, row)
    if truth is not None:
        return truth
    return outcome_of(attempt, outcome)


def failed(attempt: Attempt, error: BaseException) -> Outcome:
    return outcome_of(
        attempt,
        "failed",
        phase=None,
        code=error.code if isinstance(error, JobsError) else None,
        reason=describe_error(error),
    )


def lost(
    attempt: Attempt,
    phase: Phase,
    error: LeaseLost,
    row: FenceRow | None = None,
) -> Outcome:
    if isinstance(error, JobSettled):
        # "not leased" may be this attempt's own settlement (a cancel with
        # its lease, a handler that settled through ctx.lease): the fence
        # row the settlement met says
        truth = recorded(attempt, row)
        if truth is not None:
            return truth
    return outcome_of(attempt, "lost", phase=phase, code=error.code, reason=describe_error(error))


def recorded(attempt: Attempt, row: FenceRow | None) -> Outcome | None:
    """The outcome a fence row records for this attempt, if it records one (pure)."""
    if row is None or not settled_by(row, attempt.lease):
        return None  # not settled, or settled by another attempt
    if row.state == "done":
        return outcome_of(attempt, "completed")
    if row.state == "cancelled":
        return outcome_of(attempt, "cancelled", reason="cancelled")
    if row.state in ("failed", "dead"):
        return outcome_of(attempt, "failed", reason=row.last_error)
    if row.state == "pending":  # snoozed by this attempt (ctx.lease, store.jobs.snooze)
        return outcome_of(attempt, "snoozed", reason="snoozed")
    return None


def outcome_of(
    attempt: Attempt,
    outcome: OutcomeName,
    *,
    phase: Phase | None = None,
    code: str | None = None,
    reason: str | None = None,
) -> Outcome:
    lease = attempt.lease
    # one per attempt: built without the frozen dataclass's __init__ (assemble)
    return assemble(
        Outcome,
        {
            "outcome": outcome,
            "job_id": lease.job_id,
            "kind": attempt.claimed.kind,
            "attempt": lease.attempt,
            "generation": lease.generation,
            "phase": phase,
            "code": code,
            "reason": reason,
        },
    )


def log_outcome(owner: str, attempt: Attempt, outcome: Outcome) -> None:
    """One line per attempt, at the level its outcome deserves (SPEC §13 "Logs").

    A completion or a snooze is routine (DEBUG); a cancellation is an
    operator's act (INFO); a failed attempt that will be retried is a
    WARNING with the handler's traceback, a dead letter an ERROR with it; a
    lost attempt (refused by name, or barred by a stop) a WARNING. The line
    names the job, its kind, the attempt and the outcome, never the lease
    token (a :class:`~jaren_jobs.Lease` is never formatted here).
    """
    name = outcome.outcome
    if name in ("completed", "snoozed"):
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug(
                "jaren_jobs: worker %r: job %r (kind %r) attempt %d %s%s",
                owner,
                outcome.job_id,
                outcome.kind,
                outcome.attempt,
                name,
                f": {outcome.reason}" if outcome.reason else "",
            )
        return
    if name == "cancelled":
        _log.info(
            "jaren_jobs: worker %r: job %r (kind %r) attempt %d cancelled",
            owner,
            outcome.job_id,
            outcome.kind,
            outcome.attempt,
        )
        return
    if name == "lost":
        _log.warning(
            "jaren_jobs: worker %r: job %r (kind %r) attempt %d lost%s%s: %s",
            owner,
            outcome.job_id,
            outcome.kind,
            outcome.attempt,
            f" at its {outcome.phase}" if outcome.phase else "",
            f" ({outcome.code})" if outcome.code else "",
            outcome.reason,
        )
        return
    error = attempt.error
    retry = error is None or retryable(error)
    most = attempt.claimed.max_attempts
    dead = failure_transition(outcome.attempt, most, retry=retry) == "dead"
    # the handler's own exception, with its traceback (None when the attempt
    # was failed through its lease rather than by raising)
    exc_info = error if error is not None and error.__traceback__ is not None else None
    if dead:
        _log.error(
            "jaren_jobs: worker %r: job %r (kind %r) attempt %d of %d failed; dead letter%s: %s",
            owner,
            outcome.job_id,
            outcome.kind,
            outcome.attempt,
            most,
            "" if retry else " (the error says no retry can cure it)",
            outcome.reason,
            exc_info=exc_info,
        )
    else:
        _log.warning(
            "jaren_jobs: worker %r: job %r (kind %r) attempt %d of %d failed; it will be "
            "retried: %s",
            owner,
            outcome.job_id,
            outcome.kind,
            outcome.attempt,
            most,
            outcome.reason,
            exc_info=exc_info,
        )


def interrupted(attempt: Attempt) -> Outcome:
    return outcome_of(attempt, "lost", phase="failure", reason="the attempt was interrupted")


def is_wait(exc: BaseException) -> bool:
    """A write that gave up waiting: for the store's gate, or for SQLite's lock."""
    if isinstance(exc, GateRefused):
        return exc.details.get("reason") == "timeout"
    if isinstance(exc, StorageError):
        return str(exc.details.get("sqlite_error", "")).startswith(("SQLITE_BUSY", "SQLITE_LOCKED"))
    return False


def retryable(error: BaseException) -> bool:
    """False when the error says no retry can cure it (``retryable = False``, e.g. RunMismatch)."""
    try:
        return getattr(error, "retryable", True) is not False
    except Exception:  # a hostile __getattr__ must not break settlement
        return True


class Observers:
    """The worker's observers (``on_outcome``, ``on_renewal``, ``on_idle``): each call
    guarded, so that an observer's failure never reaches the worker's threads."""

    def __init__(
        self,
        tracker: Tracker,
        on_outcome: Callable[[Outcome], Any] | None,
        on_renewal: Callable[..., Any] | None,
        on_idle: Callable[[], Any] | None,
    ) -> None:
        self._tracker = tracker
        self.on_outcome = on_outcome
        self.on_renewal = on_renewal
        self.on_idle = on_idle

    def notify(self, name: str, observer: Callable[..., Any] | None, *args: Any) -> None:
        if observer is None:
            return
        try:
            observer(*args)
        except Exception:  # an observer's failure never affects the worker
            _log.exception(
                "jaren_jobs: worker %r: the %s observer raised; ignored", self._tracker.owner, name
            )
        except BaseException as exc:
            # never out of this thread: it may be the settling thread, whose
            # death would leave every posted attempt without an outcome
            self._interrupted(name, exc)

    def _interrupted(self, name: str, exc: BaseException) -> None:
        """An observer raised KeyboardInterrupt/SystemExit (or another BaseException): halt."""
        tracker = self._tracker
        if tracker.interrupted is None:
            tracker.interrupted = exc
        _log.error(
            "jaren_jobs: worker %r: the %s observer raised %s; the worker stops claiming, "
            "and every attempt under way still settles and gets its outcome. Call stop() or "
            "close the store to finish shutting down.",
            tracker.owner,
            name,
            type(exc).__name__,
            exc_info=exc,
        )
        why = f"the {name} observer raised {type(exc).__name__}"
        tracker.halt_for(stopping_reason(tracker.owner, why))
        # run_once() re-raises it in its caller's thread once its step is done
        tracker.local.interrupt = exc
