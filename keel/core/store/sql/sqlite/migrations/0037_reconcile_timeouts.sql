-- How many of a notification's reconciles went unanswered within its notifier's send timeout.
-- An async reconcile is cancelled there and asked again once its claim lapses: without a count,
-- a provider that never answers the look had it asked at every pass, for ever
-- (keel.core.notification_outbox.RECONCILE_TIMEOUTS bounds it; past that, `in_doubt`).
ALTER TABLE keel_outbox ADD COLUMN reconcile_timeouts INTEGER NOT NULL DEFAULT 0;
