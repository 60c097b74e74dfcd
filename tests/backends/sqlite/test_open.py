"""Opening a store on SQLite: pragmas, paths, the application's connection (SPEC §1).

What a store does once open, on every backend, is in tests/conformance/.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jaren_jobs import Runtime, StorageError, Store, StoreClosed, open_store


def other_connection(db_path: Path) -> sqlite3.Connection:
    return sqlite3.connect(db_path, isolation_level=None, timeout=0)


def job_ids(db_path: Path) -> list[str]:
    conn = other_connection(db_path)
    try:
        return [r[0] for r in conn.execute('SELECT id FROM "_jaren_jobs" ORDER BY id')]
    finally:
        conn.close()


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


def test_readonly_store_on_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    with pytest.raises(StorageError):
        open_store(missing, readonly=True)
    assert not missing.exists()
