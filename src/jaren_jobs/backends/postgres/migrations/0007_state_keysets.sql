-- jaren_jobs on PostgreSQL, schema 7: the operator's reads by state (the
-- dashboard, SPEC §15) without reading the whole table.
-- Leased rows are left out of both, as of "_jaren_jobs_unleased": a job passes
-- through 'leased' on every attempt, and the leased index reads those few.
-- A page filtered by state, in id order, seeks its next row here; run_at rides
-- along so that due_counts() counts the queued jobs from this index alone.
CREATE INDEX IF NOT EXISTS "_jaren_jobs_state_id" ON "_jaren_jobs"
  (state, id, run_at) WHERE state <> 'leased';
-- newest first (updated_at, id descending), one state at a time: a page merges
-- the states it covers, each read backwards from its own position
CREATE INDEX IF NOT EXISTS "_jaren_jobs_state_newest" ON "_jaren_jobs"
  (state, updated_at, id) WHERE state <> 'leased';
-- newest first over every state (or filtered by kind or queue only): the
-- unleased rows in one order, merged with the few leased ones
CREATE INDEX IF NOT EXISTS "_jaren_jobs_newest" ON "_jaren_jobs"
  (updated_at, id) WHERE state <> 'leased';
