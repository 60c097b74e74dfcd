"""The store's gate: a fair FIFO lock over its connections (one, or a small pool's few).

Every root call holds the gate while it uses a connection; a gate of
``capacity`` n admits n threads at once (a PostgreSQL store's pool, one
connection each), a gate of capacity 1 is a lock (SQLite's one connection,
the application's connection). Waiters are
served strictly in arrival order (a released gate is handed to the oldest
waiter, never grabbed by a newcomer), so a busy worker cannot starve a
request handler. A waiter leaves the queue on timeout, when its signal
aborts, or when the store closes. A thread that already holds the gate
(inside ``store.transaction()``) is refused at once instead of deadlocking.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from jaren_jobs.errors import GateRefused, StoreClosed
from jaren_jobs.signals import FOREIGN_POLL_SECONDS, SignalLike, subscribe

__all__ = ["Gate", "held_by_context", "holding_for_context", "release_for_context"]

_get_ident = threading.get_ident


class _Waiter:
    __slots__ = ("event", "granted", "thread")

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.event = threading.Event()
        self.granted = False


_ASYNC_HINT = (
    " (under asyncio every task of the loop shares this thread, so another task's "
    "transaction may hold it: run each task's store calls in a thread of its own, "
    "asyncio.to_thread)"
)


# the gates whose place this context's own transaction holds on another thread (an
# ``async with store.transaction()`` on SQLite runs on a lane thread of its own):
# waiting for one of them from this context would wait for itself
_HELD_BY_CONTEXT: contextvars.ContextVar[tuple[object, ...]] = contextvars.ContextVar(
    "jaren_jobs_gates_held_by_context", default=()
)


def holding_for_context(gate: object) -> contextvars.Token[tuple[object, ...]]:
    """Record that this context's transaction holds ``gate`` (undo with ``.reset``)."""
    return _HELD_BY_CONTEXT.set((*_HELD_BY_CONTEXT.get(), gate))


def held_by_context(gate: object) -> bool:
    return gate in _HELD_BY_CONTEXT.get()


def release_for_context(token: contextvars.Token[tuple[object, ...]]) -> None:
    _HELD_BY_CONTEXT.reset(token)


def _in_event_loop() -> bool:
    """Whether the calling thread is running an asyncio event loop."""
    return asyncio.events._get_running_loop() is not None


class Gate:
    """A fair, non-reentrant semaphore of ``capacity`` places (1: a lock) with queue
    timeout and signal abandonment; a thread holds at most one place."""

    def __init__(self, timeout_seconds: float, capacity: int = 1) -> None:
        if capacity < 1:
            raise ValueError(f"a gate needs at least one place, got {capacity}")
        self.timeout_seconds = timeout_seconds
        self.capacity = capacity
        self._mutex = threading.Lock()
        self._owners: set[int] = set()
        self._waiters: deque[_Waiter] = deque()
        self._closed = False
        self._forked = False  # this is a child's copy, made by os.fork()
        self._closed_reason = ""

    def held_by_me(self) -> bool:
        return threading.get_ident() in self._owners

    def _free(self) -> bool:
        return len(self._owners) < self.capacity

    def waiting(self) -> int:
        """How many calls are queued for the gate now (diagnostics, and tests)."""
        with self._mutex:
            return len(self._waiters)

    def acquire(self, what: str, signal: SignalLike | None = None) -> None:
        """Take the gate for ``what`` or raise ``GateRefused`` / ``StoreClosed``."""
        me = _get_ident()
        with self._mutex:
            if (
                self._free()
                and me not in self._owners
                and not self._waiters
                and not self._closed
                and (signal is None or not signal.aborted)
            ):
                self._owners.add(me)  # free, and nobody queued: the common case
                return
            if self._closed:
                if self._forked:
                    raise StoreClosed(f"{what}: {self._closed_reason}", forked=True)
                raise StoreClosed(f"{what}: the store is closed")
            if me in self._owners:
                raise GateRefused(
                    f"{what}: this thread holds the store's transaction; call tx.jobs "
                    "(the transaction's own view) instead of store.jobs, or finish the "
                    "transaction first — waiting here would deadlock"
                    + _ASYNC_HINT
                    * _in_event_loop(),
                    reason="reentrant",
                )
            if self in _HELD_BY_CONTEXT.get():
                # this task's own async transaction holds the gate: on the loop's
                # thread, waiting would freeze the whole event loop until it gives up
                raise GateRefused(
                    f"{what}: this task's own async store.transaction() holds the store; a "
                    "synchronous call here would wait for it (and freeze the event loop): "
                    "await tx.jobs (or the AsyncStore's calls) inside the block instead",
                    reason="task",
                )
            if signal is not None and signal.aborted:
                raise GateRefused(
                    f"{what} was abandoned before it queued: its signal is aborted "
                    f"({signal.reason!r})",
                    reason="aborted",
                )
            if self._free() and not self._waiters:
                self._owners.add(me)
                return
            waiter = _Waiter(me)
            self._waiters.append(waiter)
        unsubscribe = subscribe(signal, waiter.event.set)
        deadline = time.monotonic() + self.timeout_seconds
        try:
            while True:
                left = deadline - time.monotonic()
                step = left if unsubscribe is not None else min(left, FOREIGN_POLL_SECONDS)
                if step > 0:
                    waiter.event.wait(step)
                with self._mutex:
                    if waiter.granted:
                        if self._closed:
                            self._release_locked(me)
                            raise StoreClosed(f"{what}: the store was closed while it waited")
                        return
                    reason = self._refusal(signal, deadline)
                    if reason is None:
                        waiter.event.clear()
                        continue
                    self._waiters.remove(waiter)
                if reason == "closed":
                    raise StoreClosed(f"{what}: the store was closed while it waited")
                if reason == "aborted":
                    assert signal is not None
                    raise GateRefused(
                        f"{what} was abandoned while queued for the store: its signal "
                        f"aborted ({signal.reason!r})",
                        reason="aborted",
                    )
                held = (
                    "another thread held it"
                    if self.capacity == 1
                    else f"other threads held all {self.capacity} of its connections"
                )
                raise GateRefused(
                    f"{what} waited {self.timeout_seconds:g}s for the store and gave up; "
                    f"{held} the whole time (a long transaction?) — "
                    "shorten it, or raise gate_timeout_seconds",
                    reason="timeout",
                )
        finally:
            if unsubscribe is not None:
                unsubscribe()

    def try_acquire(self) -> bool:
        """Take the gate only if it is free and nobody is queued; never waits or raises."""
        me = _get_ident()
        with self._mutex:
            if self._free() and me not in self._owners and not self._waiters and not self._closed:
                self._owners.add(me)
                return True
            return False

    def _refusal(self, signal: SignalLike | None, deadline: float) -> str | None:
        if self._closed:
            return "closed"
        if signal is not None and signal.aborted:
            return "aborted"
        if time.monotonic() >= deadline:
            return "timeout"
        return None

    def release(self) -> None:
        me = _get_ident()
        with self._mutex:
            if me not in self._owners:
                if self._forked:
                    return  # taken before the fork: the child's copy holds nothing
                raise RuntimeError("the gate is released only by the thread that holds it")
            self._release_locked(me)

    def _release_locked(self, thread: int) -> None:
        """``thread`` gives its place back: to the oldest waiter, if any."""
        self._owners.discard(thread)
        if self._waiters and self._free():
            nxt = self._waiters.popleft()
            nxt.granted = True
            self._owners.add(nxt.thread)
            nxt.event.set()

    @contextmanager
    def held(self, what: str, signal: SignalLike | None = None) -> Iterator[None]:
        self.acquire(what, signal)
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        """Refuse newcomers and wake every waiter (they raise ``StoreClosed``)."""
        with self._mutex:
            self._closed = True
            for waiter in self._waiters:
                waiter.event.set()

    def after_fork_in_child(self, reason: str) -> None:
        """In a child of os.fork(): closed, and free of the parent's threads.

        The holder and the waiters are parent threads that do not exist here,
        and the mutex may have been copied locked: a fresh one, no owner, no
        queue, so every call is refused at once instead of waiting forever.
        """
        self._mutex = threading.Lock()
        self._owners = set()
        self._waiters = deque()
        self._closed = True
        self._closed_reason = reason
        self._forked = True

    def wait_idle(self, timeout_seconds: float) -> bool:
        """After ``close()``: wait until no one holds the gate; False on timeout."""
        end = time.monotonic() + timeout_seconds
        while True:
            with self._mutex:
                if not self._owners - {threading.get_ident()}:
                    return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.005)
