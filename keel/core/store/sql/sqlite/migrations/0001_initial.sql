-- Keel's tables: runs (admission, lifecycle, current lease), events (timeline),
-- effects (the ledger) and waits (approvals, in-doubt effects, signals).
-- Times are seconds since the epoch from Keel's injectable clock, never the database's.
CREATE TABLE keel_runs (
    run_id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    workflow TEXT NOT NULL,
    workflow_version TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    input_hash TEXT NOT NULL,
    input TEXT NOT NULL,
    status TEXT NOT NULL,
    decision TEXT NOT NULL DEFAULT 'not_decided',
    termination_reason TEXT,
    error TEXT,
    output TEXT,
    lease_owner TEXT,
    lease_token INTEGER NOT NULL DEFAULT 0,
    lease_expires_at REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX keel_runs_claimable ON keel_runs (status, created_at);
CREATE INDEX keel_runs_job ON keel_runs (job_id, workflow, input_hash);

CREATE TABLE keel_events (
    event_id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    worker_id TEXT,
    lease_token INTEGER,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX keel_events_run ON keel_events (run_id, event_id);

CREATE TABLE keel_effects (
    idempotency_key TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    node TEXT NOT NULL,
    step INTEGER NOT NULL,
    task_path TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    error TEXT,
    lease_token INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX keel_effects_run ON keel_effects (run_id, created_at);

CREATE TABLE keel_waits (
    wait_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    interrupt_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    payload TEXT NOT NULL DEFAULT 'null',
    approvers TEXT NOT NULL DEFAULT '[]',
    status TEXT NOT NULL,
    deadline REAL,
    on_timeout TEXT NOT NULL,
    decision TEXT,
    value TEXT,
    decided_by TEXT,
    action_id TEXT,
    channel TEXT,
    comment TEXT,
    decided_at REAL,
    created_at REAL NOT NULL
);
CREATE INDEX keel_waits_run ON keel_waits (run_id, created_at);
CREATE INDEX keel_waits_pending ON keel_waits (status, deadline);
