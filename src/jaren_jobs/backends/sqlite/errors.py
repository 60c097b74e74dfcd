"""The one place ``sqlite3`` errors become :class:`~jaren_jobs.StorageError`."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from jaren_jobs.errors import StorageError

__all__ = ["is_not_a_database", "storage_error", "translating"]


def storage_error(exc: BaseException, doing: str) -> StorageError:
    """Translate a driver failure into :class:`StorageError` (raise it ``from exc``)."""
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    hint = ""
    text = str(exc)
    lowered = text.lower()
    if "locked" in lowered or "busy" in lowered:
        hint = (
            " — another connection held the write lock past busy_timeout; retry, "
            "or raise busy_timeout_seconds"
        )
    elif "readonly" in lowered or "read-only" in lowered:
        hint = " — the database (or its directory) is read-only"
    elif "full" in lowered:
        hint = " — the disk or the database's page limit is full; free space and retry"
    elif isinstance(exc, sqlite3.ProgrammingError) and "thread" in lowered:
        hint = " — a connection handed to open_store() must be created with check_same_thread=False"
    return StorageError(f"{doing} failed: {text} ({name}){hint}", sqlite_error=name, doing=doing)


def is_not_a_database(exc: BaseException) -> bool:
    """Whether a failure says the file is not an SQLite database at all."""
    return isinstance(exc, sqlite3.DatabaseError) and "not a database" in str(exc)


def translating(doing: str) -> Callable[[Exception], BaseException]:
    """A cursor's ``wrap``: an ``sqlite3`` error becomes ``StorageError``, others pass."""

    def wrap(exc: Exception) -> BaseException:
        if isinstance(exc, sqlite3.Error):
            return storage_error(exc, doing)
        return exc

    return wrap
