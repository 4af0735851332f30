-- The database's clock judges every lease, claim and deadline: on SQLite (one host) that is
-- the host's clock, as keel_now(), a function the connector defines on each connection (or a
-- test clock's time). And each worker's workflow versions, so a run that no worker can execute
-- is shown as stranded.
ALTER TABLE keel_workers ADD COLUMN workflows TEXT NOT NULL DEFAULT '[]';
