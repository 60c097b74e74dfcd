"""Per-store in-process state every engine view of one store shares (typed).

The clock and defaults, the wake-ups of in-process workers and waiters, and
this process's in-flight attempts by job id (so a cancel can abort one).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from jaren_jobs.errors import CancelRequested
from jaren_jobs.records import StopOutcome
from jaren_jobs.runtime import Defaults, ResolvedRuntime

__all__ = ["CancelRequested", "EngineHub", "Stoppable"]


class Stoppable(Protocol):
    """What the store's close() needs of a live worker (the worker layer sits above)."""

    def stop(self, grace_seconds: float | None = None) -> StopOutcome: ...


@dataclass
class EngineHub:
    """What every engine view of one store shares: clock, defaults, wake-ups, attempts."""

    runtime: ResolvedRuntime
    defaults: Defaults
    wakers: set[Callable[[], None]] = field(default_factory=set)
    # in-flight attempts of THIS process by job id -> abort(reason); the
    # fence guarantees at most one live attempt per job
    local_attempts: dict[str, Callable[[Any], None]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # live workers of this store, so close() can stop them first
    workers: set[Stoppable] = field(default_factory=set)
    # wait() calls of this process, woken by every settlement's commit
    # (each a thread-safe callable that never blocks)
    settle_waiters: set[Callable[[], None]] = field(default_factory=set)
    # each live worker's "renew the lease on this job now, if you hold it":
    # what another process's forced cancel (PostgreSQL's NOTIFY) calls
    renewers: set[Callable[[str], None]] = field(default_factory=set)

    def settled(self) -> None:
        """A settlement committed (here, or in another process): every waiter reads again."""
        with self.lock:
            waiters = list(self.settle_waiters)
        for wake in waiters:
            wake()

    def wake(self) -> None:
        with self.lock:
            wakers = list(self.wakers)
        for wake in wakers:
            wake()

    def cancel_requested(self, job_id: str) -> None:
        """Another process marked ``job_id`` for cancellation: its holder here renews now.

        The renewal reads the mark back and aborts the attempt; a worker not
        holding the job does nothing. Never blocks (the listener's thread calls it).
        """
        with self.lock:
            renewers = list(self.renewers)
        for renew in renewers:
            renew(job_id)

    def abort_local(self, job_id: str, reason: Any) -> None:
        with self.lock:
            abort = self.local_attempts.get(job_id)
        if abort is not None:
            abort(reason)
