"""The connection, the one place ``sqlite3`` errors are translated, and scopes.

A *scope* is how an engine call reaches the connection:

* :class:`RootScope` (``store.jobs``; backends/scopes.py, shared with
  PostgreSQL) takes the store's gate per call and runs each write in its own
  ``BEGIN IMMEDIATE … COMMIT``;
* :class:`TxScope` (``tx.jobs``) runs inside the application's open
  transaction, under a savepoint, so a job enqueued there exists if and only
  if that transaction commits.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from jaren_jobs.backends.scopes import RootScope, TxScope
from jaren_jobs.backends.sqlite import queries as sql
from jaren_jobs.backends.sqlite.errors import storage_error
from jaren_jobs.errors import JobsError, StorageError, StoreClosed, TransactionAborted
from jaren_jobs.gate import Gate
from jaren_jobs.signals import SignalLike

__all__ = ["Database", "RootScope", "Scope", "TxScope"]

T = TypeVar("T")
R = TypeVar("R")
Params = Sequence[Any] | Mapping[str, Any]


class Database:
    """One ``sqlite3`` connection, used only under the gate; errors translated here."""

    def __init__(self, connection: sqlite3.Connection, *, owns: bool, gate: Gate) -> None:
        self.connection = connection
        self.owns = owns
        self.gate = gate
        self.closed = False
        self._savepoints = itertools.count(1)
        # the connection's busy_timeout (set by open_store); begin() polls within it
        self.busy_ms = 0
        # whether a write may leave busy_timeout at 0 once it committed (see begin)
        self.lazy_busy = False
        # True while the connection's busy_timeout is 0 because a write set it so
        self._busy_off = False
        self.max_variables = _max_variables(connection)
        # the codec of the file's text: what CAST(text AS BLOB) hands back (read_encoding)
        self.text_codec = "utf-8"
        self.opened_in = os.getpid()
        # while a store opens on an application's connection inside the application's
        # own transaction: the opening's writes (schema) run under savepoints in it
        self.joining = False
        # set in a child of os.fork(): the connection is the parent's (see _after_fork)
        self.forked = False
        _OPEN.add(self)

    def check_open(self, what: str) -> None:
        if self.closed:
            if self.forked:
                raise StoreClosed(
                    f"{what}: this store was opened in process {self.opened_in}, before "
                    "os.fork(); a child cannot use its parent's store (the SQLite connection "
                    "and the gate belong to the parent) — open a new store in the child",
                    forked=True,
                    opened_in=self.opened_in,
                )
            raise StoreClosed(f"{what}: the store is closed; open a new one")

    def after_fork_in_child(self) -> None:
        """In a child of os.fork(): refuse every call, and never touch the connection.

        SQLite forbids using a connection across fork (the child holds none of
        its locks), and the gate's holders and waiters are parent threads the
        child does not have. Marking it closed costs the calls nothing: each
        already checks ``closed``; ``close()`` then leaves the connection alone.
        """
        if not self.closed:
            self.forked = True
            self.closed = True
        self.gate.after_fork_in_child(
            f"this store was opened in process {self.opened_in}, before os.fork(); a child "
            "cannot use it — open a new store in the child"
        )

    def cursor(self) -> sqlite3.Cursor:
        if self._busy_off and not self.connection.in_transaction:
            # a statement outside any write of ours: it waits out a lock as configured
            self.restore_busy("reading")
        cur = self.connection.cursor()
        # the application's row_factory must not change what we read
        cur.row_factory = None
        return cur

    def run(self, statement: str, params: Params = (), *, doing: str) -> sqlite3.Cursor:
        """Execute one statement; a driver failure becomes ``StorageError``."""
        self.check_open(doing)
        try:
            cur = self.cursor()
            cur.execute(statement, params)
        except sqlite3.Error as exc:
            raise storage_error(exc, doing) from exc
        except UnicodeEncodeError as exc:  # every caller checks its text; this is the backstop
            raise _unstorable(exc, doing) from exc
        return cur

    def run_many(self, statement: str, rows: Iterable[Params], *, doing: str) -> sqlite3.Cursor:
        self.check_open(doing)
        try:
            cur = self.cursor()
            cur.executemany(statement, rows)
        except sqlite3.Error as exc:
            raise storage_error(exc, doing) from exc
        except UnicodeEncodeError as exc:
            raise _unstorable(exc, doing) from exc
        return cur

    # Every row the library reads comes through one(), all() or fetch_one(), with
    # the connection's text_factory set to str for the statement: the
    # application's own (bytes, a latin-1 decoder) applies to its own SQL only.
    # Both execute and fetch run under it: older sqlite3 modules build the
    # first row inside execute.

    def one(self, statement: str, params: Params = (), *, doing: str) -> tuple[Any, ...] | None:
        row: tuple[Any, ...] | None = self._read(statement, params, doing, _FETCH_ONE)
        return row

    def all(self, statement: str, params: Params = (), *, doing: str) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = self._read(statement, params, doing, _FETCH_ALL)
        return rows

    def _read(
        self, statement: str, params: Params, doing: str, fetch: Callable[[sqlite3.Cursor], R]
    ) -> R:
        connection = self.connection
        factory = connection.text_factory
        if factory is not str:
            connection.text_factory = str
        try:
            cur = self.run(statement, params, doing=doing)
            try:
                answer = fetch(cur)
                cur.close()  # the statement is done: reset it now, not when collected
                return answer
            except sqlite3.Error as exc:
                raise storage_error(exc, doing) from exc
        finally:
            if factory is not str:
                connection.text_factory = factory

    def close_cursor(self, cursor: sqlite3.Cursor) -> None:
        """Close a cursor of the caller's (a page's) once it is done with it."""
        # a connection closed first has finalised every statement with it
        with contextlib.suppress(sqlite3.ProgrammingError):
            cursor.close()

    def fetch_one(
        self, cursor: sqlite3.Cursor, statement: str, params: Params
    ) -> tuple[Any, ...] | None:
        """Run ``statement`` on a cursor of the caller's and read one row, text as str.

        For a caller that keeps its own cursor (a page); ``sqlite3`` errors
        are raised as they are, for the caller to translate.
        """
        connection = self.connection
        factory = connection.text_factory
        if factory is not str:
            connection.text_factory = str
        try:
            cursor.execute(statement, params)
            row: tuple[Any, ...] | None = cursor.fetchone()
        finally:
            if factory is not str:
                connection.text_factory = factory
        return row

    def read_encoding(self, doing: str) -> None:
        """Learn the file's text encoding, which the row mappers decode text with."""
        row = self.one(sql.READ_ENCODING, doing=doing)
        name = "" if row is None else str(row[0]).lower()
        self.text_codec = _CODECS.get(name, "utf-8")

    def changes(self, statement: str, params: Params = (), *, doing: str) -> int:
        cur = self.run(statement, params, doing=doing)
        return cur.rowcount

    @property
    def in_transaction(self) -> bool:
        return self.connection.in_transaction

    def transaction(self, fn: Callable[[], T], *, doing: str, immediate: bool = True) -> T:
        """Run ``fn`` inside BEGIN [IMMEDIATE] … COMMIT; roll back on any exception."""
        if self.joining:
            return self.savepoint(fn, doing=doing)
        connection = self.connection
        if connection.in_transaction:
            raise StorageError(
                f"{doing}: the connection has an open transaction that jaren_jobs did not "
                "start; commit it first, or enqueue through store.transaction()",
                doing=doing,
            )
        self.begin(immediate=immediate, doing=doing)
        try:
            result = fn()
            try:
                connection.execute(sql.COMMIT)
            except sqlite3.Error as exc:
                raise storage_error(exc, doing) from exc
        except BaseException:
            self.rollback_quietly()
            raise
        return result

    def begin(self, *, immediate: bool, doing: str, keep_busy: bool = False) -> None:
        """BEGIN [IMMEDIATE]; a busy write lock is polled in short naps, within busy_timeout.

        SQLite's own busy handler backs off to 100 ms naps, while a process
        writing back-to-back re-takes the lock microseconds after each commit:
        other processes could starve past busy_timeout and fail. Short polls
        find those gaps, so each attempt runs with busy_timeout at 0.

        With ``lazy_busy`` (a WAL file the store opened itself) busy_timeout
        stays 0 after the write lock is taken: nothing an immediate
        transaction runs in WAL mode waits on a lock (COMMIT included), so
        back-to-back writes pay no PRAGMA at all, and the first statement
        outside a write (:meth:`restore_busy`, called by every read path)
        turns it back on. ``keep_busy`` restores it at once, for a
        transaction that runs the application's own SQL.
        """
        self.check_open(doing)
        execute = self.connection.execute
        if not immediate:
            if self._busy_off:
                self.restore_busy(doing)
            try:
                execute(sql.BEGIN_DEFERRED)
            except sqlite3.Error as exc:
                raise storage_error(exc, doing) from exc
            return
        if self.busy_ms <= 0:
            # no wait was asked for (busy_timeout is 0 already): one attempt
            try:
                execute(sql.BEGIN_IMMEDIATE)
            except sqlite3.Error as exc:
                raise storage_error(exc, doing) from exc
            return
        try:
            if not self._busy_off:
                execute(_BUSY_OFF)
                self._busy_off = True
            try:
                execute(sql.BEGIN_IMMEDIATE)
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
                self._poll_begin(exc)
        except sqlite3.Error as exc:
            self._restore_after_begin(doing)
            raise storage_error(exc, doing) from exc
        except BaseException:  # an interrupt: whether BEGIN ran is unknown
            self.rollback_quietly()
            self._restore_after_begin(doing)
            raise
        if keep_busy or not self.lazy_busy:
            self._restore_after_begin(doing)

    def _poll_begin(self, first: sqlite3.OperationalError) -> None:
        """Retry BEGIN IMMEDIATE in short naps until it succeeds or busy_timeout passes."""
        execute = self.connection.execute
        end = time.monotonic() + self.busy_ms / 1000
        nap = 0.0005
        failure = first
        while time.monotonic() < end:
            time.sleep(nap)
            nap = min(nap * 2, 0.004)
            try:
                execute(sql.BEGIN_IMMEDIATE)
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
                failure = exc
        raise failure

    def _restore_after_begin(self, doing: str) -> None:
        if self._busy_off:
            try:
                self.restore_busy(doing)
            except JobsError:
                self.rollback_quietly()
                raise

    def busy_is_off(self) -> bool:
        """Whether a write left busy_timeout at 0 (see :meth:`begin`)."""
        return self._busy_off

    def restore_busy(self, doing: str) -> None:
        """Put busy_timeout back after a write left it at 0 (every read path calls this)."""
        if not self._busy_off:
            return
        try:
            self.connection.execute(sql.pragma_busy_timeout(self.busy_ms))
        except sqlite3.Error as exc:
            raise storage_error(exc, doing) from exc
        self._busy_off = False

    # ------------------------------------------------------------ for the root scope

    def take(self, what: str, signal: SignalLike | None = None) -> None:
        """Hold the store's one connection for this thread: its gate."""
        self.gate.acquire(what, signal)

    def give_back(self) -> None:
        self.gate.release()

    def snapshot(self, fn: Callable[[], T], *, doing: str) -> T:
        return self.transaction(fn, doing=doing, immediate=False)

    def before_read(self, what: str) -> None:
        if self._busy_off:
            self.restore_busy(what)

    def after_read(self) -> None:
        pass  # a read outside a transaction leaves nothing open on SQLite

    def savepoint(self, fn: Callable[[], T], *, doing: str) -> T:
        """Run ``fn`` under a savepoint: its writes land all together or not at all."""
        if not self.connection.in_transaction:
            # SAVEPOINT would open a transaction of its own and RELEASE commit it
            raise TransactionAborted(
                f"{doing}: the transaction it was to run in is gone (SQLite rolled it "
                "back); nothing was written — retry in a new store.transaction()",
                doing=doing,
            )
        name = f"jaren_jobs_{next(self._savepoints)}"
        self.run(sql.savepoint(name), doing=doing)
        try:
            result = fn()
        except BaseException:
            try:
                self.run(sql.rollback_to_savepoint(name), doing=doing)
                self.run(sql.release_savepoint(name), doing=doing)
            except JobsError:
                pass  # the outer transaction's rollback undoes it anyway
            raise
        self.run(sql.release_savepoint(name), doing=doing)
        return result

    def rollback_quietly(self) -> None:
        if self.closed:
            return
        try:
            if self.connection.in_transaction:
                self.connection.execute(sql.ROLLBACK)
        except sqlite3.Error:
            pass  # SQLite rolls back on its own after some failures (disk full)

    def close(self) -> None:
        if self.closed:
            return
        self.rollback_quietly()
        self.closed = True
        if self.owns:
            try:
                self.connection.close()
            except sqlite3.Error as exc:
                raise storage_error(exc, "closing the database") from exc


# every Database of this process, for the fork hook (weak: a closed store leaves)
_OPEN: weakref.WeakSet[Database] = weakref.WeakSet()


def _after_fork() -> None:
    for db in list(_OPEN):
        db.after_fork_in_child()


if hasattr(os, "register_at_fork"):  # POSIX; nothing forks elsewhere
    os.register_at_fork(after_in_child=_after_fork)


# the cursor's own methods, called directly: a read is the hottest call there is
_FETCH_ONE: Callable[[sqlite3.Cursor], Any] = sqlite3.Cursor.fetchone
_FETCH_ALL: Callable[[sqlite3.Cursor], Any] = sqlite3.Cursor.fetchall


def _max_variables(connection: sqlite3.Connection) -> int:
    """The most parameters one statement may bind (SQLITE_LIMIT_VARIABLE_NUMBER).

    Python < 3.11 cannot ask; 999 is the smallest limit any SQLite had.
    """
    getlimit = getattr(connection, "getlimit", None)
    if getlimit is None:  # pragma: no cover - Python 3.10
        return 999
    try:
        return int(getlimit(getattr(sqlite3, "SQLITE_LIMIT_VARIABLE_NUMBER", 9)))
    except sqlite3.Error:  # a closed connection: every later use says so
        return 999


def _unstorable(exc: UnicodeEncodeError, doing: str) -> ValueError:
    return ValueError(f"{doing}: a text given cannot be stored as UTF-8 ({exc.reason})")


# PRAGMA encoding's answers, as Python codecs
_CODECS = {"utf-8": "utf-8", "utf-16le": "utf-16-le", "utf-16be": "utf-16-be"}

_BUSY_OFF = sql.pragma_busy_timeout(0)
_SQLITE_BUSY = 5  # the primary result code; extended codes keep it in the low byte


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return (int(code) & 0xFF) == _SQLITE_BUSY
    return str(exc) == "database is locked"


class Scope(Protocol):
    """How an engine reaches the database: root (gated) or inside a transaction."""

    db: Database

    def write(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T: ...

    def read(self, fn: Callable[[], T], what: str, signal: SignalLike | None = None) -> T: ...

    def after_commit(self, callback: Callable[[], None]) -> None: ...


Connection = sqlite3.Connection
