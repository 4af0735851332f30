-- Traces: the run's W3C trace context (`traceparent`), set once by whoever first traces the run
-- (its submitter, else its first worker); every attempt's span is a child of it, so one trace
-- spans resumes and workers (docs/operations.md, "Traces").
ALTER TABLE keel_runs ADD COLUMN traceparent TEXT;
