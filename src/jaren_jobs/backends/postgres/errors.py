"""The one place ``psycopg`` errors become :class:`~jaren_jobs.StorageError`.

Every statement, connect, commit and rollback of this backend runs inside
:func:`translating`, so no psycopg exception reaches a user: a unique
violation on a job id is :class:`DuplicateJob`, every other driver failure
:class:`StorageError` with the driver's exception as ``__cause__``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg_errors

from jaren_jobs.errors import DuplicateJob, JobsError, StorageError

__all__ = ["is_gone", "storage_error", "translating"]

_JOBS_PKEY = "_jaren_jobs_pkey"


def is_gone(exc: BaseException) -> bool:
    """Whether a failure says the server (or the connection to it) went away."""
    return isinstance(exc, psycopg.OperationalError) or isinstance(
        exc, (pg_errors.AdminShutdown, pg_errors.CrashShutdown, pg_errors.CannotConnectNow)
    )


def storage_error(exc: BaseException, doing: str) -> JobsError:
    """Translate a driver failure (raise the answer ``from exc``)."""
    diag = getattr(exc, "diag", None)
    constraint = getattr(diag, "constraint_name", None)
    if isinstance(exc, pg_errors.UniqueViolation) and constraint == _JOBS_PKEY:
        return DuplicateJob(
            f"{doing}: a job with that id already exists; ids are unique for a job's whole "
            "life (until it is swept)",
        )
    sqlstate = getattr(exc, "sqlstate", None) or ""
    name = type(exc).__name__
    text = str(exc).strip() or name
    hint = ""
    if is_gone(exc):
        hint = (
            " — the connection to the PostgreSQL server failed or was lost; the call may "
            "not have happened: check before repeating it (the store reconnects on its own)"
        )
    elif isinstance(exc, pg_errors.ReadOnlySqlTransaction):
        hint = " — the store (or the server) is read-only"
    elif isinstance(exc, pg_errors.QueryCanceled):
        hint = " — the statement ran past statement_timeout"
    elif isinstance(exc, pg_errors.InFailedSqlTransaction):
        hint = " — an earlier statement of this transaction failed; it must be rolled back"
    return StorageError(
        f"{doing} failed: {text} ({name}{', SQLSTATE ' + sqlstate if sqlstate else ''}){hint}",
        postgres_error=name,
        sqlstate=sqlstate or None,
        doing=doing,
    )


@contextmanager
def translating(doing: str) -> Iterator[None]:
    """Inside: a psycopg error becomes :func:`storage_error`'s answer."""
    try:
        yield
    except psycopg.Error as exc:
        raise storage_error(exc, doing) from exc
