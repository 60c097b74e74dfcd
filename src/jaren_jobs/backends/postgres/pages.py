"""``store.jobs.page()`` on PostgreSQL: a keyset cursor by id, one seek per pull.

As on SQLite, each pull reads the committed state of its moment and holds
nothing between pulls (no statement, no snapshot, no connection): a root
page borrows a pooled connection per pull, ``tx.jobs.page()`` reads inside
its transaction and sees its uncommitted rows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import psycopg

from jaren_jobs.backends.sqlite.pages import _check_filters
from jaren_jobs.cursor import Admit, Cursor
from jaren_jobs.records import Job
from jaren_jobs.rows import job_from_row
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike, check_deadline_arg, check_signal_arg

from . import queries as sql
from .connection import Database, RootScope, TxScope
from .errors import storage_error

__all__ = ["page_jobs"]

T = TypeVar("T")


class _KeysetRows:
    def __init__(
        self,
        db: Database,
        run: Callable[[Callable[[], Any]], Any],
        statement: str,
        params: dict[str, Any],
        after: str,
        limit: int,
    ) -> None:
        self._db = db
        self._run = run
        self._statement = statement
        self._params = params
        self._last = after
        self._left = limit

    def __iter__(self) -> _KeysetRows:
        return self

    def __next__(self) -> tuple[Any, ...]:
        if self._left <= 0:
            raise StopIteration
        params = {**self._params, "after": self._last, "limit": 1}
        row = self._run(lambda: self._db.one(self._statement, params, doing="page()"))
        if row is None:
            self._left = 0
            raise StopIteration
        self._last = row[0]
        self._left -= 1
        return tuple(row)

    def close(self) -> None:
        pass


def _translate(exc: Exception) -> BaseException:
    if isinstance(exc, psycopg.Error):
        return storage_error(exc, "page()")
    return exc


def page_jobs(
    db: Database,
    scope: RootScope | TxScope,
    runtime: ResolvedRuntime,
    *,
    state: str | None,
    kind: str | None,
    after: str | None,
    limit: int,
    signal: SignalLike | None,
    deadline: datetime | None,
) -> Cursor[Job]:
    """SQLite's ``page_jobs`` contract, over PostgreSQL (filters checked the same way)."""
    what = "page()"
    state_, kind_, after_, limit_ = _check_filters(state, kind, after, limit, what)
    sig = check_signal_arg(signal, what)
    dl = check_deadline_arg(deadline, what)
    db.check_open(what)
    statement = sql.page_jobs(state_ is not None, kind_ is not None)
    params: dict[str, Any] = {}
    if state_ is not None:
        params["state"] = state_
    if kind_ is not None:
        params["kind"] = kind_

    admit: Admit | None
    run: Callable[[Callable[[], Any]], Any]
    if isinstance(scope, RootScope):
        admit = scope.read  # a pooled connection per pull, bound while it reads

        def run(fn: Callable[[], Any]) -> Any:
            return fn()
    else:
        admit = None

        def run(fn: Callable[[], Any]) -> Any:
            return scope.read(fn, what)

    return Cursor(
        open_rows=lambda: _KeysetRows(db, run, statement, params, after_, limit_),
        map_row=job_from_row,
        wrap=_translate,
        signal=sig,
        deadline=dl,
        now=runtime.now,
        admit=admit,
        what=what,
    )
