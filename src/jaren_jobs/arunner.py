"""Where the asyncio API's blocking calls run: threads of the store's own, awaited.

Shared by :mod:`jaren_jobs.astore` and :mod:`jaren_jobs.aworker`.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from .checkpoints import CheckpointStore

__all__ = ["AsyncCheckpointStore", "TaskRouted", "ThreadRunner"]

T = TypeVar("T")


class ThreadRunner:
    """Runs blocking calls on threads of its own and awaits them without blocking the loop."""

    def __init__(self, name: str, threads: int) -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._shut = False

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        if self._shut:
            # the store is closed: its calls refuse at once (StoreClosed), touching no
            # connection, so the refusal is answered here rather than by a thread
            return _done(fn)
        # the caller's context (contextvars) goes with the call, as asyncio.to_thread does
        return self._executor.submit(contextvars.copy_context().run, fn)

    async def run(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.submit(fn))

    async def run_to_end(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` and wait for it to finish even if this task is cancelled meanwhile
        (a rollback or a close must not be left half done); the cancellation goes on after."""
        future = asyncio.wrap_future(self.submit(fn))
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
        self._shut = True
        self._executor.shutdown(wait=False)


def _done(fn: Callable[[], T]) -> Future[T]:
    future: Future[T] = Future()
    try:
        future.set_result(fn())
    except BaseException as exc:
        future.set_exception(exc)
    return future


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

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        lane = self._lane()
        return (self._root if lane is None else lane).submit(fn)

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
