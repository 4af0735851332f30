-- The versions that unfinished runs are on, by workflow (issue 34): the stranded-run check
-- (`other_versions`) skips through this index from one (workflow, version) to the next, one
-- probe each, and reads only the runs of a version no worker serves. Finished runs are not in
-- it, and waiting runs of a served version are never visited, however many there are.
CREATE INDEX keel_runs_unfinished ON keel_runs (workflow, workflow_version, created_at, run_id)
WHERE status IN ('queued', 'running', 'waiting');
