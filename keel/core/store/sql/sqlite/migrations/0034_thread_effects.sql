-- Thread-scoped effect records. On a thread, an effect declared with `key=` is keyed by the
-- thread and the arguments `key=` names (keel.core.effects.keys.business_key): every run of the
-- thread that calls it with those values is served the first call's record. That record was the
-- ledger row of the run that made the call, and went with that run (`keel prune`, the Agent
-- Server's DELETE of a run) while the thread stayed: the thread's next call of the effect was a
-- second real call. `thread_id` names the thread whose scope a row's key belongs to (NULL: the
-- key is its run's place); such a row outlives its run for as long as its thread exists, and
-- goes with the thread. Rows recorded before this migration cannot be told apart (both keys
-- are digests): they keep going with their run.
ALTER TABLE keel_effects ADD COLUMN thread_id TEXT;
CREATE INDEX keel_effects_thread ON keel_effects (thread_id) WHERE thread_id IS NOT NULL;
