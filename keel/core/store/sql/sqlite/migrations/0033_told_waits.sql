-- A wait already told is not told again (a review of issue 33): a run that woke from a
-- `keel.sleep()` while another branch's `interrupt()` was still pending moved to `waiting`
-- again, and every such move sent a new `interrupted` webhook about the same pending wait.
-- A move to `waiting` is `interrupted` when a wait someone answers was registered by the
-- execution that made the move: since the run's latest claim (its `lease.claimed` or
-- `lease.takeover` event). Waits are registered in the move's own transaction
-- (keel.core.waits.register), after that claim. Same columns as 0030's view.
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
                                   AND k.kind NOT IN ('timer', 'outbox')
                                   AND k.created_at >= COALESCE(
                                       (SELECT MAX(e.at) FROM keel_events AS e
                                        WHERE e.run_id = r.run_id
                                          AND e.kind IN ('lease.claimed', 'lease.takeover')),
                                       0)) THEN 'interrupted'
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
