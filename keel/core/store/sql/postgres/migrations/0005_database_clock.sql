-- The database's clock judges every lease, claim and deadline: keel_now() is the server's
-- time in epoch seconds, or the time a test clock set for this session in `keel.fake_now`
-- (tests move time without sleeping; workers never set it). And each worker's workflow
-- versions, so a run that no worker can execute is shown as stranded.
CREATE OR REPLACE FUNCTION keel_now() RETURNS DOUBLE PRECISION LANGUAGE sql VOLATILE AS $$
    SELECT COALESCE(NULLIF(current_setting('keel.fake_now', true), '')::double precision,
                    EXTRACT(EPOCH FROM clock_timestamp())::double precision)
$$;
ALTER TABLE keel_workers ADD COLUMN workflows TEXT NOT NULL DEFAULT '[]';
