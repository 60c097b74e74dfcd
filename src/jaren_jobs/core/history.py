"""The error-history and snooze calls' preparations, kept off the engine shell.

``fail()`` (and the worker's batched failures) describe the error and
format its traceback here, once, before any write; ``errors()`` turns the
session's history rows into :class:`~jaren_jobs.JobError` records;
``snooze()`` checks its delay here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime

from jaren_jobs.codec import datetime_from_ms
from jaren_jobs.core.commands import Failure, prepare_fail, require_lease
from jaren_jobs.core.settle import SNOOZE, Snoozing
from jaren_jobs.records import JobError
from jaren_jobs.runtime import Defaults, check_seconds
from jaren_jobs.snooze import snooze_ms
from jaren_jobs.tracebacks import format_traceback

__all__ = ["error_records", "prepare_failure_with", "prepare_snoozing"]


def prepare_failure_with(
    defaults: Defaults,
    lease: object,
    error: object,
    *,
    retry: object,
    backoff_base_seconds: float | None,
    backoff_cap_seconds: float | None,
    what: str,
) -> Failure:
    """A failure's checks, before any write; the error is described here, once.

    An exception instance that was raised (it has a ``__traceback__``) also
    gives the attempt's history entry its formatted traceback (SPEC §13).
    """
    failure = prepare_fail(
        defaults,
        lease,
        error,
        retry=retry,
        backoff_base_seconds=backoff_base_seconds,
        backoff_cap_seconds=backoff_cap_seconds,
        what=what,
    )
    text = format_traceback(error, failure.lease.token)
    return failure if text is None else dataclasses.replace(failure, traceback=text)


def error_records(rows: Iterable[tuple[int, int, str, str | None]]) -> list[JobError]:
    """The session's history rows ``(attempt, at_ms, error, traceback)`` as records."""
    return [JobError(attempt, _utc(at), error, traceback) for attempt, at, error, traceback in rows]


def prepare_snoozing(lease: object, delay_seconds: object) -> Snoozing:
    """``snooze()``'s checks: the lease, and a finite delay >= 0 in whole milliseconds."""
    current = require_lease(lease, SNOOZE)
    delay = check_seconds(delay_seconds, f"{SNOOZE}: delay_seconds", allow_zero=True)
    return Snoozing(current, snooze_ms(delay))


def _utc(ms: int) -> datetime:
    at = datetime_from_ms(ms)
    assert at is not None
    return at
