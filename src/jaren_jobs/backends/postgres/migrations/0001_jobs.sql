-- jaren_jobs schema 1 on PostgreSQL: the same tables, columns and meanings as
-- SQLite's schema 3. Created in current_schema() (the first schema of
-- search_path). Times are bigint epoch milliseconds bound from the runtime
-- clock, never now(); payload, result and checkpoint values are JSON text,
-- stored as given so they round-trip byte-exactly. Texts that are ordered
-- or compared (id, kind, state) use the "C" collation: byte order, which is
-- SQLite's order, whatever the database's default collation.

CREATE TABLE "_jaren_jobs" (
  id text COLLATE "C" PRIMARY KEY,
  kind text COLLATE "C" NOT NULL,
  payload text,
  state text COLLATE "C" NOT NULL,
  run_at bigint NOT NULL,
  attempts integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL,
  lease_until bigint,
  lease_owner text,
  last_error text,
  result text,
  created_at bigint NOT NULL,
  updated_at bigint NOT NULL,
  priority integer NOT NULL DEFAULT 0,
  lease_generation bigint NOT NULL DEFAULT 0,
  lease_token text,
  settled_generation bigint,
  claim_key bytea
);

CREATE TABLE "_jaren_job_checkpoints" (
  run_id text COLLATE "C" NOT NULL,
  node_id text COLLATE "C" NOT NULL,
  value text NOT NULL,
  generation bigint NOT NULL DEFAULT 0,
  PRIMARY KEY (run_id, node_id)
);

-- what a claim reads: ready jobs in claim order (kinds are filtered on the way)
CREATE INDEX "_jaren_jobs_ready" ON "_jaren_jobs"
  (priority DESC, run_at, created_at, id) WHERE state IN ('pending', 'failed');

-- what a rescue reads: leases by expiry
CREATE INDEX "_jaren_jobs_leased" ON "_jaren_jobs"
  (lease_until) WHERE state = 'leased';

-- what a sweep reads: settled jobs by last change
CREATE INDEX "_jaren_jobs_settled" ON "_jaren_jobs"
  (updated_at, id) WHERE state IN ('done', 'dead', 'cancelled');

-- counts and state-filtered pages (leased rows are counted by the leased index)
CREATE INDEX "_jaren_jobs_unleased" ON "_jaren_jobs"
  (state, kind) WHERE state <> 'leased';

-- the applied schema version (written by the migration runner)
CREATE TABLE "_jaren_meta" (
  key text COLLATE "C" PRIMARY KEY,
  value text NOT NULL
);
