"""``page()`` on either backend: a keyset cursor over jobs by id (SPEC §5).

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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from jaren_jobs.backend import Scope
from jaren_jobs.core.commands import check_page_filters, check_page_queue
from jaren_jobs.cursor import Admit, Cursor
from jaren_jobs.records import Job
from jaren_jobs.runtime import ResolvedRuntime
from jaren_jobs.signals import SignalLike, check_deadline_arg, check_signal_arg

__all__ = ["Fetch", "page_cursor"]

# one row of the statement with these parameters, or None; and how to release it
Fetch = tuple[Callable[[Mapping[str, Any]], "tuple[Any, ...] | None"], Callable[[], None]]


class _KeysetRows:
    """Job rows by id past ``after``; each ``next()`` seeks the next one afresh."""

    def __init__(
        self,
        fetch: Fetch,
        *,
        params: dict[str, Any],
        after: str,
        limit: int,
        check: Callable[[], object] | None,
        now_ms: Callable[[], int],
    ) -> None:
        self._fetch_one, self._release = fetch
        self._now_ms = now_ms
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
        # now: a marked lease that ran out reads as cancelled (its effective state)
        params = {**self._params, "after": self._last, "limit": 1, "now": self._now_ms()}
        row = self._fetch_one(params)
        if row is None:
            self._left = 0
            raise StopIteration
        self._last = row[0]
        self._left -= 1
        return row

    def close(self) -> None:
        self._release()


def page_cursor(
    scope: Scope,
    runtime: ResolvedRuntime,
    *,
    check_open: Callable[[str], None],
    statement_for: Callable[[bool, bool, bool], str],
    open_fetch: Callable[[str], Fetch],
    map_row: Callable[[Any], Job],
    wrap: Callable[[Exception], BaseException],
    state: object,
    kind: object,
    after: object,
    limit: object,
    signal: SignalLike | None,
    deadline: datetime | None,
    queue: object = None,
) -> Cursor[Job]:
    """A keyset cursor over jobs by id: at most ``limit`` jobs with id > ``after``.

    ``state`` (one of the job states), ``kind`` and ``queue`` filter; a bad filter is
    ``ValueError`` (a filter of the wrong type is also a ``TypeError``).
    Construction holds nothing and reads nothing; the first pull opens the
    row source. ``signal`` and ``deadline`` are honoured at every pull
    (``CursorAborted`` / ``DeadlinePassed``).
    """
    what = "page()"
    state_, kind_, after_, limit_ = check_page_filters(state, kind, after, limit, what)
    queue_ = check_page_queue(queue, what)
    sig = check_signal_arg(signal, what)
    dl = check_deadline_arg(deadline, what)
    check_open(what)
    statement = statement_for(state_ is not None, kind_ is not None, queue_ is not None)
    params: dict[str, Any] = {}
    if state_ is not None:
        params["state"] = state_
    if kind_ is not None:
        params["kind"] = kind_
    if queue_ is not None:
        params["queue"] = queue_

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

    return Cursor(
        open_rows=lambda: _KeysetRows(
            open_fetch(statement),
            params=params,
            after=after_,
            limit=limit_,
            check=check,
            now_ms=runtime.now_ms,
        ),
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
