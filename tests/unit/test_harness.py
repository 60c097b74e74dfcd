"""The test harness itself: what each backend's harness opens, and its capability checks."""

from __future__ import annotations

import sqlite3
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
    SqliteConnection,
    SqliteFile,
)


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
