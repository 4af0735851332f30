-- Effect keys inside tool calls. LangGraph's ToolNode runs an AI message's tool calls at once
-- (threads for sync tools, tasks for async ones), so the order in which they call an effect
-- differs from one execution to the next, and keys numbered by that order named other calls
-- after a crash or a resume. Runs admitted from now on number an effect's calls per tool call
-- (`effect_keys` 2, keel.core.effects.keys); runs admitted before keep the keys their ledger
-- rows already have (1). Metadata only: existing rows read 1, new rows get 2.
ALTER TABLE keel_runs ADD COLUMN effect_keys INTEGER NOT NULL DEFAULT 1;
ALTER TABLE keel_runs ALTER COLUMN effect_keys SET DEFAULT 2;
