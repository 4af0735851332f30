-- Delayed runs (issue 33): a run admitted with `after`/`not_before` is queued at once, durable,
-- but no claim takes it before `not_before` (epoch seconds, by the database's clock, computed at
-- admission); NULL: claimable at once, as every run before. Durable sleep needs no column: a
-- sleeping run waits on a wait of kind `timer` whose deadline is its wake time.
ALTER TABLE keel_runs ADD COLUMN not_before REAL;
