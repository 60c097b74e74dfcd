"""Every SQL statement jaren_jobs runs, named, in one place (the SQLite dialect).

No other module writes SQL but :mod:`.listing` (the operator's statements). Statements
whose text depends on a *count* (how many kinds a claim names) are built from that count
alone; user input is always a bound parameter, never text. ``sqlite3`` caches prepared
statements by text per connection, so each is prepared once.
"""

from __future__ import annotations

import sqlite3
from functools import lru_cache

JOBS = '"_jaren_jobs"'
CHECKPOINTS = '"_jaren_job_checkpoints"'
ERRORS = '"_jaren_job_errors"'
META = '"_jaren_meta"'

# 1: fenced; 2: the (state, kind) index sans leased rows; 3: claim_key; 4: queue, unique_key
# (§12); 5: error history (§13); 6: cancel_requested_at (§13); 7: history keyed by
# generation; 8: trace_context (§17); 9: listing.LISTING_INDEXES; 10: two indexes whose
# reads others serve dropped (DROPPED_INDEXES); 11: "_jaren_jobs_queue_state"
# (listing.LISTING_INDEXES)
SCHEMA_VERSION = 11

# the column order every job SELECT/RETURNING uses; engine rows map by index.
# The free texts (payload, result, last_error) come back as their bytes, which
# the row mapper decodes: a row another program left with text that is not
# valid in the database's encoding reads as a marker instead of failing the
# whole statement (a claim of many rows with it, every page over it).
JOB_COLUMNS = (
    "id, kind, CAST(payload AS BLOB), state, priority, attempts, max_attempts, run_at, "
    "lease_until, lease_owner, lease_generation, CAST(last_error AS BLOB), "
    "CAST(result AS BLOB), created_at, updated_at, lease_token, queue, unique_key, "
    "cancel_requested_at"
)
# what a claim returns: JOB_COLUMNS, then the trace context its attempt's span joins
CLAIM_COLUMNS = f"{JOB_COLUMNS}, trace_context"

# A leased job marked by cancel(id, force=True) whose lease has run out is cancelled: no
# live holder can settle it any more, and no claim rescues it. The row says 'leased'
# until a write meets it (MATERIALISE_*); every read shows its effective state at :now.
MARKED_EXPIRED = "state = 'leased' AND cancel_requested_at IS NOT NULL AND lease_until <= :now"
EFFECTIVE_STATE = f"CASE WHEN {MARKED_EXPIRED} THEN 'cancelled' ELSE state END"
# JOB_COLUMNS as a read shows them: the effective state in the state's place
READ_COLUMNS = JOB_COLUMNS.replace(", state, ", f", {EFFECTIVE_STATE}, ", 1)

# the states in which a job holds its unique_key (SPEC §12); the text must be
# the very one of the unique index's predicate, so a lookup can use the index
ACTIVE = "state IN ('pending', 'failed', 'leased')"

# The guard every settling statement carries: the token, and a lease still
# valid now. Never the owner: one worker reuses one owner for every attempt.
FENCE = "state = 'leased' AND lease_token = :token AND lease_until > :now"

# ----------------------------------------------------------------- schema

# The reference's pre-fence schema is the base every database starts from; later columns
# are added in place (MIGRATIONS), so a fresh and an upgraded database end the same.
CREATE_JOBS = f"""CREATE TABLE IF NOT EXISTS {JOBS} (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, payload TEXT,
  state TEXT NOT NULL, run_at INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
  max_attempts INTEGER NOT NULL, lease_until INTEGER, lease_owner TEXT,
  last_error TEXT, result TEXT, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)"""

CREATE_CHECKPOINTS = f"""CREATE TABLE IF NOT EXISTS {CHECKPOINTS} (
  run_id TEXT NOT NULL, node_id TEXT NOT NULL,
  value TEXT NOT NULL, PRIMARY KEY (run_id, node_id))"""

# one row per failed attempt (SPEC §13), written by the failure's own transaction,
# swept with its job; keyed (and read in order) by the attempt's lease generation,
# which every claim mints anew (attempt numbers and instants both repeat)
ERRORS_DEFINITION = """(job_id TEXT NOT NULL, generation INTEGER NOT NULL,
  attempt INTEGER NOT NULL, at INTEGER NOT NULL, error TEXT NOT NULL, traceback TEXT,
  PRIMARY KEY (job_id, generation)) WITHOUT ROWID"""
CREATE_ERRORS = f"CREATE TABLE IF NOT EXISTS {ERRORS} {ERRORS_DEFINITION}"
# schema 7 rebuilds a schema 5/6 history (keyed by attempt and instant; the history,
# not a table of live jobs): entries keep their order, numbered below any generation
_BEFORE_7 = '"_jaren_job_errors_before_7"'
REKEY_ERRORS = (
    f"ALTER TABLE {ERRORS} RENAME TO {_BEFORE_7}",
    f"CREATE TABLE {ERRORS} {ERRORS_DEFINITION}",
    f"""INSERT INTO {ERRORS} (job_id, generation, attempt, at, error, traceback)
  SELECT job_id, row_number() OVER (PARTITION BY job_id ORDER BY attempt, at) - 1000000000000,
    attempt, at, error, traceback FROM {_BEFORE_7}""",
    f"DROP TABLE {_BEFORE_7}",
)

CREATE_META = f"""CREATE TABLE IF NOT EXISTS {META} (
  key TEXT PRIMARY KEY, value TEXT NOT NULL)"""

READ_SCHEMA_VERSION = f"SELECT value FROM {META} WHERE key = 'schema_version'"
WRITE_SCHEMA_VERSION = f"""INSERT INTO {META} (key, value) VALUES ('schema_version', ?)
  ON CONFLICT (key) DO UPDATE SET value = excluded.value"""

TABLE_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"


def table_columns(table: str) -> str:
    # table names are the library's own constants, never input
    return f"SELECT name FROM pragma_table_info('{table}')"


# (table, column, definition): added behind a presence check, never rebuilt.
# Every default reads as "claimed before the fence existed", which no
# token can match.
ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("_jaren_jobs", "priority", "INTEGER NOT NULL DEFAULT 0"),
    ("_jaren_jobs", "lease_generation", "INTEGER NOT NULL DEFAULT 0"),
    ("_jaren_jobs", "lease_token", "TEXT"),
    # the generation whose attempt settled the row: what makes a second
    # settlement from the same attempt idempotent, and only that attempt's
    ("_jaren_jobs", "settled_generation", "INTEGER"),
    # which claim minted the row's current (or last) attempt: a digest of the
    # claim's token, kept across renewals. A generation repeats once a swept
    # id is enqueued again; this does not, so a lease of the old life is
    # never taken for the attempt that settled the new one. NULL (rows
    # claimed before it existed) matches no lease.
    ("_jaren_jobs", "claim_key", "BLOB"),
    ("_jaren_job_checkpoints", "generation", "INTEGER NOT NULL DEFAULT 0"),
    # schema 4: every job of an older schema lands in the default queue, and
    # holds no unique key
    ("_jaren_jobs", "queue", "TEXT NOT NULL DEFAULT 'default'"),
    ("_jaren_jobs", "unique_key", "TEXT"),
    # schema 6: when cancel(id, force=True) asked the running attempt to stop
    # (epoch ms); NULL: nobody asked. Older rows were never asked.
    ("_jaren_jobs", "cancel_requested_at", "INTEGER"),
    # schema 8: the enqueuing span's W3C traceparent (§17); NULL: untraced
    ("_jaren_jobs", "trace_context", "TEXT"),
)


def add_column(table: str, column: str, definition: str) -> str:
    return f'ALTER TABLE "{table}" ADD COLUMN {column} {definition}'


CREATE_INDEXES = (
    # what a claim reads: ready jobs per kind, in claim order
    f"""CREATE INDEX IF NOT EXISTS "_jaren_jobs_ready" ON {JOBS}
      (kind, priority DESC, run_at, created_at, id) WHERE state IN ('pending', 'failed')""",
    # what a rescue reads: leases by expiry
    f"""CREATE INDEX IF NOT EXISTS "_jaren_jobs_leased" ON {JOBS}
      (lease_until) WHERE state = 'leased'""",
    # what a claim filtered by queues reads: ready jobs per (queue, kind) in
    # claim order. The kind-first index above stays for the claims of every
    # queue, which would otherwise sort the backlog of each kind
    f"""CREATE INDEX IF NOT EXISTS "_jaren_jobs_ready_queue" ON {JOBS}
      (queue, kind, priority DESC, run_at, created_at, id) WHERE state IN ('pending', 'failed')""",
    # at most one job per unique key while it still counts; the database, not
    # a read before the write, is what makes this race-free. Jobs without a
    # key have no entry (they pay nothing for it)
    f"""CREATE UNIQUE INDEX IF NOT EXISTS "_jaren_jobs_unique" ON {JOBS}
      (unique_key) WHERE unique_key IS NOT NULL AND {ACTIVE}""",
)

# indexes of older schemas that the ones above replace, dropped on upgrade (schema 10:
# two whose reads others serve as fast, listing.py; every write maintained them)
DROPPED_INDEXES = (
    "_jaren_jobs_state",  # (state, kind) of every row: "_jaren_jobs_unleased" until 10
    "_jaren_jobs_settled",  # sweeps: "_jaren_jobs_state_newest", one branch per state
    "_jaren_jobs_unleased",  # counts: "_jaren_jobs_state_id" and "_jaren_jobs_ready"
)


def drop_index(name: str) -> str:
    # names are the library's own constants, never input
    return f'DROP INDEX IF EXISTS "{name}"'


# ----------------------------------------------------------------- jobs

# No conflict target: a taken id and a unique key some active job holds both
# insert nothing (the caller reads which it was); neither raises
# ENQUEUE leaves queue, unique_key and trace_context to their defaults (the common
# job binds 8 parameters); ENQUEUE_QUEUED binds all three (11).
ENQUEUE = f"""INSERT INTO {JOBS}
  (id, kind, payload, state, priority, run_at, attempts, max_attempts,
   lease_generation, created_at, updated_at)
  VALUES (?, ?, ?, 'pending', ?, ?, 0, ?, 0, ?, ?)
  ON CONFLICT DO NOTHING"""
ENQUEUE_QUEUED = f"""INSERT INTO {JOBS}
  (id, kind, payload, state, priority, run_at, attempts, max_attempts,
   lease_generation, created_at, updated_at, queue, unique_key, trace_context)
  VALUES (?, ?, ?, 'pending', ?, ?, 0, ?, 0, ?, ?, ?, ?, ?)
  ON CONFLICT DO NOTHING"""

# the job holding a unique key, if any (pinned to the unique index: the
# predicate's terms are all here)
GET_KEY_HOLDER = f"""SELECT {JOB_COLUMNS} FROM {JOBS} INDEXED BY "_jaren_jobs_unique"
  WHERE unique_key = ? AND unique_key IS NOT NULL AND {ACTIVE}"""

# whether a job with this id exists (what tells a taken id from a held key)
ID_EXISTS = f"SELECT 1 FROM {JOBS} WHERE id = ?"

# the other job holding the unique key of job ``?`` (what refuses a requeue)
REQUEUE_KEY_HOLDER = f"""SELECT other.id FROM {JOBS} AS j
  JOIN {JOBS} AS other INDEXED BY "_jaren_jobs_unique"
    ON other.unique_key = j.unique_key AND other.unique_key IS NOT NULL
    AND other.{ACTIVE} AND other.id <> j.id
  WHERE j.state IN ('dead', 'cancelled') AND j.id = ?"""


@lru_cache(maxsize=32)
def enqueue_rows(count: int, queued: bool = False) -> str:
    """ENQUEUE for ``count`` rows in one statement: ENQUEUE's 8 parameters per row, in order
    (``queued``: ENQUEUE_QUEUED's 11).

    One multi-row INSERT costs SQLite less than ``count`` executions of
    ENQUEUE. Callers use a few fixed counts, so the connection's statement
    cache keeps each one prepared. OR FAIL, for the reason the batched updates
    below give (no statement journal: it doubled the bytes a batch wrote).
    """
    if count < 1:
        raise ValueError("a multi-row insert names at least one row")
    if queued:
        values = ",\n    ".join(["(?, ?, ?, 'pending', ?, ?, 0, ?, 0, ?, ?, ?, ?, ?)"] * count)
        columns = "created_at, updated_at, queue, unique_key, trace_context"
    else:
        values = ",\n    ".join(["(?, ?, ?, 'pending', ?, ?, 0, ?, 0, ?, ?)"] * count)
        columns = "created_at, updated_at"
    return f"""INSERT OR FAIL INTO {JOBS}
  (id, kind, payload, state, priority, run_at, attempts, max_attempts,
   lease_generation, {columns})
  VALUES {values}
  ON CONFLICT DO NOTHING"""


GET_JOB = f"SELECT {READ_COLUMNS} FROM {JOBS} WHERE id = :id"

# last_error too: a worker decides its outcome from this answer alone (a row
# its own attempt failed says why); read only when a fenced write missed
FENCE_ROW = f"""SELECT state, lease_token, lease_until, lease_generation, settled_generation,
    claim_key, last_error
  FROM {JOBS} WHERE id = ?"""

_CLAIM_ORDER = "priority DESC, run_at, created_at, id"
_PROBED_KINDS = 64  # up to this many kinds, one index probe per kind


@lru_cache(maxsize=64)
def claim_next(kind_count: int, queue_count: int = 0) -> str:
    """The one-statement claim over ``kind_count`` kinds (named ``:k0`` …).

    Each kind's best ready job comes from the ``_jaren_jobs_ready`` index in
    claim order (one probe per kind, no sort of the backlog); expired leases
    come from a range of ``_jaren_jobs_leased`` (only leases already expired:
    live leases are never read). ``INDEXED BY`` pins both plans, so neither
    an application's ``ANALYZE`` nor a backlog of live leases can turn a claim
    into a scan. The claim mints the fence: a fresh token (and its claim key)
    and generation + 1.
    """
    if kind_count < 1:
        raise ValueError("a claim names at least one kind")
    return f"""UPDATE {JOBS} SET state = 'leased', lease_owner = :owner, lease_until = :until,
    lease_generation = lease_generation + 1, lease_token = :token, settled_generation = NULL,
    claim_key = :claim_key, attempts = attempts + 1, updated_at = :now
  WHERE id = (SELECT id FROM ({_claimable(kind_count, "1", queue_count)})
    ORDER BY {_CLAIM_ORDER} LIMIT 1)
  RETURNING {CLAIM_COLUMNS}"""


def _claimable(kind_count: int, limit: str, queue_count: int = 0) -> str:
    """The claimable candidates of ``kind_count`` kinds, up to ``limit`` from each branch.

    With ``queue_count`` queues (named ``:q0`` …; 0: every queue), the ready
    branches probe the queue-first index once per (queue, kind), in claim order.
    """
    kinds = ", ".join(f":k{i}" for i in range(kind_count))
    in_queues = ""
    if queue_count:
        queues = ", ".join(f":q{j}" for j in range(queue_count))
        in_queues = f" AND queue IN ({queues})"
    if queue_count and kind_count * queue_count <= _PROBED_KINDS:
        ready = "\n    UNION ALL ".join(
            f"""SELECT * FROM (SELECT rowid AS rid, id, priority, run_at, created_at
        FROM {JOBS} INDEXED BY "_jaren_jobs_ready_queue"
        WHERE state IN ('pending', 'failed') AND queue = :q{j} AND kind = :k{i}
          AND run_at <= :now
        ORDER BY {_CLAIM_ORDER} LIMIT {limit})"""
            for j in range(queue_count)
            for i in range(kind_count)
        )
    elif queue_count:
        ready = f"""SELECT * FROM (SELECT rowid AS rid, id, priority, run_at, created_at
        FROM {JOBS} INDEXED BY "_jaren_jobs_ready_queue"
        WHERE state IN ('pending', 'failed') AND queue IN ({queues}) AND kind IN ({kinds})
          AND run_at <= :now
        ORDER BY {_CLAIM_ORDER} LIMIT {limit})"""
    elif kind_count <= _PROBED_KINDS:
        ready = "\n    UNION ALL ".join(
            f"""SELECT * FROM (SELECT rowid AS rid, id, priority, run_at, created_at
        FROM {JOBS} INDEXED BY "_jaren_jobs_ready"
        WHERE state IN ('pending', 'failed') AND kind = :k{i} AND run_at <= :now
        ORDER BY {_CLAIM_ORDER} LIMIT {limit})"""
            for i in range(kind_count)
        )
    else:
        # SQLite caps a compound SELECT at 500 terms: past a few dozen kinds,
        # one IN probe of the ready index (sorting the ready rows) replaces them
        ready = f"""SELECT * FROM (SELECT rowid AS rid, id, priority, run_at, created_at
        FROM {JOBS} INDEXED BY "_jaren_jobs_ready"
        WHERE state IN ('pending', 'failed') AND kind IN ({kinds}) AND run_at <= :now
        ORDER BY {_CLAIM_ORDER} LIMIT {limit})"""
    return f"""
    {ready}
    UNION ALL SELECT * FROM (SELECT rowid AS rid, id, priority, run_at, created_at
        FROM {JOBS} INDEXED BY "_jaren_jobs_leased"
        WHERE state = 'leased' AND lease_until <= :now AND kind IN ({kinds}) AND run_at <= :now
          AND cancel_requested_at IS NULL{in_queues}
        ORDER BY {_CLAIM_ORDER} LIMIT {limit})
  """


# ----------------------------------------------------------------- batched statements
#
# A worker claims and settles dozens of jobs per transaction; these
# statements take a whole batch at once instead of one statement per row.
# The rows come as a VALUES list of numbered parameters (``?1`` … for the
# shared values, then each row's), in a few fixed sizes (powers of two, the
# last rows padded with NULLs that match nothing), so each size is prepared
# once. Two choices keep SQLite's cost per row below the one-row
# statements':
# - OR FAIL. A multi-row UPDATE that may ABORT must be able to undo itself
#   alone, so SQLite copies every page it touches into a statement journal,
#   a temp file past 64 KiB: a third of the batch's cost. None of these
#   statements can break a constraint (every NOT NULL column gets a value),
#   and OR FAIL says so. Should one fail anyway, the error rolls back the
#   caller's whole write, as every error does.
# - VALUES, not json_each(): a virtual table in the statement brings the
#   statement journal back, whatever the conflict clause.
# UPDATE … FROM needs SQLite 3.33 (RETURNING, which every claim uses, 3.35);
# older libraries run the one-row statements row by row (MULTI_ROW_UPDATES).

MULTI_ROW_UPDATES = sqlite3.sqlite_version_info >= (3, 33, 0)

BATCH_ROWS = 256  # the most rows one batched statement carries (a power of two)
# a batched settlement's fixed cost is about three one-row statements': below
# this many rows, the one-row statements are cheaper
SETTLE_MANY_MIN = 4


def batch_size(count: int) -> int:
    """The statement size that carries ``count`` rows (1 ≤ count ≤ BATCH_ROWS)."""
    return 1 << (count - 1).bit_length()


def _values(rows: int, width: int, first: int) -> str:
    numbers = iter(range(first, first + rows * width))
    return ", ".join(
        "(" + ", ".join(f"?{next(numbers)}" for _ in range(width)) + ")" for _ in range(rows)
    )


@lru_cache(maxsize=64)
def claim_candidates(kind_count: int, queue_count: int = 0) -> str:
    """Up to ``:limit`` claimable ``(rowid, id)`` of ``kind_count`` kinds, in claim order.

    The same index-pinned branches as :func:`claim_next`, each stopping after
    ``:limit`` entries; only the few candidates are sorted.
    """
    if kind_count < 1:
        raise ValueError("a claim names at least one kind")
    return f"""SELECT rid, id FROM ({_claimable(kind_count, ":limit", queue_count)})
  ORDER BY {_CLAIM_ORDER} LIMIT :limit"""


@lru_cache(maxsize=16)
def claim_rows(rows: int) -> str:
    """Mint ``rows`` leases: ``?1`` owner, ``?2`` until, ``?3`` now, then (rowid, token, key) each.

    Each row gets its own token (a token derived from a shared one would be
    guessable). Rows are found by rowid, stable inside the write transaction
    that chose them; the claimability guard is repeated, so a stale
    candidate can never take over a live lease. ``+state`` keeps the plan on
    the rowid whatever the table's statistics say (never the state index).
    """
    return f"""UPDATE OR FAIL {JOBS} SET state = 'leased', lease_owner = ?1, lease_until = ?2,
    lease_generation = lease_generation + 1, lease_token = picked.column2,
    settled_generation = NULL, claim_key = picked.column3, attempts = attempts + 1,
    updated_at = ?3
  FROM (VALUES {_values(rows, 3, 4)}) AS picked
  WHERE {JOBS}.rowid = picked.column1 AND run_at <= ?3
    AND (+state IN ('pending', 'failed')
      OR (+state = 'leased' AND lease_until <= ?3 AND cancel_requested_at IS NULL))
  RETURNING {CLAIM_COLUMNS}"""


@lru_cache(maxsize=64)
def next_ready_at(kind_count: int, queue_count: int = 0) -> str:
    """The earliest ``run_at`` of a pending or failed job of these kinds (``:k0`` …),
    in these queues (``:q0`` …; 0: every queue)."""
    kinds = ", ".join(f":k{i}" for i in range(kind_count))
    if queue_count:
        queues = ", ".join(f":q{j}" for j in range(queue_count))
        return f"""SELECT min(run_at) FROM {JOBS} INDEXED BY "_jaren_jobs_ready_queue"
  WHERE state IN ('pending', 'failed') AND queue IN ({queues}) AND kind IN ({kinds})"""
    return f"""SELECT min(run_at) FROM {JOBS} INDEXED BY "_jaren_jobs_ready"
  WHERE state IN ('pending', 'failed') AND kind IN ({kinds})"""


# the earliest lease to expire, of any kind (a bound, never later than the
# truth); a marked lease is never rescued, so its expiry is nothing to wake for
NEXT_LEASE_EXPIRY = f"""SELECT min(lease_until) FROM {JOBS} INDEXED BY "_jaren_jobs_leased"
  WHERE state = 'leased' AND cancel_requested_at IS NULL"""

RENEW = f"""UPDATE {JOBS} SET lease_until = :until, lease_token = :new_token, updated_at = :now
  WHERE id = :id AND {FENCE}
  RETURNING {JOB_COLUMNS}"""

SETTLE_DONE = f"""UPDATE {JOBS} SET state = 'done', result = :result, lease_until = NULL,
    lease_token = NULL, settled_generation = lease_generation, updated_at = :now
  WHERE id = :id AND {FENCE}"""


@lru_cache(maxsize=16)
def settle_done_rows(rows: int) -> str:
    """SETTLE_DONE for ``rows`` items: ``?1`` now, then (id, token, result text) each.

    Each item is fenced by its own token; RETURNING names the rows settled,
    the rest are diagnosed one by one. Ids must be distinct (a row matched
    twice is updated once, by either item). ``+state`` keeps the plan on the
    primary key whatever the table's statistics say: the fence's state term
    must never turn it into a read of every lease through the state or lease index.
    """
    return f"""UPDATE OR FAIL {JOBS} SET state = 'done', result = item.column3,
    lease_until = NULL, lease_token = NULL, settled_generation = lease_generation,
    updated_at = ?1
  FROM (VALUES {_values(rows, 3, 2)}) AS item
  WHERE {JOBS}.id = item.column1 AND +state = 'leased' AND lease_token = item.column2
    AND lease_until > ?1
  RETURNING id"""


# A failure, snooze or hand-back of a job marked by cancel(id, force=True) ends it
# cancelled: the operator asked for it to stop, so it is never retried (a
# completion is not touched: done stands)
_UNLESS_MARKED = "CASE WHEN cancel_requested_at IS NULL THEN '{}' ELSE 'cancelled' END"
_PENDING_UNLESS_MARKED = _UNLESS_MARKED.format("pending")
_FAILED_UNLESS_MARKED = _UNLESS_MARKED.format("failed")
_DEAD_UNLESS_MARKED = _UNLESS_MARKED.format("dead")

# A release hands back a lease whose attempt never started (a worker that
# prefetched more than it could run before stopping): the job is pending
# again at once, without waiting out the lease, and the claim's attempt is
# undone, since none was spent. The generation stays, so the released lease
# stays superseded: it can settle nothing, and the next claim moves on.
# run_at is kept: the job keeps its place in claim order. A job a forced
# cancel marked is cancelled instead: it must never run again.
RELEASE_LEASE = f"""UPDATE {JOBS} SET state = {_PENDING_UNLESS_MARKED}, lease_until = NULL,
    lease_token = NULL, lease_owner = NULL, attempts = attempts - 1, settled_generation = NULL,
    updated_at = :now
  WHERE id = :id AND {FENCE}"""


@lru_cache(maxsize=16)
def release_rows(rows: int) -> str:
    """RELEASE_LEASE for ``rows`` leases: ``?1`` now, then (id, token) each, pairs distinct."""
    return f"""UPDATE OR FAIL {JOBS} SET state = {_PENDING_UNLESS_MARKED}, lease_until = NULL,
    lease_token = NULL, lease_owner = NULL, attempts = attempts - 1,
    settled_generation = NULL, updated_at = ?1
  FROM (VALUES {_values(rows, 2, 2)}) AS held
  WHERE {JOBS}.id = held.column1 AND +state = 'leased' AND lease_token = held.column2
    AND lease_until > ?1"""


# A snooze (SPEC §12) is a settlement that spends no attempt: the job is
# pending again at :run_at with the claim's attempt given back, its lease
# cleared. The generation stays (the snoozed lease stays refused) and the row
# records which attempt settled it, so that attempt's repeat is idempotent.
SETTLE_SNOOZE = f"""UPDATE {JOBS} SET state = {_PENDING_UNLESS_MARKED}, run_at = :run_at,
    lease_until = NULL, lease_token = NULL, lease_owner = NULL, attempts = attempts - 1,
    settled_generation = lease_generation, updated_at = :now
  WHERE id = :id AND {FENCE}"""

# the held row's counts, and whether cancel(id, force=True) marked it (its failure then
# writes ``cancelled``)
READ_ATTEMPTS = (
    f"SELECT attempts, max_attempts, cancel_requested_at FROM {JOBS} WHERE id = :id AND {FENCE}"
)

SETTLE_RETRY = f"""UPDATE {JOBS} SET state = {_FAILED_UNLESS_MARKED}, last_error = :error,
    run_at = :run_at, lease_until = NULL, lease_token = NULL, settled_generation = lease_generation,
    updated_at = :now
  WHERE id = :id AND {FENCE}"""

SETTLE_DEAD = f"""UPDATE {JOBS} SET state = {_DEAD_UNLESS_MARKED}, last_error = :error,
    lease_until = NULL, lease_token = NULL, settled_generation = lease_generation, updated_at = :now
  WHERE id = :id AND {FENCE}"""

CANCEL_QUEUED = f"""UPDATE {JOBS} SET state = 'cancelled', last_error = 'cancelled',
    lease_until = NULL, lease_token = NULL, updated_at = :now
  WHERE id = :id AND state IN ('pending', 'failed')"""

# cancel(id, force=True) of a job no live attempt holds: queued, or leased
# with a lease that ran out (unmarked; a marked one is cancelled already). An
# expired lease's attempt settled nothing: settled_generation stays NULL, so
# that attempt's late call is refused as JobSettled, never taken as its own.
CANCEL_NOW = f"""UPDATE {JOBS} SET state = 'cancelled', last_error = 'cancelled',
    lease_until = NULL, lease_token = NULL, updated_at = :now,
    settled_generation = CASE WHEN state = 'leased' THEN NULL ELSE settled_generation END
  WHERE id = :id AND (state IN ('pending', 'failed')
    OR (state = 'leased' AND lease_until <= :now AND cancel_requested_at IS NULL))"""

# cancel(id, force=True) of a live lease: the mark, once (a second call
# finds it set and changes nothing). The renewal of the holding attempt reads
# it back (RENEW returns the row) and aborts that attempt's signal.
MARK_CANCEL = f"""UPDATE {JOBS} SET cancel_requested_at = :now, updated_at = :now
  WHERE id = :id AND state = 'leased' AND lease_until > :now AND cancel_requested_at IS NULL"""

# A marked job whose lease ran out becomes the cancelled row it effectively
# is, when a write meets it: aged from its lease's expiry (updated_at), so a
# sweep treats it as settled then; settled by no attempt (NULL generation)
_MATERIALISE = """SET state = 'cancelled', last_error = 'cancelled', updated_at = lease_until,
    lease_until = NULL, lease_token = NULL, settled_generation = NULL"""
MATERIALISE_ONE = f"""UPDATE {JOBS} {_MATERIALISE}
  WHERE id = :id AND {MARKED_EXPIRED}"""
MATERIALISE_ALL = f"""UPDATE {JOBS} INDEXED BY "_jaren_jobs_leased" {_MATERIALISE}
  WHERE {MARKED_EXPIRED}"""

CANCEL_LEASED = f"""UPDATE {JOBS} SET state = 'cancelled', last_error = 'cancelled',
    lease_until = NULL, lease_token = NULL, settled_generation = lease_generation,
    updated_at = :now
  WHERE id = :id AND {FENCE}"""

# requeue keeps attempts unless :reset asks for fresh ones, and always the generation
# (checkpoints are stamped with it; the next claim raises it, so no older lease can
# settle the row again); it clears the lease until the next claim mints a new one
REQUEUE = f"""UPDATE {JOBS} SET state = 'pending', run_at = :now, lease_until = NULL,
    lease_token = NULL, lease_owner = NULL, updated_at = :now, cancel_requested_at = NULL,
    attempts = CASE WHEN :reset THEN 0 ELSE attempts END
  WHERE id = :id AND (state IN ('failed', 'dead', 'cancelled')
    OR (state = 'leased' AND lease_until <= :now))
    AND (unique_key IS NULL OR state IN ('failed', 'leased') OR NOT EXISTS (
      SELECT 1 FROM {JOBS} AS other INDEXED BY "_jaren_jobs_unique"
      WHERE other.unique_key = {JOBS}.unique_key AND other.unique_key IS NOT NULL
        AND other.{ACTIVE}))"""

# run_now(): a queued job waiting on its run_at (a delay, a retry's backoff) is due now
RUN_NOW = f"""UPDATE {JOBS} SET run_at = :now, updated_at = :now
  WHERE id = :id AND state IN ('pending', 'failed') AND run_at > :now"""
# the history entry of a failure just written under the fence (same transaction)
INSERT_ERROR = f"""INSERT INTO {ERRORS} (job_id, generation, attempt, at, error, traceback)
  VALUES (:id, :generation, :attempt, :now, :error, :traceback)
  ON CONFLICT (job_id, generation) DO NOTHING"""

# ----------------------------------------------------------------- checkpoints

CHECKPOINT_LOAD = f"""SELECT node_id, value FROM {CHECKPOINTS}
  WHERE run_id = :run_id AND generation <= :generation"""

CHECKPOINT_FENCE = f"SELECT 1 FROM {JOBS} WHERE id = :id AND {FENCE}"

CHECKPOINT_SAVE = f"""INSERT INTO {CHECKPOINTS} (run_id, node_id, value, generation)
  VALUES (:run_id, :node_id, :value, :generation)
  ON CONFLICT (run_id, node_id) DO UPDATE
    SET value = excluded.value, generation = excluded.generation"""

CHECKPOINT_PRUNE = f"""DELETE FROM {CHECKPOINTS}
  WHERE run_id = :run_id AND generation <= :generation"""

# requeue(drop_checkpoints=True): every generation, so the run starts over
CHECKPOINT_DROP_RUN = f"DELETE FROM {CHECKPOINTS} WHERE run_id = :run_id"

# ----------------------------------------------------------------- connection

READ_JOURNAL_MODE = "PRAGMA main.journal_mode"
# "UTF-8", "UTF-16le" or "UTF-16be": the bytes CAST(text AS BLOB) hands back
READ_ENCODING = "PRAGMA encoding"
SET_WAL = "PRAGMA main.journal_mode = WAL"
DATA_VERSION = "PRAGMA data_version"


@lru_cache(maxsize=8)
def pragma_busy_timeout(milliseconds: int) -> str:
    return f"PRAGMA busy_timeout = {int(milliseconds)}"


def pragma_synchronous(durability: str) -> str:
    return "PRAGMA synchronous = " + ("FULL" if durability == "full" else "NORMAL")


# ----------------------------------------------------------------- transactions

BEGIN_IMMEDIATE = "BEGIN IMMEDIATE"
BEGIN_DEFERRED = "BEGIN"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"


def savepoint(name: str) -> str:
    return f'SAVEPOINT "{name}"'


def release_savepoint(name: str) -> str:
    return f'RELEASE SAVEPOINT "{name}"'


def rollback_to_savepoint(name: str) -> str:
    return f'ROLLBACK TO SAVEPOINT "{name}"'
