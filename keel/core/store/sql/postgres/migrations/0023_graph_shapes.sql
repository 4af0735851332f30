-- Graph identity (issue 30). A run resumes on the graph of the version it started on; a graph
-- edited under the same version (a node renamed, an edge added, a state key removed) must not
-- continue it. Each name@version is held to the structure it was first served with: its digest
-- and its shape (JSON, to say what changed). A worker whose graph differs refuses that version
-- and says so in `refused` (JSON: key -> what differs), so its runs show as stranded, with why.
CREATE TABLE keel_graph_shapes (
    workflow TEXT NOT NULL,
    version TEXT NOT NULL,
    digest TEXT NOT NULL,
    shape TEXT NOT NULL,
    recorded_at DOUBLE PRECISION NOT NULL,
    recorded_by TEXT NOT NULL,
    PRIMARY KEY (workflow, version)
);
ALTER TABLE keel_workers ADD COLUMN refused TEXT NOT NULL DEFAULT '{}';
