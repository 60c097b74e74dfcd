"""``page()`` on either backend: a keyset cursor over jobs (SPEC §5), by id or newest first.

The cursor is built by :mod:`jaren_jobs.cursor` like every other. Its row
source seeks the next row past the last one delivered *at each pull*
(``id > last``), so every pull reads the committed state of that moment (rows
deleted meanwhile vanish, rows added past the last delivered id appear) and
nothing — no statement, no read snapshot, no connection — is held between
pulls. A root page takes a connection of the store per pull (the gate);
``tx.jobs.page()`` runs inside its transaction, whose thread holds one, and
sees its uncommitted rows. What differs per backend — the statement's
placeholders, how one row is fetched, how a row becomes a ``Job`` — is passed
in by ``backends/<db>/pages.py``.

Two orders: ``"id"`` (ascending; the seek is ``id > last``) and ``"newest"``
(``updated_at`` descending, ties by id descending; the seek is
``(updated_at, id) < (last_at, last)``). In newest order an ``after`` id is
a position: the first pull reads that job's ``updated_at`` (an id no job has
is :class:`~jaren_jobs.UnknownJob`), later pulls seek past the last row
delivered. A job changed between pulls moves to the front, so it is not met
again by a cursor already past it: newest order is for looking, not for
visiting every job once (that is the id order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from jaren_jobs.backend import Scope
from jaren_jobs.core.commands import PageFilters
from jaren_jobs.cursor import Admit, Cursor
from jaren_jobs.errors import UnknownJob
from jaren_jobs.records import Job
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike, check_deadline_arg, check_signal_arg

__all__ = ["UPDATED_AT", "Fetch", "page_cursor"]

# one row of the statement with these parameters, or None; and how to release it
Fetch = tuple[Callable[[Mapping[str, Any]], "tuple[Any, ...] | None"], Callable[[], None]]
#: where ``updated_at`` (epoch ms) sits in a row of either backend's JOB_COLUMNS
UPDATED_AT = 14
# "newest" from the start: past every updated_at a job can have (64-bit ms)
_FROM_THE_TOP = 2**63 - 1


class _KeysetRows:
    """Job rows past the last one delivered; each ``next()`` seeks the next one afresh."""

    def __init__(
        self,
        fetch: Fetch,
        *,
        params: dict[str, Any],
        filters: PageFilters,
        position: Callable[[str], int | None] | None,
        check: Callable[[], object] | None,
        now_ms: Callable[[], int],
    ) -> None:
        self._fetch_one, self._release = fetch
        self._now_ms = now_ms
        self._params = params
        self._last = filters.after
        self._last_at: int | None = None if filters.order == "newest" else 0
        self._newest = filters.order == "newest"
        self._left = filters.limit
        self._position = position
        self._check = check

    def __iter__(self) -> _KeysetRows:
        return self

    def _seek(self) -> dict[str, Any]:
        if not self._newest:
            return {**self._params, "after": self._last, "limit": 1}
        if self._last_at is None:
            if self._last == "" or self._position is None:
                self._last_at = _FROM_THE_TOP
            else:
                at = self._position(self._last)
                if at is None:
                    raise UnknownJob(
                        f"page(): after={self._last!r} names no job; in newest order it is "
                        "a position (that job's updated_at), so it must exist",
                        job_id=self._last,
                    )
                self._last_at = at
        return {**self._params, "after": self._last, "after_at": self._last_at, "limit": 1}

    def __next__(self) -> tuple[Any, ...]:
        if self._left <= 0:
            raise StopIteration
        if self._check is not None:
            self._check()
        # now: a marked lease that ran out reads as cancelled (its effective state)
        row = self._fetch_one({**self._seek(), "now": self._now_ms()})
        if row is None:
            self._left = 0
            raise StopIteration
        self._last = row[0]
        if self._newest:
            self._last_at = int(row[UPDATED_AT])
        self._left -= 1
        return row

    def close(self) -> None:
        self._release()


def page_cursor(
    scope: Scope,
    runtime: ResolvedRuntime,
    filters: PageFilters,
    *,
    check_open: Callable[[str], None],
    statement_for: Callable[[PageFilters], str],
    position_statement: str,
    open_fetch: Callable[[str], Fetch],
    map_row: Callable[[Any], Job],
    wrap: Callable[[Exception], BaseException],
    signal: SignalLike | None,
    deadline: datetime | None,
) -> Cursor[Job]:
    """A keyset cursor over jobs: at most ``filters.limit`` past ``filters.after``.

    ``filters`` were checked by the engine (``core.commands.check_page``).
    Construction holds nothing and reads nothing; the first pull opens the
    row source. ``signal`` and ``deadline`` are honoured at every pull
    (``CursorAborted`` / ``DeadlinePassed``).
    """
    what = "page()"
    sig = check_signal_arg(signal, what)
    dl = check_deadline_arg(deadline, what)
    check_open(what)
    statement = statement_for(filters)
    params: dict[str, Any] = {}
    if filters.state is not None:
        params["state"] = filters.state
    if filters.kind is not None:
        params["kind"] = filters.kind
    if filters.queue is not None:
        params["queue"] = filters.queue

    check: Callable[[], None] | None
    if scope.root:
        # a connection per pull, never between pulls
        admit: Admit | None = scope.read
        check = None
    else:
        # inside the transaction, whose thread holds its connection: no
        # admission, but every pull checks that the transaction is still open
        # (an ended one never comes back, so the refusal settles the cursor)
        admit = None

        def check() -> None:
            scope.read(_nothing, what)

    def open_rows() -> _KeysetRows:
        fetch = open_fetch(statement)
        position: Callable[[str], int | None] | None = None
        if filters.order == "newest" and filters.after:
            # the after-id's updated_at, read in the first pull (same connection)
            def position(job_id: str) -> int | None:
                where, release = open_fetch(position_statement)
                try:
                    row = where({"after": job_id})
                finally:
                    release()
                return None if row is None else int(row[0])

        return _KeysetRows(
            fetch,
            params=params,
            filters=filters,
            position=position,
            check=check,
            now_ms=runtime.now_ms,
        )

    return Cursor(
        open_rows=open_rows,
        map_row=map_row,
        wrap=wrap,
        signal=sig,
        deadline=dl,
        now=runtime.now,
        admit=admit,
        what=what,
    )


def _nothing() -> None:
    return None
