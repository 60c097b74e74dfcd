"""A statement's result read whole: ``Rows`` whose reads touch no driver.

The asyncio API hands these to the application: a transaction's rows are read
where the statement ran (its lane's thread, or awaited on an
``AsyncConnection``), so reading them never blocks the loop or awaits.
"""

from __future__ import annotations

from typing import Any

from jaren_jobs.backend import Rows

__all__ = ["Fetched"]


class Fetched(Rows):
    """The rows of one statement, fetched already, with its rowcount and description."""

    def __init__(
        self, rows: list[Any], rowcount: int, lastrowid: int | None, description: Any
    ) -> None:
        self._rows = rows
        self._rowcount = rowcount
        self._lastrowid = lastrowid
        self._description = description
        self._at = 0

    @classmethod
    def of(cls, rows: Rows) -> Fetched:
        """Read a driver's result whole (on the thread that ran it)."""
        everything = rows.fetchall() if rows.description is not None else []
        return cls(everything, rows.rowcount, rows.lastrowid, rows.description)

    def fetchone(self) -> Any:
        if self._at >= len(self._rows):
            return None
        self._at += 1
        return self._rows[self._at - 1]

    def fetchall(self) -> list[Any]:
        rest, self._at = self._rows[self._at :], len(self._rows)
        return rest

    def fetchmany(self, size: int = 1) -> list[Any]:
        part = self._rows[self._at : self._at + size]
        self._at += len(part)
        return part

    @property
    def rowcount(self) -> int:
        return self._rowcount

    @property
    def lastrowid(self) -> int | None:
        return self._lastrowid

    @property
    def description(self) -> Any:
        return self._description
