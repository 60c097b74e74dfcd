"""``wait()``: from a job id to the settled job, woken as promptly as the database allows.

One plan serves ``store.jobs.wait`` (a thread blocks on an event) and
``AsyncJobs.wait`` (a task awaits one; the loop never blocks). Wake-ups
come from three places, and the job's row is read again after each:

* in this process, every settlement's commit wakes the store's waiters at
  once (:meth:`EngineHub.settled`);
* across processes on PostgreSQL, the settlement's ``NOTIFY`` (sent with its
  commit) reaches the store's listener, which does the same;
* otherwise (SQLite across processes, a store without a listener) a poll
  whose pause doubles from a few milliseconds up to a short bound.

A poll still runs behind a listener (once a second): a notification sent
while the listener reconnects is never waited for forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from jaren_jobs.core.commands import check_id
from jaren_jobs.errors import DeadlinePassed, GateRefused, OperationCancelled, UnknownJob
from jaren_jobs.records import Job
from jaren_jobs.runtime import ResolvedRuntime, check_seconds
from jaren_jobs.signals import SignalLike, check_signal_arg, refuse_if_cancelled

if TYPE_CHECKING:
    from jaren_jobs.backend import JobsSession, StoreBackend
    from jaren_jobs.backend_async import AsyncJobsSession

__all__ = ["SETTLED_STATES", "WaitPlan", "plan_wait"]

SETTLED_STATES = frozenset({"done", "dead", "cancelled"})

# the poll's first pause and its bound, where no notification can come
_POLL_FIRST_SECONDS = 0.005
_POLL_MOST_SECONDS = 0.1
# the poll behind a listener: only for what a reconnection could lose
_POLL_LISTENED_SECONDS = 1.0


class WaitHub(Protocol):
    """What a wait needs of the store's engine hub (``engine.EngineHub``)."""

    lock: threading.Lock
    settle_waiters: set[Callable[[], None]]

    def settled(self) -> None: ...


class WaitPlan:
    """One ``wait()`` call's wake-ups, deadline and verdicts (checked arguments only)."""

    __slots__ = (
        "_backend",
        "_end",
        "_hub",
        "_listened",
        "_pause",
        "_unsubscribe",
        "_wake",
        "job_id",
        "signal",
        "timeout",
        "what",
    )

    def __init__(
        self,
        hub: WaitHub,
        backend: StoreBackend,
        *,
        job_id: str,
        timeout: float | None,
        signal: SignalLike | None,
        what: str,
    ) -> None:
        self._hub = hub
        self._backend = backend
        self.job_id = job_id
        self.timeout = timeout
        self.signal = signal
        self.what = what
        self._end = None if timeout is None else time.monotonic() + timeout
        self._pause = _POLL_FIRST_SECONDS
        self._listened = False
        self._wake: Callable[[], None] | None = None
        self._unsubscribe: Callable[[], None] | None = None

    def start(self, wake: Callable[[], None]) -> None:
        """Subscribe ``wake`` (thread-safe, never blocks) to every wake-up source."""
        self._wake = wake
        hub = self._hub
        with hub.lock:
            hub.settle_waiters.add(wake)
        # the hub's own method: registered once per store, however many wait
        self._listened = self._backend.wake_on_settlements(hub.settled)
        add_callback = getattr(self.signal, "add_callback", None)
        if callable(add_callback):
            self._unsubscribe = add_callback(wake)

    def stop(self) -> None:
        """Unsubscribe (idempotent): a finished wait holds nothing."""
        if self._wake is not None:
            with self._hub.lock:
                self._hub.settle_waiters.discard(self._wake)
            self._wake = None
        if self._unsubscribe is not None:
            unsubscribe, self._unsubscribe = self._unsubscribe, None
            unsubscribe()

    def verdict(self, job: Job | None) -> Job | None:
        """The job once settled; ``None`` to wait on; or the refusal raised."""
        if job is None:
            raise UnknownJob(
                f"{self.what}: no job has id {self.job_id!r} (never enqueued, or swept)",
                job_id=self.job_id,
            )
        if job.state in SETTLED_STATES:
            return job
        signal = self.signal
        if signal is not None and signal.aborted:
            raise OperationCancelled(
                f"{self.what} gave up waiting for job {self.job_id!r}: its signal was "
                f"aborted ({signal.reason!r}); the job is {job.state!r}",
                job_id=self.job_id,
                state=job.state,
            )
        if self._end is not None and time.monotonic() >= self._end:
            raise DeadlinePassed(
                f"{self.what}: job {self.job_id!r} was not settled within "
                f"{self.timeout:g} s (it is {job.state!r}); wait again, or give a longer "
                "timeout_seconds",
                job_id=self.job_id,
                state=job.state,
                timeout_seconds=self.timeout,
            )
        return None

    def pause(self) -> float:
        """How long to sleep before reading the row again, if nothing wakes the waiter."""
        if self._listened:
            pause = _POLL_LISTENED_SECONDS
        else:
            pause = self._pause
            self._pause = min(self._pause * 2, _POLL_MOST_SECONDS)
        if self._end is not None:
            pause = min(pause, max(0.0, self._end - time.monotonic()))
        return pause


def plan_wait(
    session: JobsSession | AsyncJobsSession,
    hub: WaitHub,
    runtime: ResolvedRuntime,
    *,
    id: object,
    timeout_seconds: object,
    signal: object,
) -> WaitPlan:
    """``wait()``'s checked arguments and refusals before it waits (sync and async alike)."""
    what = "wait()"
    job_id = check_id(id, f"{what}: id")
    timeout = (
        None
        if timeout_seconds is None
        else check_seconds(timeout_seconds, f"{what}: timeout_seconds", allow_zero=True)
    )
    sig = check_signal_arg(signal, what)
    refuse_if_cancelled(sig, None, runtime.now(), what)
    backend = session.store_backend
    backend.check_open(what)
    if not session.scope.root or backend.in_my_transaction():
        raise GateRefused(
            f"{what} was called inside store.transaction(): the transaction holds the "
            "store's connection, so no other settlement could ever be seen from it; wait "
            "after the transaction ends (store.jobs.wait)",
            reason="reentrant",
            job_id=job_id,
        )
    return WaitPlan(hub, backend, job_id=job_id, timeout=timeout, signal=sig, what=what)
