-- Retention: `prune` finds finished runs by status and finish time; without this index each
-- batch would sort every finished run while it holds the write lock.
CREATE INDEX keel_runs_finished ON keel_runs (status, finished_at);
