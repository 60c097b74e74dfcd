-- jaren_jobs on PostgreSQL, schema 5: the error history keyed by the attempt's
-- lease generation, which every claim mints anew (SPEC §13). Keyed by attempt
-- and instant, entries collided once attempt numbers repeated (requeue with
-- reset_attempts=True) under one instant. Entries written before keep their
-- order, numbered below every generation a claim can mint.
ALTER TABLE "_jaren_job_errors" ADD COLUMN IF NOT EXISTS generation bigint;
UPDATE "_jaren_job_errors" AS e SET generation = o.n - 1000000000000
  FROM (SELECT job_id, attempt, at,
          row_number() OVER (PARTITION BY job_id ORDER BY attempt, at) AS n
        FROM "_jaren_job_errors") AS o
  WHERE e.generation IS NULL AND e.job_id = o.job_id AND e.attempt = o.attempt AND e.at = o.at;
ALTER TABLE "_jaren_job_errors" ALTER COLUMN generation SET NOT NULL;
ALTER TABLE "_jaren_job_errors" DROP CONSTRAINT "_jaren_job_errors_pkey";
ALTER TABLE "_jaren_job_errors" ADD CONSTRAINT "_jaren_job_errors_pkey" PRIMARY KEY (job_id, generation);
