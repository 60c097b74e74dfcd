"""PostgreSQL under a ``Store``: opening, the root session, ``store.transaction()``.

The store-level half of the seam (:class:`~jaren_jobs.backend.StoreBackend`).
A store opened from a URL owns a small pool of connections (each broken one
replaced) and, for its workers, a listening connection (``LISTEN``, re-established when it
drops); a store given the application's ``psycopg.Connection`` joins the
application's transactions and never closes it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import psycopg
from psycopg import pq
from psycopg import sql as pgsql

from jaren_jobs.backend import AppParams, JobsSession, Rows, TransactionState
from jaren_jobs.backends.postgres import queries as sql
from jaren_jobs.backends.postgres.channels import cancel_channel, channel_name, settled_channel
from jaren_jobs.backends.postgres.connection import PgDatabase, PgRootScope, PgTxScope
from jaren_jobs.backends.postgres.errors import storage_error
from jaren_jobs.backends.postgres.notify import Listener
from jaren_jobs.backends.postgres.schema import ensure_schema, require_schema
from jaren_jobs.backends.postgres.session import PostgresSession
from jaren_jobs.errors import GateRefused, StorageError
from jaren_jobs.gate import Gate
from jaren_jobs.runtime import ResolvedRuntime

__all__ = ["PostgresBackend", "PostgresTransaction", "is_postgres_url", "open_postgres"]

_ENDED = (
    "PostgreSQL rolled back the whole transaction; nothing in it will be committed: "
    "leave the with block and retry in a new store.transaction()"
)


def is_postgres_url(target: object) -> bool:
    text = str(target) if not isinstance(target, bytes) else ""
    return text.startswith(("postgresql://", "postgres://"))


class PostgresBackend:
    """An open PostgreSQL database: its gate admits as many threads at once as it has
    connections (one, on the application's connection)."""

    name = "postgres"

    def __init__(self, db: PgDatabase, channel: str | None) -> None:
        self.db = db
        self.channel = channel

    @property
    def closed(self) -> bool:
        return self.db.closed

    @property
    def forked(self) -> bool:
        return self.db.forked

    @property
    def wait_seconds(self) -> float:
        return self.db.gate.timeout_seconds

    @property
    def writers(self) -> int:
        return self.db.gate.capacity

    def check_open(self, what: str) -> None:
        self.db.check_open(what)

    def root_session(self, runtime: ResolvedRuntime) -> JobsSession:
        return PostgresSession(self.db, PgRootScope(self.db), runtime, self.channel, self)

    def connection(self) -> psycopg.Connection[Any]:
        self.db.check_open("store.connection")
        return self.db.connection

    def in_my_transaction(self) -> bool:
        return self.db.gate.held_by_me()

    def begin(self, what: str) -> PostgresTransaction:
        db = self.db
        db.take(what)  # this thread's connection until release()
        try:
            db.begin(doing=what)
        except BaseException:
            db.give_back()
            raise
        return PostgresTransaction(db, self.channel, self)

    def join(self, what: str) -> PostgresTransaction:
        """The application's open transaction on its connection, joined (never committed).

        A connection out of autocommit counts as in a transaction even before its
        first statement: psycopg (and so Django's ``atomic()``) begins one with it.
        """
        db = self.db
        db.take(what)
        conn = db.connection
        if conn.autocommit and conn.info.transaction_status == pq.TransactionStatus.IDLE:
            db.give_back()
            raise StorageError(
                f"{what}: the connection has no open transaction to join (it is in "
                "autocommit); begin one first (or use store.transaction(), which opens its own)",
                doing=what,
                reason="no-transaction",
            )
        return PostgresTransaction(db, self.channel, self)

    def wake_on_commits(self, wake: Callable[[], None]) -> None:
        """Wake this process's idle workers when any process commits an enqueue."""
        listener = self.db.listener
        if listener is not None:
            listener.start(wake)

    def wake_on_cancel_requests(self, wake: Callable[[str], None]) -> None:
        """Call ``wake(job_id)`` when any process marks a running job (LISTEN)."""
        listener = self.db.listener
        if listener is not None:
            listener.on_cancel(wake)

    def wake_on_settlements(self, wake: Callable[[], None]) -> bool:
        """Call ``wake`` when any process commits a settlement (LISTEN); True if it will."""
        listener = self.db.listener
        if listener is None:
            return False
        listener.on_settled(wake)
        return True

    def close(self) -> None:
        if self.db.gate.held_by_me():
            raise GateRefused(
                "close() was called inside this store's transaction; finish it first",
                reason="reentrant",
            )
        if self.db.listener is not None:
            self.db.listener.stop()
        gate = self.db.gate
        gate.close()
        gate.wait_idle(gate.timeout_seconds)
        self.db.close()


class PostgresTransaction:
    """One open ``store.transaction()`` on PostgreSQL: it holds one of the store's
    connections (this thread's) until :meth:`release`."""

    ended_message = _ENDED
    aborted_text = (
        "PostgreSQL rolled back this store.transaction() after a statement inside it "
        "failed (a failed statement aborts a whole PostgreSQL transaction)"
    )

    def __init__(self, db: PgDatabase, channel: str | None, backend: PostgresBackend) -> None:
        self.db = db
        self.channel = channel
        self.backend = backend

    @property
    def gate(self) -> object:
        return self.db.gate

    def session(self, transaction: TransactionState, runtime: ResolvedRuntime) -> JobsSession:
        return PostgresSession(
            self.db, PgTxScope(self.db, transaction), runtime, self.channel, self.backend
        )

    def execute(
        self,
        statement: str,
        parameters: AppParams | Iterable[AppParams],
        *,
        many: bool,
        what: str,
        transaction: TransactionState,
    ) -> Rows:
        conn = self.db.connection
        cursor = conn.cursor()
        try:
            if many:
                cursor.executemany(statement, parameters)
            else:
                cursor.execute(statement, parameters or None)  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise storage_error(exc, what) from exc

        def translate(exc: BaseException) -> Exception:
            return transaction.explain(storage_error(exc, what))

        return Rows(_Results(cursor), psycopg.Error, translate)

    def ended_by_database(self) -> bool:
        db = self.db
        if db.closed:
            return False
        return db.status != pq.TransactionStatus.INTRANS

    def savepoint(self, name: str, what: str) -> None:
        self.db.run(sql.savepoint(name), doing=what)

    def release_savepoint(self, name: str, what: str) -> None:
        self.db.run(sql.release_savepoint(name), doing=what)

    def rollback_to_savepoint(self, name: str, what: str) -> None:
        self.db.run(sql.rollback_to_savepoint(name), doing=what)

    def commit(self, what: str) -> None:
        self.db.commit(doing=what)

    def rollback_quietly(self) -> None:
        self.db.rollback_quietly()

    def release(self) -> None:
        self.db.give_back()


class _Results:
    """A psycopg cursor as ``Rows`` reads it: a statement without rows fetches none."""

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor

    def fetchone(self) -> Any:
        return self._cursor.fetchone() if self._cursor.description is not None else None

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall() if self._cursor.description is not None else []

    def fetchmany(self, size: int = 1) -> list[Any]:
        return self._cursor.fetchmany(size) if self._cursor.description is not None else []

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def description(self) -> Any:
        return self._cursor.description

    lastrowid = None


def open_postgres(
    url: str | None,
    connection: object,
    *,
    durability: str,
    readonly: bool,
    gate: Gate,
) -> tuple[PostgresBackend, str | None]:
    """Open (or adopt) the connection and create or check the tables."""
    if connection is not None and not isinstance(connection, psycopg.Connection):
        raise TypeError(
            f"connection must be a sqlite3.Connection or a psycopg.Connection, "
            f"got {type(connection).__name__}"
        )
    db = PgDatabase(
        conninfo=url, connection=connection, durability=durability, readonly=readonly, gate=gate
    )
    try:
        db.take("opening")
        db.joining = not db.owns and db.in_transaction
        try:
            schema_row = db.transaction(
                lambda: db.one(sql.RESOLVE_SCHEMA, doing="opening"),
                doing="opening",
                read_only=True,
            )
            schema = None if schema_row is None else schema_row[0]
            if schema is None:
                raise StorageError(
                    "opening: the connection's search_path names no schema to keep the tables in"
                )
            db.schema = str(schema)  # from here on, every statement names it
            if readonly:
                require_schema(db)
            else:
                ensure_schema(db)
            channel = channel_name(str(schema))
            if url is not None and not readonly:
                # started by the first worker (Store.jobs.create_worker), not before
                db.listener = Listener(
                    url,
                    pgsql.Identifier(channel).as_string(db.connection),
                    pgsql.Identifier(settled_channel(channel)).as_string(db.connection),
                    settled_channel(channel),
                    quoted_cancel=pgsql.Identifier(cancel_channel(channel)).as_string(
                        db.connection
                    ),
                    cancel_name=cancel_channel(channel),
                    own_pids=db.own_pids,
                )
        finally:
            db.joining = False
            db.give_back()
    except BaseException:
        if db.owns:
            db.close()
        raise
    return PostgresBackend(db, channel), _shown(url)


def _shown(url: str | None) -> str | None:
    """The URL as a record may show it: never its password."""
    if url is None:
        return None
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error:
        return "postgresql://…"
    user = info.get("user")
    host = info.get("host") or "localhost"
    port = info.get("port")
    dbname = info.get("dbname") or ""
    who = f"{user}@" if user else ""
    return f"postgresql://{who}{host}{':' + str(port) if port else ''}/{dbname}"
