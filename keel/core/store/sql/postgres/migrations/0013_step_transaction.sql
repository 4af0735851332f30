-- One fenced transaction per step (issue 12). `keel_fence` is the fence as one statement: it
-- locks the run's row FOR SHARE (a takeover's claim skips it until the step commits) and
-- aborts the transaction with its own SQLSTATE, KL001, when the writer's token is stale (KL002:
-- no such run), so a step sent as one pipeline stops at its first statement and commits
-- nothing. Returns the run's cancel flag, read after the commit at a step boundary.
CREATE OR REPLACE FUNCTION keel_fence(p_run_id TEXT, p_token BIGINT) RETURNS INTEGER
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    held BIGINT;
    owner TEXT;
    cancel INTEGER;
BEGIN
    SELECT lease_token, lease_owner, cancel_requested INTO held, owner, cancel
    FROM keel_runs WHERE run_id = p_run_id FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no run %', p_run_id USING ERRCODE = 'KL002';
    END IF;
    IF held IS DISTINCT FROM p_token THEN
        RAISE EXCEPTION 'run %: lease token % is stale (current %, owner %)',
            p_run_id, p_token, held, owner USING ERRCODE = 'KL001';
    END IF;
    RETURN cancel;
END
$$;
-- A `step` event names its task's writes (namespace, checkpoint, task): a step transaction
-- retried after its outcome was lost cannot add the event twice.
ALTER TABLE keel_events ADD COLUMN step_key TEXT;
CREATE UNIQUE INDEX keel_events_step_key ON keel_events (run_id, step_key);
