"""The asyncio API (SPEC §11): ``open_async_store``, ``AsyncStore`` and its ``jobs``.

Every call is the synchronous engine's, run off the event loop: the engine
logic exists once, and these are thin awaited shells over it, kept in step by
a parity test (``tests/unit/test_async_parity.py``).

Where the calls run. The store's root calls run on threads the store owns
(one for SQLite, whose single connection serves one call at a time anyway;
a few for a pooled PostgreSQL store). A transaction runs on a *lane* of its
own — one thread that opens it, runs each of its statements and commits it —
because a store's transaction belongs to the thread that opened it. So a
transaction belongs to the task that opened it: another task's transaction
runs on another lane, and on SQLite waits (on that lane's thread, never on
the loop) until the first commits. A task cancelled inside
``store.transaction()`` rolls it back before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from datetime import datetime
from types import TracebackType
from typing import Any, Generic, TypeVar

from .arunner import AsyncCheckpointStore, TaskRouted, ThreadRunner
from .aworker import AsyncWorker
from .backend import Rows
from .cursor import Barrier, Cursor, Streaming
from .engine import wait_plan
from .errors import StorageError
from .periodic import Periodic
from .records import (
    ClaimedJob,
    Counts,
    DueCounts,
    Job,
    JobError,
    Lease,
    NewJob,
    Outcome,
    StopOutcome,
)
from .runtime import Defaults
from .signals import SignalLike
from .store import Jobs, Store, Transaction, current_task, open_store

__all__ = [
    "AsyncCursor",
    "AsyncJobs",
    "AsyncStore",
    "AsyncTransaction",
    "open_async_store",
]

T = TypeVar("T")
Item = TypeVar("Item")

# How many threads serve a pooled (PostgreSQL) store's root calls at once.
_POOLED_ROOT_THREADS = 4
# How many transactions may be open at once (each holds a thread, its lane).
_LANES = 8


class AsyncCursor(Generic[Item]):
    """``page()`` under asyncio: ``async for`` and ``async with`` over a §5 cursor.

    Each pull runs the synchronous cursor's pull off the loop (a root cursor
    still takes the store's connection per pull, never between pulls).
    """

    def __init__(self, cursor: Cursor[Item], runner: ThreadRunner) -> None:
        self._cursor = cursor
        self._runner = runner

    @property
    def streaming(self) -> Streaming:
        return self._cursor.streaming

    @property
    def barrier(self) -> Barrier | None:
        return self._cursor.barrier

    @property
    def settled(self) -> bool:
        return self._cursor.settled

    def __aiter__(self) -> AsyncCursor[Item]:
        return self

    async def __anext__(self) -> Item:
        done = object()
        item = await self._runner.run(lambda: next(self._cursor, done))
        if item is done:
            raise StopAsyncIteration
        return item  # type: ignore[return-value]

    async def close(self) -> None:
        await self._runner.run_to_end(self._cursor.close)

    async def __aenter__(self) -> AsyncCursor[Item]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncJobs:
    """``store.jobs`` / ``tx.jobs`` under asyncio: every call of SPEC §3 as a coroutine,
    with the same arguments, results and errors."""

    def __init__(self, jobs: Jobs, runner: ThreadRunner, root: ThreadRunner) -> None:
        self._jobs = jobs
        self._runner = runner  # where its calls run: the store's threads, or a lane
        self._root = root  # where a worker's own calls run (never a transaction's lane)

    def _run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
        return self._runner.run(functools.partial(fn, *args, **kwargs))

    async def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        id: str | None = None,
        run_at: datetime | None = None,
        delay_seconds: float | None = None,
        max_attempts: int | None = None,
        priority: int = 0,
        queue: str = "default",
        unique_key: str | None = None,
    ) -> Job:
        """Add one job (see ``store.jobs.enqueue``)."""
        return await self._run(
            self._jobs.enqueue,
            kind,
            payload,
            id=id,
            run_at=run_at,
            delay_seconds=delay_seconds,
            max_attempts=max_attempts,
            priority=priority,
            queue=queue,
            unique_key=unique_key,
        )

    async def enqueue_many(self, jobs: Iterable[NewJob]) -> list[Job]:
        return await self._run(self._jobs.enqueue_many, jobs)

    async def get(self, id: str) -> Job | None:
        return await self._run(self._jobs.get, id)

    async def errors(self, id: str) -> list[JobError]:
        return await self._run(self._jobs.errors, id)

    async def counts(self, *, queue: str | None = None) -> Counts:
        return await self._run(self._jobs.counts, queue=queue)

    async def due_counts(self, *, queue: str | None = None) -> DueCounts:
        return await self._run(self._jobs.due_counts, queue=queue)

    async def claim(
        self,
        kinds: Iterable[str],
        *,
        owner: str,
        lease_seconds: float | None = None,
        queues: Iterable[str] | None = None,
    ) -> ClaimedJob | None:
        return await self._run(
            self._jobs.claim, kinds, owner=owner, lease_seconds=lease_seconds, queues=queues
        )

    async def claim_many(
        self,
        kinds: Iterable[str],
        *,
        owner: str,
        limit: int,
        lease_seconds: float | None = None,
        queues: Iterable[str] | None = None,
    ) -> list[ClaimedJob]:
        return await self._run(
            self._jobs.claim_many,
            kinds,
            owner=owner,
            limit=limit,
            lease_seconds=lease_seconds,
            queues=queues,
        )

    async def renew(self, lease: Lease, *, lease_seconds: float | None = None) -> Lease:
        return await self._run(self._jobs.renew, lease, lease_seconds=lease_seconds)

    async def complete(self, lease: Lease, result: Any = None) -> bool:
        return await self._run(self._jobs.complete, lease, result)

    async def fail(
        self,
        lease: Lease,
        error: Any,
        *,
        retry: bool = True,
        backoff_base_seconds: float | None = None,
        backoff_cap_seconds: float | None = None,
    ) -> bool:
        return await self._run(
            self._jobs.fail,
            lease,
            error,
            retry=retry,
            backoff_base_seconds=backoff_base_seconds,
            backoff_cap_seconds=backoff_cap_seconds,
        )

    async def snooze(self, lease: Lease, delay_seconds: float) -> bool:
        """Pending again at now + delay, the attempt not spent (``store.jobs.snooze``)."""
        return await self._run(self._jobs.snooze, lease, delay_seconds)

    async def wait(
        self,
        id: str,
        *,
        timeout_seconds: float | None = None,
        signal: SignalLike | None = None,
    ) -> Job:
        """The job once done, dead or cancelled (see ``store.jobs.wait``).

        The task awaits its wake-ups on the loop; only each read of the row
        runs off it, so the loop is never blocked, and the store's thread is
        held only for those reads. Cancelling the task ends the wait.
        """
        # checked where the task's calls run: inside its own transaction that is
        # the transaction's thread, which the refusal must see
        plan = await self._run(wait_plan, self._jobs, id, timeout_seconds, signal)
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:  # from any thread; never blocks
            with suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
                loop.call_soon_threadsafe(woken.set)

        plan.start(wake)
        try:
            while True:
                woken.clear()
                job = plan.verdict(await self._run(self._jobs.get, plan.job_id))
                if job is not None:
                    return job
                with suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), plan.pause())
        finally:
            plan.stop()

    async def cancel(
        self,
        id: str,
        *,
        lease: Lease | None = None,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        force: bool = False,
    ) -> bool:
        """Cancel a job (see ``store.jobs.cancel``; ``force=True`` stops a running one)."""
        return await self._run(
            self._jobs.cancel, id, lease=lease, signal=signal, deadline=deadline, force=force
        )

    async def requeue(
        self,
        id: str,
        *,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        drop_checkpoints: bool = False,
        reset_attempts: bool = False,
    ) -> bool:
        return await self._run(
            self._jobs.requeue,
            id,
            drop_checkpoints=drop_checkpoints,
            reset_attempts=reset_attempts,
            signal=signal,
            deadline=deadline,
        )

    async def sweep(
        self,
        *,
        settled_before: datetime,
        limit: int | None = None,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        states: Iterable[str] | None = None,
    ) -> int:
        return await self._run(
            self._jobs.sweep,
            settled_before=settled_before,
            limit=limit,
            signal=signal,
            deadline=deadline,
            states=states,
        )

    def page(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        after: str | None = None,
        limit: int = 100,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
        queue: str | None = None,
        order: str = "id",
    ) -> AsyncCursor[Job]:
        """A keyset cursor (SPEC §5) by id or ``order="newest"``, pulled with ``async for``.

        Nothing is read until the first pull; bad filters raise at once.
        """
        cursor = self._jobs.page(
            state=state,
            kind=kind,
            after=after,
            limit=limit,
            signal=signal,
            deadline=deadline,
            queue=queue,
            order=order,
        )
        return AsyncCursor(cursor, self._runner)

    def checkpoints_for(self, claimed: ClaimedJob) -> AsyncCheckpointStore:
        return AsyncCheckpointStore(self._jobs.checkpoints_for(claimed), self._runner)

    def create_worker(
        self,
        handlers: Mapping[str, Any],
        *,
        concurrency: int = 1,
        poll_seconds: float | None = None,
        lease_seconds: float | None = None,
        owner: str | None = None,
        renew: bool = True,
        on_outcome: Callable[[Outcome], Any] | None = None,
        backoff_base_seconds: float | None = None,
        backoff_cap_seconds: float | None = None,
        stop_grace_seconds: float | None = None,
        on_renewal: Callable[[Lease], Any] | None = None,
        on_idle: Callable[[], Any] | None = None,
        periodic: Sequence[Periodic] | None = None,
        queues: Iterable[str] | None = None,
    ) -> AsyncWorker:
        """An :class:`~jaren_jobs.AsyncWorker` for ``handlers``, not started (SPEC §11):
        ``async def`` handlers are awaited on the calling loop, plain ones run on threads.
        Called from a coroutine (the loop its handlers will run on). Its own calls run on
        the store's threads, even when it is made through ``tx.jobs``."""
        # the keyword options as one mapping, taken first (nothing else is local yet): the
        # signature is their one list here, kept equal to Jobs.create_worker's by the parity
        # test, and the thread worker underneath checks them
        given = locals()
        options = {name: value for name, value in given.items() if name not in _NOT_OPTIONS}
        return AsyncWorker(self._jobs, self._root, handlers, options)


_NOT_OPTIONS = frozenset({"self", "handlers"})


class AsyncTransaction:
    """An open ``async with store.transaction()``: the application's SQL and ``tx.jobs``.

    Every call runs on the transaction's own lane (the thread that opened it).
    """

    def __init__(self, transaction: Transaction, lane: ThreadRunner, root: ThreadRunner) -> None:
        self._transaction = transaction
        self._lane = lane
        self.jobs = AsyncJobs(transaction.jobs, lane, root)
        self.depth = transaction.depth

    async def execute(self, statement: str, parameters: Any = ()) -> Rows:
        """The application's own SQL, as its driver takes it (``?`` on SQLite, ``%s`` on
        psycopg); the rows are read on the lane too (``await rows``-free: they are fetched)."""
        return await self._lane.run(
            lambda: _Fetched(self._transaction.execute(statement, parameters))
        )

    async def executemany(self, statement: str, seq_of_parameters: Iterable[Any]) -> Rows:
        return await self._lane.run(
            lambda: _Fetched(self._transaction.executemany(statement, seq_of_parameters))
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

    def __init__(self, lane: ThreadRunner, transaction: Transaction, mark: _Mark) -> None:
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


class _Fetched(Rows):
    """A result read whole on the lane, so the loop never waits on the driver for a row."""

    def __init__(self, rows: Rows) -> None:
        self._rowcount = rows.rowcount
        self._lastrowid = rows.lastrowid
        self._description = rows.description
        self._rows = rows.fetchall() if rows.description is not None else []
        self._at = 0

    def fetchone(self) -> Any:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    def fetchall(self) -> list[Any]:
        rest, self._at = self._rows[self._at :], len(self._rows)
        return rest

    def fetchmany(self, size: int = 1) -> list[Any]:
        part = self._rows[self._at : self._at + size]
        self._at += len(part)
        return part

    @property
    def rowcount(self) -> int:
        return self._rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._lastrowid

    @property
    def description(self) -> Any:
        return self._description


class _Mark:
    """An open outermost transaction of a task: its lane, and whether it is still open.

    The task that opened it owns it; so do the tasks that task makes inside the
    block (``asyncio.wait_for`` and ``gather`` make one per call before Python
    3.12), which find the mark in the context they copied (:data:`_INSIDE`).
    """

    __slots__ = ("lane", "open", "store", "task")

    def __init__(self, store: AsyncStore, lane: ThreadRunner, task: asyncio.Task[Any] | None):
        self.store = store
        self.lane = lane
        self.task = task
        self.open = True

    def owns(self) -> bool:
        """Whether the calling task may use this transaction (its own, or one it made)."""
        return self.open and (current_task() is self.task or self in _INSIDE.get())


# the transactions the calling context is inside (each a _Mark): copied into the tasks
# made inside an ``async with store.transaction()`` block
_INSIDE: contextvars.ContextVar[tuple[_Mark, ...]] = contextvars.ContextVar(
    "jaren_jobs_inside_transactions", default=()
)


class _TransactionBlock:
    """What ``AsyncStore.transaction()`` returns: ``async with`` it (on one task)."""

    def __init__(self, store: AsyncStore) -> None:
        self._store = store
        self._mark: _Mark | None = None
        self._block: AbstractContextManager[Transaction] | None = None
        self._owned_lane = False
        self._token: contextvars.Token[tuple[_Mark, ...]] | None = None

    async def __aenter__(self) -> AsyncTransaction:
        store = self._store
        task = current_task()
        held = store._lanes_by_task.get(task)
        if held is not None:
            # nested in the same task: a savepoint on the lane that holds the transaction
            mark = held
        else:
            mark = _Mark(store, await store._take_lane(), task)
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
            self._token = _INSIDE.set((*_INSIDE.get(), mark))
        return AsyncTransaction(tx, _OwnedLane(lane, tx, mark), store._root)

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
                    _INSIDE.reset(self._token)
                self._token = None
            store._return_lane(mark.lane)
            self._owned_lane = False


class AsyncStore:
    """An open job store under asyncio. Use :func:`open_async_store`."""

    def __init__(self, store: Store) -> None:
        self._store = store
        threads = 1 if store.backend == "sqlite" else _POOLED_ROOT_THREADS
        self._root = ThreadRunner("jaren_jobs-async", threads)
        self._lanes_lock = threading.Lock()
        self._lane_slots = asyncio.Semaphore(_LANES)
        self._idle_lanes: list[ThreadRunner] = []
        self._lanes_by_task: dict[asyncio.Task[Any] | None, _Mark] = {}
        self._shut = False
        self.jobs = AsyncJobs(store.jobs, TaskRouted(self._root, self._caller_lane), self._root)

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
            for inside in _INSIDE.get():
                if inside.store is self and inside.open:
                    return inside.lane
            return None
        return mark.lane

    def transaction(self) -> _TransactionBlock:
        """``async with store.transaction() as tx``: one transaction of the database,
        belonging to this task; rolled back on an exception or a cancellation. Nested
        in the same task it is a savepoint."""
        return _TransactionBlock(self)

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
        lane = self._caller_lane()
        # not on the root threads: those may be waiting for the gate, and a close must
        # begin at once to refuse what waits there (StoreClosed)
        runner = lane if lane is not None else ThreadRunner("jaren_jobs-async-close", 1)
        try:
            return await runner.run_to_end(lambda: self._store.close(grace_seconds=grace_seconds))
        finally:
            if lane is None:
                runner.shutdown()
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
