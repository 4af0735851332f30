-- Time is the database's: keel_now() (epoch seconds) in every statement, never a worker's clock.
-- In a WHERE clause it is written (SELECT keel_now()), evaluated once per statement, not per row.

-- name: schema_version
-- The highest migration applied (the table may not exist yet: the store checks first).
SELECT COALESCE(MAX(version), 0) AS version FROM keel_schema_migrations;

-- name: applied_migrations
-- Every migration applied: one that landed after a higher-numbered one is still applied.
SELECT version FROM keel_schema_migrations;

-- name: schema_table_exists
-- Whether the migrations table exists.
SELECT COUNT(*) AS n FROM information_schema.tables WHERE table_name = 'keel_schema_migrations' AND table_schema = current_schema();

-- name: create_schema_table
-- The migrations bookkeeping table.
CREATE TABLE IF NOT EXISTS keel_schema_migrations (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL);

-- name: migration_lock
-- Serialize concurrent `keel migrate` calls until this transaction ends.
SELECT pg_advisory_xact_lock(74213001) IS NOT NULL AS locked;

-- name: record_migration
-- Remember that a migration was applied.
INSERT INTO keel_schema_migrations (version, name, applied_at) VALUES (%(version)s, %(name)s, EXTRACT(EPOCH FROM clock_timestamp()));

-- name: fence
-- The current lease of a run, locked against a takeover until this transaction ends.
SELECT run_id, status, lease_token, lease_owner, cancel_requested FROM keel_runs WHERE run_id = %(run_id)s
FOR SHARE;

-- name: fence_step
-- The fence of a step transaction as one statement: KL001 aborts the whole pipeline when the
-- token is stale; the row (cancel flag) is read after the commit.
SELECT keel_fence(%(run_id)s, %(lease_token)s) AS cancel_requested;

-- name: lease_held
-- Whether a lease token still holds its run, unexpired, right now, and for how many seconds
-- more by the database's clock (the last check before a provider call or an artifact's rename;
-- a plain read, it holds no lock).
SELECT run_id, status, lease_token, lease_owner, cancel_requested,
       CASE WHEN lease_expires_at > keel_now() THEN 1 ELSE 0 END AS live,
       GREATEST(COALESCE(lease_expires_at, 0) - keel_now(), 0) AS lease_left
FROM keel_runs WHERE run_id = %(run_id)s;

-- name: arm_effect
-- A pending key's next provider call is about to start (after a reconciler said it never
-- happened, a person said so, or a retry): its deadline moves to `hold` seconds from now, in one
-- statement fenced like a reservation (only under a live lease of `lease_token`, no cancel
-- asked). `lease_left`: the lease's seconds left by the database's clock; `armed`: 1 if the key
-- was armed. No row: the token does not hold the run, nothing was written.
WITH fence AS (
    SELECT run_id, cancel_requested,
           GREATEST(COALESCE(lease_expires_at, 0) - keel_now(), 0) AS lease_left
    FROM keel_runs
    WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s
    FOR SHARE),
armed AS (
    UPDATE keel_effects
    SET deadline_at = keel_now() + %(hold)s, lease_token = %(lease_token)s, updated_at = keel_now()
    WHERE idempotency_key = %(key)s AND status = 'pending'
      AND EXISTS (SELECT 1 FROM fence WHERE cancel_requested = 0 AND lease_left > 0)
    RETURNING idempotency_key)
SELECT f.cancel_requested AS cancelled, f.lease_left, (SELECT COUNT(*) FROM armed) AS armed
FROM fence AS f;

-- name: insert_run
-- moves: new>queued
-- Admit a run unless it already exists (admission is idempotent).
INSERT INTO keel_runs (run_id, job_id, workflow, workflow_version, attempt, input_hash, input,
                       status, created_at, updated_at, not_before)
VALUES (%(run_id)s, %(job_id)s, %(workflow)s, %(workflow_version)s, %(attempt)s, %(input_hash)s, %(input)s,
        'queued', keel_now(), keel_now(), COALESCE(%(not_before)s::double precision, keel_now() + %(delay)s::double precision))
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id;

-- name: lock_job
-- Serialize admissions of one job (of one workflow) until this transaction ends: `admit_run`,
-- the next statement, reads the job's runs in a snapshot taken after the lock, so two
-- submissions of the job with different input at once are judged one after the other (each
-- read the job empty, and both were admitted).
SELECT pg_advisory_xact_lock(74213030, hashtext(%(workflow)s || '/' || %(job_id)s)) IS NOT NULL AS locked;

-- name: admit_run
-- moves: new>queued
-- Admission in one statement: the job's runs of this workflow with other input (`others`,
-- newest first); unless `if_exists` refuses because the job has only such runs (`refused`),
-- the run inserted queued if it is not admitted yet (`created`), with its admitted event and a
-- wake-up for idle workers (delivered on commit). The run's columns follow: NULL if refused,
-- or if an admission of the same run committed while this one waited on it (the caller reads
-- it then). `wake` 0: no wake-up here (a claim follows in the same transaction, then
-- `wake_if_queued`: idle workers are woken only if the run is still there to take).
WITH job AS (
    SELECT run_id, input_hash, created_at FROM keel_runs
    WHERE job_id = %(job_id)s AND workflow = %(workflow)s),
verdict AS (
    SELECT COALESCE((SELECT jsonb_agg(run_id ORDER BY created_at DESC, run_id DESC) FROM job
                     WHERE input_hash <> %(input_hash)s), '[]'::jsonb)::text AS others,
           CASE WHEN %(if_exists)s::text <> 'new'
                 AND EXISTS (SELECT 1 FROM job WHERE input_hash <> %(input_hash)s)
                 AND NOT EXISTS (SELECT 1 FROM job WHERE input_hash = %(input_hash)s)
                THEN 1 ELSE 0 END AS refused),
inserted AS (
    INSERT INTO keel_runs (run_id, job_id, workflow, workflow_version, attempt, input_hash, input,
                           status, created_at, updated_at, not_before)
    SELECT %(run_id)s, %(job_id)s, %(workflow)s, %(workflow_version)s, %(attempt)s, %(input_hash)s,
           %(input)s, 'queued', keel_now(), keel_now(), COALESCE(%(not_before)s::double precision, keel_now() + %(delay)s::double precision)
    FROM verdict WHERE refused = 0
    ON CONFLICT (run_id) DO NOTHING
    RETURNING *),
turn AS (SELECT pg_advisory_xact_lock(74213003, hashtext(run_id)) FROM inserted),
event AS (
    INSERT INTO keel_events (run_id, at, kind, worker_id, lease_token, data)
    SELECT run_id, keel_now(), 'admitted', NULL, NULL, %(data)s FROM inserted, turn),
wake AS (SELECT pg_notify('keel_wake', run_id) FROM inserted WHERE %(wake)s::int = 1)
SELECT v.others, v.refused, (SELECT COUNT(*) FROM inserted) AS created,
       (SELECT COUNT(*) FROM wake) AS woken, r.*
FROM verdict AS v
LEFT JOIN (SELECT * FROM inserted
           UNION ALL
           SELECT * FROM keel_runs
           WHERE run_id = %(run_id)s AND NOT EXISTS (SELECT 1 FROM inserted)) AS r ON true;

-- name: get_run
-- One run.
SELECT * FROM keel_runs WHERE run_id = %(run_id)s;

-- name: lock_run
-- One run, locked until this transaction ends, read before changing it or its waits: what
-- it says stays true meanwhile, and every writer takes the run before its waits.
SELECT * FROM keel_runs WHERE run_id = %(run_id)s
FOR UPDATE;

-- name: list_runs
-- Runs, newest first, optionally filtered.
SELECT * FROM keel_runs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(job_id)s::text IS NULL OR job_id = %(job_id)s::text)
  AND (%(since)s::double precision IS NULL OR created_at >= %(since)s::double precision)
  AND (%(until)s::double precision IS NULL OR created_at < %(until)s::double precision)
ORDER BY created_at DESC, run_id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: job_runs
-- A job's runs of one workflow, newest first: admission tells a caller about other input.
SELECT run_id, input_hash, attempt, status FROM keel_runs
WHERE job_id = %(job_id)s AND workflow = %(workflow)s
ORDER BY created_at DESC, run_id DESC;

-- name: max_attempt
-- The latest attempt of a job with this workflow and input.
SELECT COALESCE(MAX(attempt), 0) AS attempt FROM keel_runs
WHERE job_id = %(job_id)s AND workflow = %(workflow)s AND input_hash = %(input_hash)s;

-- name: claim_lock
-- Serialize claims while a workflow has a concurrency limit, so counts cannot race.
SELECT pg_advisory_xact_lock(74213002) IS NOT NULL AS locked;

-- name: claim_next
-- moves: queued>running, running>running
-- A whole claim in one statement: lock the oldest claimable run (queued, below its workflow's
-- limit in `limits` if it has one, or running under an expired lease), take its lease under a new token (a takeover counts one
-- crashed attempt) and write its lease.claimed / lease.takeover event. No row: nothing to claim.
-- With limits it runs after claim_lock in one transaction: its counts are then taken after
-- every earlier claim committed (a statement's snapshot starts with the statement).
-- `first_claim`: the run never ran, so it has no checkpoint to read. `decided_waits`: for a run
-- that ran before, its answered waits (interrupt_id, status, value as JSON text), oldest first:
-- what a resume after a decision would read next (its resume map), read in the claim instead.
-- A delayed run is not claimable before its `not_before` (database clock, migration 0026).
-- `after_rollback`: a run of its thread was rolled back, whose checkpoints may still be there.
-- The oldest queued run and the oldest expired one are each read from their own partial index
-- (migration 0021), in the order of the claim, and the older of the two is taken: a claim
-- reads a few index entries however many runs have finished. (One query over both statuses,
-- ordered by creation, let the planner walk every run ever created, oldest first, to find the
-- queued one.) Both are locked until the claim commits; the one not taken is claimable again
-- then.
WITH served AS (SELECT jsonb_array_elements_text(%(workflows)s::jsonb) AS name),
queued AS (
    SELECT run_id, status, lease_owner, started_at, created_at FROM keel_runs AS q
    WHERE q.status = 'queued'
      AND q.workflow || '@' || q.workflow_version IN (SELECT name FROM served)
      AND NOT EXISTS (
          SELECT 1 FROM jsonb_each_text(%(limits)s::jsonb) AS l
          WHERE l.key = q.workflow || '@' || q.workflow_version
            AND (SELECT COUNT(*) FROM keel_runs AS o WHERE o.status = 'running'
                 AND o.workflow = q.workflow AND o.workflow_version = q.workflow_version) >= l.value::int)
      AND (q.not_before IS NULL OR q.not_before <= (SELECT keel_now()))
      AND (q.thread_id IS NULL OR NOT EXISTS (
          SELECT 1 FROM keel_runs AS t WHERE t.thread_id = q.thread_id AND t.thread_seq < q.thread_seq
            AND t.status IN ('queued', 'running', 'waiting')))
    ORDER BY q.created_at, q.run_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED),
expired AS (
    SELECT run_id, status, lease_owner, started_at, created_at FROM keel_runs AS q
    WHERE q.status = 'running' AND q.lease_expires_at < (SELECT keel_now())
      AND q.workflow || '@' || q.workflow_version IN (SELECT name FROM served)
    ORDER BY q.created_at, q.run_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED),
candidate AS (
    SELECT run_id, status, lease_owner, started_at
    FROM (SELECT * FROM queued UNION ALL SELECT * FROM expired) AS c
    ORDER BY created_at, run_id
    LIMIT 1),
claimed AS (
    UPDATE keel_runs AS r
    SET crash_count = r.crash_count + CASE WHEN r.status = 'running' THEN 1 ELSE 0 END,
        status = 'running', lease_owner = %(worker_id)s, lease_token = r.lease_token + 1,
        lease_expires_at = keel_now() + %(ttl)s, heartbeat_at = keel_now(),
        started_at = COALESCE(r.started_at, keel_now()), updated_at = keel_now(),
        -- Its first execution decides how its effects are keyed, for good (migration 0032).
        effect_keys = CASE WHEN r.started_at IS NULL THEN 2 ELSE r.effect_keys END
    FROM candidate AS c
    WHERE r.run_id = c.run_id
    RETURNING r.*, c.status AS previous_status, c.lease_owner AS previous_owner,
              CASE WHEN c.started_at IS NULL THEN 1 ELSE 0 END AS first_claim,
              CASE WHEN c.started_at IS NOT NULL THEN
                  (SELECT COALESCE(jsonb_agg(jsonb_build_object('interrupt_id', w.interrupt_id,
                                                                'status', w.status, 'value', w.value)
                                             ORDER BY w.created_at, w.wait_id), '[]'::jsonb)::text
                   FROM keel_waits AS w WHERE w.run_id = r.run_id AND w.status <> 'pending')
              END AS decided_waits,
              EXISTS (SELECT 1 FROM keel_runs AS t
                      WHERE t.thread_id = r.thread_id AND t.cancel_reason = 'rolled_back')
                  AS after_rollback),
turn AS (SELECT pg_advisory_xact_lock(74213003, hashtext(run_id)) FROM claimed),
event AS (
    INSERT INTO keel_events (run_id, at, kind, worker_id, lease_token, data)
    SELECT run_id, keel_now(),
           CASE WHEN previous_status = 'running' THEN 'lease.takeover' ELSE 'lease.claimed' END,
           %(worker_id)s, lease_token,
           (jsonb_build_object('from', previous_status, 'to', 'running', 'expires_at', lease_expires_at)
            || CASE WHEN previous_status = 'running'
                    THEN jsonb_build_object('previous_owner', previous_owner) ELSE '{}'::jsonb END)::text
    FROM claimed, turn)
SELECT * FROM claimed;

-- name: renew_lease
-- Extend a lease this worker still holds.
UPDATE keel_runs SET lease_expires_at = keel_now() + %(ttl)s, heartbeat_at = keel_now()
WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s AND status = 'running'
RETURNING run_id, cancel_requested;

-- name: end_lease
-- Expire a lease whose holder is known dead (its process exited): the next claim takes over.
-- Already past by the database's clock (as expire_deadline_now), even for a claim this instant.
UPDATE keel_runs SET lease_expires_at = keel_now() - 1
WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s AND status = 'running'
RETURNING run_id;

-- name: set_heartbeat_details
-- Progress details from keel.heartbeat(), readable by a later attempt.
UPDATE keel_runs SET heartbeat_details = %(details)s, heartbeat_at = keel_now()
WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s;

-- name: update_run_status
-- moves: queued>cancelled, running>queued, running>failed, waiting>queued, waiting>cancelled, waiting>failed, failed>queued
-- A lifecycle transition of `keel.core.runs.transition`: only a move declared above (the
-- store refuses any other), and its timeline event with it.
UPDATE keel_runs
SET status = %(status)s, decision = COALESCE(%(decision)s::text, decision),
    termination_reason = COALESCE(%(termination_reason)s::text, termination_reason),
    error = COALESCE(%(error)s::text, error), output = COALESCE(%(output)s::text, output),
    lease_owner = CASE WHEN %(status)s::text = 'running' THEN lease_owner ELSE NULL END,
    lease_expires_at = CASE WHEN %(status)s::text = 'running' THEN lease_expires_at ELSE NULL END,
    finished_at = CASE WHEN %(finished)s THEN keel_now() ELSE NULL END, updated_at = keel_now()
WHERE run_id = %(run_id)s;

-- name: finish_run
-- moves: running>completed, running>failed, running>cancelled
-- End a running run (completed, failed or cancelled: checked in Python against the transition
-- table first) and record the move on its timeline, in one statement, only if `lease_token`
-- still holds it: the UPDATE's row lock is the fence (a takeover's claim skips the row until
-- this commits). No `termination_reason`: a graph that returned, ended by its waits (judged
-- here, on the rows as they are at the end, in the same statement: the rule's one place with
-- SQLite's twin): its approval verdict (the run's decision), unless the latest decided approval expired (a deadline's
-- rejection: timed_out); else timed_out if a wait timed out; else completed. It goes into the
-- event's data. No row: the token no longer holds a running run, and nothing was written.
-- `unless_cancelled`: nor if a cancel was asked (an end committed with the last step's
-- checkpoint: that step's boundary cancels the run, as every other step's does).
WITH finished AS (
    UPDATE keel_runs AS r
    SET status = %(status)s,
        termination_reason = COALESCE(CASE WHEN %(status)s::text = 'cancelled' THEN r.cancel_reason END,
                                      %(termination_reason)s::text, CASE
            WHEN r.decision IN ('approved', 'rejected') THEN
                CASE WHEN (SELECT w.status FROM keel_waits AS w
                           WHERE w.run_id = r.run_id AND w.kind = 'approval'
                           ORDER BY COALESCE(w.decided_at, 0) DESC, w.created_at, w.wait_id
                           LIMIT 1) = 'expired'
                     THEN 'timed_out' ELSE r.decision END
            WHEN EXISTS (SELECT 1 FROM keel_waits AS w
                         WHERE w.run_id = r.run_id AND w.decision = 'timed_out') THEN 'timed_out'
            ELSE 'completed' END),
        error = COALESCE(%(error)s::text, error), output = COALESCE(%(output)s::text, output),
        lease_owner = NULL, lease_expires_at = NULL, finished_at = keel_now(), updated_at = keel_now()
    WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s AND status = 'running'
      AND (%(unless_cancelled)s::int = 0 OR r.cancel_requested = 0)
    RETURNING run_id, termination_reason),
turn AS (SELECT pg_advisory_xact_lock(74213003, hashtext(run_id)) FROM finished),
event AS (
    INSERT INTO keel_events (run_id, at, kind, worker_id, lease_token, data)
    SELECT run_id, keel_now(), %(kind)s, %(worker_id)s, %(lease_token)s,
           (%(data)s::text::jsonb || jsonb_build_object('termination_reason', termination_reason))::text
    FROM finished, turn)
SELECT run_id AS finished_id, termination_reason AS finished_reason FROM finished;

-- name: insert_event
-- Append to a run's timeline. One writer of a run's events at a time, until it commits (a
-- transaction lock on the run): a run's event ids then grow in commit order, so a reader that
-- follows the timeline by id (`events_after`) never skips an event committed late.
WITH turn AS (SELECT pg_advisory_xact_lock(74213003, hashtext(%(run_id)s)))
INSERT INTO keel_events (run_id, at, kind, worker_id, lease_token, data)
SELECT %(run_id)s, keel_now(), %(kind)s, %(worker_id)s, %(lease_token)s, %(data)s FROM turn;

-- name: insert_step_event
-- Append a task's `step` event once per key (a retried step transaction adds nothing), in
-- commit order as insert_event does.
WITH turn AS (SELECT pg_advisory_xact_lock(74213003, hashtext(%(run_id)s)))
INSERT INTO keel_events (run_id, at, kind, worker_id, lease_token, data, step_key)
SELECT %(run_id)s, keel_now(), %(kind)s, %(worker_id)s, %(lease_token)s, %(data)s, %(step_key)s FROM turn
ON CONFLICT (run_id, step_key) DO NOTHING;

-- name: list_events
-- A run's timeline in order.
SELECT * FROM keel_events WHERE run_id = %(run_id)s ORDER BY event_id;

-- name: loop_blocks
-- What a run's timeline says of blocked event loops (`loop.blocked`: written while the block
-- lasted, by the blocked worker, fenced by its token; `loop.unblocked`: the block ended while
-- that token still held the run), newest first, with the database's time: read when a run is
-- given up on, to say why its leases lapsed.
SELECT kind, lease_token, worker_id, at, data, keel_now() AS now FROM keel_events
WHERE run_id = %(run_id)s AND kind IN ('loop.blocked', 'loop.unblocked')
ORDER BY event_id DESC LIMIT 50;

-- name: get_effect
-- One ledger row.
SELECT * FROM keel_effects WHERE idempotency_key = %(key)s;

-- name: update_effect
-- Move a ledger row on: attempts, outcome, result or error.
UPDATE keel_effects
SET status = %(status)s, attempts = %(attempts)s, result = %(result)s, error = %(error)s,
    lease_token = %(lease_token)s, updated_at = keel_now()
WHERE idempotency_key = %(key)s
RETURNING *;

-- name: reserve_effect
-- Reserve an idempotency key (pending) in one statement, fenced: only if `lease_token` holds
-- the run (its row held FOR SHARE until this commits) and no cancel was asked (`cancelled`),
-- and unless the key is in the ledger already, or the call's pre-0006 key is (`legacy`: that
-- row is served). A key is reserved only under a live lease: `lease_left` is how many seconds
-- of it remain by the database's clock (0: expired), the bound within which the provider call
-- that follows needs no second look at the lease. A new key's `deadline_at` is `hold` seconds
-- from now (its effect's timeout and margin); `deadline_in` is how long an existing key's call
-- may still be under way (nobody acts on it before). The effect's row follows, and whether this
-- call reserved it (`reserved`). No row: the token does not hold the run, nothing was written.
-- `thread_id`: the thread whose runs share the key (`key=` on a thread), else NULL.
WITH fence AS (
    SELECT run_id, cancel_requested,
           GREATEST(COALESCE(lease_expires_at, 0) - keel_now(), 0) AS lease_left
    FROM keel_runs
    WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s
    FOR SHARE),
legacy AS (
    SELECT * FROM keel_effects WHERE idempotency_key = %(legacy_key)s AND arg_hashes IS NULL),
inserted AS (
    INSERT INTO keel_effects (idempotency_key, run_id, name, node, step, task_path, args_hash,
                          arg_hashes, call_index, status, attempts, lease_token, created_at, updated_at,
                          deadline_at, thread_id)
    SELECT %(key)s, %(run_id)s, %(name)s, %(node)s, %(step)s, %(task_path)s, %(args_hash)s,
           %(arg_hashes)s, %(call_index)s, 'pending', 0, %(lease_token)s, keel_now(), keel_now(),
           keel_now() + %(hold)s, %(thread_id)s
    FROM fence WHERE cancel_requested = 0 AND lease_left > 0 AND NOT EXISTS (SELECT 1 FROM legacy)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING *)
SELECT f.cancel_requested AS cancelled, f.lease_left, (SELECT COUNT(*) FROM legacy) AS legacy,
       (SELECT COUNT(*) FROM inserted) AS reserved,
       GREATEST(COALESCE(e.deadline_at, 0) - keel_now(), 0) AS deadline_in, e.*
FROM fence AS f
LEFT JOIN (SELECT * FROM legacy
           UNION ALL
           SELECT * FROM inserted
           UNION ALL
           SELECT * FROM keel_effects
           WHERE idempotency_key = %(key)s
             AND NOT EXISTS (SELECT 1 FROM legacy) AND NOT EXISTS (SELECT 1 FROM inserted)) AS e
  ON f.cancel_requested = 0;

-- name: record_effect
-- Move a ledger row on (attempts, outcome, result or error) and record it on the timeline, in
-- one statement, fenced: only if `lease_token` holds the run (its row held FOR SHARE until
-- this commits). No row: the token does not hold the run, and nothing was written.
WITH fence AS (
    SELECT run_id FROM keel_runs WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s
    FOR SHARE),
updated AS (
    UPDATE keel_effects
    SET status = %(status)s, attempts = %(attempts)s, result = %(result)s, error = %(error)s,
        lease_token = %(lease_token)s, updated_at = keel_now()
    WHERE idempotency_key = %(key)s AND EXISTS (SELECT 1 FROM fence)
    RETURNING idempotency_key),
turn AS (SELECT pg_advisory_xact_lock(74213003, hashtext(run_id)) FROM fence),
event AS (
    INSERT INTO keel_events (run_id, at, kind, worker_id, lease_token, data)
    SELECT run_id, keel_now(), %(kind)s, %(worker_id)s, %(lease_token)s, %(data)s FROM fence, turn)
SELECT run_id AS fenced_id, (SELECT COUNT(*) FROM updated) AS updated FROM fence;

-- name: list_effects
-- A run's ledger.
SELECT * FROM keel_effects WHERE run_id = %(run_id)s ORDER BY created_at, idempotency_key;

-- name: register_wait
-- Register one wait the graph paused on, in one statement, after the step's fence
-- (`fence_step`, sent first in the same pipeline): unless it is already registered (a replay)
-- or the run, running under `lease_token`, was asked to cancel. With it: its `wait.registered`
-- event (`event`) and, unless it is an outbox wait (a machine's), one `request` intent per
-- notifier in `notifiers`. The new wait's row; none if nothing was inserted.
WITH run AS (
    SELECT run_id, job_id, workflow FROM keel_runs
    WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s AND status = 'running'
      AND cancel_requested = 0),
inserted AS (
    INSERT INTO keel_waits (wait_id, run_id, interrupt_id, kind, name, payload, approvers, status,
                            deadline, on_timeout, schedule, next_stage_at, created_at)
    SELECT %(wait_id)s, run_id, %(interrupt_id)s, %(kind)s, %(name)s, %(payload)s, %(approvers)s, 'pending',
           keel_now() + %(deadline_after)s::double precision, %(on_timeout)s, %(schedule)s,
           keel_now() + %(first_stage_after)s::double precision, keel_now()
    FROM run
    ON CONFLICT (wait_id) DO NOTHING
    RETURNING *),
turn AS (SELECT pg_advisory_xact_lock(74213003, hashtext(run_id)) FROM inserted),
event AS (
    INSERT INTO keel_events (run_id, at, kind, worker_id, lease_token, data)
    SELECT i.run_id, keel_now(), 'wait.registered', %(worker_id)s, %(lease_token)s, %(event)s
    FROM inserted AS i, turn),
intent AS (
    INSERT INTO keel_outbox (intent_id, run_id, wait_id, notifier, kind, payload, status,
                             available_at, created_at, updated_at)
    SELECT 'n:' || left(keel_digest(i.run_id, i.wait_id, 'request', '0', n.name), 32),
           i.run_id, i.wait_id, n.name, 'request',
           keel_notification(r.job_id, r.workflow, i.wait_id, i.kind, i.name, i.payload,
                             i.approvers, i.deadline, '{"stage": 0}'),
           'queued', keel_now(), keel_now(), keel_now()
    FROM inserted AS i, run AS r, jsonb_array_elements_text(%(notifiers)s::jsonb) AS n (name)
    WHERE i.kind NOT IN ('outbox', 'timer')
    ON CONFLICT (intent_id) DO NOTHING)
SELECT * FROM inserted;

-- name: end_registration
-- moves: running>waiting, running>queued, running>cancelled
-- The end of a wait registration, in one statement after its waits: the run, running under
-- `lease_token`, is cancelled if a cancel was asked while its step ran (its pending waits
-- expire: nobody is asked; its termination reason is the cancel's, as `finish_run`'s), queued
-- if one of `wait_ids` is already answered (a decision raced the registration), else waiting;
-- its lease is released, the move is on its timeline. The status it reached and the events it
-- wrote (`events`, as `decide`'s); none if the token does not hold a running run.
WITH run AS (
    SELECT run_id, cancel_requested FROM keel_runs
    WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s AND status = 'running'),
target AS (
    SELECT CASE
        WHEN r.cancel_requested = 1 THEN 'cancelled'
        WHEN EXISTS (SELECT 1 FROM keel_waits
                     WHERE run_id = r.run_id AND status <> 'pending'
                       AND wait_id IN (SELECT jsonb_array_elements_text(%(wait_ids)s::jsonb)))
        THEN 'queued'
        ELSE 'waiting' END AS status
    FROM run AS r),
expired AS (
    UPDATE keel_waits
    SET status = 'expired', decision = 'cancelled', value = 'null', decided_by = 'keel:deadline',
        channel = 'deadline', decided_at = keel_now()
    WHERE run_id = %(run_id)s AND status = 'pending'
      AND EXISTS (SELECT 1 FROM target WHERE status = 'cancelled')
    RETURNING wait_id),
moved AS (
    UPDATE keel_runs AS r
    SET status = t.status,
        termination_reason = CASE WHEN t.status = 'cancelled'
                                  THEN COALESCE(r.cancel_reason, 'cancelled')
                                  ELSE r.termination_reason END,
        lease_owner = NULL, lease_expires_at = NULL,
        finished_at = CASE WHEN t.status = 'cancelled' THEN keel_now() ELSE NULL END,
        updated_at = keel_now()
    FROM target AS t
    WHERE r.run_id = %(run_id)s
    RETURNING r.run_id, t.status, r.termination_reason),
turn AS (SELECT pg_advisory_xact_lock(74213003, hashtext(run_id)) FROM moved),
event AS (
    INSERT INTO keel_events (run_id, at, kind, worker_id, lease_token, data)
    SELECT m.run_id, keel_now(), 'status.' || m.status, %(worker_id)s, %(lease_token)s,
           (jsonb_build_object('from', 'running', 'to', m.status)
            || CASE WHEN m.status = 'cancelled'
                    THEN jsonb_build_object('termination_reason', m.termination_reason)
                    ELSE '{}'::jsonb END)::text
    FROM moved AS m, turn
    RETURNING event_id, run_id, kind, data, worker_id, lease_token)
SELECT status AS target, (SELECT COUNT(*) FROM expired) AS expired,
       (SELECT COALESCE(json_agg(json_build_object('run_id', run_id, 'kind', kind, 'data', data::json,
                                          'worker_id', worker_id, 'lease_token', lease_token)
                        ORDER BY event_id), '[]')::text FROM event) AS events
FROM moved;

-- name: get_wait
-- One wait.
SELECT * FROM keel_waits WHERE wait_id = %(wait_id)s;

-- name: list_waits
-- A run's waits.
SELECT * FROM keel_waits WHERE run_id = %(run_id)s ORDER BY created_at, wait_id;

-- name: list_pending_waits
-- Every open wait a person can answer, oldest deadline first (an outbox wait is the
-- dispatcher's: a dead intent is retried or resolved with `keel effects`, not decided).
SELECT * FROM keel_waits WHERE status = 'pending' AND kind NOT IN ('outbox', 'timer') ORDER BY deadline, created_at LIMIT %(limit)s;

-- name: decide_wait
-- The first decision wins: only a pending wait can be decided.
UPDATE keel_waits
SET status = 'decided', decision = %(decision)s, value = %(value)s, decided_by = %(decided_by)s,
    action_id = %(action_id)s, channel = %(channel)s, comment = %(comment)s, decided_at = keel_now()
WHERE wait_id = %(wait_id)s AND status = 'pending'
RETURNING *;

-- name: decide
-- moves: waiting>queued
-- A decision, in one statement after the run's lock (`lock_run`, sent in the same pipeline):
-- the target wait (the one named, else the run's only pending wait, else, for a run that has
-- moved on from waiting, its latest decided one: a duplicate), decided only if it is pending,
-- the run not finished and the answer of its kind (`effect_answer`: an in-doubt effect's wait
-- takes only performed/not_performed; an outbox wait none). The value the graph resumes with
-- gets the wait's id and the database's time. With it: an approval's verdict as the run's
-- decision, a waiting run queued, the timeline's `decision.recorded` (and `status.queued`),
-- one `decided` intent per notifier in `notifiers`, and a wake-up. The row: what was found
-- (run, pending waits, target) and `recorded` (1 for the call that decided), and the timeline
-- events it wrote (`events`: a JSON list of {run_id, kind, data, worker_id, lease_token}, which
-- the store logs as they are); none if no run.
WITH run AS (SELECT * FROM keel_runs WHERE run_id = %(run_id)s),
waits AS (SELECT * FROM keel_waits WHERE run_id = %(run_id)s),
pending AS (SELECT * FROM waits WHERE status = 'pending'),
target AS (
    SELECT w.* FROM waits AS w, run AS r
    WHERE CASE
        WHEN %(wait_id)s::text IS NOT NULL THEN w.wait_id = %(wait_id)s::text
        WHEN (SELECT COUNT(*) FROM pending) = 1 THEN w.status = 'pending'
        WHEN (SELECT COUNT(*) FROM pending) = 0
             AND r.status NOT IN ('completed', 'failed', 'cancelled', 'waiting')
        THEN w.wait_id = (SELECT wait_id FROM waits WHERE status = 'decided'
                          ORDER BY created_at DESC, wait_id DESC LIMIT 1)
        ELSE false END),
decided AS (
    UPDATE keel_waits AS w
    SET status = 'decided', decision = %(decision)s,
        value = (%(value)s::jsonb || jsonb_build_object('wait_id', w.wait_id, 'at', keel_now()))::text,
        decided_by = %(decided_by)s, action_id = %(action_id)s, channel = %(channel)s,
        comment = %(comment)s, decided_at = keel_now()
    FROM target AS t, run AS r
    WHERE w.wait_id = t.wait_id AND w.status = 'pending'
      AND r.status NOT IN ('completed', 'failed', 'cancelled')
      AND t.kind NOT IN ('outbox', 'timer') AND (t.kind = 'effect') = (%(effect_answer)s = 1)
      AND (%(decision)s::text <> 'resumed' OR t.kind = 'interrupt')
    RETURNING w.*),
moved AS (
    UPDATE keel_runs AS r
    SET decision = CASE WHEN d.kind = 'approval' AND %(decision)s IN ('approved', 'rejected')
                        THEN %(decision)s ELSE r.decision END,
        status = CASE WHEN r.status = 'waiting' THEN 'queued' ELSE r.status END,
        lease_owner = CASE WHEN r.status = 'waiting' THEN NULL ELSE r.lease_owner END,
        lease_expires_at = CASE WHEN r.status = 'waiting' THEN NULL ELSE r.lease_expires_at END,
        updated_at = keel_now()
    FROM decided AS d
    WHERE r.run_id = d.run_id
    RETURNING r.run_id),
turn AS (SELECT pg_advisory_xact_lock(74213003, hashtext(run_id)) FROM decided),
event AS (
    INSERT INTO keel_events (run_id, at, kind, worker_id, lease_token, data)
    SELECT d.run_id, keel_now(), e.kind, NULL, NULL,
           (e.data::jsonb || jsonb_build_object('wait_id', d.wait_id))::text
    FROM decided AS d, turn, run AS r,
         (VALUES (1, 'decision.recorded', %(recorded_data)s::text),
                 (2, 'status.queued', %(queued_data)s::text)) AS e (n, kind, data)
    WHERE e.n = 1 OR r.status = 'waiting'
    ORDER BY e.n
    RETURNING event_id, run_id, kind, data, worker_id, lease_token),
intent AS (
    INSERT INTO keel_outbox (intent_id, run_id, wait_id, notifier, kind, payload, status,
                             available_at, created_at, updated_at)
    SELECT 'n:' || left(keel_digest(d.run_id, d.wait_id, 'decided', '0', n.name), 32),
           d.run_id, d.wait_id, n.name, 'decided',
           keel_notification(r.job_id, r.workflow, d.wait_id, d.kind, d.name, d.payload,
                             d.approvers, d.deadline, %(details)s::text),
           'queued', keel_now(), keel_now(), keel_now()
    FROM decided AS d, run AS r, jsonb_array_elements_text(%(notifiers)s::jsonb) AS n (name)
    ON CONFLICT (intent_id) DO NOTHING),
wake AS (SELECT pg_notify('keel_wake', run_id) FROM decided WHERE %(wake)s::int = 1)
SELECT r.run_id AS found_run, r.status AS run_status,
       (SELECT COUNT(*) FROM pending) AS n_pending,
       (SELECT string_agg(wait_id, ', ' ORDER BY created_at, wait_id) FROM pending) AS pending_ids,
       (SELECT COUNT(*) FROM decided) AS recorded,
       (SELECT COUNT(*) FROM moved) + (SELECT COUNT(*) FROM wake) AS moved,
       (SELECT COALESCE(json_agg(json_build_object('run_id', run_id, 'kind', kind, 'data', data::json,
                                          'worker_id', worker_id, 'lease_token', lease_token)
                        ORDER BY event_id), '[]')::text FROM event) AS events,
       w.*
FROM run AS r
LEFT JOIN (SELECT * FROM decided
           UNION ALL
           SELECT * FROM target WHERE NOT EXISTS (SELECT 1 FROM decided)) AS w ON true;

-- name: set_run_decision
-- An approval's decision is also the run's (status moves separately, through the table).
UPDATE keel_runs SET decision = %(decision)s, updated_at = keel_now() WHERE run_id = %(run_id)s;

-- name: upsert_worker
-- A worker says it is alive, which workflow versions it executes, and which it refuses (its
-- graph differs from the one the version was first served with: key -> what differs).
INSERT INTO keel_workers (worker_id, host, pid, concurrency, workflows, refused, started_at, heartbeat_at)
VALUES (%(worker_id)s, %(host)s, %(pid)s, %(concurrency)s, %(workflows)s, %(refused)s, keel_now(), keel_now())
ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = keel_now(), stopped_at = NULL,
    workflows = excluded.workflows, refused = excluded.refused;

-- name: next_due
-- What an idle worker of these workflows has to do, by the database's clock (it sleeps until
-- then): whether a run is queued for it (and due: a delayed run's time has come), when a claim
-- next finds a run that is not there yet (`lease_at`: the earliest lease of a running run
-- expires, a takeover, or a delayed run's not-before time comes), and when the sweeper's next
-- work falls due: a wait's deadline (a sleeping run's wake time among them) or next schedule
-- stage, an outbox intent becoming deliverable or its sender's claim expiring (for a
-- worker that delivers them, `outbox`). NULL: nothing of that kind is pending.
SELECT keel_now() AS now,
       EXISTS (SELECT 1 FROM keel_runs AS q WHERE status = 'queued'
               AND (q.not_before IS NULL OR q.not_before <= (SELECT keel_now()))
               AND (q.thread_id IS NULL OR NOT EXISTS (SELECT 1 FROM keel_runs AS t
                    WHERE t.thread_id = q.thread_id AND t.thread_seq < q.thread_seq
                      AND t.status IN ('queued', 'running', 'waiting')))
               AND workflow || '@' || workflow_version IN (SELECT jsonb_array_elements_text(%(workflows)s::jsonb))) AS queued,
       (SELECT MIN(t) FROM (
            SELECT MIN(lease_expires_at) AS t FROM keel_runs WHERE status = 'running'
            AND workflow || '@' || workflow_version IN (SELECT jsonb_array_elements_text(%(workflows)s::jsonb))
            UNION ALL
            SELECT MIN(not_before) FROM keel_runs WHERE status = 'queued'
            AND not_before > (SELECT keel_now())
            AND workflow || '@' || workflow_version IN (SELECT jsonb_array_elements_text(%(workflows)s::jsonb))
        ) AS claimable) AS lease_at,
       (SELECT MIN(t) FROM (
            SELECT MIN(deadline) AS t FROM keel_waits WHERE status = 'pending'
            UNION ALL
            SELECT MIN(next_stage_at) FROM keel_waits WHERE status = 'pending'
            UNION ALL
            SELECT MIN(available_at) FROM keel_outbox WHERE status = 'queued' AND %(outbox)s = 1
            UNION ALL
            SELECT MIN(claim_expires_at) FROM keel_outbox WHERE status = 'sending' AND %(outbox)s = 1
        ) AS due) AS sweep_at;

-- name: stop_worker
-- A worker says it stopped.
UPDATE keel_workers SET stopped_at = keel_now() WHERE worker_id = %(worker_id)s;

-- name: list_workers
-- Workers that heartbeated within the last `window` seconds of the database's clock.
SELECT * FROM keel_workers WHERE heartbeat_at >= (SELECT keel_now()) - %(window)s AND stopped_at IS NULL ORDER BY started_at;

-- name: count_unfinished
-- Runs some worker still has to execute (waiting runs need a person first, and so do the runs
-- queued behind them on their thread).
SELECT COUNT(*) AS n FROM keel_runs AS q
WHERE status IN ('queued', 'running')
  AND (q.thread_id IS NULL OR q.status = 'running' OR NOT EXISTS (
      SELECT 1 FROM keel_runs AS t WHERE t.thread_id = q.thread_id AND t.thread_seq < q.thread_seq
        AND t.status IN ('queued', 'running', 'waiting')))
  AND workflow || '@' || workflow_version IN (SELECT jsonb_array_elements_text(%(workflows)s::jsonb));

-- name: notify_wake
-- Wake idle workers at once (delivered on commit).
SELECT pg_notify('keel_wake', %(run_id)s) IS NULL AS sent;

-- name: wake_if_queued
-- Wake idle workers for a run only if it is queued at this point of the transaction: after an
-- admission or a decision whose own claim (a hand-off) may have taken it already.
SELECT pg_notify('keel_wake', run_id) IS NULL AS sent FROM keel_runs
WHERE run_id = %(run_id)s AND status = 'queued';

-- name: notify_intents
-- Wake idle workers' intent dispatchers at once (delivered on commit), not their claim loops.
SELECT pg_notify('keel_wake', 'outbox:' || %(run_id)s) IS NULL AS sent;

-- name: expired_waits
-- Open waits whose deadline has passed, oldest first.
SELECT * FROM keel_waits
WHERE status = 'pending' AND deadline IS NOT NULL AND deadline < (SELECT keel_now())
ORDER BY deadline
LIMIT %(limit)s;

-- name: expire_wait
-- Apply a deadline's final policy exactly once, however many sweepers race.
UPDATE keel_waits
SET status = 'expired', decision = %(decision)s, value = %(value)s, decided_by = 'keel:deadline',
    channel = 'deadline', decided_at = keel_now()
WHERE wait_id = %(wait_id)s AND status = 'pending'
RETURNING *;

-- name: escalate_wait
-- Move an open wait to its next escalation level with a new deadline, exactly once per level.
UPDATE keel_waits
SET deadline = keel_now() + %(window)s, escalation_level = escalation_level + 1
WHERE wait_id = %(wait_id)s AND status = 'pending' AND escalation_level = %(level)s
RETURNING *;

-- name: set_cancel_requested
-- Ask a running run to stop at its next step boundary.
UPDATE keel_runs SET cancel_requested = 1, updated_at = keel_now()
WHERE run_id = %(run_id)s AND status = 'running';

-- name: insert_notification
-- Record a notification to deliver (idempotent: a replay records the same one once).
INSERT INTO keel_outbox (intent_id, run_id, wait_id, notifier, kind, payload, status,
                         available_at, created_at, updated_at)
VALUES (%(intent_id)s, %(run_id)s, %(wait_id)s, %(notifier)s, %(kind)s, %(payload)s, 'queued',
        keel_now(), keel_now(), keel_now())
ON CONFLICT (intent_id) DO NOTHING
RETURNING intent_id;

-- name: notification_candidate
-- The oldest notification due, or one whose sender died mid-delivery (claim expired).
SELECT * FROM keel_outbox
WHERE (status = 'queued' AND available_at <= (SELECT keel_now()))
   OR (status = 'sending' AND claim_expires_at < (SELECT keel_now()))
ORDER BY available_at, intent_id
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- name: claim_notification
-- Take a notification to deliver; its status says whether an earlier sender may have sent it.
UPDATE keel_outbox
SET status = %(status)s, claimed_by = %(worker_id)s, claim_expires_at = keel_now() + %(ttl)s,
    attempts = attempts + 1, updated_at = keel_now()
WHERE intent_id = %(intent_id)s
RETURNING *;

-- name: settle_notification
-- Record a notification's outcome, only under the claim that sent it: its holder and its number
-- (`attempts`, counted at each claim: the same worker's later claim is another one).
UPDATE keel_outbox
SET status = %(status)s, result = %(result)s, error = %(error)s, available_at = keel_now() + %(delay)s,
    claimed_by = NULL, claim_expires_at = NULL, updated_at = keel_now()
WHERE intent_id = %(intent_id)s AND claimed_by = %(worker_id)s AND attempts = %(attempts)s
RETURNING *;

-- name: defer_notification
-- Put a claimed notification back for later without counting the claim as an attempt (it
-- waits for its wait's request to settle: nothing was tried); only by its claimer.
UPDATE keel_outbox
SET status = 'queued', attempts = attempts - 1, available_at = keel_now() + %(delay)s,
    claimed_by = NULL, claim_expires_at = NULL, updated_at = keel_now()
WHERE intent_id = %(intent_id)s AND claimed_by = %(worker_id)s AND attempts = %(attempts)s
RETURNING intent_id;

-- name: renew_notification_claim
-- Extend a claim while its notifier sends, only under that claim: a claim that lapsed with
-- nobody taking it is still its sender's (a renewal late after the database was away), and
-- a claim taken over has another number (`attempts`) or holder.
UPDATE keel_outbox SET claim_expires_at = keel_now() + %(ttl)s
WHERE intent_id = %(intent_id)s AND claimed_by = %(worker_id)s AND attempts = %(attempts)s
  AND status = 'sending'
RETURNING intent_id;

-- name: count_reconcile_timeout
-- One more of a notification's reconciles went unanswered within its timeout, counted only
-- under the claim that asked it (its holder and number): the count so far.
UPDATE keel_outbox SET reconcile_timeouts = reconcile_timeouts + 1, updated_at = keel_now()
WHERE intent_id = %(intent_id)s AND claimed_by = %(worker_id)s AND attempts = %(attempts)s
  AND status = 'sending'
RETURNING reconcile_timeouts;

-- name: list_notifications
-- A run's notifications.
SELECT * FROM keel_outbox WHERE run_id = %(run_id)s ORDER BY created_at, intent_id;

-- name: notifications_for_wait
-- Earlier notifications about one wait (e.g. the message a decision updates).
SELECT * FROM keel_outbox WHERE wait_id = %(wait_id)s ORDER BY created_at, intent_id;

-- name: due_stages
-- Open waits whose next reminder or escalation is due.
SELECT * FROM keel_waits
WHERE status = 'pending' AND next_stage_at IS NOT NULL AND next_stage_at <= (SELECT keel_now())
ORDER BY next_stage_at
LIMIT %(limit)s;

-- name: advance_stage
-- Move a wait to its next schedule stage, exactly once per stage however many sweepers race.
UPDATE keel_waits
SET escalation_level = escalation_level + 1, next_stage_at = %(next_stage_at)s
WHERE wait_id = %(wait_id)s AND status = 'pending' AND escalation_level = %(level)s
RETURNING *;

-- name: expire_deadline_now
-- The crash harness's "let the deadline pass": the sweeper then applies the wait's policy.
UPDATE keel_waits SET deadline = keel_now() - 1 WHERE wait_id = %(wait_id)s AND status = 'pending';

-- name: database_now
-- The database's clock (epoch seconds, or a test clock's time): it judges leases and deadlines.
SELECT keel_now() AS now;

-- name: served_workflows
-- What workers serve and refuse, most recently seen first, with whether each is live.
SELECT workflows, refused, CASE WHEN stopped_at IS NULL AND heartbeat_at >= (SELECT keel_now()) - %(window)s THEN 1 ELSE 0 END AS live FROM keel_workers
WHERE workflows <> '[]' OR refused <> '{}'
ORDER BY COALESCE(stopped_at, heartbeat_at) DESC, worker_id
LIMIT 1000;

-- name: record_graph_shape
-- The structure a workflow version is first served with; a later one is not written (the
-- first one stays the version's).
INSERT INTO keel_graph_shapes (workflow, version, digest, shape, recorded_at, recorded_by)
VALUES (%(workflow)s, %(version)s, %(digest)s, %(shape)s, keel_now(), %(worker_id)s)
ON CONFLICT (workflow, version) DO NOTHING;

-- name: accept_graph_shape
-- An operator's word that a version's graph as it is now is the version's (a change that moves
-- no run elsewhere: a router renamed, a library upgrade): it replaces the one first served.
INSERT INTO keel_graph_shapes (workflow, version, digest, shape, recorded_at, recorded_by)
VALUES (%(workflow)s, %(version)s, %(digest)s, %(shape)s, keel_now(), %(by)s)
ON CONFLICT (workflow, version) DO UPDATE
SET digest = excluded.digest, shape = excluded.shape, recorded_at = excluded.recorded_at,
    recorded_by = excluded.recorded_by;

-- name: get_graph_shape
-- The structure a workflow version was first served with.
SELECT digest, shape, recorded_at, recorded_by FROM keel_graph_shapes
WHERE workflow = %(workflow)s AND version = %(version)s;

-- name: set_traceparent
-- Keep the run's trace context, unless it already has one (the first tracer wins).
UPDATE keel_runs SET traceparent = %(traceparent)s
WHERE run_id = %(run_id)s AND traceparent IS NULL
RETURNING traceparent;

-- name: get_traceparent
-- The run's trace context (NULL until a traced process submitted or claimed it).
SELECT traceparent FROM keel_runs WHERE run_id = %(run_id)s;

-- name: set_run_version
-- Move a queued or waiting run to another version of its workflow.
UPDATE keel_runs SET workflow_version = %(version)s, updated_at = keel_now()
WHERE run_id = %(run_id)s AND status IN ('queued', 'waiting')
RETURNING *;

-- name: browse_runs
-- The console's run list, newest first: filters by status, workflow, job id prefix (a range
-- in byte order, so the "C"-collated job index serves it whatever the database's collation)
-- and admission time; paged.
SELECT * FROM keel_runs
WHERE (%(status)s::text IS NULL OR status = %(status)s::text)
  AND (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(job_prefix)s::text IS NULL OR (job_id COLLATE "C" >= %(job_prefix)s::text
       AND job_id COLLATE "C" < %(job_prefix_end)s::text))
  AND (%(since)s::float8 IS NULL OR created_at >= %(since)s::float8)
  AND (%(until)s::float8 IS NULL OR created_at < %(until)s::float8)
ORDER BY created_at DESC, run_id DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: count_pending_waits
-- How many open waits each of some runs has (the run list's "pending" column).
SELECT run_id, COUNT(*) AS n FROM keel_waits
WHERE status = 'pending' AND run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb))
GROUP BY run_id;

-- name: browse_pending_waits
-- Open waits of one kind (or all), oldest deadline first, paged (the approvals inbox).
SELECT * FROM keel_waits
WHERE status = 'pending' AND ((%(kind)s::text IS NULL AND kind NOT IN ('outbox', 'timer')) OR kind = %(kind)s::text)
ORDER BY deadline, created_at, wait_id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: running_runs
-- Runs a worker holds now, by worker (the workers page).
SELECT run_id, job_id, workflow, workflow_version, lease_owner, lease_token, lease_expires_at,
       heartbeat_at, started_at
FROM keel_runs WHERE status = 'running'
ORDER BY lease_owner, started_at
LIMIT %(limit)s;

-- name: count_failed_attempt
-- One more crashed or interrupted attempt of the run, by the execution that holds its lease
-- (a crash it recovers from is counted by the takeover's claim_run instead). Interruptions
-- count in a row: one that ends an execution which committed a step starts again from 1.
UPDATE keel_runs
SET crash_count = crash_count + %(crash)s,
    infra_retries = CASE WHEN %(progressed)s = 1 THEN %(infra)s
                         ELSE infra_retries + %(infra)s END,
    updated_at = keel_now()
WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s
RETURNING crash_count, infra_retries;

-- name: hold_lease_until
-- Keep a crashed run's lease until its backoff is over: it is claimable again after that.
UPDATE keel_runs SET lease_expires_at = keel_now() + %(delay)s, updated_at = keel_now()
WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s AND status = 'running';

-- name: clear_failure
-- A resumed run starts afresh: no termination reason, error or failed attempts.
UPDATE keel_runs
SET termination_reason = NULL, error = NULL, crash_count = 0, infra_retries = 0,
    cancel_requested = 0, updated_at = keel_now()
WHERE run_id = %(run_id)s;

-- name: reopen_failed_effects
-- A resumed run's failed effects go back to pending: the ledger then asks the reconciler (or a
-- person) whether they reached the provider, as after a crash, instead of failing them again.
UPDATE keel_effects SET status = 'pending', updated_at = keel_now()
WHERE run_id = %(run_id)s AND status = 'failed';

-- name: events_after
-- A run's timeline after the event `after` (0: from the start), in order, at most `limit`.
SELECT * FROM keel_events WHERE run_id = %(run_id)s AND event_id > %(after)s
ORDER BY event_id LIMIT %(limit)s;

-- name: metrics_runs
-- Runs per workflow, version and status (scraped by /metrics).
SELECT workflow, workflow_version, status, COUNT(*) AS n FROM keel_runs
GROUP BY workflow, workflow_version, status;

-- name: metrics_queue
-- Queued runs and when the oldest was admitted.
SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM keel_runs WHERE status = 'queued';

-- name: metrics_effects
-- Ledger rows per effect name and state.
SELECT name, status, COUNT(*) AS n FROM keel_effects GROUP BY name, status;

-- name: metrics_waits
-- Open waits per kind and when the oldest opened.
SELECT kind, COUNT(*) AS n, MIN(created_at) AS oldest FROM keel_waits
WHERE status = 'pending' GROUP BY kind;

-- name: metrics_notifications
-- Notifications per state and when the oldest of each state was recorded.
SELECT status, COUNT(*) AS n, MIN(created_at) AS oldest FROM keel_outbox GROUP BY status;

-- name: metrics_intents
-- Outbox effect intents per effect and state, and when the oldest of each was recorded.
SELECT effect, status, COUNT(*) AS n, MIN(created_at) AS oldest FROM keel_intents
GROUP BY effect, status;

-- name: metrics_overdue
-- The oldest thing the sweeper should already have handled: a passed deadline or stage of an
-- open wait, or an expired lease of a running run.
SELECT MIN(t) AS oldest FROM (
    SELECT MIN(deadline) AS t FROM keel_waits WHERE status = 'pending' AND deadline < (SELECT keel_now())
    UNION ALL
    SELECT MIN(next_stage_at) FROM keel_waits WHERE status = 'pending' AND next_stage_at < (SELECT keel_now())
    UNION ALL
    SELECT MIN(lease_expires_at) FROM keel_runs WHERE status = 'running' AND lease_expires_at < (SELECT keel_now())
) AS due;

-- name: record_pruned_folders
-- The pruned runs whose artifact folders are still to be removed (same transaction as the delete).
INSERT INTO keel_pruned_folders (run_id) SELECT jsonb_array_elements_text(%(run_ids)s::jsonb) ON CONFLICT (run_id) DO NOTHING;

-- name: pruned_folders
-- Folders of runs already pruned that are still to be removed, oldest batches first.
SELECT run_id FROM keel_pruned_folders ORDER BY run_id LIMIT %(limit)s;

-- name: forget_pruned_folders
-- Their folders are gone.
DELETE FROM keel_pruned_folders WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_candidates
-- Finished runs in `statuses` that finished more than `older_than` seconds ago by the
-- database's clock, oldest first (a dry run's list).
SELECT run_id, workflow, status, finished_at FROM keel_runs
WHERE status IN (SELECT jsonb_array_elements_text(%(statuses)s::jsonb))
  AND finished_at IS NOT NULL AND finished_at < (SELECT keel_now()) - %(older_than)s
ORDER BY finished_at, run_id LIMIT %(limit)s;

-- name: prune_runs
-- Delete one batch of finished runs, skipping any a writer holds; their ids for the rest.
DELETE FROM keel_runs WHERE run_id IN (
    SELECT run_id FROM keel_runs
    WHERE status IN (SELECT jsonb_array_elements_text(%(statuses)s::jsonb))
      AND finished_at IS NOT NULL AND finished_at < (SELECT keel_now()) - %(older_than)s
    ORDER BY finished_at, run_id LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING run_id;

-- name: prune_events
DELETE FROM keel_events WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_effects
-- A row whose key is its thread's (`key=` on a thread, migration 0034) stays while the thread
-- exists: the thread's later runs are served it by key. It goes with the thread.
DELETE FROM keel_effects AS e
WHERE e.run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb))
  AND (e.thread_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM keel_threads AS t WHERE t.thread_id = e.thread_id));

-- name: prune_waits
DELETE FROM keel_waits WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_notifications
DELETE FROM keel_outbox WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_intents
-- Delivered outbox intents only: one still to deliver (or dead, in doubt) outlives its run.
DELETE FROM keel_intents WHERE status = 'delivered' AND run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_checkpoints
-- LangGraph's checkpoint tables: a run's id is its thread_id.
DELETE FROM checkpoints WHERE thread_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_checkpoint_writes
DELETE FROM checkpoint_writes WHERE thread_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_checkpoint_blobs
DELETE FROM checkpoint_blobs WHERE thread_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: insert_intent
-- Record a user effect's intent with its task's writes (a replay of the step records it once).
INSERT INTO keel_intents (intent_id, run_id, effect, node, step, task_path, call_index, args,
                          args_hash, arg_hashes, status, max_attempts, available_at,
                          created_at, updated_at)
VALUES (%(intent_id)s, %(run_id)s, %(effect)s, %(node)s, %(step)s, %(task_path)s, %(call_index)s, %(args)s,
        %(args_hash)s, %(arg_hashes)s, 'pending', %(max_attempts)s, keel_now(), keel_now(), keel_now())
ON CONFLICT (intent_id) DO NOTHING
RETURNING intent_id;

-- name: intents_next_due
-- Seconds until the dispatcher has something to do, by the database's clock (negative: now):
-- an intent becoming deliverable, or a sender's claim expiring past its call's deadline. NULL:
-- nothing is pending.
SELECT (SELECT MIN(t) FROM (
            SELECT MIN(available_at) AS t FROM keel_intents WHERE status = 'pending'
            UNION ALL
            SELECT MIN(GREATEST(claim_expires_at, COALESCE(deadline_at, 0)))
            FROM keel_intents WHERE status = 'sending'
        ) AS due) - keel_now() AS seconds;

-- name: get_intent
-- One user effect intent.
SELECT * FROM keel_intents WHERE intent_id = %(intent_id)s;

-- name: lock_intent
-- One intent, locked until this transaction ends (retry/resolve against a dispatcher).
SELECT * FROM keel_intents WHERE intent_id = %(intent_id)s
FOR UPDATE;

-- name: intent_candidate
-- The oldest due intent of the effects this dispatcher may deliver now, or one whose claim
-- expired while it was `sending` (its dispatcher died or was cut off: it is reconciled, never
-- blindly resent), once its call's deadline passed (until then that call may be under way).
SELECT * FROM keel_intents
WHERE effect IN (SELECT jsonb_array_elements_text(CAST(%(effects)s AS jsonb)))
  AND ((status = 'pending' AND available_at <= (SELECT keel_now()))
       OR (status = 'sending' AND claim_expires_at < (SELECT keel_now())
           AND COALESCE(deadline_at, 0) < (SELECT keel_now())))
ORDER BY available_at, intent_id
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- name: claim_intent
-- Take an intent for delivery under a new claim token (fencing a dispatcher that lost it).
UPDATE keel_intents
SET status = 'sending', claimed_by = %(worker_id)s, claim_token = claim_token + 1,
    claim_expires_at = keel_now() + %(ttl)s, attempts = attempts + %(count)s, updated_at = keel_now()
WHERE intent_id = %(intent_id)s
RETURNING *;

-- name: arm_intent
-- The look before a delivery's provider call: only while the dispatcher's claim still holds, by
-- the database's clock, its call's deadline moves to `hold` seconds from now (the effect's
-- timeout and margin: nobody reconciles or resends it before); a reclaim's call counts as an
-- attempt here (`count`). `claim_left`: the claim's seconds left. No row: the claim lapsed or
-- another dispatcher holds it.
UPDATE keel_intents
SET deadline_at = keel_now() + %(hold)s, attempts = attempts + %(count)s
WHERE intent_id = %(intent_id)s AND claim_token = %(claim_token)s AND status = 'sending'
  AND claim_expires_at > keel_now()
RETURNING claim_expires_at - keel_now() AS claim_left;

-- name: release_intent_claim
-- A dispatcher stops waiting for a delivery's call (past the effect's timeout): its claim ends
-- now, under that claim only, so the intent is reconciled as soon as the call's deadline has
-- passed rather than when the claim would have lapsed.
UPDATE keel_intents SET claim_expires_at = keel_now()
WHERE intent_id = %(intent_id)s AND claim_token = %(claim_token)s AND status = 'sending'
RETURNING intent_id;

-- name: renew_intent_claim
-- Extend a claim while its provider call is under way, only under that claim (as a
-- notification's: lapsed with nobody taking it, it is still its caller's; a takeover changes the
-- token).
UPDATE keel_intents SET claim_expires_at = keel_now() + %(ttl)s
WHERE intent_id = %(intent_id)s AND claim_token = %(claim_token)s AND status = 'sending'
RETURNING intent_id;

-- name: settle_intent
-- Record a delivery's outcome, only under the claim that made it.
UPDATE keel_intents
SET status = %(status)s, result = %(result)s, error = %(error)s, available_at = keel_now() + %(delay)s,
    claimed_by = NULL, claim_expires_at = NULL, updated_at = keel_now(),
    delivered_at = CASE WHEN CAST(%(status)s AS TEXT) = 'delivered' THEN keel_now() ELSE delivered_at END
WHERE intent_id = %(intent_id)s AND claim_token = %(claim_token)s AND status = 'sending'
RETURNING *;

-- name: reopen_intent
-- A person's retry (dead) or "not performed" (in doubt): deliver it again, attempts from zero.
UPDATE keel_intents
SET status = 'pending', attempts = 0, available_at = keel_now(), claimed_by = NULL,
    claim_expires_at = NULL, updated_at = keel_now()
WHERE intent_id = %(intent_id)s AND status = %(from_status)s
RETURNING *;

-- name: resolve_intent_performed
-- A person says an in-doubt (or dead) intent reached the provider: delivered, never resent.
UPDATE keel_intents
SET status = 'delivered', result = %(result)s, claimed_by = NULL, claim_expires_at = NULL,
    updated_at = keel_now(), delivered_at = keel_now()
WHERE intent_id = %(intent_id)s AND status = %(from_status)s
RETURNING *;

-- name: list_intents
-- User effect intents, oldest first, by state and/or run.
SELECT * FROM keel_intents
WHERE (CAST(%(status)s AS TEXT) IS NULL OR status = %(status)s) AND (CAST(%(run_id)s AS TEXT) IS NULL OR run_id = %(run_id)s)
ORDER BY created_at, intent_id
LIMIT %(limit)s;

-- name: intent_counts
-- A run's intents per state (its summary says what is still undelivered).
SELECT status, COUNT(*) AS n FROM keel_intents WHERE run_id = %(run_id)s GROUP BY status;

-- name: bucket_ensure
-- A rate-limited effect's token bucket, created full.
INSERT INTO keel_rate_buckets (effect, tokens, updated_at) VALUES (%(effect)s, %(burst)s, keel_now())
ON CONFLICT (effect) DO NOTHING;

-- name: bucket_lock
-- The bucket, locked until this transaction ends, with the database's time to refill it by.
SELECT tokens, updated_at, keel_now() AS now FROM keel_rate_buckets WHERE effect = %(effect)s
FOR UPDATE;

-- name: bucket_set
-- The bucket after a refill and a take.
UPDATE keel_rate_buckets SET tokens = %(tokens)s, updated_at = %(at)s WHERE effect = %(effect)s;

-- name: intents_undelivered
-- Any intent of these effects still to deliver, due now or later.
SELECT intent_id FROM keel_intents
WHERE status IN ('pending', 'sending') AND effect IN (SELECT jsonb_array_elements_text(CAST(%(effects)s AS jsonb)))
LIMIT 1;

-- == threads ==================================================================================

-- name: take_thread
-- A thread for an admission on it, created if `create` and missing, and locked until the
-- transaction ends: admissions on one thread are serialized, so its places and its strategy's
-- verdict are decided one at a time. No row: no such thread and `create` is 0. A thread with
-- no workflow yet ('': made through the Agent Server protocol before any run) takes the
-- admitted run's.
WITH made AS (
    INSERT INTO keel_threads (thread_id, workflow, workflow_version, metadata, created_at, updated_at,
                              first_seq)
    SELECT %(thread_id)s, %(workflow)s, %(workflow_version)s, %(metadata)s, keel_now(), keel_now(),
           (SELECT COALESCE(MAX(thread_seq), 0) + 1 FROM keel_runs WHERE thread_id = %(thread_id)s)
    WHERE %(create)s::int = 1
    ON CONFLICT (thread_id) DO UPDATE SET updated_at = keel_now(),
        workflow = CASE WHEN keel_threads.workflow = '' THEN EXCLUDED.workflow
                        ELSE keel_threads.workflow END,
        workflow_version = CASE WHEN keel_threads.workflow = '' THEN EXCLUDED.workflow_version
                                ELSE keel_threads.workflow_version END
    RETURNING *),
touched AS (
    UPDATE keel_threads SET updated_at = keel_now(),
        workflow = CASE WHEN workflow = '' THEN %(workflow)s ELSE workflow END,
        workflow_version = CASE WHEN workflow = '' THEN %(workflow_version)s
                                ELSE workflow_version END
    WHERE thread_id = %(thread_id)s AND %(create)s::int = 0
    RETURNING *)
SELECT * FROM made UNION ALL SELECT * FROM touched;

-- name: create_thread
-- A new thread; no row if one of that id exists.
INSERT INTO keel_threads (thread_id, workflow, workflow_version, metadata, created_at, updated_at,
                          first_seq)
VALUES (%(thread_id)s, %(workflow)s, %(workflow_version)s, %(metadata)s, keel_now(), keel_now(),
        (SELECT COALESCE(MAX(thread_seq), 0) + 1 FROM keel_runs WHERE thread_id = %(thread_id)s))
ON CONFLICT (thread_id) DO NOTHING
RETURNING *;

-- name: get_thread
-- One thread, with its status as its runs say it (the view `keel_thread_view`, migration 0024).
SELECT * FROM keel_thread_view WHERE thread_id = %(thread_id)s;

-- name: search_threads
-- Threads, most recently updated first, whose metadata contains `metadata` (JSON) as
-- PostgreSQL's `@>` decides it, of one workflow and one status if asked.
SELECT * FROM keel_thread_view AS t
WHERE (%(workflow)s::text IS NULL OR t.workflow = %(workflow)s::text)
  AND (%(status)s::text IS NULL OR t.status = %(status)s::text)
  AND t.metadata::jsonb @> %(metadata)s::jsonb
ORDER BY t.updated_at DESC, t.thread_id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: update_thread_metadata
-- Merge keys into a thread's metadata.
UPDATE keel_threads
SET metadata = (metadata::jsonb || %(metadata)s::jsonb)::text, updated_at = keel_now()
WHERE thread_id = %(thread_id)s
RETURNING *;

-- name: thread_runs
-- A thread's runs in their order: those placed since its row was made (migration 0035; a
-- thread deleted keeps its runs, not naming a new thread of its id). All of them once it is gone.
SELECT * FROM keel_runs WHERE thread_id = %(thread_id)s
  AND thread_seq >= COALESCE((SELECT first_seq FROM keel_threads WHERE thread_id = %(thread_id)s), 0)
ORDER BY thread_seq LIMIT %(limit)s;

-- name: thread_runs_newest
-- A thread's latest runs, newest first (its own, as `thread_runs` says).
SELECT * FROM keel_runs WHERE thread_id = %(thread_id)s
  AND thread_seq >= COALESCE((SELECT first_seq FROM keel_threads WHERE thread_id = %(thread_id)s), 0)
ORDER BY thread_seq DESC LIMIT %(limit)s;

-- name: thread_active_run
-- A thread's active run: its first not finished (queued, running, waiting), however long the
-- thread is.
SELECT * FROM keel_runs
WHERE thread_id = %(thread_id)s AND status IN ('queued', 'running', 'waiting')
ORDER BY thread_seq LIMIT 1;

-- name: thread_unfinished
-- A thread's runs not finished (queued, running, waiting), in their order.
SELECT run_id, status, thread_seq FROM keel_runs
WHERE thread_id = %(thread_id)s AND status IN ('queued', 'running', 'waiting')
ORDER BY thread_seq;

-- name: thread_place
-- The place the next run on a thread takes, and the thread's unfinished runs (queued, running,
-- waiting) as a JSON list: read under `take_thread`'s lock, in a statement after it (its
-- snapshot then sees every admission that held the lock before).
SELECT (SELECT COALESCE(MAX(thread_seq), 0) + 1 FROM keel_runs WHERE thread_id = %(thread_id)s) AS seq,
       (SELECT COALESCE(json_agg(json_build_object('run_id', run_id, 'status', status,
                                          'thread_seq', thread_seq) ORDER BY thread_seq), '[]')::text
        FROM keel_runs WHERE thread_id = %(thread_id)s AND status IN ('queued', 'running', 'waiting')) AS unfinished;

-- name: next_thread_seq
-- The place the next run on a thread takes (read under `take_thread`'s lock).
SELECT COALESCE(MAX(thread_seq), 0) + 1 AS seq FROM keel_runs WHERE thread_id = %(thread_id)s;

-- name: insert_thread_run
-- moves: new>queued
-- Admit a run on a thread at its place; no row if the run already exists.
INSERT INTO keel_runs (run_id, job_id, workflow, workflow_version, attempt, input_hash, input,
                       status, created_at, updated_at, thread_id, thread_seq, command,
                       checkpoint_id, config, multitask_strategy, not_before)
VALUES (%(run_id)s, %(job_id)s, %(workflow)s, %(workflow_version)s, %(attempt)s, %(input_hash)s,
        %(input)s, 'queued', keel_now(), keel_now(), %(thread_id)s, %(thread_seq)s, %(command)s,
        %(checkpoint_id)s, %(config)s, %(multitask_strategy)s, COALESCE(%(not_before)s::double precision, keel_now() + %(delay)s::double precision))
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id;

-- name: set_cancel_reason
-- Why a run is being stopped by a later one on its thread (interrupted, rolled_back): its end
-- as cancelled records it as its termination reason.
UPDATE keel_runs SET cancel_reason = %(reason)s WHERE run_id = %(run_id)s;

-- name: rolled_back_checkpoints
-- Discard the checkpoints (and their writes) that rolled-back runs of a thread wrote, named by
-- the run id each carries in its metadata; the runs' rows, timelines and ledgers stay.
WITH gone AS (
    SELECT checkpoint_id FROM checkpoints
    WHERE thread_id = %(thread_id)s
      AND metadata->>'keel_run_id' IN (SELECT run_id FROM keel_runs
                                       WHERE thread_id = %(thread_id)s
                                         AND cancel_reason = 'rolled_back')),
writes AS (
    DELETE FROM checkpoint_writes
    WHERE thread_id = %(thread_id)s AND checkpoint_id IN (SELECT checkpoint_id FROM gone)),
dropped AS (
    DELETE FROM checkpoints
    WHERE thread_id = %(thread_id)s AND checkpoint_id IN (SELECT checkpoint_id FROM gone)
    RETURNING 1)
SELECT COUNT(*) AS discarded FROM dropped;

-- name: lock_thread
-- A thread, locked until the transaction ends (a deletion's: an admission on it, which
-- `take_thread` serializes, waits, and the deletion sees its run).
SELECT thread_id, first_seq FROM keel_threads WHERE thread_id = %(thread_id)s FOR UPDATE;

-- name: lock_thread_schedules
-- The schedules on a thread, locked before the thread is (a deletion's): a scheduler claims a
-- schedule's row before it takes its thread, so the deletion takes them in that order too (the
-- other would deadlock with a tick firing), and a tick claimed first fires before it.
SELECT schedule_id FROM keel_schedules WHERE thread_id = %(thread_id)s FOR UPDATE;

-- name: delete_thread_schedules
-- A deleted thread's schedules and their tick records (as LangGraph's server deletes a thread's
-- crons with it): a tick of theirs would make the thread again. Their runs stay.
WITH gone AS (DELETE FROM keel_schedules WHERE thread_id = %(thread_id)s RETURNING schedule_id)
DELETE FROM keel_schedule_ticks WHERE schedule_id IN (SELECT schedule_id FROM gone);

-- name: delete_thread
-- A thread, its checkpoints and the effect records its runs shared (`key=` on a thread,
-- migration 0034: the thread's scope ends with it, whichever run made them); its runs,
-- timelines and the rest of their ledgers stay until retention prunes them. No row if there was
-- no such thread.
WITH effects AS (DELETE FROM keel_effects WHERE thread_id = %(thread_id)s),
writes AS (DELETE FROM checkpoint_writes WHERE thread_id = %(thread_id)s),
blobs AS (DELETE FROM checkpoint_blobs WHERE thread_id = %(thread_id)s),
checkpoints AS (DELETE FROM checkpoints WHERE thread_id = %(thread_id)s)
DELETE FROM keel_threads WHERE thread_id = %(thread_id)s RETURNING thread_id;

-- name: copy_thread
-- A new thread `to` with the workflow, metadata and checkpoints of `from` (its runs stay with
-- `from`); no row if `from` does not exist or `to` does.
WITH made AS (
    INSERT INTO keel_threads (thread_id, workflow, workflow_version, metadata, created_at, updated_at,
                              first_seq)
    SELECT %(to_thread)s, workflow, workflow_version, metadata, keel_now(), keel_now(),
           (SELECT COALESCE(MAX(thread_seq), 0) + 1 FROM keel_runs WHERE thread_id = %(to_thread)s)
    FROM keel_threads WHERE thread_id = %(from_thread)s
    ON CONFLICT (thread_id) DO NOTHING
    RETURNING *),
checkpoints AS (
    INSERT INTO checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type,
                             checkpoint, metadata)
    SELECT %(to_thread)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
           metadata
    FROM checkpoints WHERE thread_id = %(from_thread)s AND EXISTS (SELECT 1 FROM made)),
blobs AS (
    INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
    SELECT %(to_thread)s, checkpoint_ns, channel, version, type, blob
    FROM checkpoint_blobs WHERE thread_id = %(from_thread)s AND EXISTS (SELECT 1 FROM made)),
writes AS (
    INSERT INTO checkpoint_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx,
                                   channel, type, blob)
    SELECT %(to_thread)s, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob
    FROM checkpoint_writes WHERE thread_id = %(from_thread)s AND EXISTS (SELECT 1 FROM made))
SELECT * FROM made;

-- Stream chunks (keel.langgraph.chunks, keel.service.agent_server.stream) ----------------------

-- name: insert_chunks
-- A batch of one execution's chunks, in order (`rows`: a JSON array of {anchor, resumed, ns,
-- mode, data}); the caller's fenced transaction holds the run. One writer of a run's chunks at a
-- time until it commits (a transaction lock on the run): ids grow in commit order, so a reader
-- following them by id never skips one committed late.
WITH turn AS (SELECT pg_advisory_xact_lock(74213029, hashtext(%(run_id)s)))
INSERT INTO keel_stream_chunks (run_id, lease_token, anchor, resumed, ns, mode, data)
SELECT %(run_id)s, %(lease_token)s, r.item->>'anchor', (r.item->>'resumed')::INTEGER,
       r.item->>'ns', r.item->>'mode', r.item->>'data'
FROM turn, jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS r(item, n)
ORDER BY r.n;

-- name: supersede_chunks
-- An execution under `lease_token` re-runs the steps after checkpoint `anchor`: older tokens'
-- chunks of them never committed (with `keep_paused`, those produced before a pause at `anchor`
-- did: the pause committed).
UPDATE keel_stream_chunks SET superseded = 1
WHERE run_id = %(run_id)s AND lease_token < %(lease_token)s AND superseded = 0
  AND (anchor > %(anchor)s OR (anchor = %(anchor)s AND (%(keep_paused)s = 0 OR resumed = 1)));

-- name: chunk_ceiling
-- The newest chunk id of the run's executions up to lease token `lease_token` (0: none): where a
-- pause that execution ended in goes in the run's stream, after every chunk it produced.
SELECT COALESCE(MAX(chunk_id), 0) AS ceiling FROM keel_stream_chunks
WHERE run_id = %(run_id)s AND lease_token <= %(lease_token)s;

-- name: chunks_after
-- A run's chunks after `after` (0: from the start) that were not superseded, in order.
SELECT * FROM keel_stream_chunks
WHERE run_id = %(run_id)s AND chunk_id > %(after)s AND superseded = 0
ORDER BY chunk_id LIMIT %(limit)s;

-- name: chunk_superseded
-- Whether the chunk `chunk_id` of the run was superseded (no row: no such chunk).
SELECT superseded, lease_token, anchor FROM keel_stream_chunks
WHERE run_id = %(run_id)s AND chunk_id = %(chunk_id)s;

-- name: superseded_of_token
-- How many chunks of the run's execution under `lease_token` were superseded.
SELECT COUNT(*) AS n FROM keel_stream_chunks
WHERE run_id = %(run_id)s AND lease_token = %(lease_token)s AND superseded = 1;

-- name: prune_stream_chunks
DELETE FROM keel_stream_chunks
WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));
-- Schedules (issue 33): crons and intervals that start runs, a tick at a time (keel.core.schedules).

-- name: schedule_insert
-- A new schedule; no row if one of that name exists.
INSERT INTO keel_schedules (schedule_id, name, workflow, cron, every_seconds, timezone, input,
                            thread_id, catch_up, overlap, metadata, declared, paused, next_tick,
                            created_at, updated_at)
VALUES (%(schedule_id)s, %(name)s, %(workflow)s, %(cron)s, %(every_seconds)s, %(timezone)s,
        %(input)s, %(thread_id)s, %(catch_up)s, %(overlap)s, %(metadata)s, %(declared)s,
        %(paused)s, %(next_tick)s, keel_now(), keel_now())
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: schedule_declare
-- A schedule declared by `@app.workflow(schedule=)`, upserted at a worker's start: created, or
-- its timing and run brought to the declaration, its next tick kept unless its timing changed.
-- A schedule of that name made by hand is left alone (no row).
INSERT INTO keel_schedules (schedule_id, name, workflow, cron, every_seconds, timezone, input,
                            thread_id, catch_up, overlap, metadata, declared, paused, next_tick,
                            created_at, updated_at)
VALUES (%(schedule_id)s, %(name)s, %(workflow)s, %(cron)s, %(every_seconds)s, %(timezone)s,
        %(input)s, %(thread_id)s, %(catch_up)s, %(overlap)s, %(metadata)s, 1, 0, %(next_tick)s,
        keel_now(), keel_now())
ON CONFLICT (name) DO UPDATE SET
    next_tick = CASE WHEN keel_schedules.cron IS NOT DISTINCT FROM EXCLUDED.cron
                      AND keel_schedules.every_seconds IS NOT DISTINCT FROM EXCLUDED.every_seconds
                      AND keel_schedules.timezone = EXCLUDED.timezone
                     THEN keel_schedules.next_tick ELSE EXCLUDED.next_tick END,
    workflow = EXCLUDED.workflow, cron = EXCLUDED.cron, every_seconds = EXCLUDED.every_seconds,
    timezone = EXCLUDED.timezone, input = EXCLUDED.input, thread_id = EXCLUDED.thread_id,
    catch_up = EXCLUDED.catch_up, overlap = EXCLUDED.overlap, metadata = EXCLUDED.metadata,
    updated_at = keel_now()
WHERE keel_schedules.declared = 1
RETURNING *;

-- name: schedule_get
-- One schedule, by id or by name.
SELECT * FROM keel_schedules WHERE schedule_id = %(key)s OR name = %(key)s;

-- name: schedule_list
-- Schedules by name, of one workflow and one thread if asked.
SELECT * FROM keel_schedules
WHERE (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text)
ORDER BY name
LIMIT %(limit)s OFFSET %(offset)s;

-- name: schedule_count
-- How many schedules `schedule_list` would find without its page.
SELECT COUNT(*) AS n FROM keel_schedules
WHERE (%(workflow)s::text IS NULL OR workflow = %(workflow)s::text)
  AND (%(thread_id)s::text IS NULL OR thread_id = %(thread_id)s::text);

-- name: schedule_write
-- A schedule's settings replaced (a patch, a pause, a resume). Its next tick and pause are kept
-- as the row has them now unless given: an edit read the row before a tick fired meanwhile, and
-- writing that read's next tick back fired the tick again.
UPDATE keel_schedules SET cron = %(cron)s, every_seconds = %(every_seconds)s,
    timezone = %(timezone)s, input = %(input)s, catch_up = %(catch_up)s, overlap = %(overlap)s,
    metadata = %(metadata)s, paused = COALESCE(%(paused)s::integer, paused),
    next_tick = COALESCE(%(next_tick)s::double precision, next_tick), updated_at = keel_now()
WHERE schedule_id = %(schedule_id)s
RETURNING *;

-- name: schedule_delete_ticks
-- A deleted schedule's tick records.
DELETE FROM keel_schedule_ticks WHERE schedule_id = %(schedule_id)s;

-- name: schedule_delete
-- A schedule deleted (its runs stay).
DELETE FROM keel_schedules WHERE schedule_id = %(schedule_id)s RETURNING schedule_id;

-- name: schedule_next_due
-- Seconds until the next tick of a running schedule of these workflows is due by the database's
-- clock (negative: overdue; NULL: none), and whether any holds queued ticks.
SELECT MIN(next_tick) - keel_now() AS wait, COALESCE(MAX(queued), 0) AS queued
FROM keel_schedules
WHERE paused = 0 AND workflow IN (SELECT jsonb_array_elements_text(%(workflows)s::jsonb));

-- name: schedule_claim_due
-- The running schedules of these workflows whose next tick has passed by the database's clock,
-- or that hold queued ticks, oldest tick first, with that clock's time and the status of their
-- last run; locked, and skipped by other schedulers, until the transaction ends.
SELECT s.*, keel_now() AS now,
       (SELECT r.status FROM keel_runs AS r WHERE r.run_id = s.last_run_id) AS last_status
FROM keel_schedules AS s
WHERE s.paused = 0 AND (s.next_tick <= keel_now() OR s.queued > 0)
  AND s.workflow IN (SELECT jsonb_array_elements_text(%(workflows)s::jsonb))
ORDER BY s.next_tick
LIMIT %(limit)s
FOR UPDATE OF s SKIP LOCKED;

-- name: schedule_advance
-- A claimed schedule moved past the ticks it fired, only if no one else moved it meanwhile.
UPDATE keel_schedules SET next_tick = %(next_tick)s,
    last_tick = COALESCE(%(last_tick)s::double precision, last_tick),
    last_run_id = COALESCE(%(last_run_id)s::text, last_run_id),
    queued = %(queued)s, updated_at = keel_now()
WHERE schedule_id = %(schedule_id)s AND next_tick = %(was)s
RETURNING schedule_id;

-- name: schedule_record_tick
-- A tick's outcome, once: no row if the tick was recorded before.
INSERT INTO keel_schedule_ticks (schedule_id, tick, outcome, run_id, fired_at)
VALUES (%(schedule_id)s, %(tick)s, %(outcome)s, %(run_id)s::text,
        CASE WHEN %(run_id)s::text IS NULL THEN NULL ELSE keel_now() END)
ON CONFLICT (schedule_id, tick) DO NOTHING
RETURNING tick, fired_at;

-- name: schedule_oldest_queued
-- The oldest tick an `enqueue` schedule holds back.
SELECT tick FROM keel_schedule_ticks
WHERE schedule_id = %(schedule_id)s AND outcome = 'queued'
ORDER BY tick LIMIT 1;

-- name: schedule_release_tick
-- A queued tick fired now that the previous run ended.
UPDATE keel_schedule_ticks SET outcome = 'fired', run_id = %(run_id)s, fired_at = keel_now()
WHERE schedule_id = %(schedule_id)s AND tick = %(tick)s AND outcome = 'queued'
RETURNING tick, fired_at;

-- name: schedule_ticks
-- A schedule's ticks, newest first.
SELECT * FROM keel_schedule_ticks WHERE schedule_id = %(schedule_id)s
ORDER BY tick DESC LIMIT %(limit)s;

-- name: schedule_prune_ticks
-- A schedule's fired and skipped ticks beyond its newest `keep` forgotten (queued ones stay).
DELETE FROM keel_schedule_ticks
WHERE schedule_id = %(schedule_id)s AND outcome <> 'queued' AND tick < (
    SELECT tick FROM keel_schedule_ticks WHERE schedule_id = %(schedule_id)s
    ORDER BY tick DESC LIMIT 1 OFFSET %(keep)s);

-- name: insert_webhook
-- A run's completion webhook (issue 33), once: a second registration of the run keeps the first.
-- Its trigger records the intent at once if the run has already ended or paused.
INSERT INTO keel_webhooks (run_id, url, events, format, max_attempts, created_at)
VALUES (%(run_id)s, %(url)s, %(events)s, %(format)s, %(max_attempts)s, keel_now())
ON CONFLICT (run_id) DO NOTHING
RETURNING run_id;

-- name: get_webhook
-- A run's completion webhook registration.
SELECT * FROM keel_webhooks WHERE run_id = %(run_id)s;

-- name: record_hook_delivery
-- An inbound webhook delivery, the first time its id is seen: no row when it was seen before.
INSERT INTO keel_hook_deliveries (hook, delivery_id, received_at)
VALUES (%(hook)s, %(delivery_id)s, keel_now())
ON CONFLICT (hook, delivery_id) DO NOTHING
RETURNING hook;

-- name: get_hook_delivery
-- An inbound webhook delivery seen before, with the run it admitted (NULL: not yet).
SELECT * FROM keel_hook_deliveries WHERE hook = %(hook)s AND delivery_id = %(delivery_id)s;

-- name: set_hook_delivery_run
-- The run an inbound delivery admitted (the first one to say so stays).
UPDATE keel_hook_deliveries SET run_id = %(run_id)s
WHERE hook = %(hook)s AND delivery_id = %(delivery_id)s AND run_id IS NULL;

-- name: forget_hook_delivery
-- An inbound delivery whose submit was refused: no run, so a fixed one with its id is admitted.
DELETE FROM keel_hook_deliveries
WHERE hook = %(hook)s AND delivery_id = %(delivery_id)s AND run_id IS NULL;

-- name: delete_finished_run
-- Delete one finished run of a thread (the Agent Server's DELETE of a run); nothing if it is
-- unfinished or not that thread's, or a writer holds it.
DELETE FROM keel_runs WHERE run_id IN (
    SELECT run_id FROM keel_runs
    WHERE run_id = %(run_id)s AND thread_id = %(thread_id)s
      AND thread_seq >= COALESCE((SELECT first_seq FROM keel_threads WHERE thread_id = %(thread_id)s), 0)
      AND status IN ('completed', 'failed', 'cancelled')
    FOR UPDATE SKIP LOCKED
)
RETURNING run_id;

-- Assistants (migration 0028): the Agent Server's assistants of one's own and their versions.

-- name: insert_assistant
-- A new assistant at version 1; no row if one of that id exists.
INSERT INTO keel_assistants (assistant_id, graph_id, version, name, description, config, context,
                             metadata, created_at, updated_at)
VALUES (%(assistant_id)s, %(graph_id)s, 1, %(name)s, %(description)s, %(config)s, %(context)s,
        %(metadata)s,
        keel_now(), keel_now())
ON CONFLICT (assistant_id) DO NOTHING
RETURNING *;

-- name: keep_assistant_version
-- Keep the assistant's current fields as its version (after it was created or updated).
INSERT INTO keel_assistant_versions (assistant_id, version, graph_id, name, description, config,
                                     context, metadata, created_at)
SELECT assistant_id, version, graph_id, name, description, config, context, metadata, updated_at
FROM keel_assistants WHERE assistant_id = %(assistant_id)s;

-- name: get_assistant
SELECT * FROM keel_assistants WHERE assistant_id = %(assistant_id)s;

-- name: search_assistants
-- Assistants of one graph if asked whose metadata contains `metadata` (JSON) as PostgreSQL's
-- `@>` decides it, oldest first.
SELECT * FROM keel_assistants AS a
WHERE (%(graph_id)s::text IS NULL OR a.graph_id = %(graph_id)s::text)
  AND a.metadata::jsonb @> %(metadata)s::jsonb
ORDER BY a.created_at, a.assistant_id
LIMIT %(limit)s;

-- name: update_assistant
-- A new version of the assistant, the latest after every other: the fields given (NULL: as they
-- are; metadata merged into the current one's), in use at once.
UPDATE keel_assistants SET
    version = (SELECT MAX(v.version) + 1 FROM keel_assistant_versions AS v
               WHERE v.assistant_id = %(assistant_id)s),
    graph_id = COALESCE(%(graph_id)s::text, graph_id),
    name = COALESCE(%(name)s::text, name),
    description = COALESCE(%(description)s::text, description),
    config = COALESCE(%(config)s::text, config),
    context = COALESCE(%(context)s::text, context),
    metadata = COALESCE((metadata::jsonb || %(metadata)s::jsonb)::text, metadata),
    updated_at = keel_now()
WHERE assistant_id = %(assistant_id)s
RETURNING *;

-- name: assistant_versions
-- An assistant's versions, newest first, whose metadata contains `metadata` (JSON, `@>`).
SELECT * FROM keel_assistant_versions AS a
WHERE a.assistant_id = %(assistant_id)s AND a.metadata::jsonb @> %(metadata)s::jsonb
ORDER BY a.version DESC
LIMIT %(limit)s OFFSET %(offset)s;

-- name: set_assistant_version
-- Put one of the assistant's versions in use; no row if it has no such version.
UPDATE keel_assistants SET
    version = v.version, graph_id = v.graph_id, name = v.name, description = v.description,
    config = v.config, context = v.context, metadata = v.metadata, updated_at = keel_now()
FROM keel_assistant_versions AS v
WHERE keel_assistants.assistant_id = %(assistant_id)s
  AND v.assistant_id = %(assistant_id)s AND v.version = %(version)s
RETURNING keel_assistants.assistant_id, keel_assistants.graph_id, keel_assistants.version,
          keel_assistants.name, keel_assistants.description, keel_assistants.config,
          keel_assistants.context, keel_assistants.metadata, keel_assistants.created_at,
          keel_assistants.updated_at;

-- name: delete_assistant_versions
DELETE FROM keel_assistant_versions WHERE assistant_id = %(assistant_id)s;

-- name: delete_assistant
-- The assistant deleted (its versions first, `delete_assistant_versions`); no row if none.
DELETE FROM keel_assistants WHERE assistant_id = %(assistant_id)s RETURNING assistant_id;

-- name: schedule_claim_one
-- One schedule of `schedule_claim_due`'s, by id: a pass fires its schedules one by one after
-- one of them failed the batch, so that one bad schedule holds no other back.
SELECT s.*, keel_now() AS now FROM keel_schedules AS s
WHERE s.schedule_id = %(schedule_id)s AND s.paused = 0
  AND (s.next_tick <= keel_now() OR s.queued > 0)
FOR UPDATE SKIP LOCKED;

-- name: schedule_record_missed
-- Ticks passed during an outage that `catch_up` does not fire, recorded as missed (a JSON array
-- of ticks, at most the newest `MAX_CATCH_UP`); ticks recorded before are left as they are.
INSERT INTO keel_schedule_ticks (schedule_id, tick, outcome, run_id, fired_at)
SELECT %(schedule_id)s, value::double precision, 'missed', NULL, NULL
FROM jsonb_array_elements_text(%(ticks)s::jsonb)
ON CONFLICT (schedule_id, tick) DO NOTHING;

-- name: prune_webhooks
-- A pruned run's completion webhook registration (an intent still to deliver carries its URL).
DELETE FROM keel_webhooks WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: prune_hook_deliveries
-- The inbound deliveries that admitted a pruned run: a replay of one after this admits anew.
DELETE FROM keel_hook_deliveries
WHERE run_id IN (SELECT jsonb_array_elements_text(%(run_ids)s::jsonb));

-- name: schedule_fire_runs
-- moves: new>queued
-- The runs of a batch of due ticks admitted (a JSON array of their columns and admitted event),
-- those not admitted before each with its admitted event, and the batch's schedules moved past
-- their ticks (a JSON array; each only if no one moved it meanwhile): one statement for the
-- whole batch. `moved` counts the schedules moved, `admitted` lists the runs inserted. Events
-- take their run's transaction lock first, as insert_event's do.
WITH tick AS (
    SELECT * FROM jsonb_to_recordset(%(runs)s::jsonb)
        AS t (run_id text, job_id text, workflow text, workflow_version text, input_hash text,
              input text, event text)
), admitted AS (
    INSERT INTO keel_runs (run_id, job_id, workflow, workflow_version, attempt, input_hash, input,
                           status, created_at, updated_at, not_before)
    SELECT run_id, job_id, workflow, workflow_version, 1, input_hash, input, 'queued', keel_now(),
           keel_now(), NULL
    FROM tick
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
), events AS (
    INSERT INTO keel_events (run_id, at, kind, worker_id, lease_token, data)
    SELECT t.run_id, keel_now(), 'admitted', NULL, NULL, t.event
    FROM tick AS t JOIN admitted AS a ON a.run_id = t.run_id,
         LATERAL (SELECT pg_advisory_xact_lock(74213003, hashtext(t.run_id))) AS turn
    RETURNING run_id
), moved AS (
    UPDATE keel_schedules AS s SET next_tick = m.next_tick,
        last_tick = COALESCE(m.last_tick, s.last_tick),
        last_run_id = COALESCE(m.last_run_id, s.last_run_id),
        queued = m.queued, updated_at = keel_now()
    FROM jsonb_to_recordset(%(moves)s::jsonb)
        AS m (schedule_id text, was double precision, next_tick double precision,
              last_tick double precision, last_run_id text, queued integer)
    WHERE s.schedule_id = m.schedule_id AND s.next_tick = m.was
    RETURNING s.schedule_id
)
SELECT (SELECT COUNT(*) FROM moved) AS moved,
       (SELECT COALESCE(jsonb_agg(run_id), '[]'::jsonb) FROM events)::text AS admitted;

-- name: schedule_fire_ticks
-- The ticks of a batch recorded once each (a JSON array: fired with their run, skipped, queued,
-- missed); the rows of those not recorded before, `fired_at` by the database's clock.
INSERT INTO keel_schedule_ticks (schedule_id, tick, outcome, run_id, fired_at)
SELECT t.schedule_id, t.tick, t.outcome, t.run_id,
       CASE WHEN t.run_id IS NULL THEN NULL ELSE keel_now() END
FROM jsonb_to_recordset(%(ticks)s::jsonb)
    AS t (schedule_id text, tick double precision, outcome text, run_id text)
ON CONFLICT (schedule_id, tick) DO NOTHING
RETURNING schedule_id, tick, outcome, run_id, fired_at;

-- name: thread_runs_after
-- A thread's runs placed after `after` (their thread_seq), in their order (its own, as
-- `thread_runs` says).
SELECT * FROM keel_runs WHERE thread_id = %(thread_id)s AND thread_seq > %(after)s
  AND thread_seq >= COALESCE((SELECT first_seq FROM keel_threads WHERE thread_id = %(thread_id)s), 0)
ORDER BY thread_seq LIMIT %(limit)s;

-- name: unfinished_versions
-- The versions that unfinished runs of these workflows are on, one row per (workflow, version).
-- Found in keel_runs_unfinished one probe each (a loose index scan: the next version after the
-- last one found), so the cost follows the versions, never the runs waiting on them (issue 34).
-- The status list is the index's predicate, word for word.
WITH RECURSIVE versions (workflow, workflow_version) AS (
    SELECT n.name, (SELECT r.workflow_version FROM keel_runs AS r
                    WHERE r.status IN ('queued', 'running', 'waiting') AND r.workflow = n.name
                    ORDER BY r.workflow_version LIMIT 1)
    FROM (SELECT DISTINCT jsonb_array_elements_text(%(names)s::jsonb) AS name) AS n
    UNION ALL
    SELECT v.workflow, (SELECT r.workflow_version FROM keel_runs AS r
                        WHERE r.status IN ('queued', 'running', 'waiting')
                          AND r.workflow = v.workflow AND r.workflow_version > v.workflow_version
                        ORDER BY r.workflow_version LIMIT 1)
    FROM versions AS v WHERE v.workflow_version IS NOT NULL
)
SELECT workflow, workflow_version FROM versions WHERE workflow_version IS NOT NULL;

-- name: unfinished_runs_of
-- Unfinished runs of these [workflow, version] pairs, oldest first: at most `limit` of each
-- read, from keel_runs_unfinished.
SELECT r.* FROM jsonb_array_elements(%(pairs)s::jsonb) AS p (pair)
CROSS JOIN LATERAL (
    SELECT * FROM keel_runs
    WHERE status IN ('queued', 'running', 'waiting')
      AND workflow = p.pair ->> 0 AND workflow_version = p.pair ->> 1
    ORDER BY created_at, run_id
    LIMIT %(limit)s
) AS r
ORDER BY r.created_at, r.run_id
LIMIT %(limit)s;
