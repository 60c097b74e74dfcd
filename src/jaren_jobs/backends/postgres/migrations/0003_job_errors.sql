-- jaren_jobs on PostgreSQL, schema 3: the error history (SPEC §13).
-- One row per failed attempt, written by the failure's own statement and
-- deleted with its job by the sweep. No foreign key: the sweep deletes both
-- in one statement, and a key would make every failure check the job twice.
CREATE TABLE IF NOT EXISTS "_jaren_job_errors" (
  job_id text COLLATE "C" NOT NULL,
  attempt integer NOT NULL,
  at bigint NOT NULL,
  error text NOT NULL,
  traceback text,
  PRIMARY KEY (job_id, attempt, at)
);
