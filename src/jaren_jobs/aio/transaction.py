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
import itertools
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Generic, Protocol, TypeVar

from jaren_jobs.aio.runner import ThreadRunner
from jaren_jobs.aio.turns import Turn, _current_level, _enter_level, _Hold, _leave_level, _Level
from jaren_jobs.backend import Rows
from jaren_jobs.backends.fetched import Fetched
from jaren_jobs.engine.engine import EngineHub
from jaren_jobs.errors import JobsError, StorageError
from jaren_jobs.gate import holding_for_context, release_for_context
from jaren_jobs.gate_async import current_holder, hold_as, stop_holding
from jaren_jobs.store import Store, Transaction
from jaren_jobs.transaction import current_task
from jaren_jobs.transaction_async import AsyncTransactionState

__all__ = [
    "INSIDE",
    "AsyncTransaction",
    "Mark",
    "NativeOwner",
    "NativeTransactionBlock",
    "TransactionBlock",
    "Turn",
    "TxOwner",
    "not_this_task",
]

T = TypeVar("T")
JobsT = TypeVar("JobsT")
# nested blocks' savepoint names, unique per use: ROLLBACK TO names the latest
# savepoint of its name, so a name shared by siblings undoes the wrong one
_SAVEPOINTS = itertools.count(1)
JobsT_co = TypeVar("JobsT_co", covariant=True)


class TxOwner(Protocol[JobsT_co]):
    """What a transaction block needs of the ``AsyncStore`` it belongs to."""

    _store: Store
    _lanes_by_task: dict[asyncio.Task[Any] | None, Mark]

    async def _take_lane(self) -> ThreadRunner: ...

    def _return_lane(self, lane: ThreadRunner) -> None: ...

    def _tx_jobs(self, transaction: Transaction, lane: ThreadRunner, turn: Turn) -> JobsT_co:
        """The store's ``AsyncJobs`` over ``transaction``, its calls on ``lane``, each
        whole in ``turn``."""
        ...


class _Statements(Protocol):
    """Where an open transaction's SQL runs: its lane, or its ``AsyncConnection``."""

    async def execute(self, statement: str, parameters: Any) -> Rows: ...

    async def executemany(self, statement: str, seq_of_parameters: Iterable[Any]) -> Rows: ...

    def after_commit(self, callback: Callable[[], None]) -> None: ...


class AsyncTransaction(Generic[JobsT]):
    """An open ``async with store.transaction()``: the application's SQL and ``tx.jobs``.

    On SQLite every call runs on the transaction's own lane (the thread that
    opened it); on PostgreSQL it is awaited on the ``AsyncConnection`` the
    transaction holds. ``jobs`` is the store's :class:`~jaren_jobs.AsyncJobs`
    over this transaction (made by the store: this module sits below it).
    """

    def __init__(self, statements: _Statements, depth: int, jobs: JobsT) -> None:
        self._statements = statements
        self.jobs = jobs
        self.depth = depth

    async def execute(self, statement: str, parameters: Any = ()) -> Rows:
        """The application's own SQL, as its driver takes it (``?`` on SQLite, ``%s`` on
        psycopg); the rows are read whole where it ran, so reading them never waits."""
        return await self._statements.execute(statement, parameters)

    async def executemany(self, statement: str, seq_of_parameters: Iterable[Any]) -> Rows:
        return await self._statements.executemany(statement, seq_of_parameters)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the outermost transaction has committed (never on rollback)."""
        self._statements.after_commit(callback)


class _OnLane:
    """A sync transaction's statements, run on its lane, each whole in its level's turn."""

    def __init__(self, transaction: Transaction, lane: ThreadRunner, turn: Turn) -> None:
        self._transaction = transaction
        self._lane = lane
        self._turn = turn

    async def execute(self, statement: str, parameters: Any) -> Rows:
        return await self._turn.run(
            lambda: self._lane.run(
                lambda: Fetched.of(self._transaction.execute(statement, parameters))
            ),
            "tx.execute()",
        )

    async def executemany(self, statement: str, seq_of_parameters: Iterable[Any]) -> Rows:
        return await self._turn.run(
            lambda: self._lane.run(
                lambda: Fetched.of(self._transaction.executemany(statement, seq_of_parameters))
            ),
            "tx.executemany()",
        )

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._transaction.after_commit(callback)


def not_this_task() -> StorageError:
    """What a task hears when it uses another task's transaction."""
    return StorageError(
        "a transaction is used only by the task that opened it and the tasks it "
        "makes inside the block (as a sync transaction only from its thread); "
        "open a store.transaction() in this task",
        doing="store.transaction()",
    )


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
            raise not_this_task()
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
    """What ``AsyncStore.transaction()`` returns: ``async with`` it (on one task).

    Inside a block of the same store (in its task, or a task made inside it) it is
    a savepoint on the block's lane, holding the enclosing level's turn from
    entry to exit: gathered tasks' nested blocks run one after another.
    """

    def __init__(self, store: TxOwner[JobsT]) -> None:
        self._store = store
        self._mark: Mark | None = None
        self._block: AbstractContextManager[Transaction] | None = None
        self._owned_lane = False
        self._token: contextvars.Token[tuple[Mark, ...]] | None = None
        self._parent: _Level | None = None
        self._parent_turn: tuple[_Hold, contextvars.Token[tuple[_Hold, ...]]] | None = None
        self._level: _Level | None = None
        self._level_token: contextvars.Token[tuple[_Level, ...]] | None = None
        self._gate_token: contextvars.Token[tuple[object, ...]] | None = None

    async def __aenter__(self) -> AsyncTransaction[JobsT]:
        store = self._store
        parent = _current_level(store)
        if parent is not None:
            # nested: a savepoint on the lane that holds the transaction, in its turn
            assert parent.mark is not None
            self._parent = parent
            self._parent_turn = await parent.turn.take("store.transaction()")
            mark = parent.mark
        else:
            task = current_task()
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
            # a sync call of this store from this context would wait on the lane's gate
            self._gate_token = holding_for_context(tx._handle.gate)
        turn = Turn(store._store._backend.check_open)
        self._level = _Level(store, turn, mark, None)
        self._level_token = _enter_level(self._level)
        owned = _OwnedLane(lane, tx, mark)
        return AsyncTransaction(_OnLane(tx, owned, turn), tx.depth, store._tx_jobs(tx, owned, turn))

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._mark is not None
        assert self._block is not None
        assert self._level is not None
        block = self._block
        try:
            # the calls still in flight in this level end first; later ones are refused
            await _to_end(self._level.turn.close)
            # a cancelled task's rollback (CancelledError is a BaseException) runs to its end
            return bool(await self._mark.lane.run_to_end(lambda: block.__exit__(exc_type, exc, tb)))
        finally:
            self._give_back()

    def _give_back(self) -> None:
        if self._level is not None:
            self._level.turn.ended = True
        _leave_level(self._level_token)
        self._level_token = None
        if self._gate_token is not None:
            with contextlib.suppress(ValueError):  # exited in another context
                release_for_context(self._gate_token)
            self._gate_token = None
        if self._parent is not None:
            self._parent.turn.give(self._parent_turn)
            self._parent, self._parent_turn = None, None
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


# ---------------------------------------------------------------- async-native (PostgreSQL)


class NativeOwner(Protocol[JobsT_co]):
    """What a native block needs of its ``AsyncStore``: the async backend, the hub, and
    each open block's stack of levels (by holder, see :func:`jaren_jobs.gate_async.hold_as`)."""

    _native: Any  # backends.postgres.store_async.AsyncPostgresBackend (imported lazily above)

    @property
    def _hub(self) -> EngineHub: ...

    def _native_tx_jobs(
        self, state: AsyncTransactionState, guard: Callable[[], None], turn: Turn
    ) -> JobsT_co:
        """The store's ``AsyncJobs`` over ``state``, refusing a stranger task (``guard``),
        each call whole in ``turn``."""
        ...


class _Native:
    """A native transaction level's statements: awaited on the connection it holds, each
    whole in its level's turn."""

    def __init__(self, state: AsyncTransactionState, guard: Callable[[], None], turn: Turn):
        self._state = state
        self._guard = guard
        self._turn = turn

    async def execute(self, statement: str, parameters: Any) -> Rows:
        async def run() -> Rows:
            self._guard()
            return await self._state.execute(statement, parameters)

        return await self._turn.run(run, "tx.execute()")

    async def executemany(self, statement: str, seq_of_parameters: Iterable[Any]) -> Rows:
        async def run() -> Rows:
            self._guard()
            return await self._state.executemany(statement, seq_of_parameters)

        return await self._turn.run(run, "tx.executemany()")

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._state.after_commit(callback)


async def _to_end(step: Callable[[], Awaitable[None]]) -> None:
    """Run ``step`` to its end even if this task is cancelled meanwhile (a rollback, the
    connection's return); the cancellation goes on after. The step's task inherits this
    context, so it is the same holder."""
    task = asyncio.ensure_future(step())
    cancelled = False
    while True:
        try:
            await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError


class NativeTransactionBlock(Generic[JobsT]):
    """``async with store.transaction()`` on an async-native store: ``Store.transaction``'s
    steps, awaited (written once here: a sync ``@contextmanager`` generator with
    ``yield from`` for its savepoints has no line-by-line async form).

    The outermost level takes one connection of the pool for the whole block
    (its holder is the block: the tasks made inside it hold it too) and commits
    or rolls back; a nested level (in the same task, or a task made inside the
    block) is a savepoint with a name of its own, holding the enclosing level's
    turn from entry to exit. A task cancelled inside the block rolls the
    transaction back and gives the connection back before the cancellation goes on.
    """

    def __init__(self, store: NativeOwner[JobsT]) -> None:
        self._store = store
        self._state: AsyncTransactionState | None = None
        self._holding: contextvars.Token[object | None] | None = None
        self._holder: object = None
        self._savepoint = ""
        self._parent: _Level | None = None
        self._parent_turn: tuple[_Hold, contextvars.Token[tuple[_Hold, ...]]] | None = None
        self._level: _Level | None = None
        self._level_token: contextvars.Token[tuple[_Level, ...]] | None = None

    def _guard_for(self, holder: object) -> Callable[[], None]:
        def guard() -> None:
            state = self._state
            if state is not None and state._active and current_holder() is not holder:
                raise not_this_task()

        return guard

    async def __aenter__(self) -> AsyncTransaction[JobsT]:
        what = "store.transaction()"
        store = self._store
        backend = store._native
        backend.check_open(what)
        parent = _current_level(store)
        if parent is not None:
            # nested: a savepoint on the connection the block holds, in its turn
            taken = await parent.turn.take(what)
            try:
                outer: AsyncTransactionState = parent.state
                outer.check_active(what)
                handle = outer._handle
                self._savepoint = f"jaren_jobs_tx_{next(_SAVEPOINTS)}"
                state = AsyncTransactionState(
                    store, handle, store._hub, outer.depth + 1, outer._outermost
                )
                await handle.savepoint(self._savepoint, what)
            except BaseException:
                parent.turn.give(taken)
                raise
            self._parent, self._parent_turn = parent, taken
            self._holder = current_holder()
        else:
            holder = object()
            self._holding = hold_as(holder)
            self._holder = holder
            try:
                handle = await backend.begin(what)
            except BaseException:
                stop_holding(self._holding)
                raise
            state = AsyncTransactionState(store, handle, store._hub, 0)
        self._state = state
        turn = Turn(backend.check_open)
        self._level = _Level(store, turn, None, state)
        self._level_token = _enter_level(self._level)
        guard = self._guard_for(self._holder)
        return AsyncTransaction(
            _Native(state, guard, turn), state.depth, store._native_tx_jobs(state, guard, turn)
        )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        state = self._state
        assert state is not None
        assert self._level is not None
        try:
            # the calls still in flight in this level end first; later ones are refused
            await _to_end(self._level.turn.close)
            if self._parent is not None:
                await self._exit_savepoint(state, exc)
            else:
                await self._exit_outermost(state, exc)
        finally:
            self._level.turn.ended = True
            _leave_level(self._level_token)
            self._level_token = None
            if self._parent is not None:
                self._parent.turn.give(self._parent_turn)
                self._parent, self._parent_turn = None, None
        return False

    async def _exit_savepoint(
        self, state: AsyncTransactionState, exc: BaseException | None
    ) -> None:
        what = "store.transaction()"
        assert self._parent is not None
        outer: AsyncTransactionState = self._parent.state
        handle = state._handle
        name = self._savepoint
        if exc is not None:
            state._end()

            async def undo() -> None:
                try:
                    await handle.rollback_to_savepoint(name, what)
                    await handle.release_savepoint(name, what)
                except JobsError:
                    pass  # the outer rollback undoes it anyway

            await _to_end(undo)
            return
        callbacks = state._end()
        if state.rolled_back():
            raise state._aborted(what)  # the savepoint went with the whole transaction
        for callback in callbacks:
            outer.after_commit(callback)
        await handle.release_savepoint(name, what)

    async def _exit_outermost(
        self, state: AsyncTransactionState, exc: BaseException | None
    ) -> None:
        what = "store.transaction()"
        handle = state._handle
        callbacks: list[Callable[[], None]] = []

        async def rollback_and_return() -> None:
            try:
                await handle.rollback_quietly()
            finally:
                await handle.release()

        try:
            if exc is not None:
                state._end()
                await _to_end(rollback_and_return)
                return
            callbacks = state._end()
            if state.rolled_back():
                # the block caught the failure and ended normally: never a COMMIT of
                # whatever ran since, nor a silent success
                await _to_end(rollback_and_return)
                raise state._aborted(what)
            try:
                await handle.commit(what)
            except BaseException:
                callbacks = []
                await _to_end(rollback_and_return)
                raise
            await _to_end(handle.release)
        finally:
            if self._holding is not None:
                stop_holding(self._holding)
                self._holding = None
        for callback in callbacks:
            callback()
