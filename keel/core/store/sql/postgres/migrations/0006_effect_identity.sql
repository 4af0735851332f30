-- An effect's key is its place in the run (node, step, task path, call order), no longer its
-- arguments: the arguments' hashes are kept beside it, per argument name, so a replay that
-- calls the same effect with other arguments is refused and told which ones changed. Rows
-- written before this migration have no per-argument hashes (NULL): their keys still embed
-- the arguments' hash and are found by it (see keel/core/ledger.py, legacy keys).
ALTER TABLE keel_effects ADD COLUMN arg_hashes TEXT;
ALTER TABLE keel_effects ADD COLUMN call_index INTEGER;
