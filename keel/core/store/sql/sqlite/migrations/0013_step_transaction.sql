-- One fenced transaction per step (issue 12). SQLite's fence is `keel_fence`, a function the
-- connector registers on its connection (it raises on a stale token); no schema needed.
-- A `step` event names its task's writes (namespace, checkpoint, task): a step transaction
-- retried after its outcome was lost cannot add the event twice.
ALTER TABLE keel_events ADD COLUMN step_key TEXT;
CREATE UNIQUE INDEX keel_events_step_key ON keel_events (run_id, step_key);
