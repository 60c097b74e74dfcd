"""``page()`` on PostgreSQL: the same keyset cursor by id as SQLite's (SPEC §5).

Each pull seeks the next row past the last one afresh (``id > last``), under
the store's gate per pull for a root cursor, so a paused consumer holds no
connection and no transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from jaren_jobs.backend import Scope
from jaren_jobs.core.commands import check_page_filters, check_page_queue
from jaren_jobs.cursor import Admit, Cursor
from jaren_jobs.records import Job
from jaren_jobs.rows import job_from_row
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike, check_deadline_arg, check_signal_arg

from . import queries as sql
from .connection import PgDatabase
from .errors import translating

__all__ = ["page_jobs"]


class _KeysetRows:
    """Job rows by id past ``after``; each ``next()`` seeks the next one afresh."""

    def __init__(
        self,
        db: PgDatabase,
        *,
        statement: str,
        params: dict[str, Any],
        after: str,
        limit: int,
        check: Callable[[], object] | None,
    ) -> None:
        self._db = db
        self._statement = statement
        self._params = params
        self._last = after
        self._left = limit
        self._check = check

    def __iter__(self) -> _KeysetRows:
        return self

    def __next__(self) -> tuple[Any, ...]:
        if self._left <= 0:
            raise StopIteration
        if self._check is not None:
            self._check()
        params = {**self._params, "after": self._last, "limit": 1}
        row = self._db.one(self._statement, params, doing="page()")
        if row is None:
            self._left = 0
            raise StopIteration
        self._last = row[0]
        self._left -= 1
        return row

    def close(self) -> None:
        pass  # nothing stays open between pulls


def page_jobs(
    db: PgDatabase,
    scope: Scope,
    runtime: ResolvedRuntime,
    *,
    state: object,
    kind: object,
    after: object,
    limit: object,
    signal: SignalLike | None,
    deadline: datetime | None,
    queue: object = None,
) -> Cursor[Job]:
    what = "page()"
    state_, kind_, after_, limit_ = check_page_filters(state, kind, after, limit, what)
    queue_ = check_page_queue(queue, what)
    sig = check_signal_arg(signal, what)
    dl = check_deadline_arg(deadline, what)
    db.check_open(what)
    statement = sql.page_jobs(state_ is not None, kind_ is not None, queue_ is not None)
    params: dict[str, Any] = {}
    if state_ is not None:
        params["state"] = state_
    if kind_ is not None:
        params["kind"] = kind_
    if queue_ is not None:
        params["queue"] = queue_
    check: Callable[[], object] | None
    if scope.root:
        admit: Admit | None = scope.read
        check = None
    else:
        admit = None

        def check() -> None:
            scope.read(lambda: None, what)

    return Cursor(
        open_rows=lambda: _KeysetRows(
            db, statement=statement, params=params, after=after_, limit=limit_, check=check
        ),
        map_row=job_from_row,
        wrap=translating(what),
        signal=sig,
        deadline=dl,
        now=runtime.now,
        admit=admit,
        what=what,
    )
