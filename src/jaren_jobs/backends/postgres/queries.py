"""Every SQL statement jaren_jobs runs on PostgreSQL, named, in one place (with
:mod:`.listing`, the operator's reads over many rows: counts, pages, buckets).

The texts here name the tables unqualified; the store runs each one with
every table qualified by the schema it resolved at open (:func:`qualified`,
applied by ``PgDatabase.run``), so a schema that appears on ``search_path``
later never moves it. User input is always a bound parameter (psycopg's
``%(name)s``), never text; the few statements whose text depends on a
*count* (how many kinds a claim names) are built here from that count alone.
"""

from __future__ import annotations

from functools import lru_cache

JOBS = '"_jaren_jobs"'
CHECKPOINTS = '"_jaren_job_checkpoints"'
ERRORS = '"_jaren_job_errors"'
META = '"_jaren_meta"'

# same order as the SQLite backend's: the row mappers index by position
JOB_COLUMNS = (
    "id, kind, payload, state, priority, attempts, max_attempts, run_at, "
    "lease_until, lease_owner, lease_generation, last_error, result, created_at, "
    "updated_at, lease_token, queue, unique_key, cancel_requested_at"
)
# what a claim returns: JOB_COLUMNS, then the trace context its attempt's span joins
CLAIM_COLUMNS = f"{JOB_COLUMNS}, trace_context"

# A leased job marked by cancel(id, force=True) whose lease has run out is
# cancelled: no live holder can settle it any more, and no claim rescues it.
# The row says 'leased' until a write meets it (MATERIALISE_*); every read
# shows the state it effectively is, as of the bound now.
MARKED_EXPIRED = "state = 'leased' AND cancel_requested_at IS NOT NULL AND lease_until <= %(now)s"
EFFECTIVE_STATE = f"CASE WHEN {MARKED_EXPIRED} THEN 'cancelled' ELSE state END"
# JOB_COLUMNS as a read shows them: the effective state in the state's place
READ_COLUMNS = JOB_COLUMNS.replace(", state, ", f", {EFFECTIVE_STATE}, ", 1)
# the states in which a job holds its unique_key: the unique index's predicate
ACTIVE = "state IN ('pending', 'failed', 'leased')"
FENCE_COLUMNS = (
    "state, lease_token, lease_until, lease_generation, settled_generation, claim_key, last_error"
)

FENCE = "state = 'leased' AND lease_token = %(token)s AND lease_until > %(now)s"

# ----------------------------------------------------------------- schema

CREATE_META = f"""CREATE TABLE IF NOT EXISTS {META} (key text PRIMARY KEY, value text NOT NULL)"""
READ_SCHEMA_VERSION = f"SELECT value FROM {META} WHERE key = 'schema_version'"
WRITE_SCHEMA_VERSION = f"""INSERT INTO {META} (key, value) VALUES ('schema_version', %(v)s)
  ON CONFLICT (key) DO UPDATE SET value = excluded.value"""
# one lock per schema: processes opening different schemas never wait on each other
MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('jaren_jobs:' || %(schema)s, 0))"
# The schema a store keeps for good: the first schema on search_path that holds the
# tables already, else the first one (where they will be created). A schema that
# appears earlier on the path later (a role-named one, with "$user" first) then
# strands no queued job: a new store finds the tables where they are.
RESOLVE_SCHEMA = """SELECT coalesce(
  (SELECT p.name FROM unnest(current_schemas(false)) WITH ORDINALITY AS p(name, n)
    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_class c
      JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
      WHERE ns.nspname = p.name AND c.relname = '_jaren_meta')
    ORDER BY p.n LIMIT 1),
  current_schema())"""
TABLE_EXISTS = """SELECT 1 FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
  WHERE ns.nspname = %(schema)s AND c.relname = %(name)s"""

TABLES = (JOBS, CHECKPOINTS, ERRORS, META)


def qualified(statement: str, schema: str) -> str:
    """``statement`` with every table of the library named in ``schema`` (an identifier
    from the server, quoted here: no text of a caller's)."""
    quoted = '"' + schema.replace('"', '""') + '"'
    for table in TABLES:
        statement = statement.replace(table, f"{quoted}.{table}")
    return statement


# ----------------------------------------------------------------- jobs

# No conflict target: a taken id, and a unique key an active job holds, both
# insert nothing. ON CONFLICT never raises, so it never aborts the
# application's transaction.
ENQUEUE = f"""INSERT INTO {JOBS}
  (id, kind, payload, state, priority, run_at, attempts, max_attempts,
   lease_generation, created_at, updated_at, queue, unique_key, trace_context)
  VALUES (%s, %s, %s, 'pending', %s, %s, 0, %s, 0, %s, %s, %s, %s, %s)
  ON CONFLICT DO NOTHING"""

# A lone enqueue and its NOTIFY in one statement (one round trip; at the root, in
# autocommit, its own transaction): a row back, and the notification, only when the
# row went in (RETURNING runs per inserted row); delivered with the commit, as ever.
# RETURNING, not a CTE counting the insert: the CTE's plan cost the server about 15 µs
# per enqueue, the NOTIFY itself a few.
ENQUEUE_NOTIFY = f"{ENQUEUE} RETURNING pg_notify(%s, '') IS NULL"

# An enqueue with a unique key, in one round trip: whether it inserted,
# whether the id was taken already, and the job holding the key (all from
# the statement's snapshot, which does not see its own insert). A holder that
# committed while the insert waited on it is not in that snapshot: the
# caller then reads it with a statement of its own (GET_KEY_HOLDER).
ENQUEUE_UNIQUE = f"""WITH ins AS (INSERT INTO {JOBS}
    (id, kind, payload, state, priority, run_at, attempts, max_attempts,
     lease_generation, created_at, updated_at, queue, unique_key, trace_context)
    VALUES (%(id)s, %(kind)s, %(payload)s, 'pending', %(priority)s, %(run_at)s, 0,
      %(max_attempts)s, 0, %(now)s, %(now)s, %(queue)s, %(key)s, %(trace)s)
    ON CONFLICT DO NOTHING RETURNING 1)
SELECT (SELECT count(*) FROM ins), EXISTS (SELECT 1 FROM {JOBS} WHERE id = %(id)s), h.*
  FROM (SELECT 1) AS one LEFT JOIN (SELECT {JOB_COLUMNS} FROM {JOBS}
    WHERE unique_key = %(key)s AND unique_key IS NOT NULL AND {ACTIVE}) AS h ON true"""

GET_KEY_HOLDER = f"""SELECT {JOB_COLUMNS} FROM {JOBS}
  WHERE unique_key = %s AND unique_key IS NOT NULL AND {ACTIVE}"""

ID_EXISTS = f"SELECT 1 FROM {JOBS} WHERE id = %s"

# the other job holding the unique key of job ``%s`` (what refuses a requeue)
REQUEUE_KEY_HOLDER = f"""SELECT other.id FROM {JOBS} AS j
  JOIN {JOBS} AS other ON other.unique_key = j.unique_key AND other.unique_key IS NOT NULL
    AND other.{ACTIVE} AND other.id <> j.id
  WHERE j.state IN ('dead', 'cancelled') AND j.id = %s"""

# a batch in one statement: arrays, one element per job, sent in binary (psycopg's text
# format quotes each element, by a regular expression: most of the batch's dump time)
ENQUEUE_MANY = f"""INSERT INTO {JOBS}
  (id, kind, payload, state, priority, run_at, attempts, max_attempts,
   lease_generation, created_at, updated_at, queue, unique_key, trace_context)
  SELECT i, k, p, 'pending', pr, r, 0, m, 0, %(now)s, %(now)s, q, u, tc
  FROM unnest(%(ids)b::text[], %(kinds)b::text[], %(payloads)b::text[],
              %(priorities)b::bigint[], %(run_ats)b::bigint[], %(maxes)b::bigint[],
              %(queues)b::text[], %(keys)b::text[], %(traces)b::text[])
    AS t(i, k, p, pr, r, m, q, u, tc)
  ON CONFLICT DO NOTHING"""

# The batch and its NOTIFY in one statement, all or nothing: a row skipped (its id
# taken) fails the statement, so that nothing of the batch is written (the caller then
# replays it one by one, which names the taken id). The failure is a cast no input of
# ours can provoke: ``22P02`` with SKIPPED_MARK in its message. The NOTIFY only when
# ``%(due)s``: some job of the batch is due now.
SKIPPED_MARK = "jaren_jobs: a batch row was skipped"
ENQUEUE_MANY_NOTIFY = f"""WITH ins AS ({ENQUEUE_MANY} RETURNING 1),
  n AS (SELECT count(*) AS c FROM ins)
SELECT CASE WHEN n.c = %(count)s THEN n.c
    ELSE ('{SKIPPED_MARK}: ' || n.c)::bigint END,
  CASE WHEN %(due)s THEN pg_notify(%(channel)s, '') END IS NULL
  FROM n"""

NOTIFY = "SELECT pg_notify(%(channel)s, '')"

GET_JOB = f"SELECT {READ_COLUMNS} FROM {JOBS} WHERE id = %(id)s"

FENCE_ROW = f"SELECT {FENCE_COLUMNS} FROM {JOBS} WHERE id = %s"

_CLAIM_ORDER = "priority DESC, run_at, created_at, id"
_PROBED_KINDS = 32  # up to this many kinds, one index scan per kind


@lru_cache(maxsize=64)
def claim_lock(kind_count: int, queue_count: int = 0) -> str:
    """Lock up to ``%(limit)s`` claimable jobs of ``kind_count`` kinds (``%(k0)s`` …).

    Each branch walks an index in claim order and skips rows another
    transaction holds (``FOR UPDATE SKIP LOCKED``), so concurrent claimers
    never wait on each other and never take the same job; the expired-lease
    branch is the rescue of crashed workers' jobs, folded into every claim.
    A branch may lock a few rows the final ``LIMIT`` leaves out: they stay
    untouched and are released at commit.
    """
    if kind_count < 1:
        raise ValueError("a claim names at least one kind")
    kinds = ", ".join(f"%(k{i})s" for i in range(kind_count))
    columns = "id, priority, run_at, created_at"
    in_queues = ""
    if queue_count:
        queues = ", ".join(f"%(q{j})s" for j in range(queue_count))
        in_queues = f" AND queue IN ({queues})"
    if queue_count and kind_count * queue_count <= _PROBED_KINDS:
        # one walk of the queue-first index per (queue, kind), in claim order
        ready = [
            f"""r{j * kind_count + i} AS (SELECT {columns} FROM {JOBS}
      WHERE state IN ('pending', 'failed') AND queue = %(q{j})s AND kind = %(k{i})s
        AND run_at <= %(now)s
      ORDER BY {_CLAIM_ORDER} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"""
            for j in range(queue_count)
            for i in range(kind_count)
        ]
    elif queue_count:
        ready = [
            f"""r0 AS (SELECT {columns} FROM {JOBS}
      WHERE state IN ('pending', 'failed') AND queue IN ({queues}) AND kind IN ({kinds})
        AND run_at <= %(now)s
      ORDER BY {_CLAIM_ORDER} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"""
        ]
    elif kind_count <= _PROBED_KINDS:
        ready = [
            f"""r{i} AS (SELECT {columns} FROM {JOBS}
      WHERE state IN ('pending', 'failed') AND kind = %(k{i})s AND run_at <= %(now)s
      ORDER BY {_CLAIM_ORDER} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"""
            for i in range(kind_count)
        ]
    else:
        ready = [
            f"""r0 AS (SELECT {columns} FROM {JOBS}
      WHERE state IN ('pending', 'failed') AND kind IN ({kinds}) AND run_at <= %(now)s
      ORDER BY {_CLAIM_ORDER} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"""
        ]
    rescue = f"""rescue AS (SELECT {columns} FROM {JOBS}
      WHERE state = 'leased' AND lease_until <= %(now)s AND kind IN ({kinds})
        AND run_at <= %(now)s AND cancel_requested_at IS NULL{in_queues}
      ORDER BY {_CLAIM_ORDER} LIMIT %(limit)s FOR UPDATE SKIP LOCKED)"""
    names = [f"r{i}" for i in range(len(ready))] + ["rescue"]
    union = " UNION ALL ".join(f"SELECT * FROM {name}" for name in names)
    # each row's place in claim order comes along (the one-statement claim's pairing of
    # rows and tokens); computed before the LIMIT, in the same order, so it counts 1..
    return f"""WITH {", ".join([*ready, rescue])}
SELECT id, row_number() OVER (ORDER BY {_CLAIM_ORDER}) AS n
  FROM ({union}) AS c ORDER BY {_CLAIM_ORDER} LIMIT %(limit)s"""


def _qualified(alias: str, columns: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


def _mint(locked: str, source: str, token: str, key: str) -> str:
    # the leases of the rows ``locked`` placed (claim_lock), each taking the token and
    # claim key ``source`` gives it; the answer says each row's place in claim order
    return f"""WITH placed AS ({locked})
UPDATE {JOBS} AS j SET state = 'leased', lease_owner = %(owner)s,
    lease_until = %(until)s, lease_generation = j.lease_generation + 1, lease_token = {token},
    settled_generation = NULL, claim_key = {key}, attempts = j.attempts + 1,
    updated_at = %(now)s
  FROM {source}
  WHERE j.id = placed.id
  RETURNING {_qualified("j", CLAIM_COLUMNS)}, placed.n"""


# A claim in ONE statement: lock up to %(limit)s rows (claim_lock) and mint their leases,
# the n-th row in claim order taking the n-th of the tokens (and claim keys) the caller
# minted, at least as many as the limit; the answer says each row's place in that order.
@lru_cache(maxsize=64)
def claim(kind_count: int, queue_count: int = 0) -> str:
    """:func:`claim_lock` and :data:`CLAIM_ROWS` as one statement."""
    source = """placed JOIN unnest(%(tokens)b::text[], %(keys)b::bytea[]) WITH ORDINALITY
    AS p(token, key, n) ON p.n = placed.n"""
    return _mint(claim_lock(kind_count, queue_count), source, "p.token", "p.key")


# A claim of ONE job in one statement: claim() with its token and claim key as plain
# parameters, not arrays (psycopg dumps a list parameter at several times a scalar's
# client cost, which a lone claim would pay for one element).
@lru_cache(maxsize=64)
def claim_single(kind_count: int, queue_count: int = 0) -> str:
    """:func:`claim` of at most one job (``%(limit)s`` is 1), leased with ``%(token)s``
    and ``%(key)s``."""
    return _mint(claim_lock(kind_count, queue_count), "placed", "%(token)s", "%(key)s")


# Mint the leases of the locked rows: one token (and its claim key) each.
CLAIM_ROWS = f"""UPDATE {JOBS} AS j SET state = 'leased', lease_owner = %(owner)s,
    lease_until = %(until)s, lease_generation = j.lease_generation + 1, lease_token = p.token,
    settled_generation = NULL, claim_key = p.key, attempts = j.attempts + 1,
    updated_at = %(now)s
  FROM unnest(%(ids)b::text[], %(tokens)b::text[], %(keys)b::bytea[]) AS p(id, token, key)
  WHERE j.id = p.id
  RETURNING {_qualified("j", CLAIM_COLUMNS)}"""


def _fence_on(alias: str, token: str = "%(token)s") -> str:
    """:data:`FENCE` on the row named ``alias``."""
    return (
        f"{alias}.state = 'leased' AND {alias}.lease_token = {token} "
        f"AND {alias}.lease_until > %(now)s"
    )


# A fenced write and the job's fence row in ONE round trip. ``cur`` locks the
# row first: a locking read sees its latest committed version, even after
# waiting out another transaction's lock, so a refusal is named from the row
# the write met, never from an older snapshot. The write joins ``cur``, so it
# runs after the lock, guarded on the locked row and on the row it updates.
# The answer: ``(written, <returning>..., fence columns...)``, the fence
# columns all NULL when there is no such job.
# the row as the fenced write meets it (locked), and last whether cancel(id, force=True)
# marked it: a failure or snooze of a marked job writes ``cancelled`` (fence_row_of reads
# the fence columns only)
_CUR = (
    f"cur AS (SELECT {FENCE_COLUMNS}, cancel_requested_at AS marked_at FROM {JOBS} "
    "WHERE id = %(id)s FOR UPDATE)"
)
_ANSWER = "FROM (SELECT 1) AS one LEFT JOIN cur ON true"
# the same one-row start that also sends the settlement NOTIFY (SPEC §12's
# wait() in other processes): folded into a statement the settlement runs
# anyway, so it costs no round trip; delivered with the commit, and many
# identical notifications of one transaction are delivered once
_ANSWER_NOTIFY = "FROM (SELECT pg_notify(%(settled)s, '')) AS one LEFT JOIN cur ON true"


def fenced(
    assignments: str,
    *,
    guard: str = "",
    returning: str | None = None,
    notify: bool = False,
    also: str = "",
) -> str:
    """``UPDATE … SET assignments`` of job ``%(id)s`` under the fence (and ``guard``),
    answering whether it wrote, ``returning``'s columns (if any), then the fence row.

    ``notify``: the statement also sends ``NOTIFY`` on the ``%(settled)s`` channel.
    ``also``: more CTEs after ``written`` (which they may read), run by the
    same statement (no ``returning`` then)."""
    written = "(SELECT count(*) FROM written)"
    answer = _ANSWER_NOTIFY if notify else _ANSWER
    if returning is None:
        return f"""WITH {_CUR},
  written AS (UPDATE {JOBS} AS j SET {assignments}
    FROM cur WHERE j.id = %(id)s AND {_fence_on("cur")} AND {_fence_on("j")}{guard}
    RETURNING 1){also}
SELECT {written}, cur.* {answer}"""
    assert not also
    return f"""WITH {_CUR},
  written AS (UPDATE {JOBS} AS j SET {assignments}
    FROM cur WHERE j.id = %(id)s AND {_fence_on("cur")} AND {_fence_on("j")}{guard}
    RETURNING {returning})
SELECT {written}, w.*, cur.* {answer} LEFT JOIN written AS w ON true"""


RENEW = fenced(
    "lease_until = %(until)s, lease_token = %(new_token)s, updated_at = %(now)s",
    returning=_qualified("j", JOB_COLUMNS),
)

_DONE = (
    "state = 'done', result = %(result)s, lease_until = NULL, lease_token = NULL, "
    "settled_generation = j.lease_generation, updated_at = %(now)s"
)
SETTLE_DONE = fenced(_DONE)
SETTLE_DONE_NOTIFY = fenced(_DONE, notify=True)


# Many completions of distinct jobs in one statement: every row locked (in id
# order, so overlapping batches never deadlock), each guarded by its own
# token; per item, whether it was written and its fence row.
def _settle_done_many(notify: bool) -> str:
    note = ",\n  note AS MATERIALIZED (SELECT pg_notify(%(settled)s, '') AS sent)" if notify else ""
    join = " CROSS JOIN note" if notify else ""
    return f"""WITH item AS (
    SELECT * FROM unnest(%(ids)b::text[], %(tokens)b::text[], %(results)b::text[])
      AS i(id, token, result)),
  cur AS (SELECT j.id, {_qualified("j", FENCE_COLUMNS)} FROM {JOBS} AS j
    WHERE j.id = ANY(%(ids)b::text[]) ORDER BY j.id FOR UPDATE),
  written AS (UPDATE {JOBS} AS j SET state = 'done', result = item.result,
      lease_until = NULL, lease_token = NULL, settled_generation = j.lease_generation,
      updated_at = %(now)s
    FROM item, cur
    WHERE j.id = item.id AND cur.id = item.id
      AND {_fence_on("cur", "item.token")} AND {_fence_on("j", "item.token")}
    RETURNING j.id){note}
SELECT item.id, written.id IS NOT NULL, {_qualified("cur", FENCE_COLUMNS)}
  FROM item{join} LEFT JOIN cur ON cur.id = item.id LEFT JOIN written ON written.id = item.id"""


SETTLE_DONE_MANY = _settle_done_many(False)
SETTLE_DONE_MANY_NOTIFY = _settle_done_many(True)

# A failure in one statement: a retry (``failed``, run_at the backoff's) while
# attempts remain and ``%(retry)s``, else the dead letter — the transition of
# core.policy.failure_transition, on the row's own counts. ``%(attempts)s`` is
# the attempt whose backoff ``%(run_at)s`` was computed for (the lease's);
# a row that says otherwise is not written here (the caller reads it and
# writes by the row's own count).
_FAIL = (
    "state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' "
    "WHEN %(retry)s AND j.attempts < j.max_attempts THEN 'failed' ELSE 'dead' END, "
    "run_at = CASE WHEN j.cancel_requested_at IS NULL AND %(retry)s "
    "AND j.attempts < j.max_attempts THEN %(run_at)s "
    "ELSE j.run_at END, "
    "last_error = %(error)s, lease_until = NULL, lease_token = NULL, "
    "settled_generation = j.lease_generation, updated_at = %(now)s"
)
# the attempt's error history entry (SPEC §13), in the failure's own statement:
# a row exactly when the failure was written
_FAIL_HISTORY = f""",
  history AS (INSERT INTO {ERRORS} (job_id, generation, attempt, at, error, traceback)
    SELECT %(id)s, %(generation)s, %(attempts)s, %(now)s, %(error)s, %(traceback)s
    FROM written
    ON CONFLICT (job_id, generation) DO NOTHING)"""
FAIL = fenced(_FAIL, guard=" AND j.attempts = %(attempts)s", also=_FAIL_HISTORY)
FAIL_NOTIFY = fenced(_FAIL, guard=" AND j.attempts = %(attempts)s", notify=True, also=_FAIL_HISTORY)
# the history entry of the fallback's SETTLE_RETRY / SETTLE_DEAD (same transaction)
INSERT_ERROR = f"""INSERT INTO {ERRORS} (job_id, generation, attempt, at, error, traceback)
  VALUES (%(id)s, %(generation)s, %(attempt)s, %(now)s, %(error)s, %(traceback)s)
  ON CONFLICT (job_id, generation) DO NOTHING"""
JOB_EXISTS = f"SELECT 1 FROM {JOBS} WHERE id = %s"
# keyed and ordered by the attempt's lease generation, which every claim mints anew:
# attempt numbers repeat after requeue(reset_attempts=True), and instants repeat
READ_ERRORS = f"""SELECT attempt, at, error, traceback FROM {ERRORS}
  WHERE job_id = %s ORDER BY generation"""

# A failure or a snooze of a job marked by cancel(id, force=True) ends it
# cancelled: the operator asked for it to stop, so it is never retried (a
# completion is not touched: done stands)
_UNLESS_MARKED = "CASE WHEN cancel_requested_at IS NULL THEN '{}' ELSE 'cancelled' END"
_PENDING_UNLESS_MARKED = _UNLESS_MARKED.format("pending")
_FAILED_UNLESS_MARKED = _UNLESS_MARKED.format("failed")
_DEAD_UNLESS_MARKED = _UNLESS_MARKED.format("dead")

# A snooze (SPEC §12): pending again at now + delay, the claim's attempt given
# back, the lease cleared; the generation stays (the snoozed lease stays
# refused) and the row records which attempt settled it (a repeat is idempotent)
SNOOZE = fenced(
    f"state = {_PENDING_UNLESS_MARKED}, run_at = %(run_at)s, lease_until = NULL, "
    "lease_token = NULL, "
    "lease_owner = NULL, attempts = j.attempts - 1, settled_generation = j.lease_generation, "
    "updated_at = %(now)s"
)

# the fallback of FAIL for a lease whose attempt number is not its row's
READ_ATTEMPTS = f"""SELECT attempts, max_attempts FROM {JOBS}
  WHERE id = %(id)s AND {FENCE} FOR UPDATE"""

SETTLE_RETRY = f"""UPDATE {JOBS} SET state = {_FAILED_UNLESS_MARKED}, last_error = %(error)s,
    run_at = %(run_at)s, lease_until = NULL, lease_token = NULL,
    settled_generation = lease_generation, updated_at = %(now)s
  WHERE id = %(id)s AND {FENCE}"""

SETTLE_DEAD = f"""UPDATE {JOBS} SET state = {_DEAD_UNLESS_MARKED}, last_error = %(error)s,
    lease_until = NULL, lease_token = NULL, settled_generation = lease_generation,
    updated_at = %(now)s
  WHERE id = %(id)s AND {FENCE}"""

# a hand-back of a job a forced cancel marked cancels it: it must never run again
RELEASE_LEASES = f"""UPDATE {JOBS} AS j SET state = {_PENDING_UNLESS_MARKED}, lease_until = NULL,
    lease_token = NULL, lease_owner = NULL, attempts = j.attempts - 1,
    settled_generation = NULL, updated_at = %(now)s
  FROM unnest(%(ids)b::text[], %(tokens)b::text[]) AS h(id, token)
  WHERE j.id = h.id AND j.state = 'leased' AND j.lease_token = h.token
    AND j.lease_until > %(now)s"""

CANCEL_QUEUED = f"""UPDATE {JOBS} SET state = 'cancelled', last_error = 'cancelled',
    lease_until = NULL, lease_token = NULL, updated_at = %(now)s
  WHERE id = %(id)s AND state IN ('pending', 'failed')"""

# cancel(id, force=True) of a job no live attempt holds: queued, or leased
# with a lease that ran out (unmarked; a marked one is cancelled already). An
# expired lease's attempt settled nothing: settled_generation stays NULL, so
# that attempt's late call is refused as JobSettled, never taken as its own.
CANCEL_NOW = f"""UPDATE {JOBS} SET state = 'cancelled', last_error = 'cancelled',
    lease_until = NULL, lease_token = NULL, updated_at = %(now)s,
    settled_generation = CASE WHEN state = 'leased' THEN NULL ELSE settled_generation END
  WHERE id = %(id)s AND (state IN ('pending', 'failed')
    OR (state = 'leased' AND lease_until <= %(now)s AND cancel_requested_at IS NULL))"""

# cancel(id, force=True) of a live lease: the mark, once (a second call finds
# it set and changes nothing); then NOTIFY_CANCEL names the job, delivered with
# the commit: the holder's listener renews at once, and the renewal (RENEW
# returns the row) reads the mark back and aborts the attempt's signal
MARK_CANCEL = f"""UPDATE {JOBS} SET cancel_requested_at = %(now)s, updated_at = %(now)s
  WHERE id = %(id)s AND state = 'leased' AND lease_until > %(now)s
    AND cancel_requested_at IS NULL"""
NOTIFY_CANCEL = "SELECT pg_notify(%(channel)s, %(id)s)"

# A marked job whose lease ran out becomes the cancelled row it effectively
# is, when a write meets it: aged from its lease's expiry (updated_at), so a
# sweep treats it as settled then; settled by no attempt (NULL generation)
_MATERIALISE = """SET state = 'cancelled', last_error = 'cancelled', updated_at = lease_until,
    lease_until = NULL, lease_token = NULL, settled_generation = NULL"""
MATERIALISE_ONE = f"UPDATE {JOBS} {_MATERIALISE} WHERE id = %(id)s AND {MARKED_EXPIRED}"
MATERIALISE_ALL = f"UPDATE {JOBS} {_MATERIALISE} WHERE {MARKED_EXPIRED}"

CANCEL_LEASED = fenced(
    "state = 'cancelled', last_error = 'cancelled', lease_until = NULL, lease_token = NULL, "
    "settled_generation = j.lease_generation, updated_at = %(now)s",
    notify=True,
)

REQUEUE = f"""UPDATE {JOBS} SET state = 'pending', run_at = %(now)s, lease_until = NULL,
    lease_token = NULL, lease_owner = NULL, updated_at = %(now)s, cancel_requested_at = NULL,
    attempts = CASE WHEN %(reset)s THEN 0 ELSE attempts END
  WHERE id = %(id)s AND (state IN ('failed', 'dead', 'cancelled')
    OR (state = 'leased' AND lease_until <= %(now)s))
    AND (unique_key IS NULL OR state IN ('failed', 'leased') OR NOT EXISTS (
      SELECT 1 FROM {JOBS} AS other
      WHERE other.unique_key = {JOBS}.unique_key AND other.unique_key IS NOT NULL
        AND other.{ACTIVE}))"""

# run_now(): a queued job waiting on its run_at (a delay, a retry's backoff) is due now
RUN_NOW = f"""UPDATE {JOBS} SET run_at = %(now)s, updated_at = %(now)s
  WHERE id = %(id)s AND state IN ('pending', 'failed') AND run_at > %(now)s"""


def _sweep_selection(gates: dict[str, str]) -> str:
    # the oldest settled rows, each settled state read from "_jaren_jobs_state_newest"
    # (its own range, oldest first) and merged: no index of the settled rows alone
    # to maintain at every settlement (schema 8 dropped it). A branch whose state
    # was not chosen has a gate that is false for the whole statement, so it
    # reads nothing
    branches = "\n      UNION ALL ".join(
        f"""(SELECT id, updated_at FROM {JOBS}
        WHERE state = '{state}' AND updated_at < %(horizon)s{gates.get(state, "")}
        ORDER BY updated_at, id LIMIT %(limit)s)"""
        for state in ("done", "dead", "cancelled")
    )
    return f"""SELECT id FROM ({branches}) AS settled
    ORDER BY updated_at, id LIMIT %(limit)s"""


def _sweep(gates: dict[str, str]) -> str:
    selection = _sweep_selection(gates)
    return f"""WITH gone AS (DELETE FROM {JOBS} WHERE id IN ({selection}) RETURNING id),
  cleared AS (DELETE FROM {CHECKPOINTS} WHERE run_id IN (SELECT id FROM gone)),
  history AS (DELETE FROM {ERRORS} WHERE job_id IN (SELECT id FROM gone))
SELECT count(*) FROM gone"""


SWEEP = _sweep({})


@lru_cache(maxsize=4)
def sweep_only(count: int) -> str:
    """:data:`SWEEP` for only ``count`` of the settled states, bound as ``%(s0)s``..
    (``sweep(states=...)``)."""
    if count == 0:
        return SWEEP
    chosen = ", ".join(f"%(s{i})s" for i in range(count))
    return _sweep(
        {state: f" AND '{state}' IN ({chosen})" for state in ("done", "dead", "cancelled")}
    )


# ----------------------------------------------------------------- checkpoints

CHECKPOINT_LOAD = f"""SELECT node_id, value FROM {CHECKPOINTS}
  WHERE run_id = %(run_id)s AND generation <= %(generation)s"""

# the fence and the save in one round trip: the row is share-locked (a
# settlement waits for the save, the save for a settlement in flight) and the
# value is written only while the lease holds; the fence row comes back either way
CHECKPOINT_SAVE = f"""WITH cur AS (SELECT {FENCE_COLUMNS} FROM {JOBS} WHERE id = %(id)s FOR SHARE),
  written AS (INSERT INTO {CHECKPOINTS} (run_id, node_id, value, generation)
    SELECT %(run_id)s, %(node_id)s, %(value)s, %(generation)s FROM cur WHERE {_fence_on("cur")}
    ON CONFLICT (run_id, node_id) DO UPDATE
      SET value = excluded.value, generation = excluded.generation
    RETURNING 1)
SELECT (SELECT count(*) FROM written), cur.* {_ANSWER}"""

CHECKPOINT_PRUNE = f"""DELETE FROM {CHECKPOINTS}
  WHERE run_id = %(run_id)s AND generation <= %(generation)s"""

CHECKPOINT_DROP_RUN = f"DELETE FROM {CHECKPOINTS} WHERE run_id = %(run_id)s"

# ----------------------------------------------------------------- transactions


def savepoint(name: str) -> str:
    return f'SAVEPOINT "{name}"'


def release_savepoint(name: str) -> str:
    return f'RELEASE SAVEPOINT "{name}"'


def rollback_to_savepoint(name: str) -> str:
    return f'ROLLBACK TO SAVEPOINT "{name}"'
