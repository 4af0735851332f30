-- Threads (issue 31): a conversation is one checkpoint lineage holding many runs in order.
-- A run without a thread (thread_id NULL) is a thread of its own, named by its run id, as every
-- run was before: its checkpoints are LangGraph's thread `run_id`. A run on a thread carries
-- the thread's id, its place in the thread's order (`thread_seq`, dense from 1: submission
-- order, unique per thread, so two admissions can never share a place), what it was started
-- with beside its input (`command`: LangGraph's Command as JSON; `checkpoint_id`: the past
-- checkpoint a fork starts from; `config`: configurable, context and metadata) and, once a
-- later run superseded it, why it was stopped (`cancel_reason`: interrupted, rolled_back).
ALTER TABLE keel_runs ADD COLUMN thread_id TEXT;
ALTER TABLE keel_runs ADD COLUMN thread_seq INTEGER;
ALTER TABLE keel_runs ADD COLUMN command TEXT;
ALTER TABLE keel_runs ADD COLUMN checkpoint_id TEXT;
ALTER TABLE keel_runs ADD COLUMN config TEXT;
ALTER TABLE keel_runs ADD COLUMN multitask_strategy TEXT;
ALTER TABLE keel_runs ADD COLUMN cancel_reason TEXT;
CREATE UNIQUE INDEX keel_runs_thread ON keel_runs (thread_id, thread_seq)
    WHERE thread_id IS NOT NULL;

CREATE TABLE keel_threads (
    thread_id TEXT PRIMARY KEY,
    workflow TEXT NOT NULL,
    workflow_version TEXT NOT NULL,
    metadata TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX keel_threads_updated ON keel_threads (updated_at);
