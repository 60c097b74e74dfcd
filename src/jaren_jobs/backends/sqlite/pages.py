"""``store.jobs.page()`` on SQLite: the keyset cursor of backends/keyset.py.

Its row source is one ``sqlite3`` cursor of its own (two live page cursors
never share a statement) that seeks the next row past the last one delivered,
*at each pull*: Python's ``sqlite3`` reads one row ahead of the row it
returns, so a statement left stepping between pulls would hand back a row read
before another thread's transaction committed.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from functools import partial
from typing import Any

from jaren_jobs.backend import Scope
from jaren_jobs.backends.keyset import Fetch, page_cursor
from jaren_jobs.backends.sqlite import listing
from jaren_jobs.backends.sqlite.connection import Database
from jaren_jobs.backends.sqlite.errors import translating
from jaren_jobs.core.commands import PageFilters
from jaren_jobs.core.rows import job_from_row
from jaren_jobs.cursor import Cursor
from jaren_jobs.records import Job
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike

__all__ = ["page_jobs"]


def _own_cursor(db: Database, statement: str) -> Fetch:
    """One row at a time on a cursor of the page's own, closed with the page."""
    cursor = db.cursor()

    def fetch_one(params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        return db.fetch_one(cursor, statement, params)

    return fetch_one, partial(db.close_cursor, cursor)


def page_jobs(
    db: Database,
    scope: Scope,
    runtime: ResolvedRuntime,
    filters: PageFilters,
    *,
    signal: SignalLike | None,
    deadline: datetime | None,
) -> Cursor[Job]:
    """A keyset cursor over jobs (see :func:`~jaren_jobs.backends.keyset.page_cursor`)."""
    return page_cursor(
        scope,
        runtime,
        filters,
        check_open=db.check_open,
        statement_for=listing.page_jobs,
        position_statement=listing.PAGE_POSITION,
        open_fetch=partial(_own_cursor, db),
        map_row=partial(job_from_row, codec=db.text_codec),
        wrap=translating("page()"),
        signal=signal,
        deadline=deadline,
    )
