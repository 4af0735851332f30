-- Effect keys inside tool calls. LangGraph's ToolNode runs an AI message's tool calls at once
-- (threads for sync tools, tasks for async ones), so the order in which they call an effect
-- differs from one execution to the next, and keys numbered by that order named other calls
-- after a crash or a resume. A run first claimed from now on numbers an effect's calls per
-- tool call (`effect_keys` 2, keel.core.effects.keys): `claim_next` stamps it on the first
-- claim, so a run whose first execution was a worker of the release before (still running
-- while the database was migrated) keeps the keys that worker recorded (1).
ALTER TABLE keel_runs ADD COLUMN effect_keys INTEGER NOT NULL DEFAULT 1;
