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

# every state but leased from "_jaren_jobs_state_id" (covering: its leading column)
COUNT_BY_STATE = f"""SELECT state, COUNT(*) FROM {JOBS} INDEXED BY "_jaren_jobs_state_id"
  WHERE state <> 'leased' GROUP BY state"""
# leased rows are few (what workers hold now): reading each one is cheap.
# The second count: marked leases that ran out, effectively cancelled
COUNT_LEASED = f"""SELECT COUNT(*), COUNT(*) FILTER (WHERE {MARKED_EXPIRED})
  FROM {JOBS} INDEXED BY "_jaren_jobs_leased" WHERE state = 'leased'"""
# the ready jobs per kind from the claim's own index (kind first: covering, in kind order)
COUNT_PENDING_KINDS = f"""SELECT kind, COUNT(*) FROM {JOBS} INDEXED BY "_jaren_jobs_ready"
  WHERE state IN ('pending', 'failed') GROUP BY kind"""

# counts(queue=...): one queue's jobs per state from "_jaren_jobs_queue_state"
# (covering: the queue's entries only) and its few leased rows, folded as in
# counts() (a marked lease that ran out reads as cancelled); its ready jobs per
# kind from the queue-first claim index
COUNT_QUEUE_BY_STATE = f"""SELECT s, SUM(n) FROM (
    SELECT state AS s, COUNT(*) AS n FROM {JOBS} INDEXED BY "_jaren_jobs_queue_state"
      WHERE queue = :queue AND state <> 'leased' GROUP BY state
    UNION ALL
    SELECT {EFFECTIVE_STATE}, COUNT(*) FROM {JOBS} INDEXED BY "_jaren_jobs_leased"
      WHERE state = 'leased' AND queue = :queue GROUP BY 1
  ) GROUP BY s"""
COUNT_QUEUE_PENDING_KINDS = f"""SELECT kind, COUNT(*)
  FROM {JOBS} INDEXED BY "_jaren_jobs_ready_queue"
  WHERE state IN ('pending', 'failed') AND queue = :queue GROUP BY kind"""


# due_counts(): the queued jobs split at now, and the leases that ran out (one
# snapshot, one statement). Each queued state is read from "_jaren_jobs_state_id"
# (one queue's from "_jaren_jobs_queue_state"), which carries run_at (never the
# table); the leases from their own index. A marked lease that ran out is not
# counted: it reads as cancelled (EFFECTIVE_STATE)
def _due_counts(only: str, index: str) -> str:
    def queued(state: str) -> str:
        return f"""(SELECT COUNT(*) FILTER (WHERE run_at <= :now) AS ready,
      COUNT(*) FILTER (WHERE run_at > :now) AS later,
      MIN(run_at) FILTER (WHERE run_at <= :now) AS oldest
    FROM {JOBS} INDEXED BY "{index}"
    WHERE state = '{state}' AND state <> 'leased'{only}) AS {state}"""

    # the earlier of the two oldest (scalar MIN is NULL when either is)
    return f"""SELECT pending.ready, pending.later, failed.ready, failed.later, leased.expired,
    MIN(COALESCE(pending.oldest, failed.oldest), COALESCE(failed.oldest, pending.oldest))
  FROM {queued("pending")}, {queued("failed")},
  (SELECT COUNT(*) AS expired FROM {JOBS} INDEXED BY "_jaren_jobs_leased"
    WHERE state = 'leased' AND cancel_requested_at IS NULL AND lease_until <= :now{only})
    AS leased"""


DUE_COUNTS = _due_counts("", "_jaren_jobs_state_id")
DUE_COUNTS_QUEUE = _due_counts(" AND queue = :queue", "_jaren_jobs_queue_state")

# the gauges of a metrics scrape (SPEC §17), one statement: jobs per queue and
# effective state, the earliest ready run_at and the expired (unmarked) leases
# of each group. Every row is read once: a scrape caches the answer briefly
QUEUE_GAUGES = f"""SELECT queue, {EFFECTIVE_STATE} AS effective, COUNT(*),
  MIN(CASE WHEN state IN ('pending', 'failed') AND run_at <= :now THEN run_at END),
  COALESCE(SUM(CASE WHEN state = 'leased' AND cancel_requested_at IS NULL
    AND lease_until <= :now THEN 1 ELSE 0 END), 0)
  FROM {JOBS} GROUP BY queue, effective"""

# queues(): the queues of the queued jobs, one seek each in the claim's queue-first
# index (the next queue past the last one found: never a read of every queued
# row), and those of the few leased rows; sorted, at most :limit
LIVE_QUEUES = f"""WITH RECURSIVE live(queue, n) AS (
    SELECT (SELECT queue FROM {JOBS} INDEXED BY "_jaren_jobs_ready_queue"
      WHERE state IN ('pending', 'failed') ORDER BY queue LIMIT 1), 1
    UNION ALL
    SELECT (SELECT queue FROM {JOBS} INDEXED BY "_jaren_jobs_ready_queue"
      WHERE state IN ('pending', 'failed') AND queue > live.queue ORDER BY queue LIMIT 1),
      n + 1
    FROM live WHERE live.queue IS NOT NULL AND n < :limit
  )
  SELECT queue FROM live WHERE queue IS NOT NULL
  UNION
  SELECT queue FROM {JOBS} INDEXED BY "_jaren_jobs_leased" WHERE state = 'leased'
  ORDER BY 1 LIMIT :limit"""

# ----------------------------------------------------------------- pages

# schema 9: what the operator's reads by state seek in (the dashboard, SPEC §15).
# Leased rows are left out (the leased index reads those few): a job passes
# through 'leased' on every attempt, and an entry here would be inserted at the
# claim and deleted at the settlement. The WHERE of a statement meant for one
# must name its predicate ("state <> 'leased'") word for word: SQLite uses a
# partial index only then. Every enqueue and state change maintains them, so
# they serve every read by state they can (schema 10 dropped two others that did):
LISTING_INDEXES = (
    # a page filtered by state, in id order; the counts per state; run_at rides
    # along for due_counts()
    f"""CREATE INDEX IF NOT EXISTS "_jaren_jobs_state_id" ON {JOBS}
      (state, id, run_at) WHERE state <> 'leased'""",
    # newest first (updated_at, id descending), one state at a time; a sweep
    # reads it oldest first, one branch per settled state
    f"""CREATE INDEX IF NOT EXISTS "_jaren_jobs_state_newest" ON {JOBS}
      (state, updated_at, id) WHERE state <> 'leased'""",
    # newest first over every state (or by kind or queue): merged with the leased
    # rows. Not a merge of the state index's branches: a kind rare in one state
    # would have its branch read every row of that state
    f"""CREATE INDEX IF NOT EXISTS "_jaren_jobs_newest" ON {JOBS}
      (updated_at, id) WHERE state <> 'leased'""",
    # schema 11: one queue's jobs per state (counts(queue=...), the dashboard's
    # per-queue counts), with run_at for due_counts(queue=...). No id in the key:
    # an entry sits by its run_at and rowid, which grow with time, so an enqueue
    # or a settlement writes near the end of its (queue, state) run rather than
    # at a random page, as an id (a random uuid) would place it
    f"""CREATE INDEX IF NOT EXISTS "_jaren_jobs_queue_state" ON {JOBS}
      (queue, state, run_at) WHERE state <> 'leased'""",
)


# settled_buckets(): the jobs each settled state gained per bucket of [since,
# until), by updated_at (a settlement's instant). Each state reads its rows of the
# window newest first from "_jaren_jobs_state_newest" (covering), at most :limit
# of them: the cost is bounded whatever the queue's rate.
SETTLED_BUCKETS = "\n  UNION ALL ".join(
    f"""SELECT '{state}', (updated_at - :since) / :bucket, COUNT(*) FROM (
    SELECT updated_at FROM {JOBS} INDEXED BY "_jaren_jobs_state_newest"
    WHERE state = '{state}' AND state <> 'leased'
      AND updated_at >= :since AND updated_at < :until
    ORDER BY updated_at DESC LIMIT :limit) GROUP BY 2"""
    for state in ("done", "dead", "cancelled")
)


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
# (condition, index in id order, index newest first), the state a literal (one of
# STATES, checked by the engine, never input). 'cancelled' is also a marked
# lease that ran out.
_UNLEASED = "state <> 'leased'"
_LEASED = ("state = 'leased'", "_jaren_jobs_leased", "_jaren_jobs_leased")


def _stored(state: str) -> tuple[str, str, str]:
    condition = f"state = '{state}' AND {_UNLEASED}"
    return (condition, "_jaren_jobs_state_id", "_jaren_jobs_state_newest")


_STORED: dict[str, tuple[tuple[str, str, str], ...]] = {
    **{state: (_stored(state),) for state in ("pending", "failed", "done", "dead")},
    "leased": ((f"state = 'leased' AND NOT ({MARKED_EXPIRED})", *_LEASED[1:]),),
    "cancelled": (_stored("cancelled"), (MARKED_EXPIRED, *_LEASED[1:])),
}
# newest first over every state: the unleased rows in one order, and the leased ones
_EVERY_STATE = ((_UNLEASED, "", "_jaren_jobs_newest"), _LEASED)


#: a queue with fewer unleased rows (of the state read) than this is read from
#: "_jaren_jobs_queue_state" (all of them, sorted); a bigger one in page order,
#: where its rows are met soon enough
FEW_IN_QUEUE = 1000
_BY_ID = "sqlite_autoindex__jaren_jobs_1"  # the primary key's index (id order)


def _few_in_queue(condition: str) -> str:
    """True when the queue holds fewer than FEW_IN_QUEUE rows meeting ``condition``:
    a bounded count of the queue's own index entries. Used in a branch's LIMIT
    (0 or :limit), which SQLite computes once, before the branch's loop: a branch
    limited to 0 reads nothing (a WHERE term would be checked at every row)."""
    return f"""(SELECT COUNT(*) FROM (SELECT 1 FROM {JOBS} INDEXED BY "_jaren_jobs_queue_state"
    WHERE queue = :queue AND ({condition}) LIMIT {FEW_IN_QUEUE})) < {FEW_IN_QUEUE}"""


@lru_cache(maxsize=64)
def _page_statement(order_by: str, state: str | None, by_kind: bool, by_queue: bool) -> str:
    # one statement per shape and state (the values are bound, never part of the text)
    newest = order_by == "newest"
    if newest:
        # a row value, so that the index seeks to it rather than filtering every
        # newer row (jobs enqueued together share one updated_at)
        where = ["(updated_at, id) < (:after_at, :after)"]
        order = "updated_at DESC, id DESC"
    else:
        where = ["id > :after"]
        order = "id"
    if by_kind:
        where.append("kind = :kind")
    if by_queue:
        where.append("queue = :queue")
    if state is None and not newest and not by_queue:
        # by id over every state: the primary key is the order
        return f"""SELECT {READ_COLUMNS} FROM {JOBS} WHERE {" AND ".join(where)}
  ORDER BY {order} LIMIT :limit"""
    # each stored state read from its own index, at most one row each, merged:
    # never a scan of the other states' rows (the CASE of EFFECTIVE_STATE
    # matches no index). INDEXED BY pins each plan.
    branches = _EVERY_STATE if state is None else _STORED[state]
    selects = []
    for condition, by_id, by_newest in branches:
        index = (by_newest if newest else by_id) or _BY_ID
        conditions = " AND ".join([*where, f"({condition})"])
        limit = ":limit"
        if by_queue and _UNLEASED in condition:
            # a queue few rows are in: read them all from the queue's own index
            # and sort them, rather than pass every other queue's rows in page
            # order to find a few (or none); a bigger queue in page order
            few = _few_in_queue(condition)
            selects.append(
                f"""SELECT {READ_COLUMNS} FROM {JOBS} INDEXED BY "_jaren_jobs_queue_state"
  WHERE {conditions} ORDER BY {order} LIMIT (CASE WHEN {few} THEN :limit ELSE 0 END)"""
            )
            limit = f"(CASE WHEN {few} THEN 0 ELSE :limit END)"
        selects.append(
            f"""SELECT {READ_COLUMNS} FROM {JOBS} INDEXED BY "{index}"
  WHERE {conditions} ORDER BY {order} LIMIT {limit}"""
        )
    if len(selects) == 1:
        return selects[0]
    merged = "\n  UNION ALL ".join(f"SELECT * FROM ({select})" for select in selects)
    return f"{merged}\n  ORDER BY {order} LIMIT :limit"


# where a newest-first page given an ``after`` id starts: that job's updated_at
PAGE_POSITION = f"SELECT updated_at FROM {JOBS} WHERE id = :after"

# ----------------------------------------------------------------- errors

JOB_EXISTS = f"SELECT 1 FROM {JOBS} WHERE id = ?"
# the texts as their bytes, decoded by the row mapper (as a job's last_error)
READ_ERRORS = f"""SELECT attempt, at, CAST(error AS BLOB), CAST(traceback AS BLOB) FROM {ERRORS}
  WHERE job_id = ? ORDER BY generation"""

# ----------------------------------------------------------------- sweep

# A bounded sweep reads `limit` entries per settled state, oldest first, from
# "_jaren_jobs_state_newest", and keeps the oldest `limit` of those: never a
# sort of every settled row. An unbounded one takes every entry before the
# horizon, in no order (it deletes them all). The states are literals, or bound
# (:s0 ...)


def _sweep_selection(states: tuple[str, ...], bounded: bool) -> str:
    if not bounded:
        return f"""SELECT id FROM {JOBS} INDEXED BY "_jaren_jobs_state_newest"
    WHERE state IN ({", ".join(states)}) AND {_UNLEASED} AND updated_at < :horizon"""
    branches = "\n    UNION ALL ".join(
        f"""SELECT * FROM (SELECT id, updated_at FROM {JOBS} INDEXED BY "_jaren_jobs_state_newest"
      WHERE state = {state} AND {_UNLEASED} AND updated_at < :horizon
      ORDER BY updated_at, id LIMIT :limit)"""
        for state in states
    )
    return f"""SELECT id FROM (
    {branches})
    ORDER BY updated_at, id LIMIT :limit"""


@lru_cache(maxsize=16)
def sweeps(count: int, bounded: bool) -> tuple[str, str, str]:
    """The sweep's three DELETEs (checkpoints, error history, then jobs) over every settled
    state (``count`` 0) or ``count`` of them, bound as ``:s0``.. (``sweep(states=...)``);
    ``bounded``: at most ``:limit`` jobs, the oldest."""
    states = tuple(f":s{i}" for i in range(count)) or ("'done'", "'dead'", "'cancelled'")
    selection = _sweep_selection(states, bounded)
    return (
        f"DELETE FROM {CHECKPOINTS} WHERE run_id IN ({selection})",
        f"DELETE FROM {ERRORS} WHERE job_id IN ({selection})",
        f"DELETE FROM {JOBS} WHERE id IN ({selection})",
    )
