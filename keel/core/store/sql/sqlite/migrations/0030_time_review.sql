-- A sleeping run is not interrupted (issue 33's review): a run parked on `keel.sleep()` (a
-- timer wait) or on its own outbox delivery (an outbox wait) waits for nobody, so its move to
-- `waiting` owes a webhook asking for `interrupted` nothing. Only a wait someone answers (an
-- interrupt, an approval, a signal, an in-doubt effect) makes the move an `interrupted` event.
-- The waits are registered before the run moves (keel.core.waits.register), so the trigger sees
-- them. Same columns as 0027's view: the triggers, which read it by name, are unchanged.
DROP VIEW keel_webhook_due;
CREATE VIEW keel_webhook_due AS
SELECT d.*,
       (SELECT COUNT(*) FROM keel_intents AS i
        WHERE i.run_id = d.run_id AND i.effect = 'keel.webhook') AS seq
FROM (
    SELECT r.run_id, w.url, w.format, w.max_attempts, w.events,
           CASE WHEN r.status = 'waiting'
                     AND EXISTS (SELECT 1 FROM keel_waits AS k
                                 WHERE k.run_id = r.run_id AND k.status = 'pending'
                                   AND k.kind NOT IN ('timer', 'outbox')) THEN 'interrupted'
                WHEN r.status IN ('completed', 'failed', 'cancelled')
                     AND r.termination_reason = 'timed_out' THEN 'timed_out'
                WHEN r.status IN ('completed', 'failed', 'cancelled') THEN r.status
           END AS event,
           json_object('run_id', r.run_id, 'job_id', r.job_id, 'workflow', r.workflow,
                       'workflow_version', r.workflow_version, 'attempt', r.attempt,
                       'status', r.status, 'decision', r.decision,
                       'termination_reason', r.termination_reason, 'error', r.error,
                       'output', r.output, 'created_at', r.created_at, 'updated_at', r.updated_at,
                       'finished_at', r.finished_at) AS snapshot
    FROM keel_runs AS r JOIN keel_webhooks AS w ON w.run_id = r.run_id
) AS d
WHERE d.event IS NOT NULL AND instr(d.events, ',' || d.event || ',') > 0;

-- A pruned run takes the inbound deliveries that admitted it along (`prune_hook_deliveries`):
-- found by run, not by a scan of every delivery ever received.
CREATE INDEX keel_hook_deliveries_run ON keel_hook_deliveries (run_id);
