"""``async with store.transaction()`` under asyncio: the block, and the open transaction.

A transaction runs on a *lane* of its own — one thread that opens it, runs
each of its statements and commits it — because a store's transaction
belongs to the thread that opened it. So a transaction belongs to the task
that opened it (and the tasks it makes inside the block): another task's
transaction runs on another lane, and on SQLite waits (on that lane's thread,
never on the loop) until the first commits. A task cancelled inside the block
rolls the transaction back before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from .arunner import ThreadRunner
from .backend import Rows
from .backends.fetched import Fetched
from .errors import StorageError
from .store import Store, Transaction, current_task

__all__ = ["INSIDE", "AsyncTransaction", "Mark", "TransactionBlock", "TxOwner"]

T = TypeVar("T")
JobsT = TypeVar("JobsT")
JobsT_co = TypeVar("JobsT_co", covariant=True)


class TxOwner(Protocol[JobsT_co]):
    """What a transaction block needs of the ``AsyncStore`` it belongs to."""

    _store: Store
    _lanes_by_task: dict[asyncio.Task[Any] | None, Mark]

    async def _take_lane(self) -> ThreadRunner: ...

    def _return_lane(self, lane: ThreadRunner) -> None: ...

    def _tx_jobs(self, transaction: Transaction, lane: ThreadRunner) -> JobsT_co:
        """The store's ``AsyncJobs`` over ``transaction``, its calls on ``lane``."""
        ...


class AsyncTransaction(Generic[JobsT]):
    """An open ``async with store.transaction()``: the application's SQL and ``tx.jobs``.

    Every call runs on the transaction's own lane (the thread that opened it).
    ``jobs`` is the store's :class:`~jaren_jobs.AsyncJobs` over this transaction
    (made by the store: this module sits below it).
    """

    def __init__(self, transaction: Transaction, lane: ThreadRunner, jobs: JobsT) -> None:
        self._transaction = transaction
        self._lane = lane
        self.jobs = jobs
        self.depth = transaction.depth

    async def execute(self, statement: str, parameters: Any = ()) -> Rows:
        """The application's own SQL, as its driver takes it (``?`` on SQLite, ``%s`` on
        psycopg); the rows are read on the lane too (``await rows``-free: they are fetched)."""
        return await self._lane.run(
            lambda: Fetched.of(self._transaction.execute(statement, parameters))
        )

    async def executemany(self, statement: str, seq_of_parameters: Iterable[Any]) -> Rows:
        return await self._lane.run(
            lambda: Fetched.of(self._transaction.executemany(statement, seq_of_parameters))
        )

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the outermost transaction has committed (never on rollback)."""
        self._transaction.after_commit(callback)


class _OwnedLane(ThreadRunner):
    """A transaction's lane as its calls reach it: only from the task that opened it.

    The lane's thread is the transaction's, so the sync check (same thread) passes
    for any task's call; this is the async API's own check. Another task's
    statement would otherwise land in the middle of this task's transaction and
    commit or roll back with it.
    """

    def __init__(self, lane: ThreadRunner, transaction: Transaction, mark: Mark) -> None:
        self._lane = lane
        self._transaction = transaction
        self._mark = mark

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        # an ended transaction's call goes on to say so (the sync check, which comes first)
        if self._transaction._active and not self._mark.owns():
            raise StorageError(
                "a transaction is used only by the task that opened it and the tasks it "
                "makes inside the block (as a sync transaction only from its thread); "
                "open a store.transaction() in this task",
                doing="store.transaction()",
            )
        return self._lane.submit(fn)

    def shutdown(self) -> None:
        self._lane.shutdown()


class Mark:
    """An open outermost transaction of a task: its lane, and whether it is still open.

    The task that opened it owns it; so do the tasks that task makes inside the
    block (``asyncio.wait_for`` and ``gather`` make one per call before Python
    3.12), which find the mark in the context they copied (:data:`INSIDE`).
    """

    __slots__ = ("lane", "open", "store", "task")

    def __init__(self, store: TxOwner[Any], lane: ThreadRunner, task: asyncio.Task[Any] | None):
        self.store = store
        self.lane = lane
        self.task = task
        self.open = True

    def owns(self) -> bool:
        """Whether the calling task may use this transaction (its own, or one it made)."""
        return self.open and (current_task() is self.task or self in INSIDE.get())


# the transactions the calling context is inside (each a Mark): copied into the tasks
# made inside an ``async with store.transaction()`` block
INSIDE: contextvars.ContextVar[tuple[Mark, ...]] = contextvars.ContextVar(
    "jaren_jobs_inside_transactions", default=()
)


class TransactionBlock(Generic[JobsT]):
    """What ``AsyncStore.transaction()`` returns: ``async with`` it (on one task)."""

    def __init__(self, store: TxOwner[JobsT]) -> None:
        self._store = store
        self._mark: Mark | None = None
        self._block: AbstractContextManager[Transaction] | None = None
        self._owned_lane = False
        self._token: contextvars.Token[tuple[Mark, ...]] | None = None

    async def __aenter__(self) -> AsyncTransaction[JobsT]:
        store = self._store
        task = current_task()
        held = store._lanes_by_task.get(task)
        if held is not None:
            # nested in the same task: a savepoint on the lane that holds the transaction
            mark = held
        else:
            mark = Mark(store, await store._take_lane(), task)
            self._owned_lane = True
            store._lanes_by_task[task] = mark
        self._mark = mark
        lane = mark.lane
        block = store._store.transaction()
        entered = lane.submit(block.__enter__)
        cancelled: asyncio.CancelledError | None = None
        while True:
            try:
                tx = await asyncio.shield(entered)
                break
            except asyncio.CancelledError as exc:
                if entered.done() and not entered.cancelled() and entered.exception() is None:
                    tx, cancelled = entered.result(), exc
                    break
                if entered.done():
                    self._give_back()
                    raise
                cancelled = exc  # wait for BEGIN to finish, then roll it back
            except BaseException:
                self._give_back()
                raise
        if cancelled is not None:
            # cancelled while it opened: the transaction it opened ends rolled back
            failure = cancelled
            try:
                await lane.run_to_end(lambda: block.__exit__(type(failure), failure, None))
            finally:
                self._give_back()
            raise cancelled
        self._block = block
        if self._owned_lane:
            self._token = INSIDE.set((*INSIDE.get(), mark))
        owned = _OwnedLane(lane, tx, mark)
        return AsyncTransaction(tx, owned, store._tx_jobs(tx, owned))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._mark is not None
        assert self._block is not None
        block = self._block
        try:
            # a cancelled task's rollback (CancelledError is a BaseException) runs to its end
            return bool(await self._mark.lane.run_to_end(lambda: block.__exit__(exc_type, exc, tb)))
        finally:
            self._give_back()

    def _give_back(self) -> None:
        if self._owned_lane:
            store = self._store
            mark = self._mark
            assert mark is not None
            mark.open = False
            store._lanes_by_task.pop(mark.task, None)
            if self._token is not None:
                # exited in another context than it entered: nothing there to undo
                with contextlib.suppress(ValueError):
                    INSIDE.reset(self._token)
                self._token = None
            store._return_lane(mark.lane)
            self._owned_lane = False
