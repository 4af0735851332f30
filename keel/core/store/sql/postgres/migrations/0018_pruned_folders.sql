-- Retention: the artifact folders of pruned runs, recorded in the transaction that deletes the
-- runs' rows and forgotten once each folder is removed. A prune that crashed between the commit
-- and the removal leaves its folders here, and the next prune removes them.
CREATE TABLE keel_pruned_folders (run_id TEXT PRIMARY KEY);
