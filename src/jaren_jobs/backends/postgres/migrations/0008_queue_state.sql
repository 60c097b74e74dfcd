-- jaren_jobs on PostgreSQL, schema 8: the jobs of one queue per state from an
-- index (counts(queue=...), the dashboard's per-queue counts, a page filtered by
-- a queue that few jobs are in), instead of reading every row of the table.
-- It takes the place of "_jaren_jobs_unleased" (state, kind): counts() reads
-- this one whole, index-only, as it read that one, so every enqueue and state
-- change maintains as many indexes as before. run_at rides along so that
-- due_counts(queue=...) reads it alone too.
CREATE INDEX IF NOT EXISTS "_jaren_jobs_queue_state" ON "_jaren_jobs"
  (queue, state, run_at) WHERE state <> 'leased';
DROP INDEX IF EXISTS "_jaren_jobs_unleased";
-- The settled rows by last change: a sweep reads "_jaren_jobs_state_newest"
-- instead (one range per settled state, merged), as the dashboard's chart does,
-- and every settlement maintains one index fewer.
DROP INDEX IF EXISTS "_jaren_jobs_settled";
