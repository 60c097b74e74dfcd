"""The application's own SQL inside ``store.transaction()``, handed to ``sqlite3`` as it is."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from jaren_jobs.backend import AppParams
from jaren_jobs.backends.sqlite.connection import Database
from jaren_jobs.backends.sqlite.errors import storage_error

__all__ = ["run_app_statement"]


def run_app_statement(
    db: Database,
    statement: str,
    parameters: AppParams | Iterable[AppParams],
    *,
    many: bool,
    doing: str,
) -> sqlite3.Cursor:
    """Execute the application's statement (``?`` placeholders); errors become StorageError."""
    try:
        if many:
            return db.connection.executemany(statement, parameters)
        return db.connection.execute(statement, parameters)  # type: ignore[arg-type]
    except sqlite3.Error as exc:
        raise storage_error(exc, doing) from exc
