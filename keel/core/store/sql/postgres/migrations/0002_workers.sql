-- Live workers, heartbeat progress details (what a retried attempt can read back),
-- and escalation levels of waits.
CREATE TABLE keel_workers (
    worker_id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    concurrency INTEGER NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL,
    stopped_at DOUBLE PRECISION
);
ALTER TABLE keel_runs ADD COLUMN heartbeat_at DOUBLE PRECISION;
ALTER TABLE keel_runs ADD COLUMN heartbeat_details TEXT;
ALTER TABLE keel_waits ADD COLUMN escalation_level INTEGER NOT NULL DEFAULT 0;
