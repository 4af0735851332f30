-- The console's run list: newest first, by workflow, by job id prefix, by admission time.
-- Status filters already have keel_runs_claimable (status, created_at).
CREATE INDEX keel_runs_created ON keel_runs (created_at, run_id);
CREATE INDEX keel_runs_workflow ON keel_runs (workflow, created_at, run_id);
CREATE INDEX keel_runs_job_prefix ON keel_runs (job_id, created_at);
