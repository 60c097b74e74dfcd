-- jaren_jobs on PostgreSQL, schema 4: forced cancels of running jobs (SPEC §13).
-- When cancel(id, force=True) asked the attempt holding a job to stop (epoch
-- ms); NULL: nobody asked. No default, so adding it rewrites no rows.
ALTER TABLE "_jaren_jobs" ADD COLUMN IF NOT EXISTS cancel_requested_at bigint;
