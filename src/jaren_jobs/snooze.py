"""``jaren_jobs.Snooze``: what a handler raises to say "try again later, this does not count".

A snoozed attempt is not a failure: the job goes back to ``pending`` at
``now + delay_seconds`` with its attempt given back (``attempts`` as it was
before the claim), so a job that waits on something outside (a rate limit,
a resource not ready yet) can snooze any number of times without ever
being dead-lettered. The settlement is fenced like a completion (SPEC §12).
"""

from __future__ import annotations

import math

from jaren_jobs.runtime import check_seconds

__all__ = ["Snooze", "snooze_ms"]


class Snooze(Exception):
    """Raise from a handler to put the job back to pending at ``now + delay_seconds``.

    ``delay_seconds`` is a finite number >= 0 (a bool is refused); the
    attempt is not spent. The worker reports the outcome ``"snoozed"``.
    Outside a worker, ``store.jobs.snooze(lease, delay_seconds)`` does the same.
    """

    def __init__(self, delay_seconds: float) -> None:
        delay = check_seconds(delay_seconds, "Snooze(): delay_seconds", allow_zero=True)
        super().__init__(delay)
        self.delay_seconds = delay

    def __str__(self) -> str:
        return f"snoozed for {self.delay_seconds:g} s"

    def __repr__(self) -> str:
        return f"Snooze({self.delay_seconds!r})"


def snooze_ms(delay_seconds: float) -> int:
    """A checked delay in whole milliseconds (floored, as ``delay_seconds`` on enqueue)."""
    return math.floor(delay_seconds * 1000)
