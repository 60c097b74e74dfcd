"""An ``AsyncWorker``'s lease renewals: one task on its event loop (SPEC §7, §11).

It stands in for the thread worker's renewal thread (same ``start``/``wake``/
``stop``) and keeps its rules: it ticks every quarter period while attempts
are in flight, renews those that fell due, keeps the current lease on a
storage error, and only a fence refusal loses one. What differs is where the
write runs:

* on an async-native PostgreSQL store the renewal is awaited on the loop,
  through the store's pooled ``AsyncConnection`` (:func:`renew_on_loop`);
* on SQLite (and a store on the application's own connection) it runs on a
  thread the store owns, as every call of that store does (:func:`renew_on_thread`).

A task on the loop cannot renew while something blocks the loop: an ``async
def`` handler that calls ``time.sleep`` or a blocking driver stalls every task,
the renewal task among them, and its lease would run out under it (its
completion then refused, the job run again and again). So a watchdog thread
beside the task posts a callback to the loop every tick; one still unanswered
after two ticks means the loop is blocked, and while it stays blocked the
watchdog renews the due leases itself, through the worker's thread path (the
sync store underneath), and logs a WARNING naming the running async handlers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from jaren_jobs.core.policy import lease_ms
from jaren_jobs.errors import JobsError, StoreClosed
from jaren_jobs.worker.attempt import Attempt
from jaren_jobs.worker.renewals import RENEW, Renewer

if TYPE_CHECKING:
    from jaren_jobs.aio.runner import ThreadRunner
    from jaren_jobs.backend_async import AsyncJobsSession

__all__ = ["LoopRenewals", "renew_on_loop", "renew_on_thread"]

_log = logging.getLogger("jaren_jobs.worker")

Renew = Callable[[Attempt], Awaitable[None]]


class LoopRenewals:
    """The renewal scheduler of an AsyncWorker: a task on ``loop``, not a thread.

    Made on the loop's thread (``AsyncWorker.__init__`` runs there). ``start()``,
    ``wake()`` and ``stop()`` may be called from any thread, as the thread
    worker calls its scheduler's.
    """

    def __init__(
        self,
        renewer: Renewer,
        *,
        handlers: Callable[[], Mapping[str, object]],
        name: str,
        loop: asyncio.AbstractEventLoop,
        post: Callable[[Callable[[], None]], None],
        renew: Renew,
        tick_seconds: float,
    ) -> None:
        self._renewer = renewer
        self._handlers = handlers  # by kind, as the worker calls them (read when needed)
        self._name = name
        self._loop = loop
        self._loop_ident = threading.get_ident()
        self._post = post  # a callback onto the loop, from any thread
        self._renew = renew
        self._tick = tick_seconds
        self._lock = threading.Lock()
        self._started = False
        self._stopped = False
        self._task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._done = threading.Event()  # the task has ended (or never began)
        # the watchdog: when its last callback to the loop was posted (None: answered)
        self._watch_stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._posted_at: float | None = None
        self._warned = False

    @property
    def thread(self) -> threading.Thread | None:
        """No thread of its own (the thread worker's scheduler has one)."""
        return None

    def start(self) -> None:
        with self._lock:
            if self._started or self._stopped:
                return
            self._started = True
        self._on_loop(self._begin)
        watchdog = threading.Thread(target=self._watch, name=f"{self._name}-watchdog", daemon=True)
        self._watchdog = watchdog
        watchdog.start()

    def wake(self) -> None:
        """An attempt started while none was in flight (or one must renew now)."""
        self._on_loop(self._set)

    def stop(self, timeout_seconds: float) -> bool:
        """No renewal from now on; wait (bounded) for the one under way. False if the task
        did not end in time."""
        with self._lock:
            self._stopped = True
            started = self._started
        self._watch_stop.set()
        watchdog = self._watchdog
        if watchdog is not None and watchdog is not threading.current_thread():
            # quiescence: a renewal the watchdog has under way ends before stop() returns
            watchdog.join(timeout_seconds)
        if not started or self._loop.is_closed():
            return True
        if threading.get_ident() == self._loop_ident:
            # on the loop itself it cannot be waited for: cancelled (a renewal under way
            # is abandoned with it; the lease it held stays in force until it expires)
            if self._task is not None:
                self._task.cancel()
            return True
        self._on_loop(self._set)
        return self._done.wait(timeout_seconds)

    def _on_loop(self, callback: Callable[[], None]) -> None:
        if threading.get_ident() == self._loop_ident and self._loop.is_running():
            callback()
        else:
            self._post(callback)

    def _begin(self) -> None:
        if self._stopped:
            self._done.set()
            return
        self._wakeup = asyncio.Event()
        self._task = self._loop.create_task(self._run())

    def _set(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    # ------------------------------------------------------------ the watchdog thread

    def _answered(self) -> None:
        """On the loop: the watchdog's callback ran, so the loop is running."""
        self._posted_at = None

    def _watch(self) -> None:
        renewer = self._renewer
        while not self._watch_stop.wait(self._tick):
            if not renewer.busy():
                continue
            now = time.monotonic()
            posted = self._posted_at
            if posted is None:
                self._posted_at = now
                try:
                    self._post(self._answered)
                except RuntimeError:
                    return  # the loop is closed: nothing left to watch
                if self._warned:
                    self._warned = False
                continue
            if now - posted < 2 * self._tick:
                continue
            # blocked for two ticks: renew what fell due from here, as the renewal
            # thread of a thread worker does
            self._warn_blocked(now - posted)
            for attempt in renewer.due(now):
                if self._watch_stop.is_set():
                    return
                try:
                    renewer.renew(attempt)
                except Exception:  # a bug here must not end the watchdog
                    _log.exception("jaren_jobs: a lease renewal raised unexpectedly")

    def _warn_blocked(self, seconds: float) -> None:
        if self._warned:
            return
        self._warned = True
        running = self._renewer.running()
        names = sorted(
            {
                f"{_handler_name(handler)} (job {a.job_id!r})"
                for a in running
                # an async handler reaches the thread worker wrapped (aio.worker._OnLoop)
                if (handler := getattr(self._handlers().get(a.claimed.kind), "_handler", None))
                is not None
            }
        )
        _log.warning(
            "jaren_jobs: worker %r: the event loop has been blocked for %.1fs while async "
            "handler(s) ran: %s. Something in an async def handler blocks the loop (a "
            "blocking call such as time.sleep, a sync driver); every task of the loop "
            "stalls. Its leases are renewed from a thread meanwhile. Run blocking work in "
            "a plain def handler (it runs in a thread) or await asyncio.to_thread(...).",
            self._renewer.owner,
            seconds,
            ", ".join(names) or "none found",
        )

    async def _run(self) -> None:
        renewer = self._renewer
        wakeup = self._wakeup
        assert wakeup is not None
        try:
            while not self._stopped:
                # cleared before busy is read: a wake() posted after an attempt
                # registered is never lost (it runs after this step, on this loop)
                wakeup.clear()
                timeout = self._tick if renewer.busy() else None
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), timeout)
                if self._stopped:
                    return
                if renewer.has_batches():
                    # a batch stuck behind a slow job: its unstarted jobs are handed
                    # back, a write through the settling thread (waited for off the loop)
                    await asyncio.to_thread(renewer.take_back_stalled, time.monotonic())
                for attempt in renewer.due(time.monotonic()):
                    if self._stopped:
                        return
                    try:
                        await self._renew(attempt)
                    except Exception:  # a bug here must not end every other renewal
                        _log.exception("jaren_jobs: a lease renewal raised unexpectedly")
        finally:
            self._done.set()


def _handler_name(handler: object) -> str:
    module = getattr(handler, "__module__", None)
    name = getattr(handler, "__qualname__", None) or repr(handler)
    return f"{module}.{name}" if module else name


def renew_on_thread(renewer: Renewer, runner: ThreadRunner) -> Renew:
    """A renewal run on the store's thread, as the thread worker's renewal thread runs it."""

    async def renew(attempt: Attempt) -> None:
        await runner.submit(functools.partial(renewer.renew, attempt))

    return renew


def renew_on_loop(renewer: Renewer, session: AsyncJobsSession) -> Renew:
    """A renewal awaited on the loop, through the async-native store's ``session``."""

    async def renew(attempt: Attempt) -> None:
        lock = attempt.lease_lock
        # held across the write, as the renewal thread holds it: a settlement or a
        # checkpoint write of the attempt waits for its fresh lease (a code path on
        # this loop that needs it while held takes it off the loop: see aio/worker.py)
        await _acquire(lock)
        try:
            lease = renewer.renewable(attempt)
            if lease is None:
                return
            try:
                answer = await session.renew(lease, lease_ms(renewer.lease_seconds), RENEW)
            except StoreClosed:
                return  # stopping (or closed): no more renewals
            except JobsError as exc:
                renewer.failed(attempt, exc)
                return
            fresh = renewer.answered(attempt, lease, answer)
        finally:
            lock.release()
        if fresh is not None:
            renewer.renewed(attempt, fresh)

    return renew


async def _acquire(lock: threading.Lock) -> None:
    """``lock``, taken without blocking the loop (a thread waits if another holds it)."""
    if lock.acquire(blocking=False):
        return
    waiting = asyncio.get_running_loop().run_in_executor(None, lock.acquire)
    try:
        await asyncio.shield(waiting)
    except asyncio.CancelledError:
        # the thread still takes it: given back once taken, never left held
        waiting.add_done_callback(lambda _: lock.release())
        raise
