"""The asyncio twin of :mod:`jaren_jobs.gate`: a fair FIFO semaphore over an async pool.

Written once by hand rather than generated: the thread gate's waiting is timed
``threading.Event`` waits under a mutex, which has no line-by-line asyncio
form; here a waiter is a future of the loop. The rules are the thread gate's:
``capacity`` places, a released place handed to the oldest waiter (never
grabbed by a newcomer), a waiter leaves on timeout (``GateRefused``, reason
``"timeout"``), when its signal aborts, when its task is cancelled, or when the
gate closes (``StoreClosed``); a holder asking again is refused at once
(``"reentrant"``) instead of deadlocking.

A place is held by a *holder*: the calling task (:func:`current_holder`), or,
inside an ``async with store.transaction()`` block, the block's own holder,
which the tasks made inside the block inherit (a context variable) — as a
thread's transaction is that thread's. All of a gate's calls come from one
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections import deque
from typing import Any

from jaren_jobs.errors import GateRefused, StoreClosed
from jaren_jobs.signals import FOREIGN_POLL_SECONDS, SignalLike, subscribe

__all__ = ["AsyncGate", "current_holder", "hold_as", "stop_holding"]

_HOLDER: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "jaren_jobs_holder", default=None
)


def current_holder() -> object:
    """Who holds a place when the caller takes one: the transaction block it is inside
    (see :func:`hold_as`), else its task (``None`` outside any)."""
    holder = _HOLDER.get()
    if holder is not None:
        return holder
    # off the loop (a cursor's pull on the store's thread): no task, so no holder
    return None if asyncio.events._get_running_loop() is None else asyncio.current_task()


def hold_as(holder: object) -> contextvars.Token[object | None]:
    """From now on in this context (and the tasks it makes) ``holder`` holds places;
    ``_HOLDER.reset(token)`` (:func:`stop_holding`) ends it."""
    return _HOLDER.set(holder)


def stop_holding(token: contextvars.Token[object | None]) -> None:
    with contextlib.suppress(ValueError):  # reset in another context than it was set in
        _HOLDER.reset(token)


class _Waiter:
    __slots__ = ("future", "holder")

    def __init__(self, holder: object, future: asyncio.Future[None]) -> None:
        self.holder = holder
        self.future = future


class AsyncGate:
    """A fair, non-reentrant semaphore of ``capacity`` places for tasks of one loop."""

    def __init__(self, timeout_seconds: float, capacity: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"a gate needs at least one place, got {capacity}")
        self.timeout_seconds = timeout_seconds
        self.capacity = capacity
        self._owners: set[object] = set()
        self._waiters: deque[_Waiter] = deque()
        self._closed = False
        self._forked = False
        self._closed_reason = ""

    def held_by_me(self) -> bool:
        return current_holder() in self._owners

    def _free(self) -> bool:
        return len(self._owners) < self.capacity

    def waiting(self) -> int:
        """How many calls are queued for a place now."""
        return len(self._waiters)

    def _refuse_now(self, what: str, me: object, signal: SignalLike | None) -> None:
        if self._closed:
            if self._forked:
                raise StoreClosed(f"{what}: {self._closed_reason}", forked=True)
            raise StoreClosed(f"{what}: the store is closed")
        if me in self._owners:
            raise GateRefused(
                f"{what}: this task holds the store's transaction; call tx.jobs (the "
                "transaction's own view) instead of store.jobs, or finish the transaction "
                "first — waiting here would deadlock",
                reason="reentrant",
            )
        if signal is not None and signal.aborted:
            raise GateRefused(
                f"{what} was abandoned before it queued: its signal is aborted ({signal.reason!r})",
                reason="aborted",
            )

    async def acquire(self, what: str, signal: SignalLike | None = None) -> None:
        """Take a place for ``what`` or raise ``GateRefused`` / ``StoreClosed``."""
        me = current_holder()
        self._refuse_now(what, me, signal)
        if self._free() and not self._waiters:
            self._owners.add(me)  # free, and nobody queued: the common case
            return
        loop = asyncio.get_running_loop()
        waiter = _Waiter(me, loop.create_future())
        self._waiters.append(waiter)
        aborted = asyncio.Event()

        def on_abort() -> None:  # from any thread
            with contextlib.suppress(RuntimeError):  # the loop is closed
                loop.call_soon_threadsafe(aborted.set)

        unsubscribe = subscribe(signal, on_abort)
        deadline = time.monotonic() + self.timeout_seconds
        try:
            while not waiter.future.done():
                left = deadline - time.monotonic()
                if left <= 0 or aborted.is_set() or (signal is not None and signal.aborted):
                    break
                step = left if unsubscribe is not None else min(left, FOREIGN_POLL_SECONDS)
                abort_wait: asyncio.Future[Any] = asyncio.ensure_future(aborted.wait())
                either: set[asyncio.Future[Any]] = {waiter.future, abort_wait}
                try:
                    await asyncio.wait(either, timeout=step, return_when="FIRST_COMPLETED")
                finally:
                    abort_wait.cancel()
        except BaseException:
            # cancelled while queued: a place granted meanwhile goes to the next one
            self._leave(waiter)
            raise
        finally:
            if unsubscribe is not None:
                unsubscribe()
        if waiter.future.done() and not waiter.future.cancelled():
            if self._closed:
                self._release_holder(me)
                raise StoreClosed(f"{what}: the store was closed while it waited")
            return
        with contextlib.suppress(ValueError):  # close() emptied the queue already
            self._waiters.remove(waiter)
        waiter.future.cancel()
        if self._closed:
            raise StoreClosed(f"{what}: the store was closed while it waited")
        if signal is not None and signal.aborted:
            raise GateRefused(
                f"{what} was abandoned while queued for the store: its signal aborted "
                f"({signal.reason!r})",
                reason="aborted",
            )
        held = (
            "another task held it"
            if self.capacity == 1
            else f"other tasks held all {self.capacity} of its connections"
        )
        raise GateRefused(
            f"{what} waited {self.timeout_seconds:g}s for the store and gave up; {held} the "
            "whole time (a long transaction?) — shorten it, or raise gate_timeout_seconds",
            reason="timeout",
        )

    def _leave(self, waiter: _Waiter) -> None:
        if waiter.future.done() and not waiter.future.cancelled():
            self._release_holder(waiter.holder)  # granted as it was cancelled: pass it on
        else:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)
            waiter.future.cancel()

    def release(self) -> None:
        me = current_holder()
        if me not in self._owners:
            if self._forked:
                return
            raise RuntimeError("the gate is released only by the task that holds it")
        self._release_holder(me)

    def _release_holder(self, holder: object) -> None:
        """``holder`` gives its place back: to the oldest waiter, if any."""
        self._owners.discard(holder)
        while self._waiters and self._free():
            nxt = self._waiters.popleft()
            if nxt.future.done():
                continue  # left already
            self._owners.add(nxt.holder)
            nxt.future.set_result(None)

    def close(self) -> None:
        """Refuse newcomers and wake every waiter (they raise ``StoreClosed``)."""
        self._closed = True
        waiters, self._waiters = list(self._waiters), deque()
        for waiter in waiters:
            if not waiter.future.done():
                waiter.future.cancel()

    def after_fork_in_child(self, reason: str) -> None:
        """In a child of os.fork(): closed, holding nothing (the parent's tasks are not here)."""
        self._owners = set()
        self._waiters = deque()
        self._closed = True
        self._closed_reason = reason
        self._forked = True

    async def wait_idle(self, timeout_seconds: float) -> bool:
        """After ``close()``: wait until no other task holds a place; False on timeout."""
        end = time.monotonic() + timeout_seconds
        me: Any = current_holder()
        while self._owners - {me}:
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(0.005)
        return True
