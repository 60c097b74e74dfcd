"""The test harness itself: what each backend's harness opens, and its capability checks."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from jaren_jobs import StorageError
from tests.conftest import require_postgres
from tests.harness import (
    CAPABILITIES,
    HARNESSES,
    POSTGRES_HARNESSES,
    Harness,
    MissingCapability,
    PostgresUrl,
    SqliteConnection,
    SqliteFile,
    psycopg,
    with_search_path,
)
from tests.pg_schemas import SchemaPool


class _Bare(SqliteFile):
    """A backend without SQLite's capabilities (as a PostgreSQL harness will be)."""

    name = "bare"
    capabilities = frozenset({"gate"})


def test_every_harness_has_a_distinct_name_and_known_capabilities() -> None:
    names = [harness.name for harness in HARNESSES]
    assert len(set(names)) == len(names)
    for harness in HARNESSES:
        assert harness.capabilities <= set(CAPABILITIES), harness
        # the SQLite harnesses have everything; PostgreSQL's have neither a file nor SQLite's SQL
        sqlite = harness.name.startswith("sqlite")
        assert ("sqlite" in harness.capabilities) is sqlite, harness
        assert ("file" in harness.capabilities) is sqlite, harness
        assert issubclass(harness.driver_error, Exception)


def test_a_capability_used_without_declaring_it_fails_loudly(tmp_path: Path) -> None:
    backend = SqliteFile(tmp_path / "jobs.db", declared=())
    try:
        backend.open().jobs.enqueue("k", id="j")
        with pytest.raises(MissingCapability, match=r"requires\('sqlite'\)"):
            backend.write_raw_row("j", payload=b"\xff")
        with pytest.raises(MissingCapability, match=r"requires\('file'\)"):
            _ = backend.path
        assert backend.raw_row("j")["payload"] == "null"  # type: ignore[index]
    finally:
        backend.close()


def test_a_backend_without_the_capability_says_which_backend(tmp_path: Path) -> None:
    backend = _Bare(tmp_path / "jobs.db", declared=("sqlite", "gate"))
    with pytest.raises(MissingCapability, match="bare backend has no 'sqlite'"):
        backend.need("sqlite")
    backend.need("gate")
    backend.close()


def test_a_declared_capability_is_usable(tmp_path: Path) -> None:
    backend = SqliteFile(tmp_path / "jobs.db", declared=("sqlite", "file"))
    try:
        backend.open().jobs.enqueue("k", id="j")
        backend.write_raw_row("j", payload=b'{"n": "caf\xe9"}')
        assert backend.query('SELECT typeof(payload) FROM "_jaren_jobs"') == [("text",)]
        assert backend.path == tmp_path / "jobs.db"
    finally:
        backend.close()


def test_the_connection_harness_hands_its_own_connection_and_closes_it(tmp_path: Path) -> None:
    backend = SqliteConnection(tmp_path / "jobs.db")
    store = backend.open()
    assert store.path is None  # opened on a connection, not a path
    (conn,) = backend.connections
    assert store.connection is conn
    assert conn.isolation_level == ""  # sqlite3's default, as an application leaves it
    store.jobs.enqueue("k", id="j")
    backend.close()
    assert store.closed
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")  # the harness, like the application, closed it


@pytest.mark.parametrize("harness", HARNESSES, ids=[h.name for h in HARNESSES])
def test_siblings_are_independent_and_closed_with_their_parent(
    tmp_path: Path, harness: type[Harness]
) -> None:
    if harness in POSTGRES_HARNESSES:
        require_postgres()
    backend = harness(tmp_path / "jobs.db")
    twin = backend.sibling("twin")
    first, second = backend.open(), twin.open()
    first.jobs.enqueue("k", id="only-in-first")
    assert backend.job_ids() == ["only-in-first"]
    assert twin.job_ids() == []
    backend.close()
    assert first.closed
    assert second.closed


@pytest.mark.parametrize("harness", HARNESSES, ids=[h.name for h in HARNESSES])
def test_refusing_makes_the_statement_fail_only_while_inside(
    tmp_path: Path, harness: type[Harness]
) -> None:
    if harness in POSTGRES_HARNESSES:
        require_postgres()
    backend = harness(tmp_path / "jobs.db")
    try:
        store = backend.open()
        with backend.refusing(store, "INSERT", "_jaren_jobs", "no inserts"):
            with pytest.raises(StorageError, match="no inserts") as info:
                store.jobs.enqueue("k", id="refused")
            assert isinstance(info.value.__cause__, backend.driver_error)
        assert store.jobs.enqueue("k", id="after").id == "after"
        assert backend.job_ids() == ["after"]
    finally:
        backend.close()


# ----------------------------------------------------------------- the PostgreSQL schema pool


def _schemas(pool: SchemaPool) -> set[str]:
    with psycopg.connect(pool.server_url, autocommit=True) as conn:
        return {
            row[0]
            for row in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'jt_%'")
        }


@pytest.fixture
def pool() -> Iterator[SchemaPool]:
    """A pool of the test's own (not the session's), dropped at the end."""
    made = SchemaPool(require_postgres(), psycopg, with_search_path)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize("harness", sorted(POSTGRES_HARNESSES, key=lambda h: h.name))
def test_a_pooled_schema_comes_back_migrated_and_empty(
    pool: SchemaPool, tmp_path: Path, harness: type[Harness]
) -> None:
    first = harness(tmp_path / "unused.db", schemas=pool)  # type: ignore[call-arg]
    try:
        store = first.open()
        store.jobs.enqueue("k", id="a")
        claimed = store.jobs.claim(["k"], owner="w")
        assert claimed is not None
        store.jobs.checkpoints_for(claimed).save("a", "node", 1)
        assert store.jobs.fail(claimed.lease, "boom", retry=False)
        assert {t for t, rows in first.snapshot().items() if rows} == {
            "_jaren_jobs",
            "_jaren_job_errors",
            "_jaren_job_checkpoints",
            "_jaren_meta",
        }
    finally:
        first.close()
    schema = first.schema

    again = harness(tmp_path / "unused.db", schemas=pool)  # type: ignore[call-arg]
    try:
        assert again.schema == schema  # reused, not rebuilt
        assert {t for t, rows in again.snapshot().items() if rows} == {"_jaren_meta"}
        store = again.open()
        store.jobs.enqueue("k", id="b")
        # the insertion order starts over, as in a fresh schema
        assert [row[0] for row in again.job_rows()] == [1]
    finally:
        again.close()


@pytest.mark.parametrize(
    "change",
    [
        "CREATE TABLE orders (id integer)",
        'ALTER TABLE "_jaren_jobs" ADD COLUMN extra text',
        'CREATE INDEX extra ON "_jaren_jobs" (kind)',
        "UPDATE \"_jaren_meta\" SET value = '99'",
        "CREATE FUNCTION f() RETURNS integer LANGUAGE sql AS 'SELECT 1'",
        'DROP TABLE "_jaren_job_errors"',
    ],
    ids=["table", "column", "index", "meta", "function", "dropped-table"],
)
def test_a_schema_a_test_changed_is_dropped_not_reused(
    pool: SchemaPool, tmp_path: Path, change: str
) -> None:
    harness = PostgresUrl(tmp_path / "unused.db", schemas=pool)
    try:
        harness.open()
        harness.execute(change)
    finally:
        harness.close()
    schema = harness.schema
    assert schema not in _schemas(pool)
    fresh = PostgresUrl(tmp_path / "unused.db", schemas=pool)
    try:
        assert fresh.schema != schema
        assert fresh.query('SELECT count(*) FROM "_jaren_jobs"') == [(0,)]
    finally:
        fresh.close()


def test_reset_then_reopen_gives_back_a_schema_as_good_as_new(
    pool: SchemaPool, tmp_path: Path
) -> None:
    harness = PostgresUrl(tmp_path / "unused.db", schemas=pool)
    try:
        harness.open().jobs.enqueue("k")
        harness.reset()  # the tables dropped: the store's next open migrates again
        harness.reopen().jobs.enqueue("k", id="after")
    finally:
        harness.close()
    again = PostgresUrl(tmp_path / "unused.db", schemas=pool)
    try:
        assert again.job_ids() == []
    finally:
        again.close()
    pool.close()
    assert not _schemas(pool) & {harness.schema, again.schema}
