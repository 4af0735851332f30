-- The outbox for user effects (`@keel.effect(outbox=True)`, `keel.enqueue`): a node records an
-- intent in the transaction that commits its task's writes; dispatchers deliver it later under
-- the intent id, with a claim fenced like a lease, retries, and a dead-letter state.
CREATE TABLE keel_intents (
    intent_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    effect TEXT NOT NULL,
    node TEXT NOT NULL,
    step INTEGER NOT NULL,
    task_path TEXT NOT NULL,
    call_index INTEGER NOT NULL,
    args TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    arg_hashes TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL,
    available_at DOUBLE PRECISION NOT NULL,
    claimed_by TEXT,
    claim_token INTEGER NOT NULL DEFAULT 0,
    claim_expires_at DOUBLE PRECISION,
    result TEXT,
    error TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    delivered_at DOUBLE PRECISION
);
CREATE INDEX keel_intents_due ON keel_intents (status, available_at);
CREATE INDEX keel_intents_run ON keel_intents (run_id, created_at);
-- One token bucket per rate-limited effect, shared by every dispatcher of the database.
CREATE TABLE keel_rate_buckets (
    effect TEXT PRIMARY KEY,
    tokens DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
)
