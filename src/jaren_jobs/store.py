"""Opening a store: the public entry point (SPEC §1)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Literal

from jaren_jobs.backend import Rows, StoreBackend
from jaren_jobs.backends.sqlite.connection import Connection
from jaren_jobs.backends.sqlite.opening import open_database
from jaren_jobs.backends.sqlite.store import SqliteBackend
from jaren_jobs.engine.engine import EngineHub
from jaren_jobs.errors import (
    GateRefused,
    JobsError,
)
from jaren_jobs.gate import Gate
from jaren_jobs.jobs import Jobs
from jaren_jobs.records import StopOutcome
from jaren_jobs.runtime import Defaults, Runtime, check_seconds, resolve_defaults, resolve_runtime
from jaren_jobs.transaction import _SAVEPOINTS, _USE_ASYNC, Transaction, current_task

__all__ = ["Jobs", "Rows", "Store", "Transaction", "open_store"]

Durability = Literal["full", "normal"]

_MAX_BUSY_MS = 2**31 - 1
# a PostgreSQL URL store's connections unless pool_size says: enough for a
# worker's few threads and a web process's requests at once, few enough that
# many processes stay far below the server's max_connections
DEFAULT_POOL_SIZE = 4
# more than this is a typo, not a pool: each one is a server process
_MAX_POOL_SIZE = 1000


class Store:
    """An open job store over one database. Use :func:`open_store`."""

    def __init__(
        self,
        backend: StoreBackend,
        hub: EngineHub,
        *,
        path: str | None,
        readonly: bool,
        durability: Durability,
    ) -> None:
        self._backend = backend
        self._hub = hub
        self.path = path
        self.readonly = readonly
        self.durability = durability
        # each thread's open store.transaction() and its savepoints: on a pooled
        # store, several threads' transactions are open at once
        self._stacks = threading.local()
        self._close_lock = threading.Lock()
        self.jobs = Jobs(backend.root_session(hub.runtime), hub)

    # ------------------------------------------------------------ lifecycle

    @property
    def backend(self) -> str:
        """Which database the store is on: ``"sqlite"`` or ``"postgres"``."""
        return self._backend.name

    @property
    def closed(self) -> bool:
        return self._backend.closed

    @property
    def runtime(self) -> Any:
        return self._hub.runtime

    @property
    def defaults(self) -> Defaults:
        return self._hub.defaults

    @property
    def connection(self) -> Any:
        """The underlying connection (use it only inside ``store.transaction()``).

        On SQLite its ``busy_timeout`` is the store's, as configured, when it
        is handed out (unless another thread is using the store at that moment).
        On a store with a pool (PostgreSQL from a URL) it is the connection the
        calling thread's transaction holds; outside one, the connection the
        next call would take.
        """
        return self._backend.connection()

    def close(self, *, grace_seconds: float | None = None) -> list[StopOutcome]:
        """Stop every worker of this store (bounded), then close.

        Returns each worker's :class:`StopOutcome`, so what could not be
        drained is reported rather than waited out. Idempotent. In a child
        of ``os.fork()`` it does nothing: the connection and the workers are
        the parent's (and a lock may have been copied held).
        """
        backend = self._backend
        if backend.forked:
            return []
        with self._close_lock:
            if backend.closed:
                return []
            if backend.in_my_transaction():
                raise GateRefused(
                    "close() was called inside this store's transaction; finish it first",
                    reason="reentrant",
                )
            outcomes: list[StopOutcome] = []
            with self._hub.lock:
                workers = list(self._hub.workers)
            for worker in workers:
                outcomes.append(worker.stop(grace_seconds))
            backend.close()
            return outcomes

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<jaren_jobs.Store {self.path or '(connection)'} {state}>"

    # ------------------------------------------------------------ transactions

    @property
    def _stack(self) -> list[Transaction]:
        """The calling thread's open transactions, outermost first."""
        stack: list[Transaction] | None = getattr(self._stacks, "stack", None)
        if stack is None:
            stack = self._stacks.stack = []
        return stack

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """One transaction of the database (SQLite: ``BEGIN IMMEDIATE … COMMIT``
        holding the gate); rollback on exception.

        Nested inside a transaction of the same thread it is a savepoint. On a
        store with a pool (PostgreSQL from a URL), each thread's transaction
        holds a connection of its own until it ends, and runs beside the others.
        """
        what = "store.transaction()"
        backend = self._backend
        backend.check_open(what)
        stack = self._stack
        if stack and backend.in_my_transaction():
            if stack[0]._task is not current_task():
                # another task of this thread's event loop holds the transaction:
                # a savepoint inside it would share that task's fate (and commit)
                raise GateRefused(
                    f"{what}: another asyncio task on this thread holds the store's "
                    f"transaction — {_USE_ASYNC}",
                    reason="task",
                )
            yield from self._nested(what)
            return
        handle = backend.begin(what)
        callbacks: list[Callable[[], None]] = []
        try:
            tx = Transaction(self, handle, self._hub, depth=0)
            stack.append(tx)
            try:
                yield tx
            except BaseException:
                stack.pop()
                tx._end()
                handle.rollback_quietly()
                raise
            stack.pop()
            callbacks = tx._end()
            if tx.rolled_back():
                # the block caught the failure and ended normally: never a
                # COMMIT of whatever ran since, nor a silent success
                callbacks = []
                handle.rollback_quietly()
                raise tx._aborted(what)
            try:
                handle.commit(what)
            except JobsError:
                callbacks = []
                handle.rollback_quietly()
                raise
        finally:
            handle.release()
        for callback in callbacks:
            callback()

    @contextmanager
    def join_transaction(
        self, *, on_commit: Callable[[Callable[[], None]], Any]
    ) -> Iterator[Transaction]:
        """Join the transaction the application has open on the store's connection.

        For a store on the application's own connection (``open_store(connection=...)``)
        while the application holds a transaction open on it (Django's ``atomic()``,
        SQLAlchemy's ``Session``): ``tx.jobs`` and ``tx.execute`` run inside it, under
        a savepoint of a unique name, and the library never sends BEGIN, COMMIT or
        ROLLBACK of its own — a job enqueued here exists if and only if the
        application commits. An exception out of the block undoes what the block
        wrote (the savepoint) and leaves the application's transaction open.
        Wake-ups for this process's workers are handed to ``on_commit`` (Django's
        ``transaction.on_commit``; SQLAlchemy's ``after_commit`` event), which must
        call them once the outer transaction commits and never on rollback; a
        PostgreSQL ``NOTIFY`` is delivered by the server with that commit.
        With no transaction open on the connection it is a ``StorageError``.
        """
        what = "store.join_transaction()"
        if not callable(on_commit):
            raise TypeError(f"on_commit must be callable, got {type(on_commit).__name__}")
        backend = self._backend
        backend.check_open(what)
        stack = self._stack
        if stack and backend.in_my_transaction():
            raise GateRefused(
                f"{what}: this thread is inside the store's own transaction already; "
                "use its tx.jobs",
                reason="reentrant",
            )
        handle = backend.join(what)
        callbacks: list[Callable[[], None]] = []
        try:
            name = f"jaren_jobs_tx_{next(_SAVEPOINTS)}"
            handle.savepoint(name, what)
            tx = Transaction(self, handle, self._hub, depth=0)
            stack.append(tx)
            try:
                yield tx
            except BaseException:
                stack.pop()
                tx._end()
                try:
                    handle.rollback_to_savepoint(name, what)
                    handle.release_savepoint(name, what)
                except JobsError:
                    pass  # the application's rollback undoes it anyway
                raise
            stack.pop()
            callbacks = tx._end()
            if tx.rolled_back():
                raise tx._aborted(what)
            handle.release_savepoint(name, what)
        finally:
            handle.release()
        for callback in callbacks:
            on_commit(callback)

    def _nested(self, what: str) -> Iterator[Transaction]:
        stack = self._stack
        parent = stack[-1]
        parent.check_active(what)
        handle = parent._handle
        # unique per use, never by depth: two blocks at one depth must not share a name
        name = f"jaren_jobs_tx_{next(_SAVEPOINTS)}"
        tx = Transaction(self, handle, self._hub, len(stack), parent._outermost)
        handle.savepoint(name, what)
        stack.append(tx)
        try:
            yield tx
        except BaseException:
            stack.pop()
            tx._end()
            try:
                handle.rollback_to_savepoint(name, what)
                handle.release_savepoint(name, what)
            except JobsError:
                pass  # the outer rollback undoes it anyway
            raise
        stack.pop()
        callbacks = tx._end()
        if tx.rolled_back():
            raise tx._aborted(what)  # the savepoint went with the whole transaction
        for callback in callbacks:
            parent.after_commit(callback)
        handle.release_savepoint(name, what)


def open_store(
    path: str | os.PathLike[str] | None = None,
    *,
    connection: Connection | None = None,
    durability: Durability = "full",
    readonly: bool = False,
    busy_timeout_seconds: float = 5.0,
    gate_timeout_seconds: float = 30.0,
    runtime: Runtime | None = None,
    defaults: Defaults | Mapping[str, Any] | None = None,
    pool_size: int | None = None,
) -> Store:
    """Open a job store on a database file (created if missing) or on the app's connection.

    Sets WAL (not for ``:memory:``), ``busy_timeout``, and ``synchronous`` =
    FULL (``durability="full"``: an acknowledged enqueue survives power loss)
    or NORMAL (survives a process crash). Creates or upgrades the tables; a
    read-only store creates nothing and refuses with :class:`SchemaError` if
    they are missing.

    A store opened from a PostgreSQL URL keeps a pool of at most ``pool_size``
    connections (default 4), opened as calls need them: that many threads'
    calls and transactions run at once, each on a connection of its own, and
    a call that waits for one longer than ``gate_timeout_seconds`` is
    :class:`GateRefused`. Every other store has exactly one connection
    (``pool_size`` None or 1).
    """
    if (path is None) == (connection is None):
        raise TypeError("open_store() takes exactly one of path or connection")
    if durability not in ("full", "normal"):
        raise ValueError(f"durability must be 'full' or 'normal', got {durability!r}")
    if not isinstance(readonly, bool):
        raise TypeError(f"readonly must be a bool, got {type(readonly).__name__}")
    busy = check_seconds(busy_timeout_seconds, "busy_timeout_seconds", allow_zero=True)
    if round(busy * 1000) > _MAX_BUSY_MS:
        # SQLite keeps it as a C int of milliseconds: more would wrap to "never wait"
        raise ValueError(
            f"busy_timeout_seconds must be at most {_MAX_BUSY_MS / 1000} (about 24.8 days: "
            f"SQLite holds it in milliseconds in a C int), got {busy_timeout_seconds!r}"
        )
    gate_timeout = check_seconds(gate_timeout_seconds, "gate_timeout_seconds", allow_zero=True)
    pooled = connection is None and _is_postgres(path, connection)
    places = _check_pool_size(pool_size, pooled)
    resolved_runtime = resolve_runtime(runtime)
    resolved_defaults = resolve_defaults(defaults)

    backend: StoreBackend
    if _is_postgres(path, connection):
        open_postgres = _postgres()
        backend, shown_path = open_postgres(
            None if path is None else os.fspath(path),
            connection,
            durability=durability,
            readonly=readonly,
            gate=Gate(gate_timeout, capacity=places),
        )
    else:
        db, shown_path = open_database(
            path,
            connection,
            durability=durability,
            readonly=readonly,
            busy_ms=round(busy * 1000),
            gate=Gate(gate_timeout),
        )
        backend = SqliteBackend(db)
    hub = EngineHub(runtime=resolved_runtime, defaults=resolved_defaults)
    return Store(backend, hub, path=shown_path, readonly=readonly, durability=durability)


def _check_pool_size(pool_size: object, pooled: bool) -> int:
    """How many connections the store may hold: ``pool_size`` checked (SPEC §10)."""
    if pool_size is None:
        return DEFAULT_POOL_SIZE if pooled else 1
    if isinstance(pool_size, bool) or not isinstance(pool_size, int):
        raise TypeError(f"pool_size must be an int, got {type(pool_size).__name__}")
    if not 1 <= pool_size <= _MAX_POOL_SIZE:
        raise ValueError(f"pool_size must be between 1 and {_MAX_POOL_SIZE}, got {pool_size}")
    if not pooled and pool_size != 1:
        raise ValueError(
            f"pool_size={pool_size}: only a store opened from a PostgreSQL URL has a pool; "
            "an SQLite store and a store on the application's connection have exactly one "
            "connection"
        )
    return pool_size


def _is_postgres(path: object, connection: object) -> bool:
    """A ``postgresql://`` / ``postgres://`` URL, or a psycopg connection (SPEC §10)."""
    if connection is not None:
        return type(connection).__module__.split(".")[0] == "psycopg"
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        return isinstance(text, str) and text.startswith(("postgresql://", "postgres://"))
    return False


def _postgres() -> Any:
    """The PostgreSQL backend, imported only when a store asks for it."""
    try:
        from jaren_jobs.backends.postgres.store import open_postgres  # noqa: PLC0415 - optional extra
    except ImportError as exc:
        if getattr(exc, "name", None) in ("psycopg", "psycopg.pq") or "psycopg" in str(exc):
            raise ImportError(
                "PostgreSQL needs psycopg 3: pip install 'jaren_jobs[postgres]'",
                name="psycopg",
            ) from exc
        raise
    return open_postgres
