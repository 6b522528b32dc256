-- 013_roles: each program's role and exactly what it may do (docs/security.md,
-- "PostgreSQL: who may connect, and what each role may do").
--
-- The roles are made by sql/roles/roles.sql (an administrator runs it once per
-- cluster, before the migrations: roles belong to the cluster, and the owner
-- must not be able to make them). This migration runs as tally_owner, the
-- owner of everything here, and grants:
--   * nothing to PUBLIC: not CONNECT, not TEMP, not the public schema, not one
--     SECURITY DEFINER function;
--   * to each program's role, per table, the statements its SQL runs (grep the
--     program's source for them), column by column where it changes a few;
--   * where a role must change a table a little, a row-level security policy
--     says which rows (key_blocks: tally-api lifts today's block only once the
--     key is under its limit; spend_rate_points: tally-notifier deletes only
--     points of past days);
--   * the triggers (rollups, late usage, the alert outbox, the spend warning)
--     run as the owner (SECURITY DEFINER), so a writer of usage_hourly,
--     spend_daily or alerts needs no right on the tables they derive.
--
-- A migration that adds a table or a column a program uses adds its grants in
-- the section of that program below (or, after this file is released, a
-- migration of its own in the same shape). The test `pg-roles` lists every
-- role's grants against the list it expects, and tries every write a role must
-- not make.

DO $$
DECLARE
    missing text;
BEGIN
    SELECT string_agg(r, ', ') INTO missing
      FROM unnest(ARRAY['tally_owner', 'tally_aggregator', 'tally_api', 'tally_admin', 'tally_vmm', 'tally_notifier',
                        'tally_close_due', 'finance']) AS r
     WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = r);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'roles % do not exist', missing
            USING HINT = 'an administrator runs sql/roles/roles.sql once per cluster first (docs/operations.md)';
    END IF;
END $$;

-- ---------------------------------------------------------------------------
-- Nothing for anyone by default.
DO $$
BEGIN
    EXECUTE format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database());
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO tally_aggregator, tally_api, tally_admin, tally_vmm, '
                   'tally_notifier, tally_close_due, finance', current_database());
    -- the aggregator's staging tables (stage_usage, stage_fold) are temporary
    EXECUTE format('GRANT TEMP ON DATABASE %I TO tally_aggregator', current_database());
END $$;
REVOKE ALL ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO tally_aggregator, tally_api, tally_admin, tally_vmm, tally_notifier, tally_close_due;

-- The triggers run as the owner: whoever writes the table they watch needs no
-- right on what they write (and the aggregator never reads a webhook's secret).
ALTER FUNCTION usage_rollup() SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION usage_late_capture() SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION alerts_outbox() SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION spend_projection() SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION key_blocks_skip_alert_only() SECURITY DEFINER SET search_path = public, pg_temp;

-- Every program checks the schema's version before it starts (common/db.c).
GRANT SELECT ON schema_migrations TO tally_aggregator, tally_api, tally_admin, tally_vmm, tally_notifier,
    tally_close_due;

-- No SECURITY DEFINER function is anyone's by default (008 left a few to PUBLIC);
-- each is granted below to the roles that call it.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;

-- ---------------------------------------------------------------------------
-- tally_aggregator: folds samples into the ledger, rates them, enforces limits.
GRANT SELECT, INSERT, UPDATE ON fold_state, sandboxes, usage_hourly, spend_daily, hosts, consumer_offsets
    TO tally_aggregator;
-- (rating_gaps' new rows come back to be logged: RETURNING reads them; ON CONFLICT
-- (key_id, day, threshold_pct) reads alerts' columns)
GRANT SELECT, INSERT ON key_blocks, rating_gaps, alerts TO tally_aggregator;
GRANT INSERT ON dead_letters, offset_gaps TO tally_aggregator;
GRANT USAGE ON SEQUENCE alerts_id_seq, dead_letters_id_seq, offset_gaps_id_seq TO tally_aggregator;
-- rating (rate_at, account_plan) and the limits: no key hash, no name
GRANT SELECT ON price_plans, plan_rates TO tally_aggregator;
GRANT SELECT (id, plan_id) ON accounts TO tally_aggregator;
GRANT SELECT (id, account_id, daily_limit_nanodollars, limit_policy, revoked_at) ON api_keys TO tally_aggregator;
GRANT SELECT ON metering_gaps TO tally_aggregator;

-- ---------------------------------------------------------------------------
-- tally_api: agents' keys and people's sessions; keys, limits, alert
-- destinations; every read the dashboard and /v1 serve.
GRANT SELECT ON accounts, people, api_keys, sandboxes, usage_hourly, usage_key_daily, usage_key_hourly,
    spend_daily, alerts, key_blocks, hosts, sessions, audit_log, idempotency_keys, price_plans, plan_rates,
    closed_months, closed_invoices, closed_invoice_lines, closed_invoice_key_lines, alert_destinations,
    alert_deliveries, invoices, invoice_lines, metering_gaps
    TO tally_api;
GRANT INSERT, DELETE ON sessions TO tally_api;
GRANT INSERT, DELETE ON idempotency_keys TO tally_api;
GRANT UPDATE (status, body) ON idempotency_keys TO tally_api;
-- sign-in attempts per email and per address (012), counted in the database
GRANT SELECT, INSERT, DELETE ON signin_attempts TO tally_api;
GRANT UPDATE (attempts, window_start) ON signin_attempts TO tally_api;
GRANT INSERT (id, account_id, name, key_hash, prefix, daily_limit_nanodollars, limit_policy, created_by)
    ON api_keys TO tally_api;
-- (a person's changes: revocation, the limit, the caps of 010, the internet permission of 011)
GRANT UPDATE (revoked_at, daily_limit_nanodollars, limit_policy, max_sandboxes, max_memory_mib, internet)
    ON api_keys TO tally_api;
GRANT INSERT (account_id, actor, action, object_id, old_value, new_value) ON audit_log TO tally_api;
GRANT USAGE ON SEQUENCE audit_log_id_seq TO tally_api;
GRANT INSERT (id, account_id, kind, url, email, secret, created_by) ON alert_destinations TO tally_api;
GRANT UPDATE (enabled, disabled_at) ON alert_destinations TO tally_api;
GRANT INSERT (alert_id, destination_id, account_id, event_id, type, payload, resend_of, requested_by)
    ON alert_deliveries TO tally_api;
GRANT UPDATE (state, last_error) ON alert_deliveries TO tally_api;
GRANT USAGE ON SEQUENCE alert_deliveries_id_seq TO tally_api;
-- A person raising a limit above today's spend lifts today's block: the one
-- delete tally-api may make in key_blocks (the policy below).
GRANT DELETE ON key_blocks TO tally_api;
GRANT EXECUTE ON FUNCTION invoice_preview_lines(text), invoice_preview_key_lines(text),
    invoice_projection_lines(text), first_open_month() TO tally_api;

-- ---------------------------------------------------------------------------
-- tally_admin: what an operator does with tally-admin (accounts, people and
-- their passwords, keys, plans, closing months, the status and usage views).
-- Not the owner: an operator's daily tool cannot alter the schema, disable the
-- closed invoices' triggers or rewrite the ledger.
GRANT SELECT ON accounts, people, api_keys, sandboxes, usage_hourly, usage_key_daily, usage_key_hourly,
    spend_daily, alerts, key_blocks, hosts, audit_log, price_plans, plan_rates, closed_months, closed_invoices,
    dead_letters, consumer_offsets, metering_gaps, invoices, invoice_lines
    TO tally_admin;
GRANT INSERT (id, name, plan_id) ON accounts TO tally_admin;
GRANT UPDATE (plan_id) ON accounts TO tally_admin;
GRANT INSERT (id, account_id, email), DELETE ON people TO tally_admin;
GRANT UPDATE (password_hash) ON people TO tally_admin;
GRANT INSERT (id, account_id, name, key_hash, prefix, daily_limit_nanodollars, limit_policy, created_by)
    ON api_keys TO tally_admin;
GRANT INSERT (account_id, actor, action, object_id, old_value, new_value) ON audit_log TO tally_admin;
GRANT USAGE ON SEQUENCE audit_log_id_seq TO tally_admin;
GRANT EXECUTE ON FUNCTION close_month(date, text), close_due(interval, text) TO tally_admin;

-- ---------------------------------------------------------------------------
-- tally_vmm: tally-vmm's check before a create (limits_database_url).
GRANT SELECT (account_id, key_id, day) ON key_blocks TO tally_vmm;

-- ---------------------------------------------------------------------------
-- tally_notifier: claims due deliveries, sends them, records the outcome.
GRANT SELECT ON alert_deliveries, alert_destinations, alerts TO tally_notifier;
GRANT UPDATE (state, attempts, last_error, next_attempt_at, delivered_at) ON alert_deliveries TO tally_notifier;
GRANT UPDATE (delivered_at) ON alerts TO tally_notifier;
-- prunes the spend warning's points of past days (the policy below)
GRANT SELECT, DELETE ON spend_rate_points TO tally_notifier;

-- ---------------------------------------------------------------------------
-- tally_close_due: `tally-admin close-due`, run by a timer: closes the months
-- that are due, through close_due() (SECURITY DEFINER), and nothing else.
GRANT EXECUTE ON FUNCTION close_due(interval, text) TO tally_close_due;

-- ---------------------------------------------------------------------------
-- finance: the finance views (008 granted them), nothing of the public schema:
-- the views and their functions run as the owner.
GRANT USAGE ON SCHEMA finance TO finance;
GRANT SELECT ON ALL TABLES IN SCHEMA finance TO finance;

-- ---------------------------------------------------------------------------
-- Row-level security where a role changes a table a little. The owner is not
-- subject to it; every other role sees and changes only what a policy allows.
ALTER TABLE key_blocks ENABLE ROW LEVEL SECURITY;
CREATE POLICY key_blocks_read ON key_blocks FOR SELECT
    TO tally_aggregator, tally_api, tally_admin, tally_vmm USING (true);
CREATE POLICY key_blocks_enforce ON key_blocks FOR INSERT TO tally_aggregator WITH CHECK (true);
-- today's block of a key whose limit is now above today's spend (or gone, or alert_only)
CREATE POLICY key_blocks_lift ON key_blocks FOR DELETE TO tally_api USING (
    day = (now() AT TIME ZONE 'UTC')::date
    AND EXISTS (SELECT FROM api_keys k
                 WHERE k.id = key_blocks.key_id
                   AND (k.daily_limit_nanodollars IS NULL OR k.limit_policy = 'alert_only'
                        OR k.daily_limit_nanodollars > coalesce((SELECT s.nanodollars FROM spend_daily s
                                                                  WHERE s.key_id = key_blocks.key_id
                                                                    AND s.day = key_blocks.day), 0))));

ALTER TABLE spend_rate_points ENABLE ROW LEVEL SECURITY;
CREATE POLICY spend_rate_points_prune ON spend_rate_points FOR ALL TO tally_notifier
    USING (day < (now() AT TIME ZONE 'UTC')::date - 1);
