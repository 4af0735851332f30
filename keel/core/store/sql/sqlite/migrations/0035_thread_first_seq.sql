-- A thread's runs are those placed since its row was made. A thread deleted keeps its runs
-- until retention (docs/threads.md), and a new thread may take the same id: the old runs, still
-- naming the id, were listed as the new thread's, set its status (`error` if the last failed)
-- and its count. `first_seq` is the place (`thread_seq`) the thread's first run takes: the next
-- one after every run that names the id when the row is made. Threads made before this
-- migration take theirs from the clock: their first run admitted since the row was made (a
-- thread made again over an older one's runs), else past their last run.
ALTER TABLE keel_threads ADD COLUMN first_seq INTEGER NOT NULL DEFAULT 1;
UPDATE keel_threads SET first_seq = COALESCE(
    (SELECT MIN(r.thread_seq) FROM keel_runs AS r
     WHERE r.thread_id = keel_threads.thread_id AND r.created_at >= keel_threads.created_at),
    (SELECT MAX(r.thread_seq) + 1 FROM keel_runs AS r
     WHERE r.thread_id = keel_threads.thread_id),
    1);
DROP VIEW keel_thread_view;
-- The view of migration 0024, of the thread's own runs. An unfinished run is counted whichever
-- thread it was admitted on (none can be left by a deleted one: deleting waits for them), as the
-- claim's rule of one active run per thread counts it.
CREATE VIEW keel_thread_view AS
SELECT t.*,
       CASE (SELECT r.status FROM keel_runs AS r
             WHERE r.thread_id = t.thread_id AND r.status IN ('queued', 'running', 'waiting')
             ORDER BY r.thread_seq LIMIT 1)
           WHEN 'waiting' THEN 'interrupted'
           WHEN 'queued' THEN 'busy'
           WHEN 'running' THEN 'busy'
           ELSE CASE (SELECT r.status FROM keel_runs AS r
                      WHERE r.thread_id = t.thread_id AND r.thread_seq >= t.first_seq
                      ORDER BY r.thread_seq DESC LIMIT 1)
                    WHEN 'failed' THEN 'error' ELSE 'idle' END
       END AS status,
       (SELECT COUNT(*) FROM keel_runs AS r
        WHERE r.thread_id = t.thread_id AND r.thread_seq >= t.first_seq) AS runs,
       COALESCE((SELECT r.workflow_version FROM keel_runs AS r
                 WHERE r.thread_id = t.thread_id AND r.thread_seq >= t.first_seq
                 ORDER BY r.thread_seq DESC LIMIT 1), t.workflow_version) AS latest_version
FROM keel_threads AS t;
