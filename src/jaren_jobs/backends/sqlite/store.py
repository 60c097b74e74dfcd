"""SQLite under a ``Store``: its lifecycle, the root session and ``store.transaction()``.

The store-level half of the seam (:class:`~jaren_jobs.backend.StoreBackend`):
one connection, serialised by the store's gate; an application transaction
is ``BEGIN IMMEDIATE … COMMIT`` holding the gate, nested ones savepoints.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable

from jaren_jobs.backend import AppParams, JobsSession, Rows, TransactionState
from jaren_jobs.backends.sqlite import queries as sql
from jaren_jobs.backends.sqlite.apptx import run_app_statement
from jaren_jobs.backends.sqlite.connection import Database, RootScope, TxScope
from jaren_jobs.backends.sqlite.errors import storage_error
from jaren_jobs.backends.sqlite.session import IdleClaims, SqliteSession
from jaren_jobs.errors import GateRefused, StorageError
from jaren_jobs.runtime import ResolvedRuntime

__all__ = ["SqliteBackend", "SqliteTransaction"]

_ENDED = (
    "SQLite rolled back the whole transaction; nothing in it will be committed: "
    "leave the with block and retry in a new store.transaction()"
)


class SqliteBackend:
    """An open SQLite database, served to the store's threads in turn by its gate."""

    name = "sqlite"

    def __init__(self, db: Database) -> None:
        self.db = db
        # the claims that found nothing, by kinds: a root claim answered from here
        # (no write) until the database's write counter moves (see sequences.py)
        self.idle_claims: IdleClaims = {}

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
        return 1

    def check_open(self, what: str) -> None:
        self.db.check_open(what)

    def root_session(self, runtime: ResolvedRuntime) -> JobsSession:
        return SqliteSession(self.db, RootScope(self.db), runtime, self.idle_claims, self)

    def connection(self) -> sqlite3.Connection:
        db = self.db
        if db.forked:
            db.check_open("store.connection")  # the parent's connection: never handed out
        if db.busy_is_off() and not db.closed:
            # a write left it at 0 (Database.begin): the application's own
            # statements wait out a lock as configured. Never wait for the
            # gate here: a thread holding it restores it itself on its next read.
            gate = db.gate
            if gate.held_by_me():
                db.restore_busy("store.connection")
            elif gate.try_acquire():
                try:
                    db.restore_busy("store.connection")
                finally:
                    gate.release()
        return db.connection

    def in_my_transaction(self) -> bool:
        return self.db.gate.held_by_me()

    def begin(self, what: str) -> SqliteTransaction:
        db = self.db
        db.gate.acquire(what)
        try:
            if db.in_transaction:
                raise StorageError(
                    f"{what}: the connection has an open transaction that jaren_jobs did not "
                    "start; commit it first",
                    doing=what,
                )
            # the application's own statements wait out a lock as configured
            db.begin(immediate=True, doing=what, keep_busy=True)
        except BaseException:
            db.gate.release()
            raise
        return SqliteTransaction(db, self)

    def join(self, what: str) -> SqliteTransaction:
        """The application's open transaction on this connection, joined (never committed)."""
        db = self.db
        db.gate.acquire(what)
        if not db.in_transaction:
            db.gate.release()
            raise StorageError(
                f"{what}: the connection has no open transaction to join; begin one first "
                "(or use store.transaction(), which opens its own)",
                doing=what,
                reason="no-transaction",
            )
        return SqliteTransaction(db, self)

    def wake_on_commits(self, wake: Callable[[], None]) -> None:
        """SQLite has no notifications: other processes' commits are found by polling."""

    def wake_on_cancel_requests(self, wake: Callable[[str], None]) -> None:
        """SQLite has no notifications: a holder learns of a forced cancel at its renewal."""

    def wake_on_settlements(self, wake: Callable[[], None]) -> bool:
        """SQLite has no notifications: ``wait()`` polls for other processes' settlements."""
        return False

    def close(self) -> None:
        if self.db.gate.held_by_me():
            raise GateRefused(
                "close() was called inside this store's transaction; finish it first",
                reason="reentrant",
            )
        gate = self.db.gate
        gate.close()
        gate.wait_idle(gate.timeout_seconds)
        self.db.close()


class SqliteTransaction:
    """One open ``store.transaction()``: the gate is held until :meth:`release`."""

    ended_message = _ENDED
    aborted_text = (
        "SQLite rolled back this store.transaction() after a failure inside it "
        "(INSERT OR ROLLBACK, ON CONFLICT ROLLBACK, RAISE(ROLLBACK), a full disk)"
    )

    def __init__(self, db: Database, backend: SqliteBackend) -> None:
        self.db = db
        self.backend = backend

    @property
    def gate(self) -> object:
        return self.db.gate

    def session(self, transaction: TransactionState, runtime: ResolvedRuntime) -> JobsSession:
        return SqliteSession(
            self.db, TxScope(self.db, transaction), runtime, self.backend.idle_claims, self.backend
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
        cursor = run_app_statement(self.db, statement, parameters, many=many, doing=what)

        def translate(exc: BaseException) -> Exception:
            assert isinstance(exc, sqlite3.Error)
            return transaction.explain(storage_error(exc, what))

        return Rows(cursor, sqlite3.Error, translate)

    def ended_by_database(self) -> bool:
        db = self.db
        return not db.closed and not db.connection.in_transaction

    def savepoint(self, name: str, what: str) -> None:
        self.db.run(sql.savepoint(name), doing=what)

    def release_savepoint(self, name: str, what: str) -> None:
        self.db.run(sql.release_savepoint(name), doing=what)

    def rollback_to_savepoint(self, name: str, what: str) -> None:
        self.db.run(sql.rollback_to_savepoint(name), doing=what)

    def commit(self, what: str) -> None:
        self.db.run(sql.COMMIT, doing=what)

    def rollback_quietly(self) -> None:
        self.db.rollback_quietly()

    def release(self) -> None:
        self.db.gate.release()
