"""One psycopg connection, used under the store's gate; every driver error translated here.

A store opened from a URL owns its connection: it is configured once
(durability, read-only, timeouts) and, when it breaks (the server restarted,
the network dropped it), closed and replaced by a fresh one on the next call
— the call that met the break fails with ``StorageError``, never a false
success. A store given the application's connection never replaces or
closes it, and sets its options per transaction instead.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import pq

from jaren_jobs.backends.scopes import TxScope as PgTxScope
from jaren_jobs.errors import StorageError, StoreClosed
from jaren_jobs.gate import Gate
from jaren_jobs.signals import SignalLike

from .errors import storage_error

__all__ = ["PgDatabase", "PgRootScope", "PgTxScope"]

T = TypeVar("T")
Params = Sequence[Any] | Mapping[str, Any]

# a half-open connection must not hang a worker for hours (SPEC §10)
CONNECT_TIMEOUT_SECONDS = 10
STATEMENT_TIMEOUT_MS = 120_000
KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}


class PgDatabase:
    """The store's one connection to PostgreSQL, used only under the gate."""

    def __init__(
        self,
        *,
        conninfo: str | None,
        connection: psycopg.Connection[Any] | None,
        durability: str,
        readonly: bool,
        gate: Gate,
    ) -> None:
        self.conninfo = conninfo
        self.owns = connection is None
        self.durability = durability
        self.readonly = readonly
        self.gate = gate
        self.closed = False
        self.forked = False
        self.opened_in = os.getpid()
        self.text_codec = "utf-8"
        self.listener: Any = None  # notify.Listener, for a store opened from a URL
        self._connection = connection if connection is not None else self._connect("opening")
        if not self.owns:
            self._check_app_connection()
        _OPEN.add(self)

    # ------------------------------------------------------------ the connection

    def _connect(self, doing: str) -> psycopg.Connection[Any]:
        assert self.conninfo is not None
        try:
            conn = psycopg.connect(
                self.conninfo,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                **KEEPALIVES,
            )
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc
        try:
            conn.execute(
                f"SET synchronous_commit = {'on' if self.durability == 'full' else 'off'}; "
                f"SET default_transaction_read_only = {'on' if self.readonly else 'off'}; "
                f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}"
            )
        except psycopg.Error as exc:
            conn.close()
            raise storage_error(exc, doing) from exc
        return conn

    def _check_app_connection(self) -> None:
        conn = self._connection
        if conn.closed:
            raise StorageError("open_store(connection=...): the psycopg connection is closed")

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The live connection (replaced first if the store owns it and it broke)."""
        conn = self._connection
        if self.owns and (conn.closed or conn.broken):
            with contextlib.suppress(psycopg.Error):
                conn.close()
            self._connection = conn = self._connect("reconnecting")
        return conn

    def check_open(self, what: str) -> None:
        if self.closed:
            if self.forked:
                raise StoreClosed(
                    f"{what}: this store was opened in process {self.opened_in}, before "
                    "os.fork(); a child cannot use its parent's store (its PostgreSQL "
                    "connection belongs to the parent) — open a new store in the child",
                    forked=True,
                    opened_in=self.opened_in,
                )
            raise StoreClosed(f"{what}: the store is closed; open a new one")

    def after_fork_in_child(self) -> None:
        if not self.closed:
            self.forked = True
            self.closed = True
        self.gate.after_fork_in_child(
            f"this store was opened in process {self.opened_in}, before os.fork(); a child "
            "cannot use it — open a new store in the child"
        )

    # ------------------------------------------------------------ statements

    def run(
        self, statement: str, params: Params | None = None, *, doing: str
    ) -> psycopg.Cursor[Any]:
        self.check_open(doing)
        try:
            return self.connection.execute(statement, params)
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc
        except UnicodeEncodeError as exc:  # every caller checks its text; this is the backstop
            raise ValueError(
                f"{doing}: a text given cannot be stored as UTF-8 ({exc.reason})"
            ) from None

    def one(
        self, statement: str, params: Params | None = None, *, doing: str
    ) -> tuple[Any, ...] | None:
        cursor = self.run(statement, params, doing=doing)
        try:
            return cursor.fetchone()
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc

    def all(
        self, statement: str, params: Params | None = None, *, doing: str
    ) -> list[tuple[Any, ...]]:
        cursor = self.run(statement, params, doing=doing)
        try:
            return cursor.fetchall()
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc

    def changes(self, statement: str, params: Params | None = None, *, doing: str) -> int:
        return int(self.run(statement, params, doing=doing).rowcount)

    @property
    def status(self) -> pq.TransactionStatus:
        return self._connection.info.transaction_status

    @property
    def in_transaction(self) -> bool:
        return self.status != pq.TransactionStatus.IDLE

    def begin(self, *, doing: str, read_only: bool = False) -> None:
        """Open a transaction of the library's own on the connection."""
        conn = self.connection
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            raise StorageError(
                f"{doing}: the connection has an open transaction that jaren_jobs did not "
                "start; commit it first",
                doing=doing,
            )
        begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if read_only else "BEGIN"
        options = []
        if not self.owns:
            # the application's connection keeps its own settings: ours are per
            # transaction (and the first statement is what opens the transaction
            # on a connection that is not in autocommit)
            sync = "on" if self.durability == "full" else "off"
            options.append(f"SET LOCAL synchronous_commit = {sync}")
            if self.readonly and not read_only:
                options.append("SET TRANSACTION READ ONLY")
        try:
            if conn.autocommit:
                conn.execute(begin)
            elif read_only:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            for option in options:
                conn.execute(option)
        except psycopg.Error as exc:
            self.rollback_quietly()
            raise storage_error(exc, doing) from exc

    def commit(self, *, doing: str) -> None:
        try:
            conn = self._connection
            if conn.autocommit:
                conn.execute("COMMIT")
            else:
                conn.commit()
        except psycopg.Error as exc:
            self.rollback_quietly()
            raise storage_error(exc, doing) from exc

    def rollback_quietly(self) -> None:
        conn = self._connection
        try:
            if conn.closed or conn.info.transaction_status == pq.TransactionStatus.IDLE:
                return
            if conn.autocommit:
                conn.execute("ROLLBACK")
            else:
                conn.rollback()
        except psycopg.Error:
            pass  # a broken connection rolled back with its session

    def transaction(self, fn: Callable[[], T], *, doing: str, read_only: bool = False) -> T:
        self.begin(doing=doing, read_only=read_only)
        try:
            result = fn()
        except BaseException:
            self.rollback_quietly()
            raise
        self.commit(doing=doing)
        return result

    def savepoint(self, fn: Callable[[], T], *, doing: str) -> T:
        self.run('SAVEPOINT "jaren_jobs"', doing=doing)
        try:
            result = fn()
        except BaseException:
            try:
                self.run('ROLLBACK TO SAVEPOINT "jaren_jobs"', doing=doing)
                self.run('RELEASE SAVEPOINT "jaren_jobs"', doing=doing)
            except StorageError:
                pass  # the transaction itself is over: its owner hears of it
            raise
        self.run('RELEASE SAVEPOINT "jaren_jobs"', doing=doing)
        return result

    def end_read(self) -> None:
        """After a read outside any transaction of ours: end the implicit one psycopg opened
        on a connection that is not in autocommit (never leave it idle in transaction)."""
        conn = self._connection
        idle_in_transaction = pq.TransactionStatus.INTRANS
        if not conn.autocommit and not conn.closed:  # noqa: SIM102 - read in two steps
            if conn.info.transaction_status == idle_in_transaction:
                with contextlib.suppress(psycopg.Error):
                    conn.rollback()

    def close(self) -> None:
        if self.closed:
            return
        self.rollback_quietly()
        self.closed = True
        if self.owns:
            try:
                self._connection.close()
            except psycopg.Error as exc:
                raise storage_error(exc, "closing the database") from exc


class PgRootScope:
    """``store.jobs``: the gate per call, each write its own transaction."""

    root = True

    def __init__(self, db: PgDatabase) -> None:
        self.db = db

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        db = self.db
        db.check_open(what)
        gate = db.gate
        gate.acquire(what, signal)
        try:
            return db.transaction(fn, doing=what)
        finally:
            gate.release()

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        db = self.db
        db.check_open(what)
        gate = db.gate
        gate.acquire(what, signal)
        try:
            if db.in_transaction and db.owns:
                db.rollback_quietly()  # a connection left mid-transaction by a failure
            try:
                return fn()
            finally:
                db.end_read()
        finally:
            gate.release()

    def read_consistent(self, fn: Callable[[], T], what: str) -> T:
        self.db.check_open(what)
        with self.db.gate.held(what):
            return self.db.transaction(fn, doing=what, read_only=True)

    def after_commit(self, callback: Callable[[], None]) -> None:
        callback()


# every PgDatabase of this process, for the fork hook (weak: a closed store leaves)
_OPEN: weakref.WeakSet[PgDatabase] = weakref.WeakSet()


def _after_fork() -> None:
    for db in list(_OPEN):
        db.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
