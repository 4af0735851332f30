-- Effect deadlines (issue 28). A provider call may still be under way when its worker loses the
-- database or its lease (a partition, a slow provider): nobody may reconcile or resend it before
-- the moment its caller has certainly stopped waiting for it. `deadline_at` is that moment by
-- the database's clock: the call's start (a reservation, or the statement that arms a new
-- attempt) plus the effect's timeout plus a margin. NULL: a row from before this migration.
ALTER TABLE keel_effects ADD COLUMN deadline_at REAL;
ALTER TABLE keel_intents ADD COLUMN deadline_at REAL;
