-- Stream chunks (issue 32): what a run's graph streamed in the modes that cannot be told from its
-- checkpoints (messages, custom, tasks, debug, checkpoints, a subgraph's values and updates),
-- captured by the worker only for runs a client asked to stream that way. Each chunk carries
-- the lease token that wrote it (writes are fenced), the run's last committed checkpoint when
-- it was produced (`anchor`: where the stream places it), whether it was produced resuming a
-- pause at that checkpoint, and `superseded` once a later execution re-ran its step (the step
-- never committed): readers skip those.
CREATE TABLE keel_stream_chunks (
    chunk_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id TEXT NOT NULL,
    lease_token BIGINT NOT NULL,
    anchor TEXT NOT NULL,
    resumed INTEGER NOT NULL DEFAULT 0,
    ns TEXT NOT NULL DEFAULT '',
    mode TEXT NOT NULL,
    data TEXT NOT NULL,
    superseded INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX keel_stream_chunks_run ON keel_stream_chunks (run_id, chunk_id);
