"""Retry, backoff, dead-letter and lease arithmetic: pure functions of their inputs."""

from __future__ import annotations

import math
from typing import Literal

from jaren_jobs.errors import LeaseLost

__all__ = ["backoff_seconds", "failure_transition", "is_lease_lost", "lease_ms", "retry_at_ms"]


def is_lease_lost(error: BaseException) -> bool:
    """True for the three fence refusals: this attempt no longer holds its job."""
    return isinstance(error, LeaseLost)


def backoff_seconds(retry: int, base: float, cap: float, draw: float) -> float:
    """The jittered delay before retry ``retry`` (1-based): half fixed, half random.

    ``d = min(cap, base * 2**(retry-1))``; the delay is ``d/2 + draw*d/2``
    for a ``draw`` in [0, 1).
    """
    exponent = min(retry - 1, 64)  # 2**64 dwarfs any cap; keeps the float finite
    span = min(cap, base * 2.0**exponent)
    return span / 2 + draw * span / 2


def failure_transition(
    attempts: int, max_attempts: int, *, retry: bool
) -> Literal["dead", "failed"]:
    """Where a failed attempt sends its job: ``dead`` once attempts are spent or no retry."""
    if not retry or attempts >= max_attempts:
        return "dead"
    return "failed"


def retry_at_ms(now_ms: int, attempts: int, base: float, cap: float, draw: float) -> int:
    """When the retry after attempt ``attempts`` (the retry's number) may run, in epoch ms."""
    return now_ms + math.floor(backoff_seconds(attempts, base, cap, draw) * 1000)


def lease_ms(seconds: float) -> int:
    """A lease length in whole milliseconds, at least one."""
    return max(1, round(seconds * 1000))
