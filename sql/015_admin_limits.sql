-- 015_admin_limits.sql — an operator changes a key's daily limit from a
-- terminal (tally-admin key limit), as a person does through the API: the
-- limit and its policy, audited as 'admin', and today's block lifted in the
-- same transaction when the key may spend again.
GRANT UPDATE (daily_limit_nanodollars, limit_policy) ON api_keys TO tally_admin;
GRANT DELETE ON key_blocks TO tally_admin;
