"""The asyncio API (SPEC §11): ``open_async_store``, ``AsyncStore`` and its ``jobs``.

Every call is the synchronous engine's, run off the event loop: the engine
logic exists once, and these are thin awaited shells over it, kept in step by
a parity test (``tests/unit/test_async_parity.py``).

Where the calls run. The store's root calls run on threads the store owns
(one for SQLite, whose single connection serves one call at a time anyway;
a few for a pooled PostgreSQL store). A transaction runs on a *lane* of its
own (:mod:`jaren_jobs.atx`).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, suppress
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

from .abackend import AsyncJobsSession
from .acheckpoints import AsyncCheckpoints
from .aengine import AsyncJobEngine, runtime_of, session_of, settled_wake_of
from .aengine import wait_plan as native_wait_plan
from .arunner import AsyncCheckpointStore, GroupCommit, TaskRouted, ThreadRunner
from .atransaction import AsyncTransactionState
from .atx import INSIDE, AsyncTransaction, Mark, NativeTransactionBlock, TransactionBlock
from .aworker import AsyncWorker
from .core.commands import PageFilters, check_page
from .cursor import Barrier, Cursor, Streaming
from .engine import wait_plan
from .errors import GateRefused
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

    def __init__(
        self,
        cursor: Cursor[Item],
        runner: ThreadRunner,
        bind: Callable[[asyncio.AbstractEventLoop], None] | None = None,
    ) -> None:
        self._cursor = cursor
        self._runner = runner
        # async-native: the cursor's statements go back to the loop each pull comes from
        self._bind = bind

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
        if self._bind is not None:
            self._bind(asyncio.get_running_loop())
        done = object()
        item = await self._runner.run(lambda: next(self._cursor, done))
        if item is done:
            raise StopAsyncIteration
        return item  # type: ignore[return-value]

    async def close(self) -> None:
        if self._bind is not None:
            self._bind(asyncio.get_running_loop())
        await self._runner.run_to_end(self._cursor.close)

    async def __aenter__(self) -> AsyncCursor[Item]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncJobs:
    """``store.jobs`` / ``tx.jobs`` under asyncio: every call of SPEC §3 as a coroutine,
    with the same arguments, results and errors."""

    def __init__(
        self,
        jobs: Jobs,
        runner: ThreadRunner,
        root: ThreadRunner,
        engine: AsyncJobEngine | None = None,
        *,
        guard: Callable[[], None] | None = None,
        enqueues: GroupCommit | None = None,
        worker_session: AsyncJobsSession | None = None,
    ) -> None:
        self._jobs = jobs
        # async-native: the root session a worker's renewals are awaited through
        self._worker_session = worker_session
        self._runner = runner  # where its calls run: the store's threads, or a lane
        self._root = root  # where a worker's own calls run (never a transaction's lane)
        # async-native (PostgreSQL): the awaited engine its calls go to, and what refuses
        # a task that is not this transaction's
        self._engine = engine
        self._guard = guard
        # on the threads (SQLite), the root's concurrent enqueues share commits
        self._enqueues = None if engine is not None else enqueues

    def _run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
        engine = self._engine
        if engine is not None and getattr(fn, "__self__", None) is self._jobs:
            # the sync engine's call of that name, awaited on the loop instead
            if self._guard is not None:
                self._guard()
            native: Callable[..., Awaitable[T]] = getattr(engine, fn.__name__)
            return native(*args, **kwargs)
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
        if self._enqueues is not None:
            # concurrent root enqueues share one commit (GroupCommit); each its own savepoint
            return await self._runner.submit_grouped(
                lambda jobs: jobs.enqueue(
                    kind,
                    payload,
                    id=id,
                    run_at=run_at,
                    delay_seconds=delay_seconds,
                    max_attempts=max_attempts,
                    priority=priority,
                    queue=queue,
                    unique_key=unique_key,
                ),
                self._enqueues,
            )
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
        if self._engine is not None:
            if self._guard is not None:
                self._guard()
            # on the loop: the store's listener is the loop's (LISTEN on an AsyncConnection)
            plan = native_wait_plan(self._engine, id, timeout_seconds, signal)
        else:
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
        if self._engine is not None:
            filters = check_page(
                state=state,
                kind=kind,
                after=after,
                limit=limit,
                queue=queue,
                order=order,
                what="page()",
            )
            native, bind = self._native_page(filters, signal, deadline)
            return AsyncCursor(native, self._runner, bind)
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

    def _native_page(
        self, filters: PageFilters, signal: SignalLike | None, deadline: datetime | None
    ) -> tuple[Cursor[Job], Callable[[asyncio.AbstractEventLoop], None]]:
        """The keyset cursor whose pulls' statements await the async pool (its pulls run
        on the store's threads, as every AsyncCursor's do)."""
        from .backends.postgres.apages import page_jobs_async  # noqa: PLC0415 - psycopg

        # nothing checked here (page() reads nothing): each pull checks its transaction
        assert self._engine is not None
        session: Any = session_of(self._engine)
        scope = session.scope
        return page_jobs_async(
            session.db,
            runtime_of(self._engine),
            None if scope.root else scope._check,
            filters,
            signal=signal,
            deadline=deadline,
        )

    def checkpoints_for(self, claimed: ClaimedJob) -> AsyncCheckpointStore:
        checkpoints = self._jobs.checkpoints_for(claimed)  # its checks (no I/O)
        if self._engine is None:
            return AsyncCheckpointStore(checkpoints, self._runner)
        native = AsyncCheckpoints(
            session_of(self._engine),
            runtime_of(self._engine).now_ms,
            claimed.id,
            lambda: claimed.lease,
            settled_wake_of(self._engine),
        )
        # the same shell, its calls awaited on the loop instead of run on a thread
        return AsyncCheckpointStore(cast(Any, native), cast(ThreadRunner, _Awaited()))

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
        return AsyncWorker(self._jobs, self._root, handlers, options, self._worker_session)


_NOT_OPTIONS = frozenset({"self", "handlers"})


class _Awaited:
    """A runner whose calls return awaitables: it awaits them on the loop (no thread)."""

    async def run(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await fn()


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
        self._native_stacks: dict[object, list[AsyncTransactionState]] = {}
        # what a native transaction level checks is open (AsyncTransactionState)
        self._backend = self._native if self._native is not None else store._backend
        engine = session = None
        if self._native is not None:
            session = self._native.root_session(self._hub.runtime, self._hub.idle_claims)
            engine = AsyncJobEngine(session, self._hub)
        self.jobs = AsyncJobs(
            store.jobs,
            TaskRouted(self._root, self._caller_lane),
            self._root,
            engine,
            enqueues=None if engine is not None else GroupCommit(store.jobs, store.transaction),
            worker_session=session,
        )

    def _native_tx_jobs(self, state: AsyncTransactionState, guard: Callable[[], None]) -> AsyncJobs:
        # page() and create_worker() of tx.jobs still go through the sync root
        # (see docs/asyncio.md): the worker works at the root anyway
        return AsyncJobs(
            self._store.jobs,
            self.jobs._runner,
            self._root,
            state.jobs,
            guard=guard,
            worker_session=self.jobs._worker_session,
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

    def _tx_jobs(self, transaction: Transaction, lane: ThreadRunner) -> AsyncJobs:
        return AsyncJobs(transaction.jobs, lane, self._root)

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
    from .backends.postgres.aopen import open_async_postgres  # noqa: PLC0415

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
