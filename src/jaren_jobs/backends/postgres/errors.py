"""The one place psycopg's errors become :class:`~jaren_jobs.StorageError`."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from jaren_jobs.errors import StorageError

__all__ = ["storage_error", "translating"]


def storage_error(exc: BaseException, doing: str) -> StorageError:
    """Translate a driver failure into :class:`StorageError` (raise it ``from exc``)."""
    name = type(exc).__name__
    sqlstate = getattr(exc, "sqlstate", None)
    text = str(exc).strip() or name
    hint = ""
    if sqlstate in {"40001", "40P01"}:
        hint = " — a conflict with a concurrent transaction; the store retries its own work"
    elif sqlstate == "55P03":
        hint = " — a lock wait ran past lock_timeout; the store retries its own work"
    elif isinstance(exc, psycopg.OperationalError) and (
        sqlstate is None or sqlstate.startswith(("08", "57P"))
    ):
        hint = (
            " — the connection to PostgreSQL failed or was lost; a store opened from a URL "
            "reconnects on its next call"
        )
    elif sqlstate == "25006":
        hint = " — the store or the database is read-only"
    elif sqlstate == "57014":
        hint = " — the statement ran past the store's statement timeout"
    details: dict[str, object] = {"doing": doing, "pg_error": name}
    if sqlstate:
        details["sqlstate"] = sqlstate
    return StorageError(f"{doing} failed: {text} ({name}){hint}", **details)


def translating(doing: str) -> Callable[[Exception], BaseException]:
    """A cursor's ``wrap``: a psycopg error becomes ``StorageError``, others pass."""

    def wrap(exc: Exception) -> BaseException:
        if isinstance(exc, psycopg.Error):
            return storage_error(exc, doing)
        return exc

    return wrap
