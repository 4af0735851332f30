-- A thread's deletion deletes the schedules on it (as LangGraph's server deletes a thread's
-- crons): found by their thread, not by a scan of every schedule on each deletion.
CREATE INDEX keel_schedules_thread ON keel_schedules (thread_id) WHERE thread_id IS NOT NULL;
