-- The console's run list: newest first, by workflow, by job id prefix, by admission time.
-- Status filters already have keel_runs_claimable (status, created_at). The job id prefix is a
-- byte-order range, served by a "C"-collated index whatever the database's collation.
CREATE INDEX keel_runs_created ON keel_runs (created_at, run_id);
CREATE INDEX keel_runs_workflow ON keel_runs (workflow, created_at, run_id);
CREATE INDEX keel_runs_job_prefix ON keel_runs (job_id COLLATE "C", created_at);
