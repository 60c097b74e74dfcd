"""Opening a SQLite database: connect (or adopt), configure, create or check the tables.

A module of its own so that the connection (``connection.py``) and the schema
(``schema.py``, which runs on a connection) need not import each other.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from jaren_jobs.backends.sqlite import queries as sql
from jaren_jobs.backends.sqlite.connection import Database
from jaren_jobs.backends.sqlite.errors import storage_error
from jaren_jobs.backends.sqlite.schema import ensure_schema, require_schema
from jaren_jobs.errors import StorageError
from jaren_jobs.gate import Gate

__all__ = ["copy_database", "open_database"]


def open_database(
    path: str | os.PathLike[str] | None,
    connection: object,
    *,
    durability: str,
    readonly: bool,
    busy_ms: int,
    gate: Gate,
) -> tuple[Database, str | None]:
    """Open (or adopt) the connection, configure it, and create or check the tables.

    Answers the database and the path it was opened on (``None`` for an
    application's connection). A connection this opened is closed again if
    anything after the open fails.
    """
    busy = busy_ms / 1000
    memory = False
    shown_path: str | None = None
    if connection is not None:
        if not isinstance(connection, sqlite3.Connection):
            raise TypeError(
                f"connection must be a sqlite3.Connection, got {type(connection).__name__}"
            )
        conn = connection
        owns = False
    else:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or path-like, got {type(path).__name__}")
        shown_path = os.fspath(path)
        if shown_path == "":
            raise ValueError("path must name a database file (or ':memory:')")
        memory = shown_path == ":memory:"
        if memory and readonly:
            raise ValueError("a read-only store needs a database file, not ':memory:'")
        try:
            if readonly:
                if not Path(shown_path).exists():
                    raise StorageError(
                        f"cannot open {shown_path!r} read-only: no such file",
                        path=shown_path,
                    )
                uri = Path(shown_path).resolve().as_uri() + "?mode=ro"
                conn = sqlite3.connect(
                    uri, uri=True, timeout=busy, isolation_level=None, check_same_thread=False
                )
            else:
                conn = sqlite3.connect(
                    shown_path, timeout=busy, isolation_level=None, check_same_thread=False
                )
        except sqlite3.Error as exc:
            raise storage_error(exc, f"opening {shown_path!r}") from exc
        owns = True

    db = Database(conn, owns=owns, gate=gate)
    db.joining = not owns and conn.in_transaction
    try:
        _configure(
            db, durability=durability, busy_ms=busy_ms, readonly=readonly, memory=memory, owns=owns
        )
        if readonly:
            require_schema(db)
        else:
            ensure_schema(db)
            db.restore_busy("opening the store")  # creating the tables may have left it at 0
    except BaseException:
        if owns:
            conn.close()
        raise
    finally:
        db.joining = False
    return db, shown_path


def _configure(
    db: Database, *, durability: str, busy_ms: int, readonly: bool, memory: bool, owns: bool
) -> None:
    what = "configuring the connection"
    db.run(sql.pragma_busy_timeout(busy_ms), doing=what)
    db.busy_ms = busy_ms
    db.read_encoding(what)
    if db.joining:
        # inside the application's transaction SQLite changes neither the journal mode
        # nor synchronous: the application's own settings stay (the next open sets them)
        return
    if not memory and not readonly:
        row = db.one(sql.READ_JOURNAL_MODE, doing=what)
        mode = None if row is None else str(row[0]).lower()
        if mode not in ("wal", "memory"):
            row = db.one(sql.SET_WAL, doing=what)
            mode = None if row is None else str(row[0]).lower()
        # In WAL mode nothing inside an immediate transaction waits on a lock,
        # so writes may leave busy_timeout at 0 between calls (Database.begin).
        # Not on an application's connection: its own statements, outside the
        # store, keep the busy_timeout it was given.
        db.lazy_busy = owns and mode == "wal"
    db.run(sql.pragma_synchronous(durability), doing=what)


def copy_database(path: str, target_path: str) -> None:
    """Copy a database file through a read-only connection (SQLite's online backup).

    The source is never written; a failure is :class:`StorageError`.
    """
    try:
        source = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
        try:
            target = sqlite3.connect(target_path)
            try:
                source.backup(target)
            finally:
                target.close()
        finally:
            source.close()
    except sqlite3.Error as exc:
        raise storage_error(exc, f"copying {path!r}") from exc
