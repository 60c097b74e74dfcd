"""The asyncio API (SPEC §11): ``open_async_store``, ``AsyncStore`` and its ``jobs``
(:class:`~jaren_jobs.aio.jobs.AsyncJobs`, in :mod:`jaren_jobs.aio.jobs`).

Every call is the synchronous engine's, run off the event loop: the engine
logic exists once, and these are thin awaited shells over it, kept in step by
a parity test (``tests/unit/test_async_parity.py``).

Where the calls run. The store's root calls run on threads the store owns
(one for SQLite, whose single connection serves one call at a time anyway;
a few for a pooled PostgreSQL store). A transaction runs on a *lane* of its
own (:mod:`jaren_jobs.aio.transaction`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from contextlib import AbstractAsyncContextManager
from typing import Any

from jaren_jobs.aio.jobs import AsyncCursor, AsyncJobs
from jaren_jobs.aio.runner import GroupCommit, TaskRouted, ThreadRunner
from jaren_jobs.aio.transaction import (
    INSIDE,
    AsyncTransaction,
    Mark,
    NativeTransactionBlock,
    TransactionBlock,
    Turn,
)
from jaren_jobs.engine.engine_async import AsyncJobEngine
from jaren_jobs.errors import GateRefused
from jaren_jobs.records import StopOutcome
from jaren_jobs.runtime import Defaults
from jaren_jobs.store import Store, Transaction, open_store
from jaren_jobs.transaction import current_task
from jaren_jobs.transaction_async import AsyncTransactionState

# AsyncJobs and AsyncCursor live in aio.jobs; named here too, as they always were
__all__ = [
    "AsyncCursor",
    "AsyncJobs",
    "AsyncStore",
    "AsyncTransaction",
    "open_async_store",
]

# How many threads serve a pooled (PostgreSQL) store's root calls at once.
_POOLED_ROOT_THREADS = 4
# How many transactions may be open at once (each holds a thread, its lane).
_LANES = 8


class AsyncStore:
    """An open job store under asyncio. Use :func:`open_async_store`.

    On PostgreSQL from a URL it is async-native: root calls and transactions are
    awaited on a pool of psycopg ``AsyncConnection`` objects (no thread per call) and
    ``wait()`` listens on the loop; SQLite (and a store on the application's own
    connection) runs its calls on threads the store owns.
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        threads = 1 if store.backend == "sqlite" else _POOLED_ROOT_THREADS
        self._root = ThreadRunner("jaren_jobs-async", threads)
        self._lanes_lock = threading.Lock()
        self._lane_slots = asyncio.Semaphore(_LANES)
        self._idle_lanes: list[ThreadRunner] = []
        self._lanes_by_task: dict[asyncio.Task[Any] | None, Mark] = {}
        self._shut = False
        self._hub = store._hub
        self._native = _native_backend(store)
        # what a native transaction level checks is open (AsyncTransactionState)
        self._backend = self._native if self._native is not None else store._backend
        engine = session = None
        if self._native is not None:
            session = self._native.root_session(self._hub.runtime)
            engine = AsyncJobEngine(session, self._hub)
        self.jobs = AsyncJobs(
            store.jobs,
            TaskRouted(self._root, self._caller_lane),
            self._root,
            engine,
            enqueues=None if engine is not None else GroupCommit(store.jobs, store.transaction),
            worker_session=session,
        )

    def _native_tx_jobs(
        self, state: AsyncTransactionState, guard: Callable[[], None], turn: Turn
    ) -> AsyncJobs:
        # page() and create_worker() of tx.jobs still go through the sync root
        # (see docs/asyncio.md): the worker works at the root anyway
        return AsyncJobs(
            self._store.jobs,
            self.jobs._runner,
            self._root,
            state.jobs,
            guard=guard,
            worker_session=self.jobs._worker_session,
            serial=turn.run,
        )

    @property
    def store(self) -> Store:
        """The synchronous store underneath (its workers, its connection)."""
        return self._store

    @property
    def backend(self) -> str:
        return self._store.backend

    @property
    def path(self) -> str | None:
        return self._store.path

    @property
    def readonly(self) -> bool:
        return self._store.readonly

    @property
    def durability(self) -> str:
        return self._store.durability

    @property
    def closed(self) -> bool:
        return self._store.closed

    @property
    def runtime(self) -> Any:
        return self._store.runtime

    @property
    def defaults(self) -> Defaults:
        return self._store.defaults

    def _caller_lane(self) -> ThreadRunner | None:
        """The lane of the transaction the calling task is inside, if any (see TaskRouted)."""
        if not self._lanes_by_task:
            return None
        mark = self._lanes_by_task.get(current_task())
        if mark is None:
            for inside in INSIDE.get():
                if inside.store is self and inside.open:
                    return inside.lane
            return None
        return mark.lane

    def transaction(self) -> AbstractAsyncContextManager[AsyncTransaction[AsyncJobs]]:
        """``async with store.transaction() as tx``: one transaction of the database,
        belonging to this task; rolled back on an exception or a cancellation. Nested
        in the same task it is a savepoint."""
        if self._native is not None:
            return NativeTransactionBlock(self)
        return TransactionBlock(self)

    def _tx_jobs(self, transaction: Transaction, lane: ThreadRunner, turn: Turn) -> AsyncJobs:
        return AsyncJobs(transaction.jobs, lane, self._root, serial=turn.run)

    async def _take_lane(self) -> ThreadRunner:
        # a bounded number of transactions at once, each on its own thread; the rest wait
        # here, on the loop (SQLite runs one at a time anyway, behind its gate)
        await self._lane_slots.acquire()
        with self._lanes_lock:
            if self._idle_lanes:
                return self._idle_lanes.pop()
        return ThreadRunner("jaren_jobs-async-tx", 1)

    def _return_lane(self, lane: ThreadRunner) -> None:
        with self._lanes_lock:
            if self._shut:
                lane.shutdown()  # a transaction that outlived close(): its thread goes too
            else:
                self._idle_lanes.append(lane)
        self._lane_slots.release()

    async def close(self, *, grace_seconds: float | None = None) -> list[StopOutcome]:
        """Stop the store's workers (bounded), then close it (see ``Store.close``).

        Idempotent. Inside this task's own transaction it is refused as the sync
        API refuses it (``GateRefused``, reason ``"reentrant"``): it runs on that
        transaction's lane, where the store sees its own transaction open.
        """
        if self._shut:
            return []
        native = self._native
        if native is not None and native.in_my_transaction():
            raise GateRefused(
                "close() was called inside this store's transaction; finish it first",
                reason="reentrant",
            )
        lane = self._caller_lane()
        # not on the root threads: those may be waiting for the gate, and a close must
        # begin at once to refuse what waits there (StoreClosed)
        runner = lane if lane is not None else ThreadRunner("jaren_jobs-async-close", 1)
        try:
            return await runner.run_to_end(lambda: self._store.close(grace_seconds=grace_seconds))
        finally:
            if lane is None:
                runner.shutdown()
            if self._store.closed and native is not None and not native.closed:
                await native.close()  # after the sync side: its workers have stopped
            if self._store.closed and not self._shut:
                # the threads go only once the store is closed: a refused close leaves it usable
                self._root.shutdown()
                with self._lanes_lock:
                    self._shut = True
                    lanes, self._idle_lanes = self._idle_lanes, []
                for lane in lanes:
                    lane.shutdown()

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<jaren_jobs.AsyncStore {self._store.path or '(connection)'} {state}>"


def _native_backend(store: Store) -> Any:
    """The async-native backend of a PostgreSQL URL store (None: threads serve it)."""
    if store.backend != "postgres":
        return None
    # psycopg only for a PostgreSQL store: the SQLite path never imports it
    from jaren_jobs.backends.postgres.open_async import open_async_postgres  # noqa: PLC0415

    return open_async_postgres(store._backend)  # type: ignore[arg-type]


class _Opening:
    """What :func:`open_async_store` returns: await it, or ``async with`` it."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._args = args
        self._kwargs = kwargs
        self._store: AsyncStore | None = None

    async def _open(self) -> AsyncStore:
        # opening creates or upgrades the tables: off the loop, like every call
        store = await asyncio.to_thread(open_store, *self._args, **self._kwargs)
        return AsyncStore(store)

    def __await__(self) -> Generator[Any, None, AsyncStore]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncStore:
        self._store = await self._open()
        return self._store

    async def __aexit__(self, *exc: object) -> None:
        if self._store is not None:
            await self._store.close()


def open_async_store(*args: Any, **kwargs: Any) -> _Opening:
    """Open a job store for asyncio: ``open_store``'s arguments (SPEC §11).

    ``store = await open_async_store("app.db")`` or
    ``async with open_async_store("app.db") as store: ...``.
    """
    return _Opening(args, kwargs)
