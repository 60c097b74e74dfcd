"""The asyncio ``jobs`` (SPEC §11): :class:`AsyncJobs`, and :class:`AsyncCursor` for its
``page()``.

Every call is the synchronous engine's, run off the event loop (on the store's
threads or a transaction's lane) or, async-native on PostgreSQL, the same call of
the generated :class:`~jaren_jobs.engine.engine_async.AsyncJobEngine` awaited on the loop.
The store that hands these out is :mod:`jaren_jobs.aio.store`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import suppress
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

from jaren_jobs.aio.runner import AsyncCheckpointStore, GroupCommit, ThreadRunner
from jaren_jobs.aio.worker import AsyncWorker
from jaren_jobs.backend_async import AsyncJobsSession
from jaren_jobs.core.commands import PageFilters, check_page
from jaren_jobs.cursor import Barrier, Cursor, Streaming
from jaren_jobs.engine.checkpoints_async import AsyncCheckpoints
from jaren_jobs.engine.engine_async import AsyncJobEngine
from jaren_jobs.jobs import Jobs, engine_of
from jaren_jobs.periodic import Periodic
from jaren_jobs.records import (
    ClaimedJob,
    Counts,
    DueCounts,
    Job,
    JobError,
    Lease,
    NewJob,
    Outcome,
    SettledBuckets,
)
from jaren_jobs.signals import SignalLike

__all__ = ["AsyncCursor", "AsyncJobs"]

T = TypeVar("T")
Item = TypeVar("Item")


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
        serial: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]] | None = None,
    ) -> None:
        self._jobs = jobs
        # a transaction's view: each call runs whole in its level's turn (aio.turns.Turn), so
        # calls of gathered tasks never interleave on its one connection
        self._serial = serial
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
        serial = self._serial
        if serial is not None:
            return cast("Awaitable[T]", serial(lambda: self._dispatch(fn, *args, **kwargs)))
        return self._dispatch(fn, *args, **kwargs)

    def _dispatch(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
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
            plan = self._engine.wait_plan(id, timeout_seconds, signal)
        else:
            plan = await self._run(engine_of(self._jobs).wait_plan, id, timeout_seconds, signal)
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

    async def queues(self, *, limit: int = 100) -> list[str]:
        """The queues that hold live jobs (see ``store.jobs.queues``)."""
        return await self._run(self._jobs.queues, limit=limit)

    async def settled_buckets(
        self, *, since: datetime, bucket_seconds: float, buckets: int, limit: int = 10_000
    ) -> SettledBuckets:
        """The jobs settled per bucket of a window (see ``store.jobs.settled_buckets``)."""
        return await self._run(
            self._jobs.settled_buckets,
            since=since,
            bucket_seconds=bucket_seconds,
            buckets=buckets,
            limit=limit,
        )

    async def run_now(
        self,
        id: str,
        *,
        signal: SignalLike | None = None,
        deadline: datetime | None = None,
    ) -> bool:
        """Make a queued job waiting on its ``run_at`` or a retry's backoff due now (see
        ``store.jobs.run_now``)."""
        return await self._run(self._jobs.run_now, id, signal=signal, deadline=deadline)

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
        from jaren_jobs.backends.postgres.pages_async import page_jobs_async  # noqa: PLC0415 - psycopg

        # nothing checked here (page() reads nothing): each pull checks its transaction
        assert self._engine is not None
        session: Any = self._engine.session
        scope = session.scope
        return page_jobs_async(
            session.db,
            self._engine.runtime,
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
            self._engine.session,
            self._engine.runtime.now_ms,
            claimed.id,
            lambda: claimed.lease,
            self._engine.settled_wake,
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
