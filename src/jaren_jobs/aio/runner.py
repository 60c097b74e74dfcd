"""Where the asyncio API's blocking calls run: threads of the store's own, awaited.

Shared by :mod:`jaren_jobs.aio.store` and :mod:`jaren_jobs.aio.worker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from jaren_jobs.engine.checkpoints import CheckpointStore

__all__ = [
    "AsyncCheckpointStore",
    "CallerThread",
    "GroupCommit",
    "LoopPoster",
    "TaskRouted",
    "ThreadRunner",
]

T = TypeVar("T")


class LoopPoster:
    """Hands callbacks to one event loop from other threads, many per wake-up.

    ``loop.call_soon_threadsafe`` writes to the loop's self-pipe each time it is
    called; under load the store's threads finish calls faster than the loop
    wakes, so each wake-up takes every answer posted since the last one.
    """

    __slots__ = ("_items", "_lock", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[Callable[[], None]] = []

    def post(self, callback: Callable[[], None]) -> None:
        with self._lock:
            first = not self._items
            self._items.append(callback)
        if first:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits these now
                self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for callback in items:
            callback()


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> Callable[[], None]:
    def settle() -> None:
        if future.cancelled():
            return  # its awaiter was cancelled (the call may still have run, as with to_thread)
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    return settle


class ThreadRunner:
    """Runs blocking calls on threads of its own and awaits them without blocking the loop.

    Lighter per call than ``asyncio.to_thread`` / ``run_in_executor``: the loop
    puts the call on a queue (a thread wakes only if it was idle) and gets an
    ``asyncio.Future`` of its own; the answers go back through a
    :class:`LoopPoster`, one loop wake-up for every answer ready by then, instead
    of a ``concurrent.futures.Future`` chained to an asyncio one per call.
    """

    def __init__(self, name: str, threads: int) -> None:
        self._name = name
        self._threads = threads
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._started = 0
        self._start_lock = threading.Lock()
        self._posters: dict[asyncio.AbstractEventLoop, LoopPoster] = {}
        self._shut = False

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``fn`` (called from a coroutine): an ``asyncio.Future`` of the running loop."""
        return self._submit(fn, None)

    def submit_grouped(self, fn: Callable[[Any], T], group: GroupCommit) -> asyncio.Future[T]:
        """Queue ``fn(jobs)``, which may share one transaction with the calls of ``group``
        queued beside it (see :class:`GroupCommit`)."""
        return self._submit(fn, group)

    def _submit(self, fn: Callable[..., T], group: GroupCommit | None) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._shut:
            # the store is closed: its calls refuse at once (StoreClosed), touching no
            # connection, so the refusal is answered here rather than by a thread
            try:
                future.set_result(fn() if group is None else fn(group.solo))
            except BaseException as exc:
                future.set_exception(exc)
            return future
        poster = self._posters.get(loop)
        if poster is None:
            poster = self._posters.setdefault(loop, LoopPoster(loop))
        if self._started < self._threads:
            self._start_thread()
        # the caller's context (contextvars) goes with the call, as asyncio.to_thread does
        self._queue.put((contextvars.copy_context(), fn, future, poster, group))
        return future

    def _start_thread(self) -> None:
        with self._start_lock:
            if self._started >= self._threads or self._shut:
                return
            self._started += 1
            name = f"{self._name}_{self._started - 1}"
        # daemon: a store never closed must not hold the interpreter's exit on an idle
        # thread (an executor's atexit hook does that for its own; SQLite and PostgreSQL
        # commits are atomic, so a call cut short at exit leaves no half-written row)
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def _work(self) -> None:
        take = self._queue.get
        item: Any = _NOTHING
        while True:
            if item is _NOTHING:
                item = take()
            if item is None:
                return
            group = item[4]
            if group is None:
                self._answer(item)
                item = _NOTHING
                continue
            # group commit: the calls of the same group queued behind it join it
            items = [item]
            item = _NOTHING
            while len(items) < group.most:
                try:
                    after = self._queue.get_nowait()
                except queue.Empty:
                    break
                if after is None or after[4] is not group:
                    item = after  # the next one taken
                    break
                items.append(after)
            group.run(items)
            del items

    @staticmethod
    def _answer(item: tuple[Any, ...], skip: bool = True) -> None:
        context, fn, future, poster, group = item
        if skip and future.cancelled():  # a racy read, as concurrent.futures' own: it only skips
            return
        try:
            ok, value = True, context.run(fn) if group is None else context.run(fn, group.solo)
        except BaseException as exc:  # handed to the awaiting task, as an executor does
            ok, value = False, exc
        poster.post(_settle(future, ok, value))

    async def run(self, fn: Callable[[], T]) -> T:
        return await self.submit(fn)

    async def run_to_end(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` and wait for it to finish even if this task is cancelled meanwhile
        (a rollback or a close must not be left half done); the cancellation goes on after."""
        future = self.submit(fn)
        cancelled = False
        while True:
            try:
                result = await asyncio.shield(future)
                break
            except asyncio.CancelledError:
                if future.done():
                    raise
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError
        return result

    def shutdown(self) -> None:
        """Let the threads go once the calls queued so far have run (never waits)."""
        with self._start_lock:
            self._shut = True
            started = self._started
        for _ in range(started):
            self._queue.put(None)


_NOTHING: Any = object()


class GroupCommit:
    """Concurrent root calls of one kind (``enqueue``) written in one transaction.

    Under load many tasks enqueue at once, and each enqueue alone is a commit
    of its own (an fsync at durability FULL). The calls a store thread finds
    queued together run in one ``store.transaction()``, each in a savepoint of
    its own, so one call's error undoes only that call, and each caller is
    answered only after the commit that made its job durable. A transaction
    that fails as a whole (its BEGIN or COMMIT, or an error that ended it) wrote
    nothing: its calls then run again, each alone, and get exactly the answer
    they would have had without the grouping. A call found alone runs as it is.
    """

    def __init__(
        self, solo: Any, transaction: Callable[[], AbstractContextManager[Any]], most: int = 32
    ) -> None:
        self.solo = solo  # what a call alone is given (the store's root jobs)
        self._transaction = transaction
        self.most = most  # the most calls in one transaction

    def run(self, items: list[tuple[Any, ...]]) -> None:
        """On a store thread: the calls, grouped (each item as ThreadRunner queues it)."""
        live = [item for item in items if not item[2].cancelled()]
        if len(live) < 2:
            for item in live:
                ThreadRunner._answer(item)
            return
        answers: list[tuple[bool, Any]] = []
        try:
            with self._transaction() as tx:
                for context, fn, _, _, _ in live:
                    try:
                        with self._transaction() as savepoint:
                            answers.append((True, context.run(fn, savepoint.jobs)))
                    except Exception as exc:  # this call's own error: its savepoint undone
                        answers.append((False, exc))
                    if tx.rolled_back():
                        break  # the database ended it: the exit raises, nothing was written
        except Exception:
            answers = []
        if len(answers) != len(live):
            # nothing of it committed: each call alone, as if never grouped
            for item in live:
                ThreadRunner._answer(item, skip=False)
            return
        for (_, _, future, poster, _), (ok, value) in zip(live, answers, strict=True):
            poster.post(_settle(future, ok, value))


class CallerThread(ThreadRunner):
    """A runner with no thread of its own: the thread that calls :meth:`serve` runs the
    calls the loop queues, until :meth:`release` — each to its end, even one whose
    awaiter was cancelled meanwhile.

    The AsyncWorker's loop thread that handed its queue of jobs to the event loop
    waits in :meth:`serve`, and so is still there for what must not run on the
    loop: a plain handler, a wait for the settling thread.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name, 1)
        self._started = 1  # never starts a thread: serve() is its thread

    def serve(self, gone: Callable[[], bool], poll_seconds: float = 1.0) -> None:
        """Run the queued calls until :meth:`release`, or until ``gone()`` (polled while
        idle: the loop closed, so nothing will release it)."""
        take = self._queue.get
        while True:
            try:
                item = take(timeout=poll_seconds)
            except queue.Empty:
                if gone():
                    return
                continue
            if item is None:
                return
            # run even if its awaiter was cancelled: the worker's calls must end
            self._answer(item, skip=False)
            del item

    def release(self) -> None:
        """From the loop: :meth:`serve` returns once the calls queued before this have run."""
        self._queue.put(None)

    def shutdown(self) -> None:
        self.release()


class TaskRouted(ThreadRunner):
    """The store's root runner, except for a task inside its own transaction, whose calls
    run on that transaction's lane.

    So a root call (``store.jobs.*``, ``store.close()``) made inside the caller's own
    ``async with store.transaction()`` meets the store exactly as the sync API's
    same-thread call does — refused at once as reentrant where the store is gated —
    instead of waiting on another thread for a gate its own transaction holds.
    """

    def __init__(self, root: ThreadRunner, lane: Callable[[], ThreadRunner | None]) -> None:
        self._root = root
        self._lane = lane

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        lane = self._lane()
        return (self._root if lane is None else lane).submit(fn)

    def submit_grouped(self, fn: Callable[[Any], T], group: GroupCommit) -> asyncio.Future[T]:
        lane = self._lane()
        if lane is None:
            return self._root.submit_grouped(fn, group)
        # inside the caller's own transaction: alone, on its lane (refused there as reentrant)
        return lane.submit(lambda: fn(group.solo))

    def shutdown(self) -> None:
        self._root.shutdown()


class AsyncCheckpointStore:
    """``checkpoints_for(claimed)`` under asyncio (SPEC §6), bound to one attempt."""

    def __init__(self, checkpoints: CheckpointStore, runner: ThreadRunner) -> None:
        self._checkpoints = checkpoints
        self._runner = runner

    @property
    def job_id(self) -> str:
        return self._checkpoints.job_id

    @property
    def generation(self) -> int:
        return self._checkpoints.generation

    async def load(self, run_id: str) -> dict[str, Any] | None:
        return await self._runner.run(lambda: self._checkpoints.load(run_id))

    async def save(self, run_id: str, node_id: str, value: Any) -> None:
        await self._runner.run(lambda: self._checkpoints.save(run_id, node_id, value))

    async def complete(self, run_id: str, result: Any = None) -> bool:
        return await self._runner.run(lambda: self._checkpoints.complete(run_id, result))
