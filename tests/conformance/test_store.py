"""A store's transactions, its close, and os.fork() (SPEC §1).

Threads are ordered with events and by watching the gate's queue, never by
sleeping: a thread counts as "waiting on the gate" once it is in the queue.
Opening (pragmas, the application's connection, text factories) is in
tests/backends/sqlite/test_open.py, lock waits in .../test_busy.py, the gate's
own order in .../test_gate.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from jaren_jobs import (
    DuplicateJob,
    GateRefused,
    Job,
    Runtime,
    StorageError,
    Store,
    StoreClosed,
    TransactionAborted,
)
from tests.harness import Harness

WAIT = 10.0  # generous bound for anything a test waits on; never reached when all is well


def queued(store: Store) -> int:
    """How many calls wait in the store's gate queue right now."""
    return store._backend.db.gate.waiting()


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    """Wait for a condition another thread brings about (bounded; fails loudly)."""
    end = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        pause.wait(0.002)


class Call:
    """Run a callable in a thread and keep its result or exception."""

    def __init__(self, fn: Callable[[], Any], name: str = "call") -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.started = threading.Event()
        self.done = threading.Event()
        self._fn = fn
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        self.started.set()
        try:
            self.result = self._fn()
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def start(self) -> Call:
        self.thread.start()
        assert self.started.wait(WAIT)
        return self

    def join(self) -> Any:
        assert self.done.wait(WAIT), "the call never returned"
        self.thread.join(WAIT)
        if self.error is not None:
            raise self.error
        return self.result


def order_ids(backend: Harness) -> list[int]:
    return [r[0] for r in backend.query("SELECT id FROM orders ORDER BY id")]


@pytest.fixture
def app_store(store: Store) -> Store:
    """The store, plus an application table of its own in the same file."""
    with store.transaction() as tx:
        tx.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
    return store


def test_context_manager_closes(backend: Harness, runtime: Runtime) -> None:
    with backend.open(runtime=runtime) as store:
        assert not store.closed
        store.jobs.enqueue("k", id="j")
    assert store.closed
    with pytest.raises(StoreClosed):
        store.jobs.get("j")
    with pytest.raises(RuntimeError, match="boom"), backend.open() as failing:
        raise RuntimeError("boom")
    assert failing.closed
    assert backend.job_ids() == ["j"]


# ----------------------------------------------------------------- transactions


def test_transaction_commit_writes_both(app_store: Store, backend: Harness) -> None:
    with app_store.transaction() as tx:
        tx.execute(backend.app_sql("INSERT INTO orders (id, item) VALUES (?, ?)"), (1, "book"))
        job = tx.jobs.enqueue("ship", {"order": 1}, id="ship-1")
        assert isinstance(job, Job)
        assert tx.jobs.get("ship-1") == job  # visible inside the transaction
        # ... and not outside it until the commit
        assert backend.job_ids() == []
        assert order_ids(backend) == []
    assert backend.job_ids() == ["ship-1"]
    assert order_ids(backend) == [1]
    assert app_store.jobs.get("ship-1") == job


def test_transaction_exception_rolls_back_both(app_store: Store, backend: Harness) -> None:
    def checkout() -> None:
        with app_store.transaction() as tx:
            tx.execute(backend.app_sql("INSERT INTO orders (id, item) VALUES (?, ?)"), (1, "book"))
            tx.jobs.enqueue("ship", {"order": 1}, id="ship-1")
            raise RuntimeError("payment declined")

    with pytest.raises(RuntimeError, match="payment declined"):
        checkout()
    assert backend.job_ids() == []
    assert order_ids(backend) == []
    # the gate was released: root calls go on working
    assert app_store.jobs.get("ship-1") is None
    app_store.jobs.enqueue("k", id="after")
    assert backend.job_ids() == ["after"]


def test_transaction_engine_refusal_rolls_back(app_store: Store, backend: Harness) -> None:
    app_store.jobs.enqueue("k", id="taken")

    def checkout() -> None:
        with app_store.transaction() as tx:
            tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
            tx.jobs.enqueue("k", id="taken")

    with pytest.raises(DuplicateJob):
        checkout()
    assert order_ids(backend) == []


def test_nested_transaction_is_a_savepoint(app_store: Store, backend: Harness) -> None:
    with app_store.transaction() as outer:
        outer.execute("INSERT INTO orders (id, item) VALUES (1, 'kept')")
        outer.jobs.enqueue("k", id="outer-job")

        def inner_step() -> None:
            with app_store.transaction() as inner:
                assert inner.depth == 1
                inner.execute("INSERT INTO orders (id, item) VALUES (2, 'dropped')")
                inner.jobs.enqueue("k", id="inner-job")
                raise ValueError("inner failure")

        with pytest.raises(ValueError, match="inner failure"):
            inner_step()
        # the outer transaction carries on after the inner one rolled back
        with app_store.transaction() as second:
            second.execute("INSERT INTO orders (id, item) VALUES (3, 'kept too')")
            second.jobs.enqueue("k", id="second-job")
        assert outer.jobs.get("inner-job") is None
        outer.execute("INSERT INTO orders (id, item) VALUES (4, 'last')")
    assert order_ids(backend) == [1, 3, 4]
    assert backend.job_ids() == ["outer-job", "second-job"]


def test_nested_commit_is_undone_by_outer_rollback(app_store: Store, backend: Harness) -> None:
    def outer_step() -> None:
        with app_store.transaction():
            with app_store.transaction() as inner:
                inner.jobs.enqueue("k", id="inner-job")
            raise KeyError("outer fails")

    with pytest.raises(KeyError):
        outer_step()
    assert backend.job_ids() == []


def test_transaction_view_after_the_block(app_store: Store) -> None:
    with app_store.transaction() as tx:
        tx.jobs.enqueue("k", id="j")
    with pytest.raises(StorageError, match="ended"):
        tx.jobs.enqueue("k", id="late")
    with pytest.raises(StorageError, match="ended"):
        tx.jobs.get("j")
    with pytest.raises(StorageError, match="ended"):
        tx.execute("SELECT 1")
    assert app_store.jobs.get("late") is None


def test_transaction_view_from_another_thread(app_store: Store) -> None:
    with app_store.transaction() as tx:
        stray = Call(lambda: tx.jobs.enqueue("k", id="stray")).start()
        with pytest.raises(StorageError, match="thread"):
            stray.join()
    assert app_store.jobs.get("stray") is None


def test_root_call_inside_transaction_is_refused_at_once(
    backend: Harness, runtime: Runtime
) -> None:
    # a long gate timeout: if the refusal waited instead, the test would notice
    with backend.open(runtime=runtime, gate_timeout_seconds=60) as store:
        with store.transaction() as tx:
            tx.jobs.enqueue("k", id="in-tx")
            for call in (
                lambda: store.jobs.enqueue("k", id="root"),
                lambda: store.jobs.get("in-tx"),
                store.jobs.counts,
                lambda: store.jobs.claim(["k"], owner="w"),
                store.close,
            ):
                started = time.monotonic()
                with pytest.raises(GateRefused) as info:
                    call()
                assert time.monotonic() - started < 5
                assert info.value.code == "JD2064"
                assert info.value.details["reason"] == "reentrant"
                assert "tx.jobs" in str(info.value) or "finish it" in str(info.value)
            assert tx.jobs.get("in-tx") is not None
        assert store.jobs.get("in-tx") is not None
        assert store.jobs.get("root") is None
        assert not store.closed


@pytest.mark.requires("gate")
def test_root_call_from_another_thread_waits_for_commit(app_store: Store) -> None:
    with app_store.transaction() as tx:
        tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
        tx.jobs.enqueue("ship", id="ship-1")
        reader = Call(lambda: app_store.jobs.get("ship-1"), "reader").start()
        wait_until(lambda: queued(app_store) == 1, "the reader to queue on the gate")
        assert not reader.done.is_set()  # it waits: it has not read yet
        tx.jobs.enqueue("ship", id="ship-2")
    job = reader.join()
    assert job is not None
    assert job.id == "ship-1"
    assert app_store.jobs.get("ship-2") is not None


@pytest.mark.requires("gate")
def test_root_write_from_another_thread_waits_for_commit(app_store: Store) -> None:
    with app_store.transaction() as tx:
        tx.jobs.enqueue("k", id="first")
        writer = Call(lambda: app_store.jobs.claim(["k"], owner="w"), "writer").start()
        wait_until(lambda: queued(app_store) == 1, "the writer to queue on the gate")
        assert not writer.done.is_set()
    claimed = writer.join()
    assert claimed is not None
    assert claimed.id == "first"


# ----------------------------------------------------------------- asyncio tasks
#
# A sync store's transaction belongs to a thread, and every task of an event
# loop runs on one: a second task must never become a savepoint inside the
# first task's transaction (it would commit, or roll back, with it).


# about the sync API misused from coroutines: the async harnesses' bridge maps a thread to a task
@pytest.mark.requires("sync-api")
def test_a_second_asyncio_task_never_joins_another_tasks_transaction(
    app_store: Store, backend: Harness
) -> None:
    store = app_store
    insert = backend.app_sql("INSERT INTO orders (id, item) VALUES (?, ?)")
    seen: dict[str, BaseException] = {}

    async def main() -> None:
        inside, release = asyncio.Event(), asyncio.Event()
        held: list[Any] = []

        async def first() -> None:
            with store.transaction() as tx:
                tx.execute(insert, (1, "first's"))
                tx.jobs.enqueue("ship", id="first-job")
                held.append(tx)
                inside.set()
                await release.wait()  # an await inside the transaction, as handlers do
                raise RuntimeError("first's payment declined")

        async def second() -> None:
            await inside.wait()
            try:
                with store.transaction() as tx:
                    tx.jobs.enqueue("ship", id="second-job")
            except GateRefused as exc:
                seen["transaction"] = exc
            try:
                held[0].jobs.enqueue("ship", id="borrowed-job")
            except StorageError as exc:
                seen["borrowed"] = exc
            try:
                held[0].execute(insert, (2, "borrowed"))
            except StorageError as exc:
                seen["borrowed-execute"] = exc
            release.set()

        results = await asyncio.gather(first(), second(), return_exceptions=True)
        assert isinstance(results[0], RuntimeError)
        assert results[1] is None

    asyncio.run(main())
    assert seen["transaction"].details["reason"] == "task"
    assert "asyncio" in str(seen["transaction"])
    for key in ("borrowed", "borrowed-execute"):
        assert "another asyncio task" in str(seen[key])
    # first's rollback took first's writes; nothing of second's was ever written
    assert backend.job_ids() == []
    assert order_ids(backend) == []
    # and each task commits alone once they take turns
    with store.transaction() as tx:
        tx.execute(insert, (3, "later"))
    assert order_ids(backend) == [3]


def test_nested_transactions_of_one_asyncio_task_are_savepoints(
    app_store: Store, backend: Harness
) -> None:
    async def main() -> None:
        with app_store.transaction() as outer:
            outer.jobs.enqueue("k", id="outer-job")
            await asyncio.sleep(0)
            with app_store.transaction() as inner:
                assert inner.depth == 1
                inner.jobs.enqueue("k", id="inner-job")

    asyncio.run(main())
    assert backend.job_ids() == ["inner-job", "outer-job"]


@pytest.mark.requires("gate", "sync-api")  # the sync API misused from coroutines
def test_a_root_call_of_a_second_task_during_a_transaction_is_refused_naming_threads(
    app_store: Store, backend: Harness
) -> None:
    refused: list[GateRefused] = []

    async def main() -> None:
        inside, release = asyncio.Event(), asyncio.Event()

        async def first() -> None:
            with app_store.transaction() as tx:
                tx.jobs.enqueue("ship", id="first-job")
                inside.set()
                await release.wait()

        async def second() -> None:
            await inside.wait()
            try:
                app_store.jobs.enqueue("ship", id="root-job")
            except GateRefused as exc:
                refused.append(exc)
            release.set()

        await asyncio.gather(first(), second())

    asyncio.run(main())
    [exc] = refused
    assert exc.details["reason"] == "reentrant"
    assert "asyncio.to_thread" in str(exc)
    assert backend.job_ids() == ["first-job"]


# ----------------------------------------------------------------- driver errors


BAD_STATEMENTS = {
    # name: (statement with ? placeholders, parameters, many, which driver error)
    "syntax": ("SELEC nonsense", None, False, "driver_error"),
    "duplicate": (
        "INSERT INTO orders (id, item) VALUES (1, 'again')",
        None,
        False,
        "integrity_error",
    ),
    "not-null": (
        "INSERT INTO orders (id, item) VALUES (?, ?)",
        [(2, None)],
        True,
        "integrity_error",
    ),
    "no-table": ("SELECT * FROM no_such_table", None, False, "driver_error"),
}


@pytest.mark.parametrize("bad", sorted(BAD_STATEMENTS))
def test_bad_sql_is_a_storage_error(app_store: Store, backend: Harness, bad: str) -> None:
    statement, params, many, cause = BAD_STATEMENTS[bad]
    statement = backend.app_sql(statement)

    def checkout() -> None:
        with app_store.transaction() as tx:
            tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
            run = (
                (lambda: tx.executemany(statement, params))
                if many
                else (lambda: tx.execute(statement))
            )
            with pytest.raises(StorageError) as info:
                run()
            assert not isinstance(info.value, TransactionAborted)
            assert isinstance(info.value.__cause__, getattr(backend, cause))
            assert info.value.code == "JD2099"
            rows = tx.execute("SELECT id, item FROM orders")
            assert rows.fetchall() == [(1, "book")]

    if "sqlite" in backend.capabilities:
        checkout()  # SQLite undoes the one statement: the transaction goes on and commits
        assert order_ids(backend) == [1]
    else:
        # PostgreSQL aborts the whole transaction: every later call says so, nothing commits
        assert_aborted(checkout)
        assert order_ids(backend) == []


def assert_aborted(call: Callable[[], Any]) -> None:
    with pytest.raises(TransactionAborted) as info:
        call()
    assert info.value.code == "JD2093"
    assert "rolled back" in str(info.value)


def test_a_transaction_ended_by_its_own_statement_is_refused_after(
    app_store: Store, backend: Harness
) -> None:
    # ROLLBACK run through tx.execute succeeds, yet ends the transaction
    def checkout() -> None:
        with app_store.transaction() as tx:
            tx.jobs.enqueue("ship", id="ship-1")
            tx.execute("ROLLBACK")
            assert_aborted(lambda: tx.jobs.enqueue("ship", id="orphan"))

    assert_aborted(checkout)
    assert backend.job_ids() == []


@pytest.mark.requires("gate")
def test_close_wakes_queued_callers(backend: Harness, runtime: Runtime) -> None:
    store = backend.open(runtime=runtime)
    holder_in = threading.Event()
    holder_release = threading.Event()

    def hold() -> None:
        with store.transaction():
            holder_in.set()
            assert holder_release.wait(WAIT)

    holder = Call(hold, "holder").start()
    assert holder_in.wait(WAIT)
    waiter = Call(lambda: store.jobs.get("x"), "waiter").start()
    wait_until(lambda: queued(store) == 1, "the waiter to queue")
    closer = Call(store.close, "closer").start()
    # the queued caller is refused as soon as close() begins
    with pytest.raises(StoreClosed):
        waiter.join()
    holder_release.set()
    holder.join()
    closer.join()
    assert store.closed
