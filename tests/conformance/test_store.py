"""Opening a store, its transactions, and its gate (SPEC §1).

Threads are ordered with events and by watching the gate's queue, never by
sleeping: a thread counts as "waiting on the gate" once it is in the queue.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import (
    CancelScope,
    DuplicateJob,
    GateRefused,
    Job,
    NewJob,
    Runtime,
    StorageError,
    Store,
    StoreClosed,
    TransactionAborted,
    open_store,
)

WAIT = 10.0  # generous bound for anything a test waits on; never reached when all is well


def queued(store: Store) -> int:
    """How many calls wait in the store's gate queue right now."""
    return store._db.gate.waiting()


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


def other_connection(db_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(db_path, isolation_level=None, timeout=0)


def job_ids(db_path: Path) -> list[str]:
    conn = other_connection(db_path)
    try:
        return [r[0] for r in conn.execute('SELECT id FROM "_jaren_jobs" ORDER BY id')]
    finally:
        conn.close()


def order_ids(db_path: Path) -> list[int]:
    conn = other_connection(db_path)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM orders ORDER BY id")]
    finally:
        conn.close()


@pytest.fixture
def app_store(store: Store) -> Store:
    """The store, plus an application table of its own in the same file."""
    with store.transaction() as tx:
        tx.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)")
    return store


# ----------------------------------------------------------------- opening


@pytest.mark.parametrize(("durability", "synchronous"), [("full", 2), ("normal", 1)])
def test_open_with_a_path(db_path: Path, durability: str, synchronous: int) -> None:
    assert not db_path.exists()
    store = open_store(db_path, durability=durability, busy_timeout_seconds=1.5)  # type: ignore[arg-type]
    try:
        assert db_path.exists()
        assert store.path == str(db_path)
        assert store.durability == durability
        conn = store.connection
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == synchronous
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 1500
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        other = other_connection(db_path)
        try:
            # WAL is a property of the file: another connection sees it too
            assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            tables = {
                r[0] for r in other.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
        finally:
            other.close()
        assert {"_jaren_jobs", "_jaren_job_checkpoints", "_jaren_meta"} <= tables
        assert store.jobs.enqueue("k").state == "pending"
    finally:
        store.close()
    assert store.closed


def test_the_longest_busy_timeout_sqlite_holds_is_accepted(db_path: Path) -> None:
    with open_store(db_path, busy_timeout_seconds=2_147_483.647) as store:
        assert store.connection.execute("PRAGMA busy_timeout").fetchone()[0] == 2**31 - 1
    with pytest.raises(ValueError, match="busy_timeout_seconds"):
        open_store(db_path, busy_timeout_seconds=2_147_483.648)


def test_open_default_busy_timeout(store: Store) -> None:
    assert store.connection.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    assert store.connection.execute("PRAGMA synchronous").fetchone()[0] == 2


@pytest.mark.parametrize(("durability", "synchronous"), [("full", 2), ("normal", 1)])
def test_open_with_an_app_connection(db_path: Path, durability: str, synchronous: int) -> None:
    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    try:
        store = open_store(connection=conn, durability=durability, busy_timeout_seconds=2)  # type: ignore[arg-type]
        assert store.connection is conn
        assert store.path is None
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == synchronous
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2000
        store.jobs.enqueue("k", id="j")
        store.close()
        assert store.closed
        with pytest.raises(StoreClosed):
            store.jobs.get("j")
        # a store given a connection never closes it
        assert conn.execute('SELECT id FROM "_jaren_jobs"').fetchall() == [("j",)]
        with open_store(connection=conn) as again:
            assert again.jobs.get("j") is not None
        assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        conn.close()


def latin1(raw: bytes) -> str:
    return raw.decode("latin-1")


@pytest.mark.parametrize("factory", [bytes, latin1], ids=["bytes", "latin-1"])
def test_the_app_connections_text_factory_changes_nothing_the_library_reads(
    db_path: Path, runtime: Runtime, factory: Callable[[bytes], Any]
) -> None:
    """The library reads text as str whatever the application set; its own SQL keeps
    the application's factory."""
    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    conn.text_factory = factory
    payload = {"name": "café ☕", "n": 1}
    try:
        with open_store(connection=conn, runtime=runtime) as store:
            store.jobs.enqueue("brew", payload, id="j")
            got = store.jobs.get("j")
            assert got is not None
            assert (got.id, got.kind, got.state, got.payload) == ("j", "brew", "pending", payload)
            [paged] = list(store.jobs.page(kind="brew"))
            assert paged == got
            assert store.jobs.counts().pending_kinds == {"brew": 1}
            seen: list[Any] = []

            def handler(value: Any, ctx: Any) -> Any:
                seen.append((value, ctx.job.kind, ctx.checkpoints.load("j")))
                ctx.checkpoints.save("j", "step", "é")
                return {"echo": value["name"]}

            worker = store.jobs.create_worker({"brew": handler})
            assert worker.run_once() is True
            worker.stop()
            assert seen == [(payload, "brew", None)]
            done = store.jobs.get("j")
            assert done is not None
            assert (done.state, done.result) == ("done", {"echo": "café ☕"})
            with store.transaction() as tx:
                # the application's own statements read with its own factory
                row = tx.execute('SELECT kind FROM "_jaren_jobs" WHERE id = ?', ("j",)).fetchone()
                assert row == (factory(b"brew"),)
                assert tx.jobs.get("j") == done
            assert conn.text_factory is factory
        assert conn.text_factory is factory
    finally:
        conn.close()


def test_a_utf16_database_round_trips_text(tmp_path: Path, runtime: Runtime) -> None:
    path = tmp_path / "utf16.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA encoding = 'UTF-16le'")
    conn.execute("CREATE TABLE app (x TEXT)")  # the encoding is fixed by the first table
    conn.commit()
    conn.close()
    payload = {"name": "café ☕ 😀", "kéy": ["ü", 1.5]}
    with open_store(path, runtime=runtime) as store:
        assert store.connection.execute("PRAGMA encoding").fetchone()[0] == "UTF-16le"
        store.jobs.enqueue("k", payload, id="j")
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert claimed.payload == payload
        assert store.jobs.fail(claimed.lease, "erreur é", retry=False) is True
        assert store.jobs.requeue("j") is True
        again = store.jobs.claim(["k"], owner="w")
        assert again is not None
        assert (again.payload, again.last_error) == (payload, "erreur é")
        assert store.jobs.complete(again.lease, {"résultat": "😀"}) is True
        done = store.jobs.get("j")
        assert done is not None
        assert (done.payload, done.result) == (payload, {"résultat": "😀"})
        assert [job.payload for job in store.jobs.page()] == [payload]


def test_open_memory(runtime: Runtime) -> None:
    with open_store(":memory:", runtime=runtime) as store:
        store.jobs.enqueue("k", id="j")
        assert store.jobs.get("j") is not None
        assert store.connection.execute("PRAGMA journal_mode").fetchone()[0] == "memory"


def test_context_manager_closes(db_path: Path, runtime: Runtime) -> None:
    with open_store(db_path, runtime=runtime) as store:
        assert not store.closed
        store.jobs.enqueue("k", id="j")
    assert store.closed
    with pytest.raises(StoreClosed):
        store.jobs.get("j")
    with pytest.raises(RuntimeError, match="boom"), open_store(db_path) as failing:
        raise RuntimeError("boom")
    assert failing.closed
    assert job_ids(db_path) == ["j"]


def test_exactly_one_of_path_or_connection(db_path: Path) -> None:
    with pytest.raises(TypeError, match="exactly one"):
        open_store()
    conn = sqlite3.connect(db_path, check_same_thread=False)
    try:
        with pytest.raises(TypeError, match="exactly one"):
            open_store(db_path, connection=conn)
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"durability": "fast"}, ValueError),
        ({"readonly": "yes"}, TypeError),
        ({"busy_timeout_seconds": -1}, ValueError),
        # SQLite keeps busy_timeout in a C int of milliseconds: more would wrap to "never wait"
        ({"busy_timeout_seconds": 2_147_484.0}, ValueError),
        ({"busy_timeout_seconds": 3e9}, ValueError),
        ({"gate_timeout_seconds": float("nan")}, ValueError),
        ({"defaults": {"lease_seconds": 0}}, ValueError),
        ({"defaults": {"no_such_key": 1}}, ValueError),
        ({"runtime": object()}, TypeError),
    ],
)
def test_open_refuses_bad_options(db_path: Path, kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        open_store(db_path, **kwargs)


# ----------------------------------------------------------------- transactions


def test_transaction_commit_writes_both(app_store: Store, db_path: Path) -> None:
    with app_store.transaction() as tx:
        tx.execute("INSERT INTO orders (id, item) VALUES (?, ?)", (1, "book"))
        job = tx.jobs.enqueue("ship", {"order": 1}, id="ship-1")
        assert isinstance(job, Job)
        assert tx.jobs.get("ship-1") == job  # visible inside the transaction
        # ... and not outside it until the commit
        assert job_ids(db_path) == []
        assert order_ids(db_path) == []
    assert job_ids(db_path) == ["ship-1"]
    assert order_ids(db_path) == [1]
    assert app_store.jobs.get("ship-1") == job


def test_transaction_exception_rolls_back_both(app_store: Store, db_path: Path) -> None:
    def checkout() -> None:
        with app_store.transaction() as tx:
            tx.execute("INSERT INTO orders (id, item) VALUES (?, ?)", (1, "book"))
            tx.jobs.enqueue("ship", {"order": 1}, id="ship-1")
            raise RuntimeError("payment declined")

    with pytest.raises(RuntimeError, match="payment declined"):
        checkout()
    assert job_ids(db_path) == []
    assert order_ids(db_path) == []
    # the gate was released: root calls go on working
    assert app_store.jobs.get("ship-1") is None
    app_store.jobs.enqueue("k", id="after")
    assert job_ids(db_path) == ["after"]


def test_transaction_engine_refusal_rolls_back(app_store: Store, db_path: Path) -> None:
    app_store.jobs.enqueue("k", id="taken")

    def checkout() -> None:
        with app_store.transaction() as tx:
            tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
            tx.jobs.enqueue("k", id="taken")

    with pytest.raises(DuplicateJob):
        checkout()
    assert order_ids(db_path) == []


def test_nested_transaction_is_a_savepoint(app_store: Store, db_path: Path) -> None:
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
    assert order_ids(db_path) == [1, 3, 4]
    assert job_ids(db_path) == ["outer-job", "second-job"]


def test_nested_commit_is_undone_by_outer_rollback(app_store: Store, db_path: Path) -> None:
    def outer_step() -> None:
        with app_store.transaction():
            with app_store.transaction() as inner:
                inner.jobs.enqueue("k", id="inner-job")
            raise KeyError("outer fails")

    with pytest.raises(KeyError):
        outer_step()
    assert job_ids(db_path) == []


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


def test_root_call_inside_transaction_is_refused_at_once(db_path: Path, runtime: Runtime) -> None:
    # a long gate timeout: if the refusal waited instead, the test would notice
    with open_store(db_path, runtime=runtime, gate_timeout_seconds=60) as store:
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


def test_root_write_from_another_thread_waits_for_commit(app_store: Store) -> None:
    with app_store.transaction() as tx:
        tx.jobs.enqueue("k", id="first")
        writer = Call(lambda: app_store.jobs.claim(["k"], owner="w"), "writer").start()
        wait_until(lambda: queued(app_store) == 1, "the writer to queue on the gate")
        assert not writer.done.is_set()
    claimed = writer.join()
    assert claimed is not None
    assert claimed.id == "first"


# ----------------------------------------------------------------- driver errors


def test_bad_sql_is_a_storage_error(app_store: Store, db_path: Path) -> None:
    with app_store.transaction() as tx:
        tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
        with pytest.raises(StorageError) as info:
            tx.execute("SELEC nonsense")
        assert isinstance(info.value.__cause__, sqlite3.Error)
        assert info.value.code == "JD2099"
        with pytest.raises(StorageError) as dup:
            tx.execute("INSERT INTO orders (id, item) VALUES (1, 'again')")
        assert isinstance(dup.value.__cause__, sqlite3.IntegrityError)
        with pytest.raises(StorageError) as many:
            tx.executemany("INSERT INTO orders (id, item) VALUES (?, ?)", [(2, None)])
        assert isinstance(many.value.__cause__, sqlite3.IntegrityError)
        with pytest.raises(StorageError):
            tx.execute("SELECT * FROM no_such_table")
        rows = tx.execute("SELECT id, item FROM orders")
        assert rows.fetchall() == [(1, "book")]
    # the caught errors did not spoil the transaction
    assert order_ids(db_path) == [1]


# Statements after which SQLite itself rolls the whole transaction back.
ROLLBACK_CAUSES = {
    "insert-or-rollback": "INSERT OR ROLLBACK INTO orders (id, item) VALUES (1, 'again')",
    "on-conflict-rollback": "INSERT INTO seats (n) VALUES (1)",
    "raise-rollback": "INSERT INTO audit (note) VALUES ('refused')",
}


@pytest.fixture
def rollback_store(app_store: Store) -> Store:
    """``app_store`` plus tables whose constraint or trigger rolls a transaction back."""
    with app_store.transaction() as tx:
        tx.execute("CREATE TABLE seats (n INTEGER PRIMARY KEY ON CONFLICT ROLLBACK)")
        tx.execute("INSERT INTO seats (n) VALUES (1)")
        tx.execute("CREATE TABLE audit (note TEXT)")
        tx.execute(
            "CREATE TRIGGER audit_refuses BEFORE INSERT ON audit "
            "BEGIN SELECT RAISE(ROLLBACK, 'audit refused'); END"
        )
    return app_store


def assert_aborted(call: Callable[[], Any]) -> None:
    with pytest.raises(TransactionAborted) as info:
        call()
    assert info.value.code == "JD2093"
    assert "rolled back" in str(info.value)


@pytest.mark.parametrize("cause", sorted(ROLLBACK_CAUSES))
def test_a_transaction_sqlite_rolled_back_refuses_every_later_call(
    rollback_store: Store, db_path: Path, cause: str
) -> None:
    store = rollback_store
    committed: list[str] = []

    def checkout() -> None:
        with store.transaction() as tx:
            tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
            tx.jobs.enqueue("ship", {"order": 1}, id="ship-1")
            tx.after_commit(lambda: committed.append("ship-1"))
            with pytest.raises(StorageError) as first:
                tx.execute(ROLLBACK_CAUSES[cause])
            assert not isinstance(first.value, TransactionAborted)
            assert "rolled back" in str(first.value)
            # the application caught it and carries on: nothing may run outside
            # the transaction it believes it is in
            assert_aborted(lambda: tx.jobs.enqueue("ship", {"order": 2}, id="orphan"))
            assert_aborted(lambda: tx.jobs.enqueue_many([NewJob("ship", id="orphan-many")]))
            assert_aborted(lambda: tx.execute("INSERT INTO orders (id, item) VALUES (2, 'x')"))
            assert_aborted(lambda: tx.executemany("INSERT INTO orders VALUES (?, ?)", [(3, "y")]))
            assert_aborted(lambda: tx.jobs.get("ship-1"))
            assert_aborted(tx.jobs.counts)
            assert_aborted(lambda: tx.jobs.claim(["ship"], owner="w"))

            def nested() -> None:
                with store.transaction() as inner:
                    inner.jobs.enqueue("ship", id="orphan-nested")

            assert_aborted(nested)

    assert_aborted(checkout)  # the block itself ends in the error, never in a COMMIT
    assert committed == []
    assert job_ids(db_path) == []
    assert order_ids(db_path) == []
    # the store is not wedged: the gate is free, a new transaction commits
    assert store.jobs.get("orphan") is None
    with store.transaction() as tx:
        tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
        tx.jobs.enqueue("ship", {"order": 1}, id="ship-1")
    assert job_ids(db_path) == ["ship-1"]
    assert order_ids(db_path) == [1]


def test_a_rollback_inside_a_nested_transaction_ends_the_outer_one(
    rollback_store: Store, db_path: Path
) -> None:
    store = rollback_store

    def checkout() -> None:
        with store.transaction() as outer:
            outer.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")

            def step() -> None:
                with store.transaction() as inner:
                    inner.jobs.enqueue("ship", id="ship-1")
                    with pytest.raises(StorageError):
                        inner.execute(ROLLBACK_CAUSES["raise-rollback"])
                    assert_aborted(lambda: inner.jobs.enqueue("ship", id="orphan-inner"))

            assert_aborted(step)  # the savepoint block ends in the error too
            assert_aborted(lambda: outer.jobs.enqueue("ship", id="orphan-outer"))
            assert_aborted(lambda: outer.execute("INSERT INTO orders (id, item) VALUES (2, 'x')"))

    assert_aborted(checkout)
    assert job_ids(db_path) == []
    assert order_ids(db_path) == []


def test_a_transaction_ended_by_its_own_statement_is_refused_after(
    app_store: Store, db_path: Path
) -> None:
    # ROLLBACK run through tx.execute succeeds, yet ends the transaction
    def checkout() -> None:
        with app_store.transaction() as tx:
            tx.jobs.enqueue("ship", id="ship-1")
            tx.execute("ROLLBACK")
            assert_aborted(lambda: tx.jobs.enqueue("ship", id="orphan"))

    assert_aborted(checkout)
    assert job_ids(db_path) == []


def test_locked_database_is_a_storage_error(db_path: Path, runtime: Runtime) -> None:
    with open_store(db_path, runtime=runtime, busy_timeout_seconds=0) as store:
        blocker = other_connection(db_path)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(StorageError) as info:
                store.jobs.enqueue("k", id="j")
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            assert "locked" in str(info.value) or "busy" in str(info.value)
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        # the refused call left no transaction behind
        assert store.jobs.enqueue("k", id="j").id == "j"


def test_busy_write_lock_gives_up_after_busy_timeout(db_path: Path, runtime: Runtime) -> None:
    with open_store(db_path, runtime=runtime, busy_timeout_seconds=0.2) as store:
        blocker = other_connection(db_path)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            for call in (
                lambda: store.jobs.enqueue("k", id="j"),
                lambda: store.transaction().__enter__(),
            ):
                started = time.monotonic()
                with pytest.raises(StorageError) as info:
                    call()
                assert time.monotonic() - started >= 0.2
                assert isinstance(info.value.__cause__, sqlite3.OperationalError)
                assert "busy_timeout" in str(info.value)
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        # the configured timeout is still the connection's
        assert store.connection.execute("PRAGMA busy_timeout").fetchone()[0] == 200
        assert store.jobs.enqueue("k", id="j").id == "j"


@pytest.mark.parametrize("via", ["root", "transaction"])
def test_write_waits_for_another_connections_lock(
    db_path: Path, runtime: Runtime, via: str
) -> None:
    with open_store(db_path, runtime=runtime) as store:
        begins = threading.Event()

        def trace(statement: str) -> None:
            if statement.strip().upper() == "BEGIN IMMEDIATE":
                begins.set()

        def write() -> object:
            if via == "root":
                return store.jobs.enqueue("k", id="j")
            with store.transaction() as tx:
                return tx.jobs.enqueue("k", id="j")

        blocker = other_connection(db_path)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            blocker.execute(
                'INSERT INTO "_jaren_jobs" (id, kind, state, run_at, max_attempts, created_at, '
                "updated_at) VALUES ('blocker', 'k', 'pending', 0, 1, 0, 0)"
            )
            store.connection.set_trace_callback(trace)
            writer = Call(write, "writer").start()
            assert begins.wait(WAIT)  # it tried, and found the lock taken
            assert not writer.done.is_set()
            blocker.execute("COMMIT")
            job = writer.join()
        finally:
            store.connection.set_trace_callback(None)
            blocker.close()
        assert job.id == "j"
        assert job_ids(db_path) == ["blocker", "j"]


def test_app_connection_with_an_open_transaction(db_path: Path) -> None:
    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    try:
        store = open_store(connection=conn)
        conn.execute("BEGIN")
        with pytest.raises(StorageError, match="open transaction"):
            store.jobs.enqueue("k")
        with pytest.raises(StorageError, match="open transaction"), store.transaction():
            pass
        conn.execute("ROLLBACK")
        assert store.jobs.enqueue("k", id="j").id == "j"
        store.close()
    finally:
        conn.close()


# ----------------------------------------------------------------- the gate


def test_gate_serves_waiters_in_arrival_order(store: Store, db_path: Path) -> None:
    # ids are minted under the gate, so the id each waiter's job gets records
    # the order in which the gate served them
    calls: list[Call] = []
    with store.transaction() as tx:
        tx.execute("SELECT 1")
        for index in range(5):
            call = Call(lambda i=index: store.jobs.enqueue(f"waiter-{i}"), f"waiter-{index}")
            calls.append(call.start())
            wait_until(lambda n=index + 1: queued(store) == n, f"waiter {index} to queue")
        assert not any(c.done.is_set() for c in calls)
    jobs = [c.join() for c in calls]
    assert [j.kind for j in jobs] == [f"waiter-{i}" for i in range(5)]
    assert [j.id for j in jobs] == [f"id-{i:06d}" for i in range(1, 6)]
    assert queued(store) == 0


def test_gate_handover_beats_a_newcomer(store: Store) -> None:
    # a release hands the gate to the oldest waiter; a thread arriving after
    # the release but before the waiter wakes must queue behind it
    with store.transaction():
        first = Call(lambda: store.jobs.enqueue("first"), "first").start()
        wait_until(lambda: queued(store) == 1, "the first waiter to queue")
    newcomer = store.jobs.enqueue("newcomer")
    assert first.join().id == "id-000001"
    assert newcomer.id == "id-000002"


def test_gate_timeout(db_path: Path, runtime: Runtime) -> None:
    with open_store(db_path, runtime=runtime, gate_timeout_seconds=0.2) as store:
        with store.transaction() as tx:
            tx.jobs.enqueue("k", id="j")
            started = time.monotonic()
            waiter = Call(lambda: store.jobs.get("j"), "waiter").start()
            with pytest.raises(GateRefused) as info:
                waiter.join()
            assert time.monotonic() - started >= 0.2
            assert info.value.details["reason"] == "timeout"
            assert info.value.code == "JD2064"
            assert queued(store) == 0  # it left the queue
        assert store.jobs.get("j") is not None


class ForeignSignal:
    """A signal the library did not make: it can only be polled."""

    def __init__(self) -> None:
        self.aborted = False
        self.reason: Any = None


@pytest.mark.parametrize("kind", ["cancel-scope", "foreign"])
def test_gate_abandoned_through_a_signal(store: Store, db_path: Path, kind: str) -> None:
    store.jobs.enqueue("k", id="j")
    scope = CancelScope()
    foreign = ForeignSignal()
    signal: Any = scope.signal if kind == "cancel-scope" else foreign
    calls = [
        ("cancel", lambda: store.jobs.cancel("j", signal=signal)),
        ("requeue", lambda: store.jobs.requeue("j", signal=signal)),
    ]
    with store.transaction():
        waiters: list[Call] = []
        for count, (name, fn) in enumerate(calls, start=1):
            waiters.append(Call(fn, name).start())
            wait_until(lambda n=count: queued(store) == n, f"{name} to queue")
        if kind == "cancel-scope":
            scope.abort("user went away")
        else:
            foreign.reason = "user went away"
            foreign.aborted = True
        for waiter in waiters:
            with pytest.raises(GateRefused) as info:
                waiter.join()
            assert info.value.details["reason"] == "aborted"
            assert "user went away" in str(info.value)
        assert queued(store) == 0
    job = store.jobs.get("j")
    assert job is not None
    assert job.state == "pending"  # nothing was written


def test_gate_abandonment_keeps_the_queue_order(store: Store) -> None:
    store.jobs.enqueue("k", id="j")
    scope = CancelScope()
    with store.transaction():
        first = Call(lambda: store.jobs.enqueue("first"), "first").start()
        wait_until(lambda: queued(store) == 1, "first to queue")
        quitter = Call(lambda: store.jobs.cancel("j", signal=scope.signal), "quitter").start()
        wait_until(lambda: queued(store) == 2, "quitter to queue")
        last = Call(lambda: store.jobs.enqueue("last"), "last").start()
        wait_until(lambda: queued(store) == 3, "last to queue")
        scope.abort("gone")
        with pytest.raises(GateRefused):
            quitter.join()
        assert queued(store) == 2
    assert first.join().id == "id-000001"
    assert last.join().id == "id-000002"
    assert store.jobs.get("j").state == "pending"  # type: ignore[union-attr]


def test_close_wakes_queued_callers(db_path: Path, runtime: Runtime) -> None:
    store = open_store(db_path, runtime=runtime)
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


# ----------------------------------------------------------------- os.fork()
#
# A child made by os.fork() has a copy of the parent's SQLite connection (whose
# locks it does not hold) and of the gate's state (whose holders and waiters
# are parent threads that do not exist in the child). The store refuses it all
# at once. The children below run a real os.fork(); each answers through a
# pipe and leaves with os._exit, so nothing of pytest runs twice. Python 3.12+
# warns that a fork with threads running may deadlock: these tests fork with
# threads on purpose (that is the case they pin), so they silence exactly it.

FORK_WARNING = "ignore:This process .* is multi-threaded:DeprecationWarning"
needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")


def in_forked_child(body: Callable[[], Any], timeout: float = WAIT) -> Any:
    """Run ``body`` in a child of a real ``os.fork()``; its JSON answer, or fail loudly."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: whatever happens, never return into pytest
        code = 70
        try:
            os.close(read_end)
            try:
                answer: Any = {"answer": body()}
            except BaseException as exc:
                answer = {"raised": repr(exc), "traceback": traceback.format_exc()}
            with os.fdopen(write_end, "w") as out:
                json.dump(answer, out)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            ready = select.select([read_end], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"the forked child did not answer within {timeout}s")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status), status
    assert os.WEXITSTATUS(status) == 0, status
    reply = json.loads(b"".join(chunks))
    assert "answer" in reply, reply.get("traceback", reply)
    return reply["answer"]


def refusal(call: Callable[[], Any]) -> list[Any]:
    """In the child: ``[code, message, seconds]`` of the StoreClosed ``call`` raised."""
    started = time.monotonic()
    try:
        call()
    except StoreClosed as exc:
        return [exc.code, str(exc), time.monotonic() - started]
    except BaseException as exc:
        return ["not StoreClosed", repr(exc), time.monotonic() - started]
    return ["no refusal", None, time.monotonic() - started]


def enter_transaction(store: Store) -> None:
    with store.transaction() as tx:
        tx.execute("SELECT 1")


def assert_refused_as_forked(found: dict[str, list[Any]]) -> None:
    for name, (code, message, seconds) in found.items():
        assert code == "JD2091", (name, code, message)
        assert "fork" in message, (name, message)
        assert seconds < 2.0, (name, seconds)  # at once: never a wait for a parent thread


@needs_fork
@pytest.mark.filterwarnings(FORK_WARNING)
@pytest.mark.parametrize("holder", ["nobody", "a parent transaction", "the gate's own lock"])
def test_a_forked_child_is_refused_at_once_and_never_touches_the_connection(
    db_path: Path, runtime: Runtime, holder: str
) -> None:
    # a long gate timeout: a child that queued for a parent thread would hang
    store = open_store(db_path, runtime=runtime, gate_timeout_seconds=60)
    store.jobs.enqueue("k", id="before")
    statements: list[str] = []
    store.connection.set_trace_callback(statements.append)
    holding = threading.Event()
    done = threading.Event()

    def hold() -> None:
        if holder == "a parent transaction":
            with store.transaction() as tx:
                tx.jobs.enqueue("k", id="parent-tx")
                holding.set()
                assert done.wait(3 * WAIT)  # past the child's own bound
        else:  # the gate's mutex, as a thread forked in the middle of acquire() holds it
            gate = store._db.gate
            with gate._mutex:  # the state a fork can catch in the middle of acquire()
                holding.set()
                assert done.wait(3 * WAIT)  # past the child's own bound

    thread = threading.Thread(target=hold, daemon=True)
    if holder != "nobody":
        thread.start()
        assert holding.wait(WAIT)

    def child() -> dict[str, Any]:
        ran_before = len(statements)
        found = {
            "enqueue": refusal(lambda: store.jobs.enqueue("k", id="child")),
            "get": refusal(lambda: store.jobs.get("before")),
            "counts": refusal(store.jobs.counts),
            "claim": refusal(lambda: store.jobs.claim(["k"], owner="child")),
            "page": refusal(lambda: list(store.jobs.page())),
            "transaction": refusal(lambda: enter_transaction(store)),
            "connection": refusal(lambda: store.connection),
            # the gate itself, held (or its lock held) by a parent thread the child lacks
            "gate": refusal(lambda: store._db.gate.acquire("the gate")),
        }
        started = time.monotonic()
        outcomes = store.close()
        return {
            "found": found,
            "close": [len(outcomes), store.closed, time.monotonic() - started],
            "after_close": refusal(lambda: store.jobs.get("before")),
            "statements": statements[ran_before:],
        }

    try:
        answer = in_forked_child(child)
    finally:
        done.set()
        if holder != "nobody":
            thread.join(WAIT)
    assert_refused_as_forked(answer["found"])
    assert answer["close"][:2] == [0, True]
    assert answer["close"][2] < 2.0
    assert answer["after_close"][0] == "JD2091"
    assert answer["statements"] == []  # not one statement on the parent's connection

    # the parent's store is untouched by all of it, the child's close() included
    try:
        assert not store.closed
        store.connection.set_trace_callback(None)
        store.jobs.enqueue("k", id="after")
        claimed = store.jobs.claim(["k"], owner="parent")
        assert claimed is not None
        assert store.jobs.complete(claimed.lease) is True
        expected = ["after", "before"] + (["parent-tx"] if holder == "a parent transaction" else [])
        assert job_ids(db_path) == sorted(expected)  # read on a connection of its own
    finally:
        store.close()


@needs_fork
@pytest.mark.filterwarnings(FORK_WARNING)
def test_a_fork_inside_a_transaction_leaves_it_to_the_parent(
    app_store: Store, db_path: Path
) -> None:
    statements: list[str] = []
    app_store.connection.set_trace_callback(statements.append)
    block = app_store.transaction()  # a with block, entered and left by hand around the fork
    tx = block.__enter__()
    tx.execute("INSERT INTO orders (id, item) VALUES (1, 'book')")
    tx.jobs.enqueue("ship", id="ship-1")

    def child() -> dict[str, Any]:
        ran_before = len(statements)
        found = {
            "tx.execute": refusal(lambda: tx.execute("INSERT INTO orders VALUES (2, 'child')")),
            "tx.jobs": refusal(lambda: tx.jobs.enqueue("ship", id="child")),
            "nested": refusal(lambda: enter_transaction(app_store)),
            # the block the child inherited ends in the refusal: never a COMMIT
            # (or a ROLLBACK) on the parent's connection, never a gate error
            "block end": refusal(lambda: block.__exit__(None, None, None)),
        }
        return {"found": found, "statements": statements[ran_before:]}

    try:
        answer = in_forked_child(child)
    finally:
        block.__exit__(None, None, None)
    app_store.connection.set_trace_callback(None)
    assert_refused_as_forked(answer["found"])
    assert answer["statements"] == []
    # the parent's transaction committed as if nothing had happened
    assert order_ids(db_path) == [1]
    assert job_ids(db_path) == ["ship-1"]
