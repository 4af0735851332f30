-- The payload of a wait's notification intent (a registration's `request`, a decision's
-- `decided`), built in SQL by the rule of keel.core.notifications.intent_payload (a test
-- compares the two): `payload`, `approvers` and `details` are JSON. SQLite's
-- `keel_notification` is that Python function, registered on each connection.
CREATE OR REPLACE FUNCTION keel_notification(job_id TEXT, workflow TEXT, wait_id TEXT, kind TEXT,
                                             name TEXT, payload TEXT, approvers TEXT,
                                             deadline DOUBLE PRECISION, details TEXT)
RETURNS TEXT LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
               'job_id', job_id, 'workflow', workflow,
               'wait', jsonb_build_object('wait_id', wait_id, 'kind', kind, 'name', name,
                                          'payload', payload::jsonb, 'approvers', approvers::jsonb,
                                          'deadline', deadline),
               'details', details::jsonb)::text
$$;
