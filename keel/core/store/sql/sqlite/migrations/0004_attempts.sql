-- Failed attempts of a run since its admission or its last resume: executions that crashed
-- outside the graph's nodes, and executions an infrastructure fault interrupted. Each is
-- bounded (the executor ends the run failed past its limit); `keel runs resume` resets both.
ALTER TABLE keel_runs ADD COLUMN crash_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE keel_runs ADD COLUMN infra_retries INTEGER NOT NULL DEFAULT 0;
