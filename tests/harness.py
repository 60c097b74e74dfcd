"""One harness per backend: how the conformance suite opens stores and reaches raw rows.

The conformance suite (``tests/conformance/``) is written once and run over
every harness here (the ``backend`` fixture of ``tests/conftest.py``). A
test gets its store from :meth:`Harness.open` and reads or corrupts what is
stored only through the harness — never ``sqlite3.connect(path)`` of its own —
so that a new backend is one more class:

* ``open(runtime=..., **options) -> Store``: a store as that backend's user
  would open it; every store (and connection) it made is closed by
  :meth:`close` at the end of the test.
* raw access on a connection of the harness's own, so it sees only what was
  committed: :meth:`query` / :meth:`execute` (the backend's own SQL),
  :meth:`raw_row`, :meth:`job_ids`, :meth:`job_rows`, :meth:`checkpoint_rows`,
  :meth:`snapshot`, :meth:`write_raw_row` (rows left as another program
  would leave them), :meth:`refusing` (make one statement of the store fail).
* :meth:`sibling`: a second, independent database of the same backend (twin
  stores compared row for row), and :meth:`reset`.

A PostgreSQL harness is one more subclass: ``open`` passes a URL (or a
``psycopg.Connection``), the raw helpers use psycopg, ``driver_error`` is
``psycopg.Error``, and its ``capabilities`` leave out ``file`` and
``sqlite``.

Capabilities. A test that needs something not every backend has declares it
with ``@pytest.mark.requires("file")`` (or ``"sqlite"``); it then runs only
on the harnesses that have it (the others are deselected and counted in the
summary, never skipped silently), and a harness method that needs a
capability the test did not declare fails the test at once
(:class:`MissingCapability`), on every backend.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from jaren_jobs import Runtime, Store, open_store

__all__ = [
    "CAPABILITIES",
    "CHECKPOINTS",
    "HARNESSES",
    "JOBS",
    "Harness",
    "MissingCapability",
    "SqliteConnection",
    "SqliteFile",
]

JOBS = "_jaren_jobs"
CHECKPOINTS = "_jaren_job_checkpoints"

CAPABILITIES: dict[str, str] = {
    "file": "the database is a file at backend.path, which the test may open again by path",
    "gate": (
        "one connection serves all the store's threads, in turn (its gate): a call from "
        "another thread waits while a transaction is open (a pooled store does not)"
    ),
    "sqlite": (
        "the test speaks SQLite itself: SQLite's own SQL (PRAGMA, triggers, conflict "
        "clauses, rowid), the sqlite3 module's API, or TEXT that is not UTF-8"
    ),
}


class MissingCapability(AssertionError):
    """A test used a harness feature it did not declare with ``@pytest.mark.requires``."""


class Harness:
    """What every backend's harness offers (see the module docstring)."""

    name: ClassVar[str]
    capabilities: ClassVar[frozenset[str]]
    # the driver's base exception (a StorageError's __cause__) and its constraint violation
    driver_error: ClassVar[type[Exception]]
    integrity_error: ClassVar[type[Exception]]

    def __init__(self, db_path: Path, *, declared: Sequence[str] | None = None) -> None:
        self.db_path = Path(db_path)
        # what the running test declared with @pytest.mark.requires; None: not checked
        # (a harness built outside the fixture, e.g. by a Hypothesis state machine)
        self.declared = None if declared is None else frozenset(declared)
        self._stores: list[Store] = []
        self._siblings: list[Harness] = []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.db_path}>"

    # ------------------------------------------------------------ capabilities

    def need(self, capability: str) -> None:
        """Fail the test unless it declared ``capability`` (and this backend has it)."""
        assert capability in CAPABILITIES, f"unknown capability {capability!r}"
        if capability not in self.capabilities:
            raise MissingCapability(
                f"the {self.name} backend has no {capability!r} capability "
                f"({CAPABILITIES[capability]}); the test must declare "
                f"@pytest.mark.requires({capability!r})"
            )
        if self.declared is not None and capability not in self.declared:
            raise MissingCapability(
                f"this test uses {capability!r} ({CAPABILITIES[capability]}) without "
                f"declaring it: add @pytest.mark.requires({capability!r})"
            )

    # ------------------------------------------------------------ stores

    def open(self, *, runtime: Runtime | None = None, **options: Any) -> Store:
        """A store on this backend's database, closed by :meth:`close` if the test does not."""
        store = self._open(runtime=runtime, **options)
        self._stores.append(store)
        return store

    def reopen(self, *, runtime: Runtime | None = None, **options: Any) -> Store:
        """Close every store opened so far, then open a fresh one on the same database."""
        self.close_stores()
        return self.open(runtime=runtime, **options)

    def close_stores(self) -> None:
        while self._stores:
            self._stores.pop().close()

    def close(self) -> None:
        """Close every store, connection and sibling this harness made."""
        try:
            self.close_stores()
        finally:
            try:
                self._close_connections()
            finally:
                while self._siblings:
                    self._siblings.pop().close()

    def sibling(self, name: str) -> Harness:
        """Another database of the same backend, empty and independent of this one."""
        other = self._sibling(name)
        other.declared = self.declared
        self._siblings.append(other)
        return other

    def _open(self, *, runtime: Runtime | None, **options: Any) -> Store:
        raise NotImplementedError

    def _close_connections(self) -> None:
        pass

    def _sibling(self, name: str) -> Harness:
        raise NotImplementedError

    # ------------------------------------------------------------ raw access

    def query(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows of ``statement``, read on a connection of the harness's own (committed state)."""
        raise NotImplementedError

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        """Run and commit ``statement`` on a connection of the harness's own; rows changed."""
        raise NotImplementedError

    def raw_row(self, job_id: str) -> dict[str, Any] | None:
        """The job's row as the database holds it (every column), or None."""
        raise NotImplementedError

    def job_ids(self) -> list[str]:
        return [row[0] for row in self.query(f'SELECT id FROM "{JOBS}" ORDER BY id')]

    def checkpoint_rows(self) -> list[tuple[str, str, str, int]]:
        """Every checkpoint row as stored: (run_id, node_id, value as JSON text, generation)."""
        return [
            (run, node, value, generation)
            for run, node, value, generation in self.query(
                f'SELECT run_id, node_id, value, generation FROM "{CHECKPOINTS}" '
                "ORDER BY run_id, node_id"
            )
        ]

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        """Every row of every table in the database, each table in a fixed order."""
        raise NotImplementedError

    def job_rows(self) -> list[tuple[Any, ...]]:
        """Every job row (every column), in insertion order, the backend's own insertion
        key first (SQLite: the rowid): twins fed the same calls hold equal lists."""
        raise NotImplementedError

    def write_raw_row(self, job_id: str, **columns: Any) -> None:
        """Set columns of a job's row directly, as another program would.

        ``bytes`` stand for text that is not UTF-8, stored as TEXT as it is
        (capability ``sqlite``); anything else is bound as it is.
        """
        raise NotImplementedError

    @contextlib.contextmanager
    def refusing(self, store: Store, operation: str, table: str, message: str) -> Iterator[None]:
        """While inside, every ``operation`` (INSERT/UPDATE/DELETE) of ``store`` on
        ``table`` fails with a driver error saying ``message``."""
        raise NotImplementedError
        yield

    def reset(self) -> None:
        """Drop the library's tables: the database as a first open finds it."""
        raise NotImplementedError


class _Sqlite(Harness):
    """What both SQLite harnesses share: a file in the test's tmp_path."""

    capabilities: ClassVar[frozenset[str]] = frozenset({"file", "gate", "sqlite"})
    driver_error: ClassVar[type[Exception]] = sqlite3.Error
    integrity_error: ClassVar[type[Exception]] = sqlite3.IntegrityError

    @property
    def path(self) -> Path:
        """The database file (capability ``file``)."""
        self.need("file")
        return self.db_path

    def _sibling(self, name: str) -> Harness:
        return type(self)(self.db_path.with_name(f"{self.db_path.stem}-{name}.db"))

    @contextlib.contextmanager
    def _raw(self) -> Iterator[sqlite3.Connection]:
        # a fresh connection per call, autocommit: it pins no snapshot and holds no lock
        conn = sqlite3.connect(self.db_path, isolation_level=None, timeout=10)
        try:
            yield conn
        finally:
            conn.close()

    def query(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._raw() as conn:
            return conn.execute(statement, params).fetchall()

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        with self._raw() as conn:
            return conn.execute(statement, params).rowcount

    def raw_row(self, job_id: str) -> dict[str, Any] | None:
        with self._raw() as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute(f'SELECT * FROM "{JOBS}" WHERE id = ?', (job_id,)).fetchone()
            return None if row is None else dict(row)

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        with self._raw() as conn:
            tables = [
                r[0]
                for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
                )
            ]
            return {
                t: conn.execute(f'SELECT * FROM "{t}" ORDER BY 1, 2').fetchall() for t in tables
            }

    def job_rows(self) -> list[tuple[Any, ...]]:
        return self.query(f'SELECT rowid, * FROM "{JOBS}" ORDER BY rowid')

    def write_raw_row(self, job_id: str, **columns: Any) -> None:
        assert columns, "write_raw_row() needs at least one column"
        sets, params = [], []
        for column, value in columns.items():
            if isinstance(value, bytes):
                self.need("sqlite")
                # CAST keeps invalid bytes as TEXT, which sqlite3 would otherwise store as a BLOB
                sets.append(f'"{column}" = CAST(? AS TEXT)')
            else:
                sets.append(f'"{column}" = ?')
            params.append(value)
        with self._raw() as conn:
            changed = conn.execute(
                f'UPDATE "{JOBS}" SET {", ".join(sets)} WHERE id = ?', (*params, job_id)
            ).rowcount
            assert changed == 1, f"no job {job_id!r} to write"
            for column, value in columns.items():
                if isinstance(value, (bytes, str)):
                    stored = conn.execute(
                        f'SELECT typeof("{column}") FROM "{JOBS}" WHERE id = ?', (job_id,)
                    ).fetchone()
                    assert stored == ("text",), stored

    @contextlib.contextmanager
    def refusing(self, store: Store, operation: str, table: str, message: str) -> Iterator[None]:
        assert operation in ("INSERT", "UPDATE", "DELETE"), operation
        assert "'" not in message
        # a TEMP trigger lives on the store's own connection only
        with store.transaction() as tx:
            tx.execute(
                f'CREATE TEMP TRIGGER "harness_refuses" BEFORE {operation} ON "{table}" '
                f"BEGIN SELECT RAISE(ABORT, '{message}'); END"
            )
        try:
            yield
        finally:
            if not store.closed:
                with store.transaction() as tx:
                    tx.execute('DROP TRIGGER IF EXISTS "harness_refuses"')

    def reset(self) -> None:
        with self._raw() as conn:
            for table in (CHECKPOINTS, JOBS, "_jaren_meta"):
                conn.execute(f'DROP TABLE IF EXISTS "{table}"')


class SqliteFile(_Sqlite):
    """``open_store(path)``: the store opens, configures and owns its connection."""

    name: ClassVar[str] = "sqlite-file"

    def _open(self, *, runtime: Runtime | None, **options: Any) -> Store:
        return open_store(self.db_path, runtime=runtime, **options)


class SqliteConnection(_Sqlite):
    """``open_store(connection=conn)``: the application's own ``sqlite3.Connection``.

    Made as docs/quickstart.md tells an application to make it, and as most
    do: ``sqlite3.connect(path, check_same_thread=False)``, so the sqlite3
    module's default (legacy) transaction handling is on. The harness, like
    the application, owns the connection: it closes it after the store.
    A read-only store gets a read-only connection (``mode=ro``), as an
    application asking for ``readonly=True`` would hand it.
    """

    name: ClassVar[str] = "sqlite-connection"

    def __init__(self, db_path: Path, *, declared: Sequence[str] | None = None) -> None:
        super().__init__(db_path, declared=declared)
        self.connections: list[sqlite3.Connection] = []

    def connect(self, *, readonly: bool = False) -> sqlite3.Connection:
        """A connection as the application makes it (closed by :meth:`close`)."""
        if readonly:
            uri = self.db_path.resolve().as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        else:
            conn = sqlite3.connect(self.db_path, check_same_thread=False)
        self.connections.append(conn)
        return conn

    def _open(self, *, runtime: Runtime | None, **options: Any) -> Store:
        conn = self.connect(readonly=bool(options.get("readonly", False)))
        return open_store(connection=conn, runtime=runtime, **options)

    def _close_connections(self) -> None:
        while self.connections:
            self.connections.pop().close()


HARNESSES: tuple[type[Harness], ...] = (SqliteFile, SqliteConnection)
