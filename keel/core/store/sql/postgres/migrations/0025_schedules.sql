-- Schedules (issue 33): a cron expression in a timezone, or an interval, that starts a run of a
-- workflow (or a run on a thread) at each tick. `next_tick` is the next tick not yet fired, by
-- the database's clock; a scheduler claims a schedule whose `next_tick` has passed, admits the
-- tick's run and moves `next_tick` on in one transaction. `queued`: ticks of an `enqueue`
-- schedule held back until the previous tick's run ends. `declared`: made by
-- `@app.workflow(schedule=)` and upserted at worker start.
CREATE TABLE keel_schedules (
    schedule_id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    workflow TEXT NOT NULL,
    cron TEXT,
    every_seconds DOUBLE PRECISION,
    timezone TEXT NOT NULL DEFAULT 'UTC',
    input TEXT NOT NULL DEFAULT 'null',
    thread_id TEXT,
    catch_up TEXT NOT NULL DEFAULT 'latest',
    overlap TEXT NOT NULL DEFAULT 'skip',
    metadata TEXT NOT NULL DEFAULT '{}',
    declared INTEGER NOT NULL DEFAULT 0,
    paused INTEGER NOT NULL DEFAULT 0,
    next_tick DOUBLE PRECISION NOT NULL,
    last_tick DOUBLE PRECISION,
    last_run_id TEXT,
    queued INTEGER NOT NULL DEFAULT 0,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX keel_schedules_due ON keel_schedules (next_tick) WHERE paused = 0;

-- One row per tick of a schedule (the primary key refuses a second): `fired` with the run it
-- admitted, `skipped` (overlap skip: the previous run was unfinished), `queued` (overlap
-- enqueue: fired later, when the previous run ends) or `triggered` (by hand, off the clock).
-- `fired_at` is the database's time of the admission: lateness is fired_at - tick.
CREATE TABLE keel_schedule_ticks (
    schedule_id TEXT NOT NULL,
    tick DOUBLE PRECISION NOT NULL,
    outcome TEXT NOT NULL,
    run_id TEXT,
    fired_at DOUBLE PRECISION,
    PRIMARY KEY (schedule_id, tick)
);
