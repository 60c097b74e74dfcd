"""The SQLite statements of the operator's calls over many rows: ``counts()``,
``due_counts()``, ``page()``, ``errors()`` and ``sweep()`` (the rest of the dialect
is :mod:`.queries`, whose names these build on).

As there, a statement's text depends only on the *shape* of a call (which
filters a page has, how many states a sweep names), never on a value: values
are always bound parameters.
"""

from __future__ import annotations

from functools import lru_cache

from jaren_jobs.backends.sqlite.queries import (
    CHECKPOINTS,
    EFFECTIVE_STATE,
    ERRORS,
    JOBS,
    MARKED_EXPIRED,
    READ_COLUMNS,
)
from jaren_jobs.core.commands import PageFilters

# ----------------------------------------------------------------- counts

COUNT_BY_STATE = f"""SELECT state, COUNT(*) FROM {JOBS} INDEXED BY "_jaren_jobs_unleased"
  WHERE state <> 'leased' GROUP BY state"""
# leased rows are few (what workers hold now): reading each one is cheap.
# The second count: marked leases that ran out, effectively cancelled
COUNT_LEASED = f"""SELECT COUNT(*), COUNT(*) FILTER (WHERE {MARKED_EXPIRED})
  FROM {JOBS} INDEXED BY "_jaren_jobs_leased" WHERE state = 'leased'"""
COUNT_PENDING_KINDS = f"""SELECT kind, COUNT(*) FROM {JOBS} INDEXED BY "_jaren_jobs_unleased"
  WHERE state IN ('pending', 'failed') AND state <> 'leased' GROUP BY kind"""

# counts(queue=...): one queue's jobs per state, and its ready jobs per kind.
# The ready jobs come from the queue-first index; the rest is read row by row
# (a per-queue report, not a hot path)
COUNT_QUEUE_BY_STATE = f"""SELECT {EFFECTIVE_STATE}, COUNT(*) FROM {JOBS} WHERE queue = :queue
  GROUP BY 1"""
COUNT_QUEUE_PENDING_KINDS = f"""SELECT kind, COUNT(*)
  FROM {JOBS} INDEXED BY "_jaren_jobs_ready_queue"
  WHERE state IN ('pending', 'failed') AND queue = :queue GROUP BY kind"""

# due_counts(): the queued jobs split at now, and the leases that ran out (one
# snapshot, one statement; an operator's read, not a hot path). A marked lease
# that ran out is not counted: it reads as cancelled (EFFECTIVE_STATE)
_DUE_COUNTS = f"""SELECT
  COALESCE(SUM(CASE WHEN state = 'pending' AND run_at <= :now THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 'pending' AND run_at > :now THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 'failed' AND run_at <= :now THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 'failed' AND run_at > :now THEN 1 ELSE 0 END), 0),
  COALESCE(SUM(CASE WHEN state = 'leased' AND cancel_requested_at IS NULL
    AND lease_until <= :now THEN 1 ELSE 0 END), 0)
  FROM {JOBS} WHERE state IN ('pending', 'failed', 'leased')"""
DUE_COUNTS = _DUE_COUNTS
DUE_COUNTS_QUEUE = _DUE_COUNTS + " AND queue = :queue"

# the gauges of a metrics scrape (SPEC §17), one statement: jobs per queue and
# effective state, the earliest ready run_at and the expired (unmarked) leases
# of each group. Every row is read once: a scrape caches the answer briefly
QUEUE_GAUGES = f"""SELECT queue, {EFFECTIVE_STATE} AS effective, COUNT(*),
  MIN(CASE WHEN state IN ('pending', 'failed') AND run_at <= :now THEN run_at END),
  COALESCE(SUM(CASE WHEN state = 'leased' AND cancel_requested_at IS NULL
    AND lease_until <= :now THEN 1 ELSE 0 END), 0)
  FROM {JOBS} GROUP BY queue, effective"""

# ----------------------------------------------------------------- pages


def page_jobs(filters: PageFilters) -> str:
    """A keyset page, filtered by state, kind and/or queue (values are bound), in
    ``filters.order``: by id, or newest first (``updated_at`` then id, descending)."""
    return _page_statement(
        filters.order,
        filters.state is not None,
        filters.kind is not None,
        filters.queue is not None,
    )


@lru_cache(maxsize=16)
def _page_statement(order_by: str, by_state: bool, by_kind: bool, by_queue: bool) -> str:
    # one statement per shape (the values are bound, never part of the text)
    if order_by == "newest":
        where = ["(updated_at < :after_at OR (updated_at = :after_at AND id < :after))"]
        order = "updated_at DESC, id DESC"
    else:
        where = ["id > :after"]
        order = "id"
    if by_state:
        where.append(f"{EFFECTIVE_STATE} = :state")
    if by_kind:
        where.append("kind = :kind")
    if by_queue:
        where.append("queue = :queue")
    return f"""SELECT {READ_COLUMNS} FROM {JOBS} WHERE {" AND ".join(where)}
  ORDER BY {order} LIMIT :limit"""


# where a newest-first page given an ``after`` id starts: that job's updated_at
PAGE_POSITION = f"SELECT updated_at FROM {JOBS} WHERE id = :after"

# ----------------------------------------------------------------- errors

JOB_EXISTS = f"SELECT 1 FROM {JOBS} WHERE id = ?"
# the texts as their bytes, decoded by the row mapper (as a job's last_error)
READ_ERRORS = f"""SELECT attempt, at, CAST(error AS BLOB), CAST(traceback AS BLOB) FROM {ERRORS}
  WHERE job_id = ? ORDER BY generation"""

# ----------------------------------------------------------------- sweep

# the settled index is in sweep order: a bounded sweep reads `limit` entries,
# never sorts every settled row
_SWEEP_SELECTION = f"""SELECT id FROM {JOBS} INDEXED BY "_jaren_jobs_settled"
    WHERE state IN ('done', 'dead', 'cancelled') AND updated_at < :horizon
    ORDER BY updated_at, id LIMIT :limit"""

SWEEP_CHECKPOINTS = f"DELETE FROM {CHECKPOINTS} WHERE run_id IN ({_SWEEP_SELECTION})"
SWEEP_ERRORS = f"DELETE FROM {ERRORS} WHERE job_id IN ({_SWEEP_SELECTION})"
SWEEP_JOBS = f"DELETE FROM {JOBS} WHERE id IN ({_SWEEP_SELECTION})"


@lru_cache(maxsize=4)
def sweep_only(count: int) -> tuple[str, str, str]:
    """:data:`SWEEP_CHECKPOINTS`, :data:`SWEEP_ERRORS` and :data:`SWEEP_JOBS` for only
    ``count`` of the settled states, bound as ``:s0``.. (``sweep(states=...)``)."""
    if count == 0:
        return SWEEP_CHECKPOINTS, SWEEP_ERRORS, SWEEP_JOBS
    only = ", ".join(f":s{i}" for i in range(count))
    selection = _SWEEP_SELECTION.replace(
        "AND updated_at < :horizon", f"AND state IN ({only}) AND updated_at < :horizon"
    )
    return (
        f"DELETE FROM {CHECKPOINTS} WHERE run_id IN ({selection})",
        f"DELETE FROM {ERRORS} WHERE job_id IN ({selection})",
        f"DELETE FROM {JOBS} WHERE id IN ({selection})",
    )
