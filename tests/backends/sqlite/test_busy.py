"""Busy handling on SQLite: another connection's write lock, busy_timeout, and the
root write that leaves busy_timeout at 0 between writes (WAL only)."""

from __future__ import annotations

import multiprocessing
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import NewJob, Runtime, StorageError, Store, open_store
from tests.conformance.test_store import WAIT, Call


def other_connection(db_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(db_path, isolation_level=None, timeout=0)


def job_ids(db_path: Path) -> list[str]:
    conn = other_connection(db_path)
    try:
        return [r[0] for r in conn.execute('SELECT id FROM "_jaren_jobs" ORDER BY id')]
    finally:
        conn.close()


def snapshot(db_path: Path) -> dict[str, list[tuple[Any, ...]]]:
    conn = sqlite3.connect(db_path)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: conn.execute(f'SELECT * FROM "{t}" ORDER BY 1').fetchall() for t in tables}
    finally:
        conn.close()


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


# ----------------------------------------------------------------- locks and busy_timeout


def hold_write_lock(db_path: str, locked: Any, release: Any) -> None:
    """Another process's write in progress: BEGIN IMMEDIATE and an uncommitted row."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            'INSERT INTO "_jaren_jobs" (id, kind, payload, state, run_at, max_attempts, '
            "created_at, updated_at) VALUES ('uncommitted', 'k', 'null', 'pending', 0, 5, 0, 0)"
        )
        locked.set()
        release.wait(60)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


@pytest.fixture
def locked_by_another_process(db_path: Path) -> Iterator[Callable[[], None]]:
    """The store's file, write-locked by another process until the callable releases it."""
    open_store(db_path).close()
    ctx = multiprocessing.get_context("spawn")
    locked, release = ctx.Event(), ctx.Event()
    process = ctx.Process(target=hold_write_lock, args=(str(db_path), locked, release))
    process.start()
    try:
        assert locked.wait(30), "the other process never took the write lock"
        yield release.set
    finally:
        release.set()
        process.join(30)
    assert process.exitcode == 0


def test_a_locked_database_is_the_librarys_error_after_busy_timeout(
    db_path: Path, runtime: Runtime, locked_by_another_process: Callable[[], None]
) -> None:
    with open_store(db_path, runtime=runtime, busy_timeout_seconds=0.3) as store:
        before = snapshot(db_path)
        for attempt in (
            lambda: store.jobs.enqueue("k", id="single"),
            lambda: store.jobs.enqueue_many([NewJob("k", n) for n in range(20)]),
            lambda: store.jobs.enqueue_many([NewJob("k", id="one")]),
        ):
            started = time.monotonic()
            with pytest.raises(StorageError) as info:
                attempt()
            waited = time.monotonic() - started
            assert info.value.code == "JD2099"
            assert isinstance(info.value.__cause__, sqlite3.OperationalError)
            assert "busy_timeout" in str(info.value)
            assert 0.25 <= waited < 5, waited
        # reads go on during the other process's write, and do not see it
        assert store.jobs.get("uncommitted") is None
        assert store.jobs.counts().pending == 0
        assert list(store.jobs.page()) == []
        locked_by_another_process()
        # the lock released: writes go through, and the failed ones left nothing
        assert snapshot(db_path) == before
        assert store.jobs.enqueue("k", id="single").id == "single"
        assert len(store.jobs.enqueue_many([NewJob("k", n) for n in range(20)])) == 20


def test_a_write_waits_out_a_short_lock_and_succeeds(
    db_path: Path, runtime: Runtime, locked_by_another_process: Callable[[], None]
) -> None:
    with open_store(db_path, runtime=runtime, busy_timeout_seconds=10) as store:
        store.jobs.get("warm")  # a read first: busy_timeout is on
        releaser = threading.Timer(0.3, locked_by_another_process)
        releaser.start()
        try:
            started = time.monotonic()
            job = store.jobs.enqueue("k", id="waited")
            assert time.monotonic() - started >= 0.2
        finally:
            releaser.join()
        assert store.jobs.get("waited") == job
        assert store.jobs.get("uncommitted") is None  # the other write rolled back


class Statements:
    """Every statement the store's connection runs (sqlite3's trace callback)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.seen: list[str] = []
        conn.set_trace_callback(self.seen.append)

    def take(self) -> list[str]:
        seen = list(self.seen)
        self.seen.clear()  # the callback holds this list
        return seen


def busy_pragmas(statements: list[str]) -> list[str]:
    return [s for s in statements if s.upper().startswith("PRAGMA BUSY_TIMEOUT")]


def test_back_to_back_writes_set_no_pragma_and_a_read_restores_busy_timeout(
    db_path: Path, runtime: Runtime
) -> None:
    with open_store(db_path, runtime=runtime, busy_timeout_seconds=4.0) as store:
        conn = store.connection
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 4000
        trace = Statements(conn)
        store.jobs.enqueue("k", id="a")
        assert busy_pragmas(trace.take()) == ["PRAGMA busy_timeout = 0"]
        store.jobs.enqueue("k", id="b")
        store.jobs.enqueue_many([NewJob("k", n) for n in range(10)])
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        assert store.jobs.complete(claimed.lease) is True
        assert busy_pragmas(trace.take()) == []  # writes only: the lock is polled at 0
        assert store.jobs.get("a") is not None
        statements = trace.take()
        # the read turned busy_timeout back on before it read anything
        assert busy_pragmas(statements) == ["PRAGMA busy_timeout = 4000"]
        assert statements[0] == "PRAGMA busy_timeout = 4000"
        store.jobs.counts()
        assert list(store.jobs.page(limit=2))
        assert busy_pragmas(trace.take()) == []  # reads only: already on
        # a cursor pull after a write (its statement opened before it) turns it on too
        with store.jobs.page(limit=5) as jobs:
            next(jobs)
            store.jobs.enqueue("k", id="between")
            trace.take()
            next(jobs)
            assert trace.take()[0] == "PRAGMA busy_timeout = 4000"
        store.jobs.enqueue("k", id="c")
        # the application's own SQL runs with the busy_timeout it was given
        with store.transaction() as tx:
            assert tx.execute("PRAGMA busy_timeout").fetchone()[0] == 4000
            tx.jobs.enqueue("k", id="in-tx")
        store.jobs.enqueue("k", id="d")
        # and the connection handed out says so too
        assert store.connection.execute("PRAGMA busy_timeout").fetchone()[0] == 4000


def test_an_applications_connection_keeps_its_busy_timeout_between_calls(
    db_path: Path, runtime: Runtime
) -> None:
    conn = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    try:
        with open_store(connection=conn, runtime=runtime, busy_timeout_seconds=2.5) as store:
            store.jobs.enqueue("k")
            store.jobs.enqueue_many([NewJob("k", n) for n in range(5)])
            claimed = store.jobs.claim(["k"], owner="w")
            assert claimed is not None
            store.jobs.complete(claimed.lease)
            # read on the raw connection, not through the store
            assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2500
    finally:
        conn.close()


def test_handing_out_the_connection_never_waits_for_the_gate(store: Store) -> None:
    store.jobs.enqueue("k")  # a write: busy_timeout left at 0
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with store.transaction():
            inside.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        started = time.monotonic()
        assert store.connection is not None
        assert time.monotonic() - started < 1  # not the 30 s gate timeout
    finally:
        leave.set()
        holder.join(10)
    assert store.connection.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
