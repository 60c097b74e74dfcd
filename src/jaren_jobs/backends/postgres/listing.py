"""The PostgreSQL statements of the operator's reads over many rows: ``counts()``,
``due_counts()``, ``page()`` and ``settled_buckets()`` (the rest of the dialect is
:mod:`.queries`, whose names these build on).

As there, a statement's text depends only on the *shape* of a call (which
filters a page has, which state it reads: one of STATES, never input), never on
a value: values are always bound parameters. Each reads an index, never the
whole table (schema 6 added the ones the reads by state need).
"""

from __future__ import annotations

from functools import lru_cache

from jaren_jobs.backends.postgres.queries import EFFECTIVE_STATE, JOBS, MARKED_EXPIRED, READ_COLUMNS
from jaren_jobs.core.commands import PageFilters

# ----------------------------------------------------------------- counts


# counts(): the stored states from "_jaren_jobs_queue_state" alone (an index-only
# scan of it whole, never the table), and the few leased rows from their own
# index, where a marked lease that ran out reads as cancelled (EFFECTIVE_STATE).
# The outer sum folds that 'cancelled' into the stored one. Exact, from one
# snapshot. counts(queue=...) is the same over that queue's entries only.
# The stored states are counted per (queue, state), the index's own order, so
# that each run is counted as it streams past (no hash of every entry's state).
def _count_by_state(only: str) -> str:
    return f"""SELECT s, sum(n) FROM (
    SELECT state AS s, count(*) AS n FROM {JOBS} WHERE state <> 'leased'{only}
      GROUP BY queue, state
    UNION ALL
    SELECT {EFFECTIVE_STATE}, count(*) FROM {JOBS} WHERE state = 'leased'{only} GROUP BY 1
  ) AS counted GROUP BY s"""


COUNT_BY_STATE = _count_by_state("")
COUNT_QUEUE_BY_STATE = _count_by_state(" AND queue = %(queue)s")
COUNT_PENDING_KINDS = f"""SELECT kind, count(*) FROM {JOBS}
  WHERE state IN ('pending', 'failed') GROUP BY kind"""
COUNT_QUEUE_PENDING_KINDS = f"""SELECT kind, count(*) FROM {JOBS}
  WHERE state IN ('pending', 'failed') AND queue = %(queue)s GROUP BY kind"""


# due_counts(): the queued jobs split at now, and the leases that ran out (one
# snapshot, one statement). Each state is its own literal so that its index
# answers it: the queued ones from "_jaren_jobs_state_id" (one queue's from
# "_jaren_jobs_queue_state"; both carry run_at: an index-only scan), the leases
# from "_jaren_jobs_leased". A marked lease that
# ran out is not counted: it reads as cancelled (EFFECTIVE_STATE)
def _due_counts(only: str) -> str:
    def queued(state: str) -> str:
        return f"""(SELECT count(*) FILTER (WHERE run_at <= %(now)s) AS ready,
      count(*) FILTER (WHERE run_at > %(now)s) AS later,
      min(run_at) FILTER (WHERE run_at <= %(now)s) AS oldest
    FROM {JOBS} WHERE state = '{state}'{only}) AS {state}"""

    # LEAST ignores a NULL: the earlier of the two oldest
    return f"""SELECT pending.ready, pending.later, failed.ready, failed.later, leased.expired,
    LEAST(pending.oldest, failed.oldest)
  FROM {queued("pending")}, {queued("failed")},
  (SELECT count(*) AS expired FROM {JOBS} WHERE state = 'leased'
    AND cancel_requested_at IS NULL AND lease_until <= %(now)s{only}) AS leased"""


DUE_COUNTS = _due_counts("")
DUE_COUNTS_QUEUE = _due_counts(" AND queue = %(queue)s")


# settled_buckets(): the jobs each settled state gained per bucket of
# [since, until), by updated_at (a settlement's instant). Each state reads its
# rows of the window newest first from "_jaren_jobs_state_newest" (index-only),
# at most %(limit)s of them: the cost is bounded whatever the queue's rate.
SETTLED_BUCKETS = "\n  UNION ALL ".join(
    f"""SELECT '{state}', (updated_at - %(since)s) / %(bucket)s, count(*) FROM (
    SELECT updated_at FROM {JOBS} WHERE state = '{state}'
      AND updated_at >= %(since)s AND updated_at < %(until)s
    ORDER BY updated_at DESC LIMIT %(limit)s) AS {state} GROUP BY 2"""
    for state in ("done", "dead", "cancelled")
)


# queues(): the queues of the queued jobs, one seek each in the claim's queue-first
# index "_jaren_jobs_ready_queue" (the next queue past the last one found: never a
# read of every queued row), and those of the few leased rows; sorted, at most
# %(limit)s. Ordered by (queue, kind), that index's own order, so that the planner
# reads it rather than "_jaren_jobs_queue_state", whose entries of settled rows
# it would have to pass
LIVE_QUEUES = f"""WITH RECURSIVE live(queue, n) AS (
    SELECT (SELECT queue FROM {JOBS}
      WHERE state IN ('pending', 'failed') ORDER BY queue, kind LIMIT 1), 1
    UNION ALL
    SELECT (SELECT queue FROM {JOBS}
      WHERE state IN ('pending', 'failed') AND queue > live.queue
      ORDER BY queue, kind LIMIT 1),
      n + 1
    FROM live WHERE live.queue IS NOT NULL AND n < %(limit)s
  )
  SELECT queue FROM live WHERE queue IS NOT NULL
  UNION
  SELECT queue FROM {JOBS} WHERE state = 'leased'
  ORDER BY 1 LIMIT %(limit)s"""

# ----------------------------------------------------------------- pages


def page_jobs(filters: PageFilters) -> str:
    """A keyset page, filtered by state, kind and/or queue (values are bound), in
    ``filters.order``: by id, or newest first (``updated_at`` then id, descending)."""
    return _page_statement(
        filters.order,
        filters.state,
        filters.kind is not None,
        filters.queue is not None,
    )


# The stored rows a state filter reads, per effective state (EFFECTIVE_STATE):
# each a condition on one stored state, written as a literal (a state is one of
# STATES, checked by the engine, never input text) so that the planner matches
# it to a partial index even in a generic prepared plan. 'cancelled' is also a
# marked lease that ran out.
_STORED: dict[str, tuple[str, ...]] = {
    "pending": ("state = 'pending'",),
    "failed": ("state = 'failed'",),
    "done": ("state = 'done'",),
    "dead": ("state = 'dead'",),
    "leased": (f"state = 'leased' AND NOT ({MARKED_EXPIRED})",),
    "cancelled": ("state = 'cancelled'", MARKED_EXPIRED),
}
# newest first over every state: the unleased rows from "_jaren_jobs_newest",
# merged with the few leased ones
_EVERY_STATE = ("state <> 'leased'", "state = 'leased'")


@lru_cache(maxsize=64)
def _page_statement(order_by: str, state: str | None, by_kind: bool, by_queue: bool) -> str:
    # one statement per shape and state (the values are bound, never part of the text)
    if order_by == "newest":
        # a row comparison, so that the index seeks to it rather than filtering
        # every newer row (jobs enqueued together share one updated_at)
        seek = "(updated_at, id) < (%(after_at)s, %(after)s)"
        order = "updated_at DESC, id DESC"
    else:
        seek = "id > %(after)s"
        order = "id"
    where = [seek]
    if by_kind:
        where.append("kind = %(kind)s")
    if by_queue:
        where.append("queue = %(queue)s")
    if state is None and order_by != "newest":
        # by id over every state: the primary key is the order
        branches: tuple[str, ...] = ("",)
    else:
        # each stored state read from its own index ("_jaren_jobs_state_id" or
        # "_jaren_jobs_state_newest"; leased rows from "_jaren_jobs_leased"), at
        # most one row each, merged: never a scan of the other states' rows (the
        # CASE of EFFECTIVE_STATE matches no index)
        branches = _EVERY_STATE if state is None else _STORED[state]
    selects = [
        f"""SELECT {READ_COLUMNS} FROM {JOBS}
  WHERE {" AND ".join([*where, f"({branch})"] if branch else where)}
  ORDER BY {order} LIMIT %(limit)s"""
        for branch in branches
    ]
    if len(selects) == 1:
        return selects[0]
    merged = "\n  UNION ALL ".join(f"({select})" for select in selects)
    return f"{merged}\n  ORDER BY {order} LIMIT %(limit)s"


# where a newest-first page given an ``after`` id starts: that job's updated_at
PAGE_POSITION = f"SELECT updated_at FROM {JOBS} WHERE id = %(after)s"


# the gauges of a metrics scrape (SPEC §17), one statement: jobs per queue and
# effective state, the earliest ready run_at and the expired (unmarked) leases
# of each group. Every row is read once: a scrape caches the answer briefly
QUEUE_GAUGES = f"""SELECT queue, {EFFECTIVE_STATE} AS effective, count(*),
  min(CASE WHEN state IN ('pending', 'failed') AND run_at <= %(now)s THEN run_at END),
  count(*) FILTER (WHERE state = 'leased' AND cancel_requested_at IS NULL
    AND lease_until <= %(now)s)
  FROM {JOBS} GROUP BY 1, 2"""
