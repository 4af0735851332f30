-- Webhooks (issue 33). Outbound: a run submitted with `webhook=` has a row in keel_webhooks (its
-- URL, the events it asked for, the shape of the body). When the run ends or pauses, an intent
-- of the built-in outbox effect `keel.webhook` is inserted IN THE TRANSACTION THAT MOVED IT, by
-- the triggers below: every statement that ends a run (finish_run, update_run_status,
-- end_registration, and any later one) is covered without touching it. A registration that
-- commits after its run already ended (a fast worker) records the intent at once, the same way.
-- The intent's id is `webhook:<run_id>:<n>`, n counting the run's webhooks: the delivery id the
-- receiver dedupes by, the same on every retry.
CREATE TABLE keel_webhooks (
    run_id TEXT PRIMARY KEY,
    url TEXT NOT NULL,
    events TEXT NOT NULL,
    format TEXT NOT NULL,
    max_attempts INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);

-- What a run's move owes its webhook, if anything: its event (interrupted, timed_out,
-- completed, failed, cancelled) when the registration asked for it, and the run's fields a
-- move changes, as they are now (what never changes after admission is read at delivery).
CREATE VIEW keel_webhook_due AS
SELECT d.*,
       (SELECT COUNT(*) FROM keel_intents AS i
        WHERE i.run_id = d.run_id AND i.effect = 'keel.webhook') AS seq
FROM (
    SELECT r.run_id, w.url, w.format, w.max_attempts, w.events,
           CASE WHEN r.status = 'waiting' THEN 'interrupted'
                WHEN r.status IN ('completed', 'failed', 'cancelled')
                     AND r.termination_reason = 'timed_out' THEN 'timed_out'
                WHEN r.status IN ('completed', 'failed', 'cancelled') THEN r.status
           END AS event,
           json_build_object('run_id', r.run_id, 'job_id', r.job_id, 'workflow', r.workflow,
                             'workflow_version', r.workflow_version, 'attempt', r.attempt,
                             'status', r.status, 'decision', r.decision,
                             'termination_reason', r.termination_reason, 'error', r.error,
                             'output', r.output, 'created_at', r.created_at, 'updated_at', r.updated_at,
                             'finished_at', r.finished_at) AS snapshot
    FROM keel_runs AS r JOIN keel_webhooks AS w ON w.run_id = r.run_id
) AS d
WHERE d.event IS NOT NULL AND position(',' || d.event || ',' IN d.events) > 0;

-- One function for both triggers: the run moved, or its registration arrived.
CREATE OR REPLACE FUNCTION keel_webhook_due_now() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO keel_intents (intent_id, run_id, effect, node, step, task_path, call_index,
                              args, args_hash, arg_hashes, status, max_attempts, available_at,
                              created_at, updated_at)
    SELECT 'webhook:' || run_id || ':' || seq, run_id, 'keel.webhook', 'keel:webhook', 0, '',
           seq, json_build_object('args', json_build_array(), 'kwargs',
                                  json_build_object('url', url, 'event', event,
                                                    'format', format, 'run', snapshot))::text,
           '', '{}', 'pending', max_attempts, keel_now(), keel_now(), keel_now()
    FROM keel_webhook_due WHERE run_id = NEW.run_id
    ON CONFLICT (intent_id) DO NOTHING;
    IF FOUND THEN
        PERFORM pg_notify('keel_wake', 'outbox:' || NEW.run_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER keel_webhook_on_move AFTER UPDATE OF status ON keel_runs
FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION keel_webhook_due_now();

CREATE TRIGGER keel_webhook_on_register AFTER INSERT ON keel_webhooks
FOR EACH ROW EXECUTE FUNCTION keel_webhook_due_now();

-- Inbound (`app.webhook(name, ...)`, `POST /hooks/{name}`): one row per delivery a sender made,
-- by its delivery id. The primary key decides a replay: a second insert finds the first's row.
CREATE TABLE keel_hook_deliveries (
    hook TEXT NOT NULL,
    delivery_id TEXT NOT NULL,
    run_id TEXT,
    received_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (hook, delivery_id)
);
