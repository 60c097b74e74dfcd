"""``page()`` on the async pool: the one keyset cursor (backends/keyset.py), its
statements awaited on the store's ``AsyncConnection``.

Written by hand, and a bridge rather than a twin: the §5 cursor's lifecycle
(signal, deadline, barrier, streaming) is the sync :class:`~jaren_jobs.cursor.Cursor`,
whose pulls ``AsyncCursor`` runs on the store's threads; each statement of a pull
is handed back to the loop (``run_coroutine_threadsafe``) and runs on the pool's
connection — a root pull takes one for the pull, a transaction's pull uses the
one its block holds (the pull's thread runs in the task's context, so it is the
same holder, see :mod:`jaren_jobs.gate_async`). The loop is never blocked: only the
pull's thread waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from datetime import datetime
from typing import Any, TypeVar

from jaren_jobs.backends.keyset import Fetch, page_cursor
from jaren_jobs.backends.postgres import listing
from jaren_jobs.backends.postgres.connection_async import AsyncPgDatabase
from jaren_jobs.backends.postgres.errors import translating
from jaren_jobs.core.commands import PageFilters
from jaren_jobs.core.rows import job_from_row
from jaren_jobs.cursor import Cursor
from jaren_jobs.errors import GateRefused
from jaren_jobs.gate_async import hold_as, stop_holding
from jaren_jobs.records import Job
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike

__all__ = ["page_jobs_async"]

R = TypeVar("R")


class _Bridge:
    """The scope a sync cursor sees, its database calls awaited on ``loop``."""

    def __init__(self, db: AsyncPgDatabase, check_active: Callable[[str], None] | None) -> None:
        self._db = db
        self._loop: asyncio.AbstractEventLoop | None = None
        self._check_active = check_active  # a transaction's (None: the root)
        self.root = check_active is None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the cursor is pulled from (``AsyncCursor`` says, at each pull)."""
        self._loop = loop

    def on_loop(self, work: Coroutine[Any, Any, R]) -> R:
        assert self._loop is not None, "pulled through AsyncCursor only"
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def read(self, fn: Callable[[], R], what: str, signal: SignalLike | None = None) -> R:
        if self._check_active is not None:
            self._check_active(what)  # inside the transaction: its connection, no admission
            return fn()
        db = self._db
        db.check_open(what)
        if db.gate.held_by_me():
            raise GateRefused(
                f"{what}: this task holds the store's transaction; call tx.jobs (the "
                "transaction's own view) instead of store.jobs, or finish the transaction "
                "first — waiting here would deadlock",
                reason="reentrant",
            )
        # this pull is the holder of the connection it takes (its statements and the
        # give-back are tasks of the loop, made in this context)
        holding = hold_as(object())
        try:
            self.on_loop(db.take(what, signal))
            try:
                return fn()
            finally:
                self.on_loop(db.give_back())
        finally:
            stop_holding(holding)

    def fetch(self, statement: str) -> Fetch:
        def fetch_one(params: Mapping[str, Any]) -> tuple[Any, ...] | None:
            return self.on_loop(self._db.one(statement, params, doing="page()"))

        return fetch_one, _nothing


def _nothing() -> None:
    return None


def page_jobs_async(
    db: AsyncPgDatabase,
    runtime: ResolvedRuntime,
    check_active: Callable[[str], None] | None,
    filters: PageFilters,
    *,
    signal: SignalLike | None,
    deadline: datetime | None,
) -> tuple[Cursor[Job], Callable[[asyncio.AbstractEventLoop], None]]:
    """A keyset cursor over jobs by id whose pulls must run off the loop (``AsyncCursor``
    runs them on the store's threads), and what tells it the loop of each pull."""
    bridge = _Bridge(db, check_active)
    cursor = page_cursor(
        bridge,  # type: ignore[arg-type]
        runtime,
        filters,
        check_open=db.check_open,
        statement_for=listing.page_jobs,
        position_statement=listing.PAGE_POSITION,
        open_fetch=bridge.fetch,
        map_row=job_from_row,
        wrap=translating("page()"),
        signal=signal,
        deadline=deadline,
    )
    return cursor, bridge.bind
