"""``page()`` on PostgreSQL: the keyset cursor of backends/keyset.py (SPEC §5).

Each pull is one statement on the connection the pull holds (a root cursor
takes one of the store's per pull), so a paused consumer holds no connection
and no transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from jaren_jobs.backend import Scope
from jaren_jobs.backends.keyset import Fetch, page_cursor
from jaren_jobs.backends.postgres import listing
from jaren_jobs.backends.postgres.connection import PgDatabase
from jaren_jobs.backends.postgres.errors import translating
from jaren_jobs.core.commands import PageFilters
from jaren_jobs.core.rows import job_from_row
from jaren_jobs.cursor import Cursor
from jaren_jobs.records import Job
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike

__all__ = ["page_jobs"]


def _statements(db: PgDatabase, statement: str) -> Fetch:
    """One statement per row; nothing to release between or after pulls."""

    def fetch_one(params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        return db.one(statement, params, doing="page()")

    return fetch_one, _nothing


def _nothing() -> None:
    return None


def page_jobs(
    db: PgDatabase,
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
        open_fetch=lambda statement: _statements(db, statement),
        map_row=job_from_row,
        wrap=translating("page()"),
        signal=signal,
        deadline=deadline,
    )
