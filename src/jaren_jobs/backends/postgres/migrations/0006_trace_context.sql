-- jaren_jobs on PostgreSQL, schema 6: the W3C traceparent of the span that
-- enqueued a job (SPEC §17), so the span of each attempt joins its trace.
-- NULL: enqueued untraced. No default, so adding it rewrites no rows.
ALTER TABLE "_jaren_jobs" ADD COLUMN IF NOT EXISTS trace_context text;
