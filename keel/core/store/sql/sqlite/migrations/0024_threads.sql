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

-- A thread as it is read: its status is never stored but derived from its runs, here, the one
-- place of that rule: `interrupted` when its first unfinished run waits, `busy` when it is
-- queued or running, else `error` when its latest run failed, else `idle`; its runs' count; and
-- the workflow version of its latest run (its state is read with that version's graph).
CREATE VIEW keel_thread_view AS
SELECT t.*,
       CASE (SELECT r.status FROM keel_runs AS r
             WHERE r.thread_id = t.thread_id AND r.status IN ('queued', 'running', 'waiting')
             ORDER BY r.thread_seq LIMIT 1)
           WHEN 'waiting' THEN 'interrupted'
           WHEN 'queued' THEN 'busy'
           WHEN 'running' THEN 'busy'
           ELSE CASE (SELECT r.status FROM keel_runs AS r WHERE r.thread_id = t.thread_id
                      ORDER BY r.thread_seq DESC LIMIT 1)
                    WHEN 'failed' THEN 'error' ELSE 'idle' END
       END AS status,
       (SELECT COUNT(*) FROM keel_runs AS r WHERE r.thread_id = t.thread_id) AS runs,
       COALESCE((SELECT r.workflow_version FROM keel_runs AS r WHERE r.thread_id = t.thread_id
                 ORDER BY r.thread_seq DESC LIMIT 1), t.workflow_version) AS latest_version
FROM keel_threads AS t;
