"""Connections to PostgreSQL: a small pool (or the application's connection) and scopes.

A *scope* is how an engine call reaches a connection, as on SQLite:

* :class:`RootScope` (``store.jobs``): each call takes a connection from the
  store's pool (waiting at most ``gate_timeout_seconds``: ``GateRefused``)
  and runs its write in a transaction of its own;
* :class:`TxScope` (``tx.jobs``): inside a transaction already open on this
  thread's connection, under a savepoint.

The connection a call runs on is bound to the calling thread for the call
(:meth:`Database.bound`), so the session's statements (``db.one`` …) never
name it. A connection that broke is closed, never pooled again, and the
idle ones are checked, so the next call reconnects: the same store goes on
once the server is back.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import pq

from jaren_jobs.errors import GateRefused, StorageError, StoreClosed
from jaren_jobs.signals import SignalLike

from .errors import is_gone, storage_error, translating

__all__ = ["Database", "RootScope", "TxScope", "connect_kwargs"]

T = TypeVar("T")
Params = Sequence[Any] | Mapping[str, Any]

# libpq defaults for a connection the store opens, unless the URL sets them:
# a dead server or a half-open TCP connection is noticed in seconds, never
# hangs a worker for the kernel's two hours
_CONNECT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}
# server-side bound on one statement of the library's (a lock wait included)
STATEMENT_TIMEOUT_MS = 60_000

_POLL = 0.05  # how often a waiter for a connection re-checks its signal


def connect_kwargs(url: str) -> dict[str, Any]:
    """The keyword arguments of ``psycopg.connect`` for ``url`` (the URL's own win)."""
    given = psycopg.conninfo.conninfo_to_dict(url)
    return {key: value for key, value in _CONNECT_DEFAULTS.items() if key not in given}


class Database:
    """One store's connections (a pool from a URL, or the application's one)."""

    def __init__(
        self,
        *,
        url: str | None,
        connection: psycopg.Connection[Any] | None,
        durability: str,
        readonly: bool,
        timeout_seconds: float,
        max_size: int = 8,
    ) -> None:
        self.url = url
        self.app_connection = connection
        self.owns = connection is None
        self.durability = durability
        self.readonly = readonly
        self.timeout_seconds = timeout_seconds
        self.max_size = 1 if connection is not None else max_size
        self.closed = False
        self.forked = False
        self.opened_in = os.getpid()
        self.channel = "jaren_jobs"  # set once the schema is known (schema.py)
        self._cond = threading.Condition()
        self._idle: list[psycopg.Connection[Any]] = [] if connection is None else [connection]
        self._size = 0 if connection is None else 1
        self._waiting = 0
        self._local = threading.local()
        _OPEN.add(self)

    # ------------------------------------------------------------ lifecycle

    def check_open(self, what: str) -> None:
        if self.closed:
            if self.forked:
                raise StoreClosed(
                    f"{what}: this store was opened in process {self.opened_in}, before "
                    "os.fork(); a child cannot use its parent's store (its PostgreSQL "
                    "connections belong to the parent) — open a new store in the child",
                    forked=True,
                    opened_in=self.opened_in,
                )
            raise StoreClosed(f"{what}: the store is closed; open a new one")

    def after_fork_in_child(self) -> None:
        # never touch the parent's sockets: closing one would end its session
        self.forked = True
        self.closed = True
        self._idle = []

    def close(self) -> None:
        with self._cond:
            if self.closed:
                return
            self.closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        if self.owns:
            for conn in idle:
                _close_quietly(conn)

    # ------------------------------------------------------------ the pool

    def connect(self, doing: str) -> psycopg.Connection[Any]:
        """A new connection of the store's own, configured (autocommit; settings per session)."""
        assert self.url is not None
        with translating(f"{doing}: connecting to PostgreSQL"):
            conn = psycopg.connect(self.url, autocommit=True, **connect_kwargs(self.url))
        try:
            with translating(f"{doing}: configuring the connection"):
                conn.execute(self.session_settings())
        except BaseException:
            _close_quietly(conn)
            raise
        return conn

    def session_settings(self) -> str:
        """The settings of a connection the store owns: durability, timeouts, read-only."""
        sync = "on" if self.durability == "full" else "off"
        statements = [
            f"SET synchronous_commit = {sync}",
            f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}",
            # a transaction the library left open (a killed thread) does not hold locks forever
            f"SET idle_in_transaction_session_timeout = {STATEMENT_TIMEOUT_MS}",
        ]
        if self.readonly:
            statements.append("SET default_transaction_read_only = on")
        return "; ".join(statements)

    def acquire(self, what: str, signal: SignalLike | None = None) -> psycopg.Connection[Any]:
        """A connection for one call; ``GateRefused`` past the timeout or when ``signal`` aborts."""
        deadline = time.monotonic() + self.timeout_seconds
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    self.check_open(what)
                    if signal is not None and signal.aborted:
                        raise GateRefused(
                            f"{what}: abandoned while waiting for a connection (its signal "
                            "aborted)",
                            reason="aborted",
                        )
                    if self._idle:
                        return self._idle.pop()
                    if self._size < self.max_size:
                        self._size += 1
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise GateRefused(
                            f"{what}: waited {self.timeout_seconds:g}s for one of the store's "
                            f"{self.max_size} PostgreSQL connections and none came free; "
                            "raise gate_timeout_seconds or use fewer threads at once",
                            reason="timeout",
                            timeout_seconds=self.timeout_seconds,
                        )
                    self._cond.wait(min(left, _POLL))
            finally:
                self._waiting -= 1
        try:
            return self.connect(what)
        except BaseException:
            with self._cond:
                self._size -= 1
                self._cond.notify()
            raise

    def release(self, conn: psycopg.Connection[Any]) -> None:
        """Hand a connection back: pooled if healthy and idle, else closed and replaced later."""
        healthy = not conn.closed and not conn.broken
        if healthy and conn.info.transaction_status != pq.TransactionStatus.IDLE:
            healthy = self.app_connection is conn  # the application's: its state is its own
        with self._cond:
            if healthy and not self.closed:
                self._idle.append(conn)
                self._cond.notify()
                return
            if self.owns:
                self._size -= 1
            elif healthy or self.app_connection is conn:
                self._idle.append(conn)  # never ours to close
            self._cond.notify()
        if self.owns:
            _close_quietly(conn)
        if not healthy:
            self.drop_broken()

    def drop_broken(self) -> None:
        """After a broken connection: close the idle ones that broke with it (a restart)."""
        if not self.owns:
            return
        with self._cond:
            idle, self._idle = self._idle, []
        keep = []
        for conn in idle:
            try:
                conn.execute("SELECT 1")
                keep.append(conn)
            except psycopg.Error:
                _close_quietly(conn)
        with self._cond:
            self._size -= len(idle) - len(keep)
            if self.closed:
                for conn in keep:
                    _close_quietly(conn)
                return
            self._idle.extend(keep)
            self._cond.notify_all()

    # ------------------------------------------------------------ the bound connection

    @contextmanager
    def bound(self, conn: psycopg.Connection[Any]) -> Iterator[None]:
        stack: list[psycopg.Connection[Any]] = self._local.__dict__.setdefault("stack", [])
        stack.append(conn)
        try:
            yield
        finally:
            stack.pop()

    @property
    def conn(self) -> psycopg.Connection[Any]:
        stack = self._local.__dict__.get("stack")
        if not stack:
            raise AssertionError("no connection is bound to this thread")
        conn: psycopg.Connection[Any] = stack[-1]
        return conn

    def in_store_transaction(self) -> bool:
        """Whether this thread is inside one of this store's ``store.transaction()``."""
        return bool(self._local.__dict__.get("tx_depth", 0))

    def enter_store_transaction(self) -> None:
        self._local.tx_depth = self._local.__dict__.get("tx_depth", 0) + 1

    def leave_store_transaction(self) -> None:
        self._local.tx_depth -= 1

    # ------------------------------------------------------------ statements

    def run(self, statement: str, params: Params | None = None, *, doing: str) -> psycopg.Cursor[Any]:
        """Execute one statement on the bound connection; driver failures translated."""
        self.check_open(doing)
        try:
            return self.conn.execute(statement, params)  # type: ignore[arg-type]
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc

    def one(self, statement: str, params: Params | None = None, *, doing: str) -> tuple[Any, ...] | None:
        cur = self.run(statement, params, doing=doing)
        with translating(doing):
            row: tuple[Any, ...] | None = cur.fetchone()
        return row

    def all(self, statement: str, params: Params | None = None, *, doing: str) -> list[tuple[Any, ...]]:
        cur = self.run(statement, params, doing=doing)
        with translating(doing):
            return list(cur.fetchall())

    def changes(self, statement: str, params: Params | None = None, *, doing: str) -> int:
        return self.run(statement, params, doing=doing).rowcount

    # ------------------------------------------------------------ transactions

    def _begin_settings(self, *, read_only: bool) -> str | None:
        """What a transaction the library begins on the application's connection sets."""
        if self.owns:
            return None  # session settings of the store's own connections
        sync = "on" if self.durability == "full" else "off"
        parts = [f"SET LOCAL synchronous_commit = {sync}"]
        if read_only or self.readonly:
            parts.insert(0, "SET TRANSACTION READ ONLY")
        return "; ".join(parts)

    def in_transaction(self, conn: psycopg.Connection[Any]) -> bool:
        return conn.info.transaction_status != pq.TransactionStatus.IDLE

    def transaction(
        self,
        fn: Callable[[], T],
        *,
        doing: str,
        signal: SignalLike | None = None,
        read_only: bool = False,
        consistent: bool = False,
    ) -> T:
        """``fn`` in one transaction on a connection of the pool (a savepoint when the
        application's connection already has one open: the call joins it)."""
        self.check_open(doing)
        if self.in_store_transaction():
            raise GateRefused(
                f"{doing}: this thread holds the store's transaction; call tx.jobs (the "
                "transaction's own view) instead of store.jobs, or finish the transaction "
                "first — waiting here would deadlock",
                reason="reentrant",
            )
        conn = self.acquire(doing, signal)
        try:
            with self.bound(conn):
                return self._transaction_on(conn, fn, doing, read_only, consistent)
        finally:
            self.release(conn)

    def _transaction_on(
        self,
        conn: psycopg.Connection[Any],
        fn: Callable[[], T],
        doing: str,
        read_only: bool,
        consistent: bool,
    ) -> T:
        joined = self.in_transaction(conn)
        try:
            with conn.transaction():
                if not joined:
                    settings = self._begin_settings(read_only=read_only)
                    if consistent:
                        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                    if settings is not None:
                        conn.execute(settings)
                return fn()
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc

    def savepoint(self, fn: Callable[[], T], *, doing: str) -> T:
        """``fn`` under a savepoint on the bound connection: all of it or none."""
        conn = self.conn
        try:
            with conn.transaction():
                return fn()
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc

    def autocommit_read(self, fn: Callable[[], T], *, doing: str, signal: SignalLike | None) -> T:
        """``fn``'s reads on a pooled connection, each statement its own snapshot."""
        self.check_open(doing)
        if self.in_store_transaction():
            raise GateRefused(
                f"{doing}: this thread holds the store's transaction; call tx.jobs instead "
                "of store.jobs, or finish the transaction first",
                reason="reentrant",
            )
        conn = self.acquire(doing, signal)
        try:
            with self.bound(conn):
                if not self.owns and not self.in_transaction(conn) and not conn.autocommit:
                    # the application's connection would begin a transaction and keep it
                    return self._transaction_on(conn, fn, doing, True, False)
                return fn()
        finally:
            self.release(conn)


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.close()
    except psycopg.Error:
        pass


# every Database of this process, for the fork hook (weak: a closed store leaves)
_OPEN: weakref.WeakSet[Database] = weakref.WeakSet()


def _after_fork() -> None:
    for db in list(_OPEN):
        db.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class RootScope:
    """``store.jobs``: a pooled connection per call, each write its own transaction."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        return self.db.transaction(fn, doing=what, signal=signal)

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        return self.db.autocommit_read(fn, doing=what, signal=signal)

    def read_consistent(self, fn: Callable[[], T], what: str) -> T:
        return self.db.transaction(fn, doing=what, read_only=True, consistent=True)

    def after_commit(self, callback: Callable[[], None]) -> None:
        callback()


class TxScope:
    """``tx.jobs``: inside the open ``store.transaction()``, writes under savepoints."""

    def __init__(self, db: Database, transaction: Any) -> None:
        self.db = db
        self._transaction = transaction

    def _check(self, what: str) -> None:
        self.db.check_open(what)
        self._transaction.check_active(what)

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        self._check(what)
        with self.db.bound(self._transaction.connection):
            return self.db.savepoint(fn, doing=what)

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T:
        self._check(what)
        with self.db.bound(self._transaction.connection):
            return fn()

    def read_consistent(self, fn: Callable[[], T], what: str) -> T:
        return self.read(fn, what)

    def after_commit(self, callback: Callable[[], None]) -> None:
        self._transaction.after_commit(callback)


def gone(exc: BaseException) -> bool:
    """Whether a translated failure's cause says the server went away."""
    cause = exc.__cause__ if isinstance(exc, StorageError) else exc
    return cause is not None and is_gone(cause)
