-- Assistants of one's own (issue 32): the Agent Server's assistants a client creates, beside the
-- default assistant of each registered graph (which is not stored: its id is derived from the
-- graph's, keel.service.agent_server.shapes). An assistant names a graph (a Keel workflow) and
-- holds the config, context and metadata its runs start with. Each update adds a version;
-- `keel_assistants` holds the one in use (`version`), which any past one may become again.
-- JSON fields are text, as elsewhere in Keel's schema.
CREATE TABLE keel_assistants (
    assistant_id TEXT PRIMARY KEY,
    graph_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    name TEXT NOT NULL,
    description TEXT,
    config TEXT NOT NULL DEFAULT '{}',
    context TEXT NOT NULL DEFAULT '{}',
    metadata TEXT NOT NULL DEFAULT '{}',
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX keel_assistants_graph ON keel_assistants (graph_id);

CREATE TABLE keel_assistant_versions (
    assistant_id TEXT NOT NULL,
    version INTEGER NOT NULL,
    graph_id TEXT NOT NULL,
    name TEXT NOT NULL,
    description TEXT,
    config TEXT NOT NULL DEFAULT '{}',
    context TEXT NOT NULL DEFAULT '{}',
    metadata TEXT NOT NULL DEFAULT '{}',
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (assistant_id, version)
);
