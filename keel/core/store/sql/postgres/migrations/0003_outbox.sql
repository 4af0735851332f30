-- The outbox: notifications (approval requests, reminders, escalations, decision updates)
-- recorded as intents in the same transaction as the change they announce, delivered later by
-- every worker's dispatcher under the same once-only rules as effects.
CREATE TABLE keel_outbox (
    intent_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    wait_id TEXT,
    notifier TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    available_at DOUBLE PRECISION NOT NULL,
    claimed_by TEXT,
    claim_expires_at DOUBLE PRECISION,
    result TEXT,
    error TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX keel_outbox_due ON keel_outbox (status, available_at);
CREATE INDEX keel_outbox_run ON keel_outbox (run_id, created_at);
ALTER TABLE keel_waits ADD COLUMN schedule TEXT NOT NULL DEFAULT '[]';
ALTER TABLE keel_waits ADD COLUMN next_stage_at DOUBLE PRECISION;
CREATE INDEX keel_waits_stage ON keel_waits (status, next_stage_at);
