-- A claim's candidates in the order it takes them, each status in its own small index: only the
-- runs waiting for a worker, and only those holding a lease. A claim reads the oldest of each
-- from the front of its index, however many runs have finished (issue 12).
CREATE INDEX keel_runs_queued ON keel_runs (created_at, run_id) WHERE status = 'queued';
CREATE INDEX keel_runs_leased ON keel_runs (created_at, run_id) WHERE status = 'running';
