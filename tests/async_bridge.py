"""The sync ``Store`` surface, driven through the asyncio API: the conformance suite's
async harnesses (``sqlite-file-async``, ``postgres-async``).

A test written against ``Store`` gets a :class:`BridgeStore`; every call it
makes becomes the matching coroutine of an :class:`~jaren_jobs.AsyncStore`
(from ``open_async_store``) awaited on a private event loop thread, and the
calling thread waits for the answer. So the whole suite exercises the async
API — its results, its errors, its transactions and workers — without a
second copy of any test.

How the sync shapes map onto the async ones:

* ``store.jobs.x(...)`` → ``await astore.jobs.x(...)`` in a task of its own;
* ``with store.transaction() as tx`` → ``async with astore.transaction()``
  entered and exited by one task (a transaction belongs to a task), which
  then runs every ``tx.*`` call of the thread that opened it, every
  ``store.jobs.*`` call of that thread too (as the sync API's thread is the
  async API's task), and a nested ``store.transaction()`` of that thread (a
  savepoint in the same task). A call on ``tx`` from another thread runs in
  a task of its own — another task, which the async API must refuse as the
  sync API refuses another thread;
* ``page()`` → an ``AsyncCursor`` pulled with ``__anext__``;
* ``checkpoints_for()`` → an ``AsyncCheckpointStore``;
* ``create_worker()`` → an ``AsyncWorker`` made on the loop (its ``async def``
  handlers would be awaited there), ``start``/``stop``/``run_once`` awaited.

Anything else (``store.connection``, the SQLite gate a test watches) is the
sync store underneath, which the async store wraps.

The cursor, checkpoint store and worker shims subclass the sync types they
stand for (and override every public name), so a test's ``isinstance(cursor,
Cursor)`` asks what it means here: that the async API handed back its own
twin (``AsyncCursor``…), which each shim asserts when it is made.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

from jaren_jobs import (
    AsyncCheckpointStore,
    AsyncCursor,
    AsyncStore,
    AsyncWorker,
    CheckpointStore,
    Cursor,
    Worker,
    open_async_store,
)
from jaren_jobs.aio.store import AsyncJobs

T = TypeVar("T")

# a call that never answers fails its test with this, well inside pytest's own timeout
_ANSWER_SECONDS = 120.0


class EventLoopThread:
    """An event loop running on a daemon thread of its own, for the bridge's coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="bridge-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            try:
                self.loop.run_forever()
            except (KeyboardInterrupt, SystemExit):
                # asyncio lets these out of the loop as well as setting them on their task
                # (an AsyncWorker's run_once whose handler raised one): the task's caller
                # gets it; the loop goes on serving the other calls
                continue

    def run(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()``'s coroutine in a task of its own on the loop; its result or error."""
        assert threading.current_thread() is not self._thread, (
            "the bridge's loop would wait on itself"
        )

        async def call() -> T:
            return await make()

        future = asyncio.run_coroutine_threadsafe(call(), self.loop)
        return _answer(future)

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def drain() -> None:
            # what a test left running (a transaction it never ended) is cancelled, not leaked
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(drain(), self.loop).result(_ANSWER_SECONDS)
        finally:
            self._stopping = True
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(_ANSWER_SECONDS)
            self.loop.close()


def _answer(future: concurrent.futures.Future[T]) -> T:
    try:
        return future.result(_ANSWER_SECONDS)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise AssertionError(
            f"the async API did not answer within {_ANSWER_SECONDS} s (a deadlock?)"
        ) from None


class _TransactionTask:
    """The one task that holds a bridged transaction: it enters ``astore.transaction()``
    (and nested ones), runs the opening thread's calls, and exits them, in order."""

    def __init__(self, bridge: BridgeStore) -> None:
        self._bridge = bridge
        self._loop = bridge.loop.loop
        self._requests: asyncio.Queue[tuple[str, Any, concurrent.futures.Future[Any]]] | None = None
        self._ready = concurrent.futures.Future[None]()
        self.depth = 0
        self.task = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        _answer(self._ready)

    async def _serve(self) -> None:
        self._requests = asyncio.Queue()
        self._ready.set_result(None)
        blocks: list[Any] = []
        while True:
            kind, payload, reply = await self._requests.get()
            try:
                if kind == "enter":
                    block = self._bridge.astore.transaction()
                    tx = await block.__aenter__()
                    blocks.append(block)
                    reply.set_result(tx)
                elif kind == "exit":
                    block = blocks.pop()
                    reply.set_result(await block.__aexit__(*payload))
                else:
                    reply.set_result(await payload())
            except BaseException as exc:  # the caller's thread raises it
                reply.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError) and not blocks:
                    raise
            if not blocks:
                return  # the outermost ended (or never opened)

    def send(self, kind: str, payload: Any) -> Any:
        reply: concurrent.futures.Future[Any] = concurrent.futures.Future()
        requests = self._requests
        assert requests is not None
        self._loop.call_soon_threadsafe(requests.put_nowait, (kind, payload, reply))
        return _answer(reply)


class BridgeStore:
    """What an async harness's ``open()`` returns: ``Store``'s surface over an ``AsyncStore``."""

    def __init__(self, loop: EventLoopThread, astore: AsyncStore) -> None:
        self.loop = loop
        self.astore = astore
        self._open_by_thread: dict[int, _TransactionTask] = {}
        self._lock = threading.Lock()
        self.jobs = BridgeJobs(self, lambda: astore.jobs, None)

    @classmethod
    def open(cls, loop: EventLoopThread, *args: Any, **kwargs: Any) -> BridgeStore:
        return cls(loop, loop.run(lambda: open_async_store(*args, **kwargs)))

    # ------------------------------------------------------------ where a call runs

    def _held(self) -> _TransactionTask | None:
        with self._lock:
            return self._open_by_thread.get(threading.get_ident())

    def call(self, make: Callable[[], Awaitable[T]], owner: _TransactionTask | None = None) -> T:
        """``make()`` awaited: in the task holding this thread's transaction if there is one
        (``owner`` when the call belongs to a given transaction), else in a task of its own."""
        held = self._held()
        if held is not None and (owner is None or owner is held):
            return held.send("call", make)  # type: ignore[no-any-return]
        return self.loop.run(make)

    # ------------------------------------------------------------ Store's surface

    @property
    def backend(self) -> str:
        return self.astore.backend

    @property
    def path(self) -> str | None:
        return self.astore.path

    @property
    def readonly(self) -> bool:
        return self.astore.readonly

    @property
    def durability(self) -> str:
        return self.astore.durability

    @property
    def closed(self) -> bool:
        return self.astore.closed

    @property
    def runtime(self) -> Any:
        return self.astore.runtime

    @property
    def defaults(self) -> Any:
        return self.astore.defaults

    def close(self, *, grace_seconds: float | None = None) -> Any:
        return self.call(lambda: self.astore.close(grace_seconds=grace_seconds))

    def __enter__(self) -> BridgeStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name == "_backend":
            # the database the async calls reach: on PostgreSQL its async pool and gate
            return self.astore._backend
        # store.connection: the sync store the async one wraps
        return getattr(self.astore.store, name)

    def __repr__(self) -> str:
        return f"<BridgeStore over {self.astore!r}>"

    def transaction(self) -> BridgeTransactionBlock:
        return BridgeTransactionBlock(self)


class BridgeTransactionBlock:
    """``with store.transaction() as tx`` of the bridge."""

    def __init__(self, bridge: BridgeStore) -> None:
        self._bridge = bridge
        self._task: _TransactionTask | None = None
        self._outermost = False

    def __enter__(self) -> BridgeTransaction:
        bridge = self._bridge
        task = bridge._held()
        if task is None:
            task = _TransactionTask(bridge)
            self._outermost = True
        try:
            atx = task.send("enter", None)
        except BaseException:
            if self._outermost:
                _answer(task.task)  # it ended with its failed opening
            raise
        self._task = task
        if self._outermost:
            with bridge._lock:
                bridge._open_by_thread[threading.get_ident()] = task
        task.depth += 1
        return BridgeTransaction(bridge, task, atx)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        task = self._task
        assert task is not None
        task.depth -= 1
        try:
            return bool(task.send("exit", (exc_type, exc, tb)))
        finally:
            if self._outermost:
                with self._bridge._lock:
                    self._bridge._open_by_thread.pop(threading.get_ident(), None)
                _answer(task.task)


class BridgeTransaction:
    """``tx`` of the bridge: each call awaited on the transaction's task (from the
    thread that opened it) or on a task of its own (from any other thread)."""

    def __init__(self, bridge: BridgeStore, task: _TransactionTask, atx: Any) -> None:
        self._bridge = bridge
        self._task = task
        self._atx = atx
        self.depth = atx.depth
        self.jobs = BridgeJobs(bridge, lambda: atx.jobs, task)

    def execute(self, statement: str, parameters: Any = ()) -> Any:
        return self._bridge.call(lambda: self._atx.execute(statement, parameters), self._task)

    def executemany(self, statement: str, seq_of_parameters: Iterable[Any]) -> Any:
        return self._bridge.call(
            lambda: self._atx.executemany(statement, seq_of_parameters), self._task
        )

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._atx.after_commit(callback)


# every coroutine of AsyncJobs goes through the bridge as a plain call; the parity
# test (tests/unit/test_async_parity.py) keeps that set the sync surface's
_COROUTINES = frozenset(
    name
    for name, member in vars(AsyncJobs).items()
    if not name.startswith("_") and inspect.iscoroutinefunction(member)
)


class BridgeJobs:
    """``store.jobs`` / ``tx.jobs`` of the bridge."""

    def __init__(
        self,
        bridge: BridgeStore,
        jobs: Callable[[], Any],
        owner: _TransactionTask | None,
    ) -> None:
        self._bridge = bridge
        self._jobs = jobs
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        if name not in _COROUTINES:
            raise AttributeError(name)
        bridge, owner, jobs = self._bridge, self._owner, self._jobs

        def call(*args: Any, **kwargs: Any) -> Any:
            return bridge.call(lambda: getattr(jobs(), name)(*args, **kwargs), owner)

        call.__name__ = name
        return call

    def page(self, **filters: Any) -> BridgeCursor:
        # page() itself is not a coroutine: bad filters raise here, nothing is read yet
        return BridgeCursor(self._bridge, self._jobs().page(**filters), self._owner)

    def checkpoints_for(self, claimed: Any) -> BridgeCheckpoints:
        return BridgeCheckpoints(self._bridge, self._jobs().checkpoints_for(claimed), self._owner)

    def create_worker(self, handlers: Any, **options: Any) -> BridgeWorker:
        jobs = self._jobs

        async def make() -> Any:
            return jobs().create_worker(handlers, **options)  # on the loop, as a coroutine does

        return BridgeWorker(self._bridge, self._bridge.loop.run(make))


class BridgeCursor(Cursor[Any]):
    """A sync cursor over an ``AsyncCursor``."""

    def __init__(self, bridge: BridgeStore, cursor: Any, owner: _TransactionTask | None) -> None:
        assert isinstance(cursor, AsyncCursor), cursor
        self._bridge = bridge
        self._cursor = cursor
        self._owner = owner

    @property
    def streaming(self) -> Any:
        return self._cursor.streaming

    @property
    def barrier(self) -> Any:
        return self._cursor.barrier

    @property
    def settled(self) -> bool:
        return bool(self._cursor.settled)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return self._bridge.call(self._cursor.__anext__, self._owner)
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        self._bridge.call(self._cursor.close, self._owner)

    def __enter__(self) -> BridgeCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return repr(self._cursor)


class BridgeCheckpoints(CheckpointStore):
    """A sync checkpoint store over an ``AsyncCheckpointStore``."""

    def __init__(self, bridge: BridgeStore, checkpoints: Any, owner: _TransactionTask | None):
        assert isinstance(checkpoints, AsyncCheckpointStore), checkpoints
        self._bridge = bridge
        self._checkpoints = checkpoints
        self._owner = owner

    @property
    def job_id(self) -> str:
        return str(self._checkpoints.job_id)

    @property
    def generation(self) -> int:
        return int(self._checkpoints.generation)

    def load(self, run_id: str) -> Any:
        return self._bridge.call(lambda: self._checkpoints.load(run_id), self._owner)

    def save(self, run_id: str, node_id: str, value: Any) -> None:
        self._bridge.call(lambda: self._checkpoints.save(run_id, node_id, value), self._owner)

    def complete(self, run_id: str, result: Any = None) -> bool:
        return bool(
            self._bridge.call(lambda: self._checkpoints.complete(run_id, result), self._owner)
        )


class BridgeWorker(Worker):
    """A sync worker over an ``AsyncWorker``: its lifecycle awaited, the rest read as is."""

    _OWN = frozenset({"_bridge", "aworker", "owner"})

    def __init__(self, bridge: BridgeStore, worker: Any) -> None:
        assert isinstance(worker, AsyncWorker), worker
        self._bridge = bridge
        self.aworker = worker
        self.owner = worker.owner

    def __setattr__(self, name: str, value: Any) -> None:
        # a test standing in one of the worker's internals (worker._step = ...) means the
        # thread worker's, which the AsyncWorker runs on
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.aworker.worker, name, value)

    @property
    def name(self) -> str:
        return str(self.aworker.name)

    @property
    def kinds(self) -> list[str]:
        return list(self.aworker.kinds)

    @property
    def running(self) -> bool:
        return bool(self.aworker.running)

    @property
    def interrupted(self) -> BaseException | None:
        return self.aworker.interrupted  # type: ignore[no-any-return]

    def stats(self) -> Any:
        return self.aworker.stats()

    def leases(self) -> Any:
        return self.aworker.leases()

    def start(self) -> BridgeWorker:
        self._bridge.loop.run(self.aworker.start)
        return self

    def stop(self, grace_seconds: float | None = None) -> Any:
        return self._bridge.loop.run(lambda: self.aworker.stop(grace_seconds))

    def run_once(self) -> bool:
        return bool(self._bridge.loop.run(self.aworker.run_once))

    def __getattr__(self, name: str) -> Any:
        # anything else a test reads: the thread worker underneath
        return getattr(self.aworker.worker, name)

    def __repr__(self) -> str:
        return repr(self.aworker)
