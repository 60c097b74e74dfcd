"""The application's own SQL inside ``store.transaction()``, handed to ``sqlite3`` as it is."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from jaren_jobs.errors import StorageError

from .connection import Database
from .errors import storage_error

__all__ = ["Rows", "run_app_statement"]

AppParams = Sequence[Any] | Mapping[str, Any]


class _Explains(Protocol):
    """The transaction a failure happened in: it says whether SQLite ended it."""

    def explain(self, error: StorageError) -> StorageError: ...


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


class Rows:
    """The result of ``tx.execute``: a cursor whose driver errors are translated."""

    def __init__(self, cursor: sqlite3.Cursor, doing: str, transaction: _Explains) -> None:
        self._cursor = cursor
        self._doing = doing
        self._transaction = transaction

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except sqlite3.Error as exc:
            # a row's step can fail and roll back the transaction too (a trigger)
            raise self._transaction.explain(storage_error(exc, self._doing)) from exc

    def fetchone(self) -> Any:
        return self._call(self._cursor.fetchone)

    def fetchall(self) -> list[Any]:
        return list(self._call(self._cursor.fetchall))

    def fetchmany(self, size: int = 1) -> list[Any]:
        return list(self._call(lambda: self._cursor.fetchmany(size)))

    def __iter__(self) -> Iterator[Any]:
        while True:
            row = self.fetchone()
            if row is None:
                return
            yield row

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._cursor.lastrowid

    @property
    def description(self) -> Any:
        return self._cursor.description
