"""The store's connections to PostgreSQL, each used by one thread at a time; every
driver error translated here.

A store opened from a URL owns a small pool of connections (``open_store``'s
``pool_size``, 4 unless it says): the store's gate admits that many threads at once,
and each call — a root call, or a whole ``store.transaction()`` — takes one
connection for its whole duration (this thread's, until it gives it back). A
connection is opened when a call needs one and none is idle, configured once
(durability, read-only, timeouts) and, when it breaks (the server restarted,
the network dropped it), closed and never handed out again: the call that met
the break fails with ``StorageError``, never a false success, and the next
call that needs a connection opens a fresh one. A store given the
application's connection has exactly that one, behind a gate of one place; it
never replaces or closes it, and sets its options per transaction instead.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg import pq

from jaren_jobs.backends.postgres import queries as sql
from jaren_jobs.backends.postgres.errors import storage_error
from jaren_jobs.backends.scopes import RootScope as PgRootScope
from jaren_jobs.backends.scopes import TxScope as PgTxScope
from jaren_jobs.errors import StorageError, StoreClosed
from jaren_jobs.gate import Gate
from jaren_jobs.signals import SignalLike

__all__ = ["PgDatabase", "PgRootScope", "PgTxScope"]

T = TypeVar("T")
# savepoint names, unique per use in this process: a ROLLBACK TO names the most
# recent savepoint of its name, so a shared name could undo a sibling's write
_SAVEPOINTS = itertools.count(1)
_TEXTS_KEPT = 512
# a deferred unit of work whose final statement committed it (see PgDatabase.run)
_ENDED = "\x00ended"
Params = Sequence[Any] | Mapping[str, Any]

# a half-open connection must not hang a worker for hours (SPEC §10)
CONNECT_TIMEOUT_SECONDS = 10
STATEMENT_TIMEOUT_MS = 120_000
# libpq settings of every connection a store opens, unless its URL sets them:
# keepalives notice an idle connection whose peer vanished; tcp_user_timeout
# bounds data sent to a vanished peer and never acknowledged (no keepalive is
# sent meanwhile: without it, the kernel's retransmissions take ~15 minutes)
CONNECT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": CONNECT_TIMEOUT_SECONDS,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


# SQLSTATEs that are a wait, not a failure: the unit of work wrote nothing and runs again
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03"})
TRANSIENT_RETRIES = 8


def is_transient(error: StorageError) -> bool:
    """Whether ``error`` is a serialization failure, a deadlock or a lock timeout."""
    return error.details.get("sqlstate") in TRANSIENT_SQLSTATES


# read from libpq directly: ``conn.info`` builds an object and an enum per read
_IDLE = int(pq.TransactionStatus.IDLE)


def _readable(conn: Any) -> bool:
    try:
        ready, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True  # no socket to poll: not a connection to use
    return bool(ready)


def _unencodable(exc: UnicodeEncodeError, doing: str) -> ValueError:
    return ValueError(f"{doing}: a text given cannot be stored as UTF-8 ({exc.reason})")


def connect_settings(conninfo: str) -> dict[str, Any]:
    """:data:`CONNECT_DEFAULTS` less what ``conninfo`` sets itself: the URL's own win
    (``psycopg.connect``'s keyword arguments override the URL's). A URL psycopg
    cannot parse is left for the connect to refuse."""
    try:
        given = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        given = {}
    return {key: value for key, value in CONNECT_DEFAULTS.items() if key not in given}


class PgDatabase:
    """The store's connections to PostgreSQL: a pool of ``gate.capacity`` (one: the
    application's), each used by one thread at a time, taken and given back
    through the gate."""

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
        if not self.owns and gate.capacity != 1:
            raise ValueError("a store on the application's connection has exactly one")
        self.durability = durability
        self.readonly = readonly
        self.gate = gate
        self.closed = False
        self.forked = False
        self.opened_in = os.getpid()
        self.text_codec = "utf-8"
        self.listener: Any = None  # notify.Listener, for a store opened from a URL
        # while a store opens on an application's connection inside the application's
        # own transaction: the opening's reads run in it, its writes under savepoints
        self.joining = False
        # the schema resolved at open, which every statement of the library names
        # (None until then); and each statement's text qualified with it, made once
        self.schema: str | None = None
        self._texts: dict[str, str] = {}
        # per holder: the BEGIN a unit of work of ours has not sent yet (it goes with
        # the unit's first statement), or _ENDED once its final statement committed it
        self._deferred: dict[int, str] = {}
        self._lock = threading.Lock()
        # the connections no call holds (the last given back is the next handed out:
        # a quiet store keeps using one), those held, by thread, and every one open
        self._idle: list[psycopg.Connection[Any]] = []
        self._held: dict[int, psycopg.Connection[Any]] = {}
        self._open: list[psycopg.Connection[Any]] = []
        first = connection if connection is not None else self._connect("opening")
        self._idle.append(first)
        self._open.append(first)
        if not self.owns:
            self._check_app_connection()
        _OPEN.add(self)

    # ------------------------------------------------------------ the connections

    def _connect(self, doing: str) -> psycopg.Connection[Any]:
        assert self.conninfo is not None
        try:
            conn = psycopg.connect(
                self.conninfo,
                autocommit=True,
                **connect_settings(self.conninfo),
            )
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc
        try:
            # the isolation named here too: a unit of work of one statement runs in
            # autocommit, without a BEGIN to name it (a server's or role's default,
            # SERIALIZABLE say, would turn the fence's waits into serialization failures)
            conn.execute(
                f"SET synchronous_commit = {'on' if self.durability == 'full' else 'off'}; "
                f"SET default_transaction_read_only = {'on' if self.readonly else 'off'}; "
                "SET default_transaction_isolation = 'read committed'; "
                f"SET statement_timeout = {STATEMENT_TIMEOUT_MS}"
            )
        except psycopg.Error as exc:
            conn.close()
            raise storage_error(exc, doing) from exc
        return conn

    def _check_app_connection(self) -> None:
        if self._idle[0].closed:
            raise StorageError("open_store(connection=...): the psycopg connection is closed")

    def _usable(self, conn: psycopg.Connection[Any]) -> bool:
        return not self.owns or not (conn.closed or conn.broken)

    def _closed_while_idle(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether the server ended this idle connection of ours (``idle_session_timeout``,
        a restart, ``pg_terminate_backend``): its socket is readable with no statement in
        flight. One non-blocking poll; such a connection is replaced, never used."""
        if not self.owns:
            return False  # the application's connection: its owner's to look after
        return _readable(conn)

    def _discard(self, conn: psycopg.Connection[Any]) -> None:
        """A broken connection of ours leaves the pool for good."""
        with self._lock:
            if conn in self._open:
                self._open.remove(conn)
        with contextlib.suppress(psycopg.Error):
            conn.close()

    def _idle_connection(self, doing: str) -> psycopg.Connection[Any]:
        """An idle connection that is not known broken, opened if none is (not held)."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                conn = self._connect(doing)
                with self._lock:
                    self._open.append(conn)
                return conn
            if self._usable(conn) and not self._closed_while_idle(conn):
                return conn
            self._discard(conn)

    def take(self, what: str, signal: SignalLike | None = None) -> None:
        """Hold one of the store's connections for this thread, until :meth:`give_back`.

        Waits for a free one in the gate's fair queue, bounded by
        ``gate_timeout_seconds`` (``GateRefused``); raises ``StorageError`` if
        a fresh connection is needed and cannot be opened.
        """
        self.gate.acquire(what, signal)
        try:
            # the call that needs a connection names the failure to open one
            conn = self._idle_connection(f"{what} (connecting)")
        except BaseException:
            self.gate.release()
            raise
        self._held[threading.get_ident()] = conn

    def give_back(self) -> None:
        """The connection this thread holds goes back to the pool (or away, if broken)."""
        conn = self._held.pop(threading.get_ident(), None)
        try:
            if conn is None:
                return
            # a call that failed may have left it mid-transaction: never hand
            # that out (the next call's statements would join it)
            usable = self._usable(conn)
            if self.owns and usable and conn.pgconn.transaction_status != _IDLE:
                with contextlib.suppress(psycopg.Error):
                    conn.execute("ROLLBACK")
                usable = self._usable(conn)
            if usable and not (self.closed and self.owns):
                with self._lock:
                    self._idle.append(conn)
            elif self._usable(conn):
                self._discard(conn)  # given back after close() stopped waiting for it
            else:
                self._discard(conn)
                # what broke it (a server restart, a failover, a network cut) most
                # likely broke the idle ones too, unseen until used: drop them all,
                # so the next calls (a worker's retry of what just failed) get a
                # fresh connection, as the store's one connection did, instead of
                # failing once per dead idle connection
                with self._lock:
                    idle, self._idle = self._idle, []
                for other in idle:
                    self._discard(other)
        finally:
            self.gate.release()

    def own_pids(self) -> frozenset[int]:
        """The server pids of the connections open now (the listener skips their NOTIFYs)."""
        with self._lock:
            return frozenset(c.pgconn.backend_pid for c in self._open if not c.closed)

    @property
    def size(self) -> int:
        """How many connections the store has open now (at most ``gate.capacity``)."""
        with self._lock:
            return len(self._open)

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The connection this thread holds; outside a call, the one handed out next
        (replaced first if the store owns it and it broke) — ``store.connection``."""
        held = self._held.get(threading.get_ident())
        if held is not None:
            return held
        with self._lock:
            idle = self._idle[-1] if self._idle else None
            busy = self._open[-1] if idle is None and self._open else None
        if busy is not None:
            return busy  # every one is held by another thread now: never a new one
        if idle is not None and self._usable(idle):
            return idle
        if idle is not None:
            with self._lock:
                if idle in self._idle:
                    self._idle.remove(idle)
            self._discard(idle)
        fresh = self._idle_connection("store.connection (connecting)")
        with self._lock:
            self._idle.append(fresh)
        return fresh

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

    def _qualified(self, statement: str) -> str:
        schema = self.schema
        if schema is None:
            return statement
        text = self._texts.get(statement)
        if text is None:
            if len(self._texts) > _TEXTS_KEPT:
                self._texts.clear()  # texts made from counts (sweep sizes) stay bounded
            text = self._texts[statement] = sql.qualified(statement, schema)
        return text

    def run(
        self, statement: str, params: Params | None = None, *, doing: str, final: bool = False
    ) -> psycopg.Cursor[Any]:
        """Run ``statement``; ``final``: no other statement follows it in its unit of work.

        Inside :meth:`transaction` on a connection of ours, the BEGIN goes in one round
        trip with the unit's first statement, and the COMMIT with its final one: a
        unit of one final statement runs in autocommit, its own transaction.
        """
        self.check_open(doing)
        deferred = self._deferred
        try:
            conn = self.connection
            text = self._qualified(statement)
            holder = threading.get_ident()
            begin = deferred.get(holder) if deferred else None
            assert begin != _ENDED, "a statement after its unit of work's final one"
            if begin is None or (not begin and not final):
                return conn.execute(text, params)  # not a unit of ours, or its BEGIN went
            deferred[holder] = _ENDED if final else ""  # "": BEGIN sent, the COMMIT owed
            if begin and final:  # the unit's only statement: in autocommit, its own
                return conn.execute(text, params)
            if begin and params is None:  # a script of several statements: not pipelined
                conn.execute(begin)
                return conn.execute(text, params)
            after = "COMMIT" if final else None
            return self._pipelined(conn, begin or None, [(text, params)], after)[0]
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc
        except UnicodeEncodeError as exc:  # every caller checks its text; this is the backstop
            raise _unencodable(exc, doing) from None

    def one(
        self, statement: str, params: Params | None = None, *, doing: str, final: bool = False
    ) -> tuple[Any, ...] | None:
        cursor = self.run(statement, params, doing=doing, final=final)
        try:
            return cursor.fetchone()
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc

    def all(
        self, statement: str, params: Params | None = None, *, doing: str, final: bool = False
    ) -> list[tuple[Any, ...]]:
        cursor = self.run(statement, params, doing=doing, final=final)
        try:
            return cursor.fetchall()
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc

    def changes(
        self, statement: str, params: Params | None = None, *, doing: str, final: bool = False
    ) -> int:
        return int(self.run(statement, params, doing=doing, final=final).rowcount)

    def together(
        self, statements: Sequence[tuple[str, Params]], *, doing: str
    ) -> list[list[tuple[Any, ...]]] | None:
        """``statements`` as the whole unit of work, in ONE round trip (its BEGIN, each of
        them, its COMMIT in one pipeline): each one's rows. None when the unit is not
        one of ours that has sent nothing yet: the caller runs them one by one."""
        deferred = self._deferred
        holder = threading.get_ident()
        begin = deferred.get(holder) if deferred else None
        if not begin or begin == _ENDED:
            return None
        self.check_open(doing)
        deferred[holder] = _ENDED
        try:
            conn = self.connection
            sent = [(self._qualified(statement), params) for statement, params in statements]
            cursors = self._pipelined(conn, begin, sent, "COMMIT")
            return [cursor.fetchall() for cursor in cursors]
        except psycopg.Error as exc:
            raise storage_error(exc, doing) from exc
        except UnicodeEncodeError as exc:  # as in run()
            raise _unencodable(exc, doing) from None

    def _pipelined(
        self,
        conn: psycopg.Connection[Any],
        before: str | None,
        statements: Sequence[tuple[str, Params | None]],
        after: str | None,
    ) -> list[psycopg.Cursor[Any]]:
        """``statements`` between ``before`` and ``after`` (BEGIN, COMMIT), one round trip."""
        with conn.pipeline():
            if before is not None:
                conn.execute(before)
            cursors = [conn.execute(statement, params) for statement, params in statements]
            if after is not None:
                conn.execute(after)
        return cursors

    @property
    def status(self) -> pq.TransactionStatus:
        return self.connection.info.transaction_status

    @property
    def in_transaction(self) -> bool:
        return self.status != pq.TransactionStatus.IDLE

    def begin(self, *, doing: str, read_only: bool = False, deferred: bool = False) -> None:
        """Open a transaction of the library's own on the connection; ``deferred``: on a
        connection of ours, its BEGIN goes with the unit's first statement (:meth:`run`)."""
        conn = self.connection
        if conn.pgconn.transaction_status != _IDLE:
            raise StorageError(
                f"{doing}: the connection has an open transaction that jaren_jobs did not "
                "start; commit it first",
                doing=doing,
            )
        # the isolation always named: a server's or role's default (SERIALIZABLE, say)
        # would turn the fence's ordinary waits into serialization failures
        begin = (
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
            if read_only
            else "BEGIN ISOLATION LEVEL READ COMMITTED"
        )
        if deferred and self.owns and conn.autocommit:
            self._deferred[threading.get_ident()] = begin
            return
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
            else:
                conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            for option in options:
                conn.execute(option)
        except psycopg.Error as exc:
            self.rollback_quietly()
            raise storage_error(exc, doing) from exc

    def commit(self, *, doing: str) -> None:
        if self._deferred:
            state = self._deferred.pop(threading.get_ident(), None)
            if state:
                return  # no statement sent, or the final one committed it: nothing owed
        try:
            conn = self.connection
            if conn.autocommit:
                conn.execute("COMMIT")
            else:
                conn.commit()
        except psycopg.Error as exc:
            self.rollback_quietly()
            raise storage_error(exc, doing) from exc

    def rollback_quietly(self) -> None:
        if self._deferred:
            self._deferred.pop(threading.get_ident(), None)
        conn = self.connection
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
        """``fn`` in a transaction of the library's own, committed; rolled back on error.

        A serialization failure, a deadlock or a lock timeout is a wait, not a
        failure: the whole unit of work runs again (it wrote nothing), a bounded
        number of times. A connection the server closed while it sat idle is
        replaced before the first statement (``_idle_connection``).
        """
        if self.joining:
            return fn() if read_only else self.savepoint(fn, doing=doing)
        retries = 0
        while True:
            self.begin(doing=doing, read_only=read_only, deferred=True)
            try:
                result = fn()
                self.commit(doing=doing)
            except StorageError as exc:
                self.rollback_quietly()
                if is_transient(exc) and retries < TRANSIENT_RETRIES:
                    retries += 1
                    continue
                raise
            except BaseException:
                self.rollback_quietly()
                raise
            return result

    def snapshot(self, fn: Callable[[], T], *, doing: str) -> T:
        return self.transaction(fn, doing=doing, read_only=True)

    def before_read(self, what: str) -> None:
        if self.owns and self.in_transaction:
            self.rollback_quietly()  # a connection left mid-transaction by a failure

    def after_read(self) -> None:
        self.end_read()

    def savepoint(self, fn: Callable[[], T], *, doing: str) -> T:
        name = f"jaren_jobs_{next(_SAVEPOINTS)}"
        self.run(sql.savepoint(name), doing=doing)
        try:
            result = fn()
        except BaseException:
            try:
                self.run(sql.rollback_to_savepoint(name), doing=doing)
                self.run(sql.release_savepoint(name), doing=doing)
            except StorageError:
                pass  # the transaction itself is over: its owner hears of it
            raise
        self.run(sql.release_savepoint(name), doing=doing)
        return result

    def end_read(self) -> None:
        """After a read outside any transaction of ours: end the implicit one psycopg opened
        on a connection that is not in autocommit (never leave it idle in transaction)."""
        conn = self.connection
        idle_in_transaction = pq.TransactionStatus.INTRANS
        if not conn.autocommit and not conn.closed:  # noqa: SIM102 - read in two steps
            if conn.info.transaction_status == idle_in_transaction:
                with contextlib.suppress(psycopg.Error):
                    conn.rollback()

    def close(self) -> None:
        """Close every connection the store opened (the application's stays open)."""
        if self.closed:
            return
        self.closed = True
        if not self.owns:
            self.rollback_quietly()
            return
        with self._lock:
            connections, self._open, self._idle = self._open, [], []
        failure: psycopg.Error | None = None
        for conn in connections:
            try:
                conn.close()
            except psycopg.Error as exc:
                failure = failure or exc
        if failure is not None:
            raise storage_error(failure, "closing the database") from failure


# every PgDatabase of this process, for the fork hook (weak: a closed store leaves)
_OPEN: weakref.WeakSet[PgDatabase] = weakref.WeakSet()


def _after_fork() -> None:
    for db in list(_OPEN):
        db.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
