-- jaren_jobs on PostgreSQL, schema 1: the fenced queue (SPEC §1-§10).
-- Times are epoch milliseconds from the runtime clock (never the server's
-- now()); payload, result and checkpoint values are JSON text, byte-exact.
CREATE TABLE IF NOT EXISTS "_jaren_jobs" (
  id text COLLATE "C" PRIMARY KEY,
  kind text COLLATE "C" NOT NULL,
  payload text,
  state text NOT NULL,
  priority bigint NOT NULL DEFAULT 0,
  run_at bigint NOT NULL,
  attempts bigint NOT NULL DEFAULT 0,
  max_attempts bigint NOT NULL,
  lease_until bigint,
  lease_owner text,
  lease_generation bigint NOT NULL DEFAULT 0,
  lease_token text,
  -- the generation and claim key of the attempt that settled the row
  settled_generation bigint,
  claim_key bytea,
  last_error text,
  result text,
  created_at bigint NOT NULL,
  updated_at bigint NOT NULL,
  -- insertion order (what SQLite's rowid gives for free): ties in claim order
  -- and pages stay by id; this is for operators and tests reading the table
  seq bigint GENERATED ALWAYS AS IDENTITY
);

CREATE TABLE IF NOT EXISTS "_jaren_job_checkpoints" (
  run_id text COLLATE "C" NOT NULL,
  node_id text COLLATE "C" NOT NULL,
  value text NOT NULL,
  generation bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, node_id)
);

-- what a claim reads: ready jobs per kind, in claim order
CREATE INDEX IF NOT EXISTS "_jaren_jobs_ready" ON "_jaren_jobs"
  (kind, priority DESC, run_at, created_at, id) WHERE state IN ('pending', 'failed');
-- what a rescue reads: leases by expiry
CREATE INDEX IF NOT EXISTS "_jaren_jobs_leased" ON "_jaren_jobs"
  (lease_until) WHERE state = 'leased';
-- what a sweep reads: settled jobs by last change
CREATE INDEX IF NOT EXISTS "_jaren_jobs_settled" ON "_jaren_jobs"
  (updated_at, id) WHERE state IN ('done', 'dead', 'cancelled');
-- counts and state-filtered pages
CREATE INDEX IF NOT EXISTS "_jaren_jobs_unleased" ON "_jaren_jobs"
  (state, kind) WHERE state <> 'leased';
