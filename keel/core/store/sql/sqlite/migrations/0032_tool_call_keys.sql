-- Effect keys inside tool calls. LangGraph's ToolNode runs an AI message's tool calls at once
-- (threads for sync tools, tasks for async ones), so the order in which they call an effect
-- differs from one execution to the next, and keys numbered by that order named other calls
-- after a crash or a resume. Runs admitted from now on number an effect's calls per tool call
-- (`effect_keys` 2, keel.core.effects.keys); runs admitted before keep the keys their ledger
-- rows already have (1). SQLite cannot change a column's default: added as 2, set to 1 for the
-- runs already there.
ALTER TABLE keel_runs ADD COLUMN effect_keys INTEGER NOT NULL DEFAULT 2;
UPDATE keel_runs SET effect_keys = 1;
