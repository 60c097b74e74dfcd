"""``store.jobs.page()``: a keyset cursor over jobs, by id.

The cursor is built by :mod:`jaren_jobs.cursor` like every other. Its row
source is one ``sqlite3`` cursor of its own (two live page cursors never
share a statement) that seeks the next row past the last one delivered, *at
each pull*: Python's ``sqlite3`` reads one row ahead of the row it returns,
so a statement left stepping between pulls would hand back a row read
before another thread's transaction committed. Seeking per pull means every
pull reads the committed state of that moment (rows deleted meanwhile
vanish, rows added past the last delivered id appear) and nothing — no
statement, no read snapshot — is held between pulls.

A root page takes the store's gate per pull; ``tx.jobs.page()`` runs inside
its transaction (whose thread already holds the gate) and sees its
uncommitted rows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

from jaren_jobs.backend import Scope
from jaren_jobs.core.commands import check_page_filters, check_page_queue
from jaren_jobs.cursor import Admit, Cursor
from jaren_jobs.records import Job
from jaren_jobs.rows import job_from_row
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike, check_deadline_arg, check_signal_arg

from . import queries as sql
from .connection import Database
from .errors import translating

__all__ = ["page_jobs"]


class _KeysetRows:
    """Job rows by id past ``after``; each ``next()`` seeks the next one afresh."""

    def __init__(
        self,
        db: Database,
        *,
        statement: str,
        params: dict[str, Any],
        after: str,
        limit: int,
        check: Callable[[], object] | None,
    ) -> None:
        self._check = check
        self._db = db
        self._cursor = db.cursor()
        self._statement = statement
        self._params = params
        self._last = after
        self._left = limit

    def __iter__(self) -> _KeysetRows:
        return self

    def __next__(self) -> tuple[Any, ...]:
        if self._left <= 0:
            raise StopIteration
        if self._check is not None:
            self._check()
        params = {**self._params, "after": self._last, "limit": 1}
        row = self._db.fetch_one(self._cursor, self._statement, params)
        if row is None:
            self._left = 0
            raise StopIteration
        self._last = row[0]
        self._left -= 1
        return row

    def close(self) -> None:
        self._db.close_cursor(self._cursor)


def page_jobs(
    db: Database,
    scope: Scope,
    runtime: ResolvedRuntime,
    *,
    state: str | None,
    kind: str | None,
    after: str | None,
    limit: int,
    signal: SignalLike | None,
    deadline: datetime | None,
    queue: object = None,
) -> Cursor[Job]:
    """A keyset cursor over jobs by id: at most ``limit`` jobs with id > ``after``.

    ``state`` (one of the job states) and ``kind`` filter; a bad filter is
    ``ValueError`` (a filter of the wrong type is also a ``TypeError``).
    Construction holds nothing and reads nothing; the first pull opens the
    statement. ``signal`` and ``deadline`` are honoured at every pull
    (``CursorAborted`` / ``DeadlinePassed``).
    """
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

    if scope.root:
        # the gate per pull, never between pulls
        admit: Admit | None = scope.read
        check = None
    else:
        # inside the transaction, whose thread holds the gate: no admission,
        # but every pull checks that the transaction is still open (an ended
        # one never comes back, so the refusal settles the cursor)
        admit = None

        def check() -> None:
            scope.read(_nothing, what)

    return Cursor(
        open_rows=lambda: _KeysetRows(
            db, statement=statement, params=params, after=after_, limit=limit_, check=check
        ),
        map_row=partial(job_from_row, codec=db.text_codec),
        wrap=translating(what),
        signal=sig,
        deadline=dl,
        now=runtime.now,
        admit=admit,
        what=what,
    )


def _nothing() -> None:
    return None
