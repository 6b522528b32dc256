-- 010_key_caps: per-key caps on what a key may hold at once, set by a person
-- (like the daily limit: no API key can set or raise them, not even its own).
--
-- tally-api enforces them at create and fork (docs/api.md, "Caps"):
--   max_sandboxes   sandboxes of the key that are not stopped (running or
--                   paused), the new ones included;
--   max_memory_mib  their memory sizes summed, the new ones included.
-- NULL is no cap. Each change is written to audit_log ('key.caps').

ALTER TABLE api_keys ADD COLUMN max_sandboxes integer CHECK (max_sandboxes >= 0);
ALTER TABLE api_keys ADD COLUMN max_memory_mib bigint CHECK (max_memory_mib >= 0);
