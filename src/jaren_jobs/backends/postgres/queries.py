"""Every SQL statement the PostgreSQL backend runs, named, in one place.

Parameters are psycopg's (``%(name)s``), always bound, never text. Batches
bind arrays (``unnest``), so one statement of one text serves every batch
size and psycopg keeps it prepared. Tables are unqualified: they resolve in
the connection's ``search_path``, whose first schema holds them.
"""

from __future__ import annotations

JOBS_NAME = "_jaren_jobs"
CHECKPOINTS_NAME = "_jaren_job_checkpoints"
META_NAME = "_jaren_meta"
JOBS = f'"{JOBS_NAME}"'
CHECKPOINTS = f'"{CHECKPOINTS_NAME}"'
META = f'"{META_NAME}"'

# the column order of SQLite's JOB_COLUMNS: the shared row mappers read by index
JOB_COLUMNS = (
    "id, kind, payload, state, priority, attempts, max_attempts, run_at, lease_until, "
    "lease_owner, lease_generation, last_error, result, created_at, updated_at, lease_token"
)
FENCE_COLUMNS = "state, lease_token, lease_until, lease_generation, settled_generation, claim_key"


def _cols(alias: str, columns: str = JOB_COLUMNS) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


# The guard every settling statement carries (on the row as locked, ``cur``,
# and on the row updated): the token, and a lease still valid now.
def _fence(alias: str) -> str:
    return (
        f"{alias}.state = 'leased' AND {alias}.lease_token = %(token)s "
        f"AND {alias}.lease_until > %(now)s"
    )


# ----------------------------------------------------------------- schema

TABLE_EXISTS = "SELECT to_regclass(quote_ident(current_schema()) || '.' || quote_ident(%s))"
CURRENT_SCHEMA = "SELECT current_schema()"
# one lock per schema: processes migrating other schemas never wait on it
MIGRATION_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended('jaren_jobs:' || current_schema(), 0))"
)
READ_SCHEMA_VERSION = f"SELECT value FROM {META} WHERE key = 'schema_version'"
WRITE_SCHEMA_VERSION = f"""INSERT INTO {META} (key, value) VALUES ('schema_version', %s)
  ON CONFLICT (key) DO UPDATE SET value = excluded.value"""

# ----------------------------------------------------------------- jobs

# one insert for one job or many (arrays of equal length); a taken id
# inserts nothing. The enqueue's NOTIFY goes with it: delivered at commit,
# once per statement, only when a row went in.
INSERT_JOBS = f"""WITH ins AS (
  INSERT INTO {JOBS} (id, kind, payload, state, priority, run_at, attempts, max_attempts,
      lease_generation, created_at, updated_at)
    SELECT id, kind, payload, 'pending', priority, run_at, 0, max_attempts, 0, %(now)s, %(now)s
    FROM unnest(%(ids)s::text[], %(kinds)s::text[], %(payloads)s::text[],
                %(priorities)s::integer[], %(run_ats)s::bigint[], %(max_attempts)s::integer[])
      WITH ORDINALITY AS t(id, kind, payload, priority, run_at, max_attempts, ord)
    ORDER BY ord
  ON CONFLICT (id) DO NOTHING
  RETURNING 1)
SELECT n, CASE WHEN n > 0 THEN pg_notify(%(channel)s, '') END
  FROM (SELECT count(*) AS n FROM ins) AS c"""

GET_JOB = f"SELECT {JOB_COLUMNS} FROM {JOBS} WHERE id = %s"

GET_SETTLED_BY = f"""SELECT {JOB_COLUMNS} FROM {JOBS}
  WHERE id = %(id)s AND state <> 'leased' AND settled_generation = %(generation)s
    AND claim_key = %(claim_key)s"""

FENCE_ROW = f"SELECT {FENCE_COLUMNS} FROM {JOBS} WHERE id = %s"

_CLAIM_ORDER = "priority DESC, run_at, created_at, id"

# Claimable candidates in claim order, locked, skipping rows another
# transaction holds (a concurrent claim never waits on them, nor takes them):
# ready jobs from the ready index in claim order, and expired leases (the
# rescue, folded into every claim) from the leased index.
CLAIM_CANDIDATES = f"""WITH ready AS (
    SELECT id, priority, run_at, created_at FROM {JOBS}
    WHERE state IN ('pending', 'failed') AND kind = ANY(%(kinds)s::text[])
      AND run_at <= %(now)s
    ORDER BY {_CLAIM_ORDER} LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED),
  expired AS (
    SELECT id, priority, run_at, created_at FROM {JOBS}
    WHERE state = 'leased' AND lease_until <= %(now)s AND kind = ANY(%(kinds)s::text[])
      AND run_at <= %(now)s
    ORDER BY {_CLAIM_ORDER} LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
SELECT id FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) AS c
  ORDER BY {_CLAIM_ORDER} LIMIT %(limit)s"""

# Mint one lease per picked row (rows this transaction locked above): its
# own token and claim key, generation + 1, attempts + 1. The claimability
# guard is repeated, so a stale candidate can never take over a live lease.
CLAIM_ROWS = f"""UPDATE {JOBS} AS j SET state = 'leased', lease_owner = %(owner)s,
    lease_until = %(until)s, lease_generation = j.lease_generation + 1,
    lease_token = p.token, settled_generation = NULL, claim_key = p.claim_key,
    attempts = j.attempts + 1, updated_at = %(now)s
  FROM unnest(%(ids)s::text[], %(tokens)s::text[], %(keys)s::bytea[]) AS p(id, token, claim_key)
  WHERE j.id = p.id AND j.run_at <= %(now)s
    AND (j.state IN ('pending', 'failed') OR (j.state = 'leased' AND j.lease_until <= %(now)s))
  RETURNING {_cols("j")}"""

# one job: the candidate and its lease in one statement
CLAIM_ONE = f"""WITH picked AS ({CLAIM_CANDIDATES})
UPDATE {JOBS} AS j SET state = 'leased', lease_owner = %(owner)s,
    lease_until = %(until)s, lease_generation = j.lease_generation + 1,
    lease_token = %(token)s, settled_generation = NULL, claim_key = %(claim_key)s,
    attempts = j.attempts + 1, updated_at = %(now)s
  FROM picked WHERE j.id = picked.id
  RETURNING {_cols("j")}"""


# A fenced write and the job's fence row in ONE round trip: ``cur`` locks
# the row (its latest committed version), the update is guarded on it, and
# the answer carries the fence row either way. No row: no such job.
def fenced(update_set: str, returning: str = "j.id", extra_from: str = "") -> str:
    """An UPDATE of one job under the fence, answering (hit, returning..., fence row...)."""
    return f"""WITH cur AS (SELECT {FENCE_COLUMNS} FROM {JOBS} WHERE id = %(id)s FOR UPDATE),
  upd AS (UPDATE {JOBS} AS j SET {update_set}
    FROM cur{extra_from} WHERE j.id = %(id)s AND {_fence("cur")} AND {_fence("j")}
    RETURNING {returning})
SELECT upd.*, {_cols("cur", FENCE_COLUMNS)} FROM cur LEFT JOIN upd ON true"""


RENEW = fenced(
    "lease_until = %(until)s, lease_token = %(new_token)s, updated_at = %(now)s",
    returning=_cols("j"),
)

SETTLE_DONE = fenced(
    "state = 'done', result = %(result)s, lease_until = NULL, lease_token = NULL, "
    "settled_generation = j.lease_generation, updated_at = %(now)s"
)

CANCEL_LEASED = fenced(
    "state = 'cancelled', last_error = 'cancelled', lease_until = NULL, lease_token = NULL, "
    "settled_generation = j.lease_generation, updated_at = %(now)s"
)

# a failure: the row locked and its fence row with its attempts, in one round
# trip; the retry or dead letter is written next, in the same transaction
READ_ATTEMPTS = f"""SELECT attempts, max_attempts, {FENCE_COLUMNS} FROM {JOBS}
  WHERE id = %(id)s FOR UPDATE"""

SETTLE_RETRY = f"""UPDATE {JOBS} SET state = 'failed', last_error = %(error)s, run_at = %(run_at)s,
    lease_until = NULL, lease_token = NULL, settled_generation = lease_generation,
    updated_at = %(now)s
  WHERE id = %(id)s AND {_fence(JOBS)}"""

SETTLE_DEAD = f"""UPDATE {JOBS} SET state = 'dead', last_error = %(error)s, lease_until = NULL,
    lease_token = NULL, settled_generation = lease_generation, updated_at = %(now)s
  WHERE id = %(id)s AND {_fence(JOBS)}"""

# Many completions of distinct jobs: every row locked in id order (two
# workers settling overlapping batches never deadlock), each fenced by its
# own token; per item its fence row and whether it was written.
SETTLE_DONE_MANY = f"""WITH item AS (
    SELECT * FROM unnest(%(ids)s::text[], %(tokens)s::text[], %(results)s::text[])
      AS t(id, token, result)),
  cur AS (SELECT j.id, {_cols("j", FENCE_COLUMNS)} FROM {JOBS} AS j
    WHERE j.id IN (SELECT id FROM item) ORDER BY j.id FOR UPDATE),
  upd AS (UPDATE {JOBS} AS j SET state = 'done', result = item.result, lease_until = NULL,
      lease_token = NULL, settled_generation = j.lease_generation, updated_at = %(now)s
    FROM item, cur
    WHERE j.id = item.id AND cur.id = item.id
      AND cur.state = 'leased' AND cur.lease_token = item.token AND cur.lease_until > %(now)s
      AND j.state = 'leased' AND j.lease_token = item.token AND j.lease_until > %(now)s
    RETURNING j.id)
SELECT item.id, upd.id IS NOT NULL, {_cols("cur", FENCE_COLUMNS)}
  FROM item LEFT JOIN cur ON cur.id = item.id LEFT JOIN upd ON upd.id = item.id"""

# leases whose attempts never started, handed back (see SQLite's RELEASE_LEASE)
RELEASE_MANY = f"""UPDATE {JOBS} AS j SET state = 'pending', lease_until = NULL,
    lease_token = NULL, lease_owner = NULL, attempts = j.attempts - 1,
    settled_generation = NULL, updated_at = %(now)s
  FROM unnest(%(ids)s::text[], %(tokens)s::text[]) AS held(id, token)
  WHERE j.id = held.id AND j.state = 'leased' AND j.lease_token = held.token
    AND j.lease_until > %(now)s"""

CANCEL_QUEUED = f"""WITH cur AS (SELECT {FENCE_COLUMNS} FROM {JOBS} WHERE id = %(id)s FOR UPDATE),
  upd AS (UPDATE {JOBS} AS j SET state = 'cancelled', last_error = 'cancelled',
      lease_until = NULL, lease_token = NULL, updated_at = %(now)s
    FROM cur WHERE j.id = %(id)s AND cur.state IN ('pending', 'failed')
    RETURNING j.id)
SELECT upd.id, {_cols("cur", FENCE_COLUMNS)} FROM cur LEFT JOIN upd ON true"""

# requeue keeps attempts and the generation; it clears the lease. Its NOTIFY
# wakes idle workers everywhere, like an enqueue's.
REQUEUE = f"""WITH cur AS (SELECT {FENCE_COLUMNS} FROM {JOBS} WHERE id = %(id)s FOR UPDATE),
  upd AS (UPDATE {JOBS} AS j SET state = 'pending', run_at = %(now)s, lease_until = NULL,
      lease_token = NULL, lease_owner = NULL, updated_at = %(now)s
    FROM cur WHERE j.id = %(id)s AND (cur.state IN ('failed', 'dead', 'cancelled')
      OR (cur.state = 'leased' AND cur.lease_until <= %(now)s))
    RETURNING j.id)
SELECT upd.id, CASE WHEN upd.id IS NOT NULL THEN pg_notify(%(channel)s, '') END,
    {_cols("cur", FENCE_COLUMNS)}
  FROM cur LEFT JOIN upd ON true"""

_SWEEP_SELECTION = f"""SELECT id FROM {JOBS}
    WHERE state IN ('done', 'dead', 'cancelled') AND updated_at < %(horizon)s
    ORDER BY updated_at, id LIMIT %(limit)s"""

SWEEP = f"""WITH doomed AS ({_SWEEP_SELECTION} FOR UPDATE SKIP LOCKED),
  gone_checkpoints AS (DELETE FROM {CHECKPOINTS} WHERE run_id IN (SELECT id FROM doomed))
DELETE FROM {JOBS} WHERE id IN (SELECT id FROM doomed)"""

COUNT_BY_STATE = f"SELECT state, count(*) FROM {JOBS} WHERE state <> 'leased' GROUP BY state"
COUNT_LEASED = f"SELECT count(*) FROM {JOBS} WHERE state = 'leased'"
COUNT_PENDING_KINDS = f"""SELECT kind, count(*) FROM {JOBS}
  WHERE state IN ('pending', 'failed') GROUP BY kind"""


def page_jobs(by_state: bool, by_kind: bool) -> str:
    """A keyset page by id, filtered by state and/or kind (values are bound)."""
    where = ["id > %(after)s"]
    if by_state:
        where.append("state = %(state)s")
    if by_kind:
        where.append("kind = %(kind)s")
    return f"""SELECT {JOB_COLUMNS} FROM {JOBS} WHERE {" AND ".join(where)}
  ORDER BY id LIMIT %(limit)s"""


# ----------------------------------------------------------------- checkpoints

CHECKPOINT_LOAD = f"""SELECT node_id, value FROM {CHECKPOINTS}
  WHERE run_id = %(run_id)s AND generation <= %(generation)s"""

# the fence and the save in one round trip: nothing is written unless it holds
CHECKPOINT_SAVE = f"""WITH cur AS (SELECT {FENCE_COLUMNS} FROM {JOBS} WHERE id = %(id)s FOR SHARE),
  ins AS (INSERT INTO {CHECKPOINTS} (run_id, node_id, value, generation)
    SELECT %(run_id)s, %(node_id)s, %(value)s, %(generation)s FROM cur WHERE {_fence("cur")}
    ON CONFLICT (run_id, node_id) DO UPDATE
      SET value = excluded.value, generation = excluded.generation
    RETURNING 1)
SELECT (SELECT count(*) FROM ins), {_cols("cur", FENCE_COLUMNS)} FROM cur"""

CHECKPOINT_PRUNE = f"""DELETE FROM {CHECKPOINTS}
  WHERE run_id = %(run_id)s AND generation <= %(generation)s"""

CHECKPOINT_DROP_RUN = f"DELETE FROM {CHECKPOINTS} WHERE run_id = %(run_id)s"

# ----------------------------------------------------------------- wake-ups


def listen(channel: str) -> str:
    # the channel is the library's own (derived from the schema name), quoted
    return 'LISTEN "' + channel.replace('"', '""') + '"'
