-- jaren_jobs on PostgreSQL, schema 2: queues and unique jobs (SPEC §12).
-- Both columns carry a constant default (or none), so adding them rewrites
-- no rows: every job of schema 1 lands in the default queue, with no key.
ALTER TABLE "_jaren_jobs" ADD COLUMN IF NOT EXISTS queue text COLLATE "C" NOT NULL DEFAULT 'default';
ALTER TABLE "_jaren_jobs" ADD COLUMN IF NOT EXISTS unique_key text COLLATE "C";

-- what a claim filtered by queues reads: ready jobs per (queue, kind), in
-- claim order. "_jaren_jobs_ready" stays for the claims of every queue.
CREATE INDEX IF NOT EXISTS "_jaren_jobs_ready_queue" ON "_jaren_jobs"
  (queue, kind, priority DESC, run_at, created_at, id) WHERE state IN ('pending', 'failed');
-- at most one job per unique key while it still counts (pending, failed,
-- leased): concurrent enqueues of one key meet here, whatever the host.
-- Jobs without a key have no entry.
CREATE UNIQUE INDEX IF NOT EXISTS "_jaren_jobs_unique" ON "_jaren_jobs"
  (unique_key) WHERE unique_key IS NOT NULL AND state IN ('pending', 'failed', 'leased');
