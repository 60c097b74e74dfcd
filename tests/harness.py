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

The async harnesses (:class:`SqliteFileAsync`, :class:`PostgresUrlAsync`)
open their stores with ``open_async_store`` and hand the test a
:class:`tests.async_bridge.BridgeStore`: ``Store``'s surface whose every call
is the asyncio API's coroutine, awaited on an event loop thread of the
harness's own. So the whole suite also runs through the async API; a test
about the sync API's own thread mechanics declares ``requires("sync-api")``.

The PostgreSQL harnesses (:class:`PostgresUrl`, :class:`PostgresConnection`)
give each test a schema of its own on the server named by
``JAREN_JOBS_TEST_POSTGRES_URL`` (or on the throwaway server
``tests/postgres_server.py`` starts for the session when that is unset), and
the store finds its tables there through ``search_path``. The ``backend``
fixture's schemas come migrated from the session's pool and are emptied
between tests (``tests/pg_schemas.py``); a harness made without a pool gets
an empty schema, which the store's first open migrates. Statements handed
to :meth:`query` / :meth:`execute` / :meth:`app_sql` may use ``?``
placeholders on every backend: a PostgreSQL harness turns them into ``%s``.

Capabilities. A test that needs something not every backend has declares it
with ``@pytest.mark.requires("file")`` (or ``"sqlite"``); it then runs only
on the harnesses that have it (the others are deselected and counted in the
summary, never skipped silently), and a harness method that needs a
capability the test did not declare fails the test at once
(:class:`MissingCapability`), on every backend.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import quote

from jaren_jobs import Runtime, Store, open_store
from tests.async_bridge import BridgeStore, EventLoopThread
from tests.pg_schemas import SchemaPool

try:  # the PostgreSQL harnesses need the driver (the extra jaren_jobs[postgres]); SQLite's do not
    import psycopg
except ImportError:  # pragma: no cover - the dev extra installs it
    psycopg = None  # type: ignore[assignment]

__all__ = [
    "CAPABILITIES",
    "CHECKPOINTS",
    "HARNESSES",
    "JOBS",
    "Harness",
    "MissingCapability",
    "PostgresConnection",
    "PostgresUrl",
    "PostgresUrlAsync",
    "SqliteConnection",
    "SqliteFile",
    "SqliteFileAsync",
    "app_sql_for",
]

JOBS = "_jaren_jobs"
CHECKPOINTS = "_jaren_job_checkpoints"

CAPABILITIES: dict[str, str] = {
    "app-connection": (
        "the store is on the application's own connection (open_store(connection=...)), "
        "on which the test holds transactions of the application's own"
    ),
    "file": "the database is a file at backend.path, which the test may open again by path",
    "gate": (
        "one connection serves all the store's threads, in turn (its gate): a call from "
        "another thread waits while a transaction is open (a pooled store does not)"
    ),
    "pool": (
        "the store serves several threads at once, each call on a connection of its own "
        "taken from a small pool (open_store's pool_size): PostgreSQL from a URL"
    ),
    "sqlite": (
        "the test speaks SQLite itself: SQLite's own SQL (PRAGMA, triggers, conflict "
        "clauses, rowid), the sqlite3 module's API, or TEXT that is not UTF-8"
    ),
    "sync-api": (
        "the test is about the synchronous API itself — its thread mechanics (a call from "
        "a worker's own thread, fork), that API misused from coroutines or given async "
        "handlers, or the engine internals it hands to group_commit/testing — which "
        "the async harnesses, driving the asyncio API, do not present; every test outside "
        "tests/conformance/ has it implied (the async harnesses run the conformance suite)"
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

    def app_connection(self, store: Store) -> Any:
        """The application's connection ``store`` was opened on (capability
        ``app-connection``), as the application holds it."""
        self.need("app-connection")
        return store.connection

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

    def app_sql(self, statement: str) -> str:
        """``statement`` (written with ``?`` placeholders) in this backend's driver's style,
        for ``tx.execute``, which hands SQL to the driver as it is."""
        return statement

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
    capabilities: ClassVar[frozenset[str]] = _Sqlite.capabilities | {"sync-api"}

    def _open(self, *, runtime: Runtime | None, **options: Any) -> Store:
        return open_store(self.db_path, runtime=runtime, **options)


class _AsyncApi(Harness):
    """The harness's stores opened with ``open_async_store`` and driven through the asyncio
    API (``tests/async_bridge.py``), on an event loop thread of the harness's own."""

    _loop: EventLoopThread | None = None

    def _bridge(self, *args: Any, **options: Any) -> Store:
        if self._loop is None:
            self._loop = EventLoopThread()
        return BridgeStore.open(self._loop, *args, **options)  # type: ignore[return-value]

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._loop is not None:
                self._loop.close()
                self._loop = None


class SqliteFileAsync(_AsyncApi, _Sqlite):
    """``open_async_store(path)``, every call through the asyncio API."""

    name: ClassVar[str] = "sqlite-file-async"

    def _open(self, *, runtime: Runtime | None, **options: Any) -> Store:
        return self._bridge(self.db_path, runtime=runtime, **options)


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
    capabilities: ClassVar[frozenset[str]] = _Sqlite.capabilities | {"sync-api", "app-connection"}

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


# ---------------------------------------------------------------- PostgreSQL

_PLACEHOLDER = re.compile(r"'[^']*'|\"[^\"]*\"|\?")


def postgres_sql(statement: str) -> str:
    """``?`` placeholders (outside quotes) as psycopg's ``%s``; a literal ``%`` doubled."""
    statement = statement.replace("%", "%%")
    return _PLACEHOLDER.sub(lambda m: "%s" if m.group(0) == "?" else m.group(0), statement)


def app_sql_for(store: Store, statement: str) -> str:
    """``statement`` (``?`` placeholders) as ``store``'s driver takes it in ``tx.execute``."""
    return postgres_sql(statement) if store.backend == "postgres" else statement


def postgres_server_url() -> str | None:
    """The server the PostgreSQL harnesses use (set by .ci/run or the session fixture)."""
    return os.environ.get("JAREN_JOBS_TEST_POSTGRES_URL") or None


def with_search_path(url: str, schema: str) -> str:
    """``url`` whose connections find their tables in ``schema`` (first in search_path)."""
    options = quote(f"-csearch_path={schema}", safe="")
    return f"{url}{'&' if '?' in url else '?'}options={options}"


class _Postgres(Harness):
    """What both PostgreSQL harnesses share: a fresh schema of the test server per test."""

    capabilities: ClassVar[frozenset[str]] = frozenset()
    driver_error: ClassVar[type[Exception]] = psycopg.Error if psycopg else Exception
    integrity_error: ClassVar[type[Exception]] = psycopg.IntegrityError if psycopg else Exception

    def __init__(
        self,
        db_path: Path,
        *,
        declared: Sequence[str] | None = None,
        schemas: SchemaPool | None = None,
    ) -> None:
        super().__init__(db_path, declared=declared)
        assert psycopg is not None, "the backend fixture checks for the driver first"
        server = postgres_server_url()
        assert server is not None, "the backend fixture checks for a server first"
        self._psycopg = psycopg
        self.server_url = server
        # from a pool: migrated, its tables empty (tests/pg_schemas.py); without one: an
        # empty schema of the harness's own, which the store's first open migrates
        self._schemas = schemas
        if schemas is not None:
            self.schema = schemas.take()
        else:
            self.schema = f"jt_{secrets.token_hex(6)}"
            with psycopg.connect(server, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{self.schema}"')
        self.url = with_search_path(server, self.schema)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} schema {self.schema}>"

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._schemas is not None:
                self._schemas.give_back(self.schema)
            else:
                with self._psycopg.connect(self.server_url, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')

    def _sibling(self, name: str) -> Harness:
        return type(self)(
            self.db_path.with_name(f"{self.db_path.stem}-{name}.db"), schemas=self._schemas
        )

    def app_sql(self, statement: str) -> str:
        return postgres_sql(statement)

    @contextlib.contextmanager
    def _raw(self) -> Iterator[Any]:
        # a fresh autocommit connection per call: it sees what is committed and holds no lock;
        # jaren.harness marks it, so the refusing() trigger lets the harness itself write
        conn = self._psycopg.connect(self.url, autocommit=True)
        try:
            conn.execute("SELECT set_config('jaren.harness', 'on', false)")
            yield conn
        finally:
            conn.close()

    def query(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._raw() as conn:
            return list(conn.execute(postgres_sql(statement), tuple(params)).fetchall())

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        with self._raw() as conn:
            return int(conn.execute(postgres_sql(statement), tuple(params)).rowcount)

    def raw_row(self, job_id: str) -> dict[str, Any] | None:
        with self._raw() as conn:
            cursor = conn.execute(f'SELECT * FROM "{JOBS}" WHERE id = %s', (job_id,))
            row = cursor.fetchone()
            if row is None:
                return None
            names = [column.name for column in cursor.description]
            return dict(zip(names, row, strict=True))

    def _tables(self, conn: Any) -> list[str]:
        return [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = %s AND table_type = 'BASE TABLE' ORDER BY table_name",
                (self.schema,),
            )
        ]

    def snapshot(self) -> dict[str, list[tuple[Any, ...]]]:
        with self._raw() as conn:
            return {
                t: list(conn.execute(f'SELECT * FROM "{t}" ORDER BY 1, 2').fetchall())
                for t in self._tables(conn)
            }

    def job_rows(self) -> list[tuple[Any, ...]]:
        # seq is the insertion order PostgreSQL's table keeps (SQLite's rowid)
        return self.query(f'SELECT seq, * FROM "{JOBS}" ORDER BY seq')

    def write_raw_row(self, job_id: str, **columns: Any) -> None:
        assert columns, "write_raw_row() needs at least one column"
        for value in columns.values():
            if isinstance(value, bytes):
                self.need("sqlite")  # PostgreSQL's text is always valid UTF-8
        sets = ", ".join(f'"{column}" = %s' for column in columns)
        with self._raw() as conn:
            changed = conn.execute(
                f'UPDATE "{JOBS}" SET {sets} WHERE id = %s', (*columns.values(), job_id)
            ).rowcount
            assert changed == 1, f"no job {job_id!r} to write"

    @contextlib.contextmanager
    def refusing(self, store: Store, operation: str, table: str, message: str) -> Iterator[None]:
        assert operation in ("INSERT", "UPDATE", "DELETE"), operation
        assert "'" not in message
        assert "$" not in message
        with self._raw() as conn:
            conn.execute(
                "CREATE FUNCTION harness_refuses() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                "IF current_setting('jaren.harness', true) IS DISTINCT FROM 'on' THEN "
                f"RAISE EXCEPTION '{message}'; END IF; "
                "IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END $$"
            )
            conn.execute(
                f'CREATE TRIGGER harness_refuses BEFORE {operation} ON "{table}" '
                "FOR EACH ROW EXECUTE FUNCTION harness_refuses()"
            )
        try:
            yield
        finally:
            with self._raw() as conn:
                conn.execute(f'DROP TRIGGER IF EXISTS harness_refuses ON "{table}"')
                conn.execute("DROP FUNCTION IF EXISTS harness_refuses()")

    def reset(self) -> None:
        with self._raw() as conn:
            conn.execute(f'DROP SCHEMA "{self.schema}" CASCADE')
            conn.execute(f'CREATE SCHEMA "{self.schema}"')


class PostgresUrl(_Postgres):
    """``open_store("postgresql://...")``: the store opens and owns a small pool."""

    name: ClassVar[str] = "postgres"
    # no "gate": another thread's call takes another connection of the pool
    capabilities: ClassVar[frozenset[str]] = frozenset({"pool", "sync-api"})

    def _open(self, *, runtime: Runtime | None, **options: Any) -> Store:
        return open_store(self.url, runtime=runtime, **options)


class PostgresUrlAsync(_AsyncApi, _Postgres):
    """``open_async_store("postgresql://...")``, every call through the asyncio API."""

    name: ClassVar[str] = "postgres-async"
    # a pooled URL store underneath: another task's transaction takes another connection
    capabilities: ClassVar[frozenset[str]] = frozenset({"pool"})

    def _open(self, *, runtime: Runtime | None, **options: Any) -> Store:
        return self._bridge(self.url, runtime=runtime, **options)


class PostgresConnection(_Postgres):
    """``open_store(connection=conn)``: the application's own ``psycopg.Connection``,
    made as an application makes it (``psycopg.connect(url)``, not autocommit); the
    harness, like the application, closes it after the store."""

    name: ClassVar[str] = "postgres-connection"
    # one connection behind the store's gate, as on SQLite
    capabilities: ClassVar[frozenset[str]] = frozenset({"gate", "sync-api", "app-connection"})

    def __init__(
        self,
        db_path: Path,
        *,
        declared: Sequence[str] | None = None,
        schemas: SchemaPool | None = None,
    ) -> None:
        super().__init__(db_path, declared=declared, schemas=schemas)
        self.connections: list[Any] = []

    def connect(self) -> Any:
        """A connection as the application makes it (closed by :meth:`close`)."""
        conn = self._psycopg.connect(self.url)
        self.connections.append(conn)
        return conn

    def _open(self, *, runtime: Runtime | None, **options: Any) -> Store:
        return open_store(connection=self.connect(), runtime=runtime, **options)

    def _close_connections(self) -> None:
        while self.connections:
            self.connections.pop().close()


HARNESSES: tuple[type[Harness], ...] = (
    SqliteFile,
    SqliteConnection,
    SqliteFileAsync,
    PostgresUrl,
    PostgresConnection,
    PostgresUrlAsync,
)
POSTGRES_HARNESSES: frozenset[type[Harness]] = frozenset(
    {PostgresUrl, PostgresConnection, PostgresUrlAsync}
)
# the harnesses that drive the asyncio API (the others drive the sync one)
ASYNC_HARNESSES: frozenset[type[Harness]] = frozenset({SqliteFileAsync, PostgresUrlAsync})
# where a test marked once_per_api runs: one harness of each API (SQLite: no server, and
# its connection traces the statements the test asserts were never sent)
ONCE_PER_API: tuple[type[Harness], ...] = (SqliteFile, SqliteFileAsync)
