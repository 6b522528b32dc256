-- 017_time_zones: each account's days and months are those of its own IANA
-- time zone (accounts.time_zone, UTC by default; docs/billing.md "Days and
-- time zones"). The ledger's hours stay UTC hours; a day is a set of whole
-- UTC hours, computed here and nowhere else:
--
--   the day of an instant (or of an hour row) is the local date, in the
--   account's zone, of the start of the UTC hour it falls in.
--
-- So a day of a whole-hour zone runs from local midnight to local midnight
-- (23 hours on a spring-forward day, 25 on a fall-back day); in a zone whose
-- offset is not a whole hour (Asia/Kolkata +05:30, Asia/Kathmandu +05:45,
-- America/St_Johns -03:30) it starts at the first UTC hour boundary after
-- local midnight (00:30 in Kolkata), 24 hours long. An hourly row is never
-- split between two days: a day's spend is exactly the sum of its hours.
-- Months follow the days: a month is its local days.

ALTER TABLE accounts ADD COLUMN time_zone text NOT NULL DEFAULT 'UTC';

-- Only the names PostgreSQL knows (pg_timezone_names): an abbreviation or an
-- offset string ('+05:30', 'EST5EDT' posix rules) that the view does not list is refused.
CREATE FUNCTION time_zone_known(p_zone text) RETURNS boolean LANGUAGE sql STABLE
    RETURN p_zone = 'UTC' OR EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = p_zone);

CREATE FUNCTION accounts_time_zone_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT time_zone_known(NEW.time_zone) THEN
        RAISE EXCEPTION 'unknown time zone %', NEW.time_zone USING ERRCODE = 'invalid_parameter_value',
              HINT = 'an IANA zone name such as Europe/Berlin (pg_timezone_names)';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER accounts_time_zone_insert BEFORE INSERT ON accounts
    FOR EACH ROW WHEN (NEW.time_zone <> 'UTC') EXECUTE FUNCTION accounts_time_zone_check();
CREATE TRIGGER accounts_time_zone_update BEFORE UPDATE OF time_zone ON accounts
    FOR EACH ROW WHEN (NEW.time_zone IS DISTINCT FROM OLD.time_zone) EXECUTE FUNCTION accounts_time_zone_check();

-- ---------------------------------------------------------------------------
-- The day rule, once. Immutable given the zone (no session setting enters:
-- the hour is truncated in UTC, never in the session's TimeZone). The
-- functions here have SQL-standard bodies: their names are bound when they
-- are made, whatever the caller's search_path (the finance role's has no public).
CREATE FUNCTION zone_day(p_zone text, p_at timestamptz) RETURNS date
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN ((date_trunc('hour', p_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') AT TIME ZONE p_zone)::date;

-- The instant a day starts: the first UTC hour whose day (zone_day) is p_day
-- or later. Searched around local midnight, so that a zone whose midnight is
-- skipped or repeated by a change of offset still gets its first hour.
CREATE FUNCTION zone_day_start(p_zone text, p_day date) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
BEGIN ATOMIC
    SELECT min(h)
      FROM generate_series(date_trunc('hour', (p_day::timestamp AT TIME ZONE p_zone) AT TIME ZONE 'UTC')
                               AT TIME ZONE 'UTC' - interval '3 hours',
                           date_trunc('hour', (p_day::timestamp AT TIME ZONE p_zone) AT TIME ZONE 'UTC')
                               AT TIME ZONE 'UTC' + interval '3 hours',
                           interval '1 hour') AS h
     WHERE zone_day(p_zone, h) >= p_day;
END;

-- An account's zone; an account not (yet) in accounts is UTC (as its plan is the default).
CREATE FUNCTION account_zone(p_account text) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE
    RETURN coalesce((SELECT a.time_zone FROM accounts a WHERE a.id = p_account), 'UTC');

CREATE FUNCTION account_day(p_account text, p_at timestamptz) RETURNS date LANGUAGE sql STABLE PARALLEL SAFE
    RETURN zone_day(account_zone(p_account), p_at);

CREATE FUNCTION account_day_start(p_account text, p_day date) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN zone_day_start(account_zone(p_account), p_day);

-- The zones in use (UTC always among them): a month has ended for every
-- account once it has ended in each of them.
CREATE VIEW zones_in_use AS SELECT 'UTC'::text AS zone UNION SELECT DISTINCT time_zone FROM accounts;

CREATE FUNCTION month_end_everywhere(p_month date) RETURNS timestamptz LANGUAGE sql STABLE
BEGIN ATOMIC
    SELECT max(zone_day_start(z.zone, (date_trunc('month', p_month) + interval '1 month')::date)) FROM zones_in_use z;
END;

-- The local days of a zone a rate starts inside of (not at the day's first
-- hour): their usage is rated hour by hour (as sql/008's rate_split_days, per zone).
CREATE VIEW zone_rate_split_days AS
SELECT DISTINCT z.zone, zone_day(z.zone, pr.effective_from) AS day
  FROM plan_rates pr CROSS JOIN zones_in_use z
 WHERE pr.effective_from <> zone_day_start(z.zone, zone_day(z.zone, pr.effective_from));

-- ---------------------------------------------------------------------------
-- Limits: a key's block is for its account's day.
CREATE OR REPLACE FUNCTION key_blocked(p_key text, p_at timestamptz DEFAULT now()) RETURNS boolean
LANGUAGE sql STABLE
    RETURN EXISTS (SELECT 1 FROM key_blocks b WHERE b.key_id = p_key AND b.day = account_day(b.account_id, p_at));

-- A person lifts today's block of the account's day (sql/013's policy, by the account's zone).
ALTER POLICY key_blocks_lift ON key_blocks USING (
    day = account_day(key_blocks.account_id, now())
    AND EXISTS (SELECT FROM api_keys k
                 WHERE k.id = key_blocks.key_id
                   AND (k.daily_limit_nanodollars IS NULL OR k.limit_policy = 'alert_only'
                        OR k.daily_limit_nanodollars > coalesce((SELECT s.nanodollars FROM spend_daily s
                                                                  WHERE s.key_id = key_blocks.key_id
                                                                    AND s.day = key_blocks.day), 0))));

-- Whoever computes a day reads the account's zone (and nothing else of it).
GRANT SELECT (id, time_zone) ON accounts TO tally_aggregator, tally_vmm;

-- ---------------------------------------------------------------------------
-- The per-key daily rollup (sql/007's trigger) by the account's day.
CREATE OR REPLACE FUNCTION usage_rollup() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
DECLARE
    cols constant text := 'account_id, key_id, hour';
    src text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        src := format('SELECT %s, cpu_ns::numeric AS cpu, mem_byte_ns AS mem, storage_byte_ns AS sto FROM new_rows', cols);
    ELSIF TG_OP = 'UPDATE' THEN
        src := format('SELECT %s, cpu_ns::numeric AS cpu, mem_byte_ns AS mem, storage_byte_ns AS sto FROM new_rows'
                      ' UNION ALL SELECT %s, -cpu_ns::numeric, -mem_byte_ns, -storage_byte_ns FROM old_rows', cols, cols);
    ELSE
        src := format('SELECT %s, -cpu_ns::numeric AS cpu, -mem_byte_ns AS mem, -storage_byte_ns AS sto FROM old_rows', cols);
    END IF;
    EXECUTE format($q$
        WITH g AS (SELECT account_id, key_id, hour, sum(cpu) AS cpu, sum(mem) AS mem, sum(sto) AS sto
                     FROM (%s) r GROUP BY account_id, key_id, hour),
             -- Rates and the zone once per (account, hour), not per sandbox.
             rt AS (SELECT account_id, hour, coalesce(rate_at(plan, 'cpu', hour), 0) AS rc,
                           coalesce(rate_at(plan, 'memory', hour), 0) AS rm,
                           coalesce(rate_at(plan, 'storage', hour), 0) AS rs, zone_day(zone, hour) AS day
                      FROM (SELECT ah.account_id, ah.hour, coalesce(a.plan_id, 'default') AS plan,
                                   coalesce(a.time_zone, 'UTC') AS zone
                              FROM (SELECT DISTINCT account_id, hour FROM g) ah
                              LEFT JOIN accounts a ON a.id = ah.account_id) p),
             gr AS (SELECT g.account_id, g.key_id, g.hour, rt.day, g.cpu, g.mem, g.sto,
                           g.cpu * rt.rc AS cpu_r, g.mem * rt.rm AS mem_r, g.sto * rt.rs AS sto_r
                      FROM g JOIN rt ON rt.account_id = g.account_id AND rt.hour = g.hour),
             kh AS (INSERT INTO usage_key_hourly AS u (account_id, key_id, hour, cpu_ns, mem_byte_ns, storage_byte_ns,
                                                      cpu_rated, memory_rated, storage_rated)
                    SELECT account_id, key_id, hour, sum(cpu), sum(mem), sum(sto), sum(cpu_r), sum(mem_r), sum(sto_r)
                      FROM gr GROUP BY account_id, key_id, hour
                    ON CONFLICT (account_id, key_id, hour) DO UPDATE SET
                        cpu_ns = u.cpu_ns + EXCLUDED.cpu_ns, mem_byte_ns = u.mem_byte_ns + EXCLUDED.mem_byte_ns,
                        storage_byte_ns = u.storage_byte_ns + EXCLUDED.storage_byte_ns,
                        cpu_rated = u.cpu_rated + EXCLUDED.cpu_rated,
                        memory_rated = u.memory_rated + EXCLUDED.memory_rated,
                        storage_rated = u.storage_rated + EXCLUDED.storage_rated)
        INSERT INTO usage_key_daily AS u (account_id, day, key_id, cpu_ns, mem_byte_ns, storage_byte_ns,
                                          cpu_rated, memory_rated, storage_rated)
        SELECT account_id, day, key_id, sum(cpu), sum(mem), sum(sto), sum(cpu_r), sum(mem_r), sum(sto_r)
          FROM gr GROUP BY account_id, day, key_id
        ON CONFLICT (account_id, day, key_id) DO UPDATE SET
            cpu_ns = u.cpu_ns + EXCLUDED.cpu_ns, mem_byte_ns = u.mem_byte_ns + EXCLUDED.mem_byte_ns,
            storage_byte_ns = u.storage_byte_ns + EXCLUDED.storage_byte_ns,
            cpu_rated = u.cpu_rated + EXCLUDED.cpu_rated,
            memory_rated = u.memory_rated + EXCLUDED.memory_rated,
            storage_rated = u.storage_rated + EXCLUDED.storage_rated
    $q$, src);
    RETURN NULL;
END $fn$;

-- ---------------------------------------------------------------------------
-- spend_day: the day an instant belongs to for an account, with the instants
-- it starts and ends — what the limits' code asks (sql/016 made it, UTC days,
-- to be replaced here; made here when it is not there). By the rule above.
CREATE OR REPLACE FUNCTION spend_day(p_account text, p_at timestamptz, OUT day date, OUT day_start timestamptz,
                                     OUT day_end timestamptz)
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT x.d, zone_day_start(x.z, x.d), zone_day_start(x.z, x.d + 1)
      FROM (SELECT a.z, zone_day(a.z, p_at) AS d FROM (SELECT account_zone(p_account) AS z) a) x;
END;

-- The projected-limit warning (sql/009's trigger): today, and the end of
-- today, are the account's. sql/016 (the limits' one projection) replaces the
-- trigger with one that asks spend_day already; sql/009's, which computes UTC
-- days itself, is replaced here with the same text asking spend_day.
DO $do$
BEGIN
    IF position('spend_day' IN pg_get_functiondef('spend_projection()'::regprocedure)) = 0 THEN
        EXECUTE $def$
CREATE OR REPLACE FUNCTION spend_projection() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    WITH cand AS (
        SELECT n.key_id, n.day, n.account_id, n.nanodollars, k.daily_limit_nanodollars AS lim
          FROM new_spend n JOIN api_keys k ON k.id = n.key_id
         WHERE n.day = (spend_day(n.account_id, now())).day AND n.nanodollars > 0
           AND k.revoked_at IS NULL AND n.nanodollars < k.daily_limit_nanodollars
           AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.key_id = n.key_id AND a.day = n.day AND a.threshold_pct = 0)),
    moved AS (
        INSERT INTO spend_rate_points AS p (key_id, day, b_at, b_nanodollars)
        SELECT key_id, day, now(), nanodollars FROM cand
        ON CONFLICT (key_id, day) DO UPDATE SET a_at = p.b_at, a_nanodollars = p.b_nanodollars,
                                                b_at = now(), b_nanodollars = EXCLUDED.b_nanodollars
         WHERE now() - p.b_at >= (SELECT rate_window FROM alert_settings)
        RETURNING p.*),
    pts AS (
        SELECT c.key_id, c.day,
               CASE WHEN m.key_id IS NULL THEN p.a_at ELSE m.a_at END AS a_at,
               CASE WHEN m.key_id IS NULL THEN p.a_nanodollars ELSE m.a_nanodollars END AS a_nanodollars,
               CASE WHEN m.key_id IS NULL THEN p.b_at ELSE m.b_at END AS b_at,
               CASE WHEN m.key_id IS NULL THEN p.b_nanodollars ELSE m.b_nanodollars END AS b_nanodollars
          FROM cand c
          LEFT JOIN moved m ON m.key_id = c.key_id AND m.day = c.day
          LEFT JOIN spend_rate_points p ON p.key_id = c.key_id AND p.day = c.day)
    INSERT INTO alerts (key_id, day, threshold_pct, account_id, spend_nanodollars, limit_nanodollars, type, projected_at)
    SELECT c.key_id, c.day, 0, c.account_id, c.nanodollars, c.lim, 'spend.limit_projected',
           now() + make_interval(secs => ((c.lim - c.nanodollars)::numeric * r.elapsed
                                          / (c.nanodollars - r.base_nd))::double precision)
      FROM cand c
      JOIN pts p ON p.key_id = c.key_id AND p.day = c.day
     CROSS JOIN alert_settings st
     CROSS JOIN LATERAL (SELECT extract(epoch FROM now() - coalesce(p.a_at, p.b_at)) AS elapsed,
                                coalesce(p.a_nanodollars, p.b_nanodollars) AS base_nd,
                                extract(epoch FROM least(now() + st.projection_horizon,
                                                         (spend_day(c.account_id, now())).day_end) - now()) AS left_s) r
     WHERE now() - coalesce(p.a_at, p.b_at) >= st.rate_min_window AND c.nanodollars > r.base_nd
       AND (c.lim - c.nanodollars)::numeric * r.elapsed <= (c.nanodollars - r.base_nd)::numeric * r.left_s
     ORDER BY c.key_id
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
$def$;
    END IF;
END $do$;

-- ---------------------------------------------------------------------------
-- A person (or an operator) changes an account's zone. Its days are rebuilt
-- from its hours in one transaction: spend_daily and usage_key_daily from the
-- per-key hourly rollup (usage_key_hourly: the same hours, rated as they were
-- written), and today's blocks are those of the new day (a key whose spend of
-- the new today reaches its limit is blocked, the others are not). Alerts
-- already recorded keep the day they were recorded for; the new days re-arm
-- theirs. Usage commits wait while it runs (SHARE on usage_hourly, as a
-- month's close does), so no batch adds to a day being rebuilt. Audited.
CREATE FUNCTION account_set_time_zone(p_account text, p_zone text, p_actor text)
RETURNS TABLE (old_zone text, new_zone text) LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
DECLARE
    was text;
BEGIN
    IF p_zone IS NULL OR NOT time_zone_known(p_zone) THEN
        RAISE EXCEPTION 'unknown time zone %', p_zone USING ERRCODE = 'invalid_parameter_value',
              HINT = 'an IANA zone name such as Europe/Berlin (pg_timezone_names)';
    END IF;
    LOCK TABLE usage_hourly IN SHARE MODE;
    SELECT a.time_zone INTO was FROM accounts a WHERE a.id = p_account FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no account %', p_account USING ERRCODE = 'no_data_found';
    END IF;
    old_zone := was;
    new_zone := p_zone;
    IF was = p_zone THEN
        RETURN NEXT;
        RETURN;
    END IF;
    UPDATE accounts SET time_zone = p_zone WHERE id = p_account;

    DELETE FROM spend_daily WHERE account_id = p_account;
    INSERT INTO spend_daily (key_id, day, account_id, cpu_rated, memory_rated, storage_rated)
    SELECT h.key_id, zone_day(p_zone, h.hour), p_account, sum(h.cpu_rated), sum(h.memory_rated), sum(h.storage_rated)
      FROM usage_key_hourly h WHERE h.account_id = p_account
     GROUP BY 1, 2;

    DELETE FROM usage_key_daily WHERE account_id = p_account;
    INSERT INTO usage_key_daily (account_id, day, key_id, cpu_ns, mem_byte_ns, storage_byte_ns,
                                 cpu_rated, memory_rated, storage_rated)
    SELECT p_account, zone_day(p_zone, h.hour), h.key_id, sum(h.cpu_ns), sum(h.mem_byte_ns), sum(h.storage_byte_ns),
           sum(h.cpu_rated), sum(h.memory_rated), sum(h.storage_rated)
      FROM usage_key_hourly h WHERE h.account_id = p_account
     GROUP BY 2, 3;

    DELETE FROM key_blocks
     WHERE account_id = p_account AND day >= least(zone_day(was, now()), zone_day(p_zone, now()));
    INSERT INTO key_blocks (key_id, day, account_id, policy)
    SELECT d.key_id, d.day, p_account, k.limit_policy
      FROM spend_daily d JOIN api_keys k ON k.id = d.key_id
     WHERE d.account_id = p_account AND d.day = zone_day(p_zone, now())
       AND k.daily_limit_nanodollars IS NOT NULL AND k.revoked_at IS NULL
       AND d.nanodollars >= k.daily_limit_nanodollars
    ON CONFLICT DO NOTHING;

    INSERT INTO audit_log (account_id, actor, action, object_id, old_value, new_value)
    VALUES (p_account, p_actor, 'account.time_zone', p_account,
            jsonb_build_object('time_zone', was), jsonb_build_object('time_zone', p_zone));
    RETURN NEXT;
END $fn$;
REVOKE EXECUTE ON FUNCTION account_set_time_zone(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION account_set_time_zone(text, text, text) TO tally_api, tally_admin;

-- ---------------------------------------------------------------------------
-- Invoices: calendar months of the account's zone (sql/008's functions, by
-- the account's days). A month is its local days: usage_key_daily's days
-- are already local, an hour row belongs to the month of its day.

-- The usage of late hours is that of closed months when its day is in one,
-- by the account's zone (hours within a day of the closed months' UTC end
-- are the only ones that can be; the rest are not looked at twice).
CREATE OR REPLACE FUNCTION usage_late_capture() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
DECLARE
    through_m date := (SELECT (max(month) + interval '1 month')::date FROM closed_months);
    src text;
BEGIN
    IF through_m IS NULL THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        src := 'SELECT account_id, key_id, hour, cpu_ns::numeric AS cpu, mem_byte_ns AS mem, storage_byte_ns AS sto'
               ' FROM new_rows WHERE hour < $1';
    ELSIF TG_OP = 'UPDATE' THEN
        src := 'SELECT account_id, key_id, hour, cpu_ns::numeric AS cpu, mem_byte_ns AS mem, storage_byte_ns AS sto'
               ' FROM new_rows WHERE hour < $1'
               ' UNION ALL SELECT account_id, key_id, hour, -cpu_ns::numeric, -mem_byte_ns, -storage_byte_ns'
               ' FROM old_rows WHERE hour < $1';
    ELSE
        src := 'SELECT account_id, key_id, hour, -cpu_ns::numeric AS cpu, -mem_byte_ns AS mem, -storage_byte_ns AS sto'
               ' FROM old_rows WHERE hour < $1';
    END IF;
    EXECUTE format($q$
        INSERT INTO late_usage AS l (account_id, key_id, hour, cpu_ns, mem_byte_ns, storage_byte_ns)
        SELECT r.account_id, r.key_id, r.hour, sum(r.cpu), sum(r.mem), sum(r.sto) FROM (%s) r
          LEFT JOIN accounts a ON a.id = r.account_id
         WHERE zone_day(coalesce(a.time_zone, 'UTC'), r.hour) < $2
         GROUP BY r.account_id, r.key_id, r.hour
        HAVING sum(r.cpu) <> 0 OR sum(r.mem) <> 0 OR sum(r.sto) <> 0
        ON CONFLICT (account_id, key_id, hour) WHERE billed_in IS NULL DO UPDATE SET
            cpu_ns = l.cpu_ns + EXCLUDED.cpu_ns, mem_byte_ns = l.mem_byte_ns + EXCLUDED.mem_byte_ns,
            storage_byte_ns = l.storage_byte_ns + EXCLUDED.storage_byte_ns
    $q$, src) USING month_start(through_m) + interval '1 day', through_m;
    RETURN NULL;
END $fn$;

CREATE OR REPLACE FUNCTION invoice_charges(p_from date, p_to date, p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, key_id text, month date, kind text, meter text, for_month date,
               quantity_base numeric, rated numeric)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    -- As sql/008: usage summed per rate segment, then rated. A local day no
    -- rate starts inside of is read from the per-day rollup (its local noon
    -- names its segment: every hour of the day is in the same one), a day a
    -- rate starts inside of from the hours.
    WITH bounds AS (SELECT b FROM rate_bounds),
         split AS MATERIALIZED (SELECT zone, day FROM zone_rate_split_days),
         src AS (
             SELECT d.account_id, d.key_id, date_trunc('month', d.day)::date AS month, 'usage' AS kind,
                    date_trunc('month', d.day)::date AS for_month,
                    (d.day + time '12:00') AT TIME ZONE coalesce(a.time_zone, 'UTC') AS at,
                    d.cpu_ns, d.mem_byte_ns, d.storage_byte_ns
               FROM usage_key_daily d LEFT JOIN accounts a ON a.id = d.account_id
              WHERE d.day >= p_from AND d.day < p_to
                AND NOT EXISTS (SELECT 1 FROM split s WHERE s.zone = coalesce(a.time_zone, 'UTC') AND s.day = d.day)
                AND (p_account IS NULL OR d.account_id = p_account)
             UNION ALL
             SELECT u.account_id, u.key_id, date_trunc('month', x.day)::date, 'usage', date_trunc('month', x.day)::date,
                    u.hour, u.cpu_ns, u.mem_byte_ns, u.storage_byte_ns
               FROM usage_key_hourly u LEFT JOIN accounts a ON a.id = u.account_id
              CROSS JOIN LATERAL (SELECT zone_day(coalesce(a.time_zone, 'UTC'), u.hour) AS day) x
              WHERE EXISTS (SELECT 1 FROM split)
                AND u.hour >= month_start(p_from) - interval '1 day' AND u.hour < month_start(p_to) + interval '1 day'
                AND x.day >= p_from AND x.day < p_to
                AND EXISTS (SELECT 1 FROM split s WHERE s.zone = coalesce(a.time_zone, 'UTC') AND s.day = x.day)
                AND (p_account IS NULL OR u.account_id = p_account)
             UNION ALL
             SELECT l.account_id, l.key_id, p_from, 'adjustment',
                    date_trunc('month', zone_day(coalesce(a.time_zone, 'UTC'), l.hour))::date,
                    l.hour, l.cpu_ns, l.mem_byte_ns, l.storage_byte_ns
               FROM late_usage l LEFT JOIN accounts a ON a.id = l.account_id
              WHERE l.billed_in IS NULL AND p_from < p_to AND (p_account IS NULL OR l.account_id = p_account)),
         g AS (
             SELECT s.account_id, s.key_id, s.month, s.kind, s.for_month,
                    bounds.b[width_bucket(s.at, bounds.b)] AS seg,
                    sum(s.cpu_ns) AS cpu, sum(s.mem_byte_ns) AS mem, sum(s.storage_byte_ns) AS sto
               FROM src s CROSS JOIN bounds
              GROUP BY 1, 2, 3, 4, 5, 6)
    SELECT g.account_id, g.key_id, g.month, g.kind, m.meter, g.for_month, sum(m.q), sum(m.q * coalesce(rp.rate, 0))
      FROM g
      LEFT JOIN accounts a ON a.id = g.account_id
     CROSS JOIN LATERAL (VALUES ('cpu', g.cpu), ('memory', g.mem), ('storage', g.sto)) AS m(meter, q)
      LEFT JOIN rate_periods rp ON rp.plan_id = coalesce(a.plan_id, 'default') AND rp.meter = m.meter
                               AND g.seg >= rp.since AND g.seg < rp.until
     GROUP BY g.account_id, g.key_id, g.month, g.kind, m.meter, g.for_month
$$;

-- The free credit (sql/008), over the account's local months.
CREATE OR REPLACE FUNCTION invoice_credit(p_from date, p_to date, p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, month date, running_ns numeric, num numeric, den numeric)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
DECLARE
    gib_hour constant numeric := 1073741824::numeric * 3600000000000;
    acc record;
    r record;
    left_ns numeric;
    run numeric;
    val numeric;
    m date;
    after_hour timestamptz;
    after_sb text;
    got integer;
BEGIN
    FOR acc IN
        SELECT a.id, a.plan_id, a.time_zone,
               a.free_sandbox_hours::numeric * 3600000000000
               - coalesce((SELECT sum(ci.credit_running_ns) FROM closed_invoices ci WHERE ci.account_id = a.id), 0)
                 AS allowance
          FROM accounts a
         WHERE (p_account IS NULL OR a.id = p_account) AND a.free_sandbox_hours > 0
    LOOP
        CONTINUE WHEN acc.allowance <= 0;
        left_ns := acc.allowance;
        account_id := acc.id;
        month := NULL;
        after_hour := zone_day_start(acc.time_zone, p_from);
        after_sb := '';
        -- in pages of 256 rows by (hour, sandbox id): the credit usually ends
        -- in the first page, and a page is an index range of the account's
        -- hours, not a sort of its whole month
        <<pages>>
        LOOP
            got := 0;
            FOR r IN EXECUTE
                'SELECT u.hour, u.sandbox_id, u.cpu_ns, u.mem_byte_ns, s.mem_size_bytes,'
                '       coalesce(rc.rate, 0) AS rc, coalesce(rm.rate, 0) AS rm'
                '  FROM usage_hourly u JOIN sandboxes s ON s.id = u.sandbox_id'
                '  LEFT JOIN rate_periods rc ON rc.plan_id = $4 AND rc.meter = ''cpu'''
                '                           AND u.hour >= rc.since AND u.hour < rc.until'
                '  LEFT JOIN rate_periods rm ON rm.plan_id = $4 AND rm.meter = ''memory'''
                '                           AND u.hour >= rm.since AND u.hour < rm.until'
                ' WHERE u.account_id = $1 AND u.hour >= $2 AND u.hour < $3'
                '   AND (u.hour > $2 OR u.sandbox_id > $5)'
                '   AND u.mem_byte_ns > 0 AND s.mem_size_bytes > 0'
                ' ORDER BY u.hour, u.sandbox_id LIMIT 256'
                USING acc.id, after_hour, zone_day_start(acc.time_zone, p_to), acc.plan_id, after_sb
            LOOP
                got := got + 1;
                after_hour := r.hour;
                after_sb := r.sandbox_id;
                m := date_trunc('month', zone_day(acc.time_zone, r.hour))::date;
                IF month IS DISTINCT FROM m THEN
                    IF month IS NOT NULL THEN
                        RETURN NEXT;
                    END IF;
                    month := m;
                    running_ns := 0;
                    num := 0;
                    den := gib_hour;
                END IF;
                run := div(r.mem_byte_ns, r.mem_size_bytes);
                -- (cpu rated) / vCPU-hour base + (memory rated) / GiB-hour base, over the GiB-hour base
                val := r.cpu_ns::numeric * r.rc * 1073741824 + r.mem_byte_ns * r.rm;
                IF run <= left_ns THEN
                    num := num + val;
                    running_ns := running_ns + run;
                    left_ns := left_ns - run;
                ELSE
                    -- the last piece: its share left_ns / run (exact, one fraction)
                    num := num * run + val * left_ns;
                    den := den * run;
                    running_ns := running_ns + left_ns;
                    left_ns := 0;
                END IF;
                EXIT pages WHEN left_ns <= 0;
            END LOOP;
            EXIT WHEN got < 256;
        END LOOP;
        IF month IS NOT NULL THEN
            RETURN NEXT;
        END IF;
    END LOOP;
END $fn$;
-- A month closes once it has ended in every account's zone.
CREATE OR REPLACE FUNCTION close_month(p_month date, p_by text DEFAULT '')
RETURNS TABLE (month date, status text, invoices integer, total_cents bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
DECLARE
    target constant date := date_trunc('month', p_month)::date;
    m date;
BEGIN
    -- ended in every account's zone
    IF month_end_everywhere(target) > now() THEN
        RAISE EXCEPTION 'month % has not ended (it ends %)', to_char(target, 'YYYY-MM'),
              month_end_everywhere(target) USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    LOCK TABLE closed_months IN EXCLUSIVE MODE; -- one close at a time
    IF EXISTS (SELECT 1 FROM closed_months c WHERE c.month >= target) THEN
        month := target;
        status := 'already closed';
        SELECT count(*), coalesce(sum(ci.total_cents), 0) INTO invoices, total_cents
          FROM closed_invoices ci WHERE ci.month = target;
        RETURN NEXT;
        RETURN;
    END IF;
    LOCK TABLE usage_hourly IN SHARE MODE;
    m := least(first_open_month(), target);
    WHILE m <= target LOOP
        INSERT INTO closed_months (month, closed_by) VALUES (m, p_by);
        CREATE TEMP TABLE close_lines ON COMMIT DROP AS
            SELECT * FROM invoice_lines_compute(m, (m + interval '1 month')::date, NULL) l WHERE l.month = m;
        INSERT INTO closed_invoices (account_id, month, plan_id, credit_running_ns, total_nanodollars, total_cents,
                                     line_count, closed_at)
        SELECT l.account_id, m, account_plan(l.account_id), sum(l.credit_running_ns), sum(l.amount_nanodollars),
               sum(l.amount_cents), count(*), now()
          FROM close_lines l WHERE l.key_id IS NULL GROUP BY l.account_id;
        INSERT INTO closed_invoice_lines (account_id, month, line_no, kind, meter, for_month, quantity_base, quantity,
                                          exact_num, exact_den, amount_nanodollars, amount_cents)
        SELECT l.account_id, l.month, l.line_no, l.kind, l.meter, l.for_month, l.quantity_base, l.quantity,
               l.exact_num, l.exact_den, l.amount_nanodollars, l.amount_cents
          FROM close_lines l WHERE l.key_id IS NULL;
        INSERT INTO closed_invoice_key_lines (account_id, month, key_id, kind, meter, for_month, quantity_base,
                                              quantity, exact_num, exact_den, amount_nanodollars, amount_cents)
        SELECT k.account_id, k.month, k.key_id, k.kind, k.meter, k.for_month, k.quantity_base, k.quantity,
               k.exact_num, k.exact_den, k.amount_nanodollars, k.amount_cents
          FROM close_lines k WHERE k.key_id IS NOT NULL;
        -- the pending late usage was carried by this month's invoices
        UPDATE late_usage SET billed_in = m WHERE billed_in IS NULL;
        month := m;
        status := 'closed';
        SELECT count(*), coalesce(sum(ci.total_cents), 0) INTO invoices, total_cents
          FROM closed_invoices ci WHERE ci.month = m;
        DROP TABLE close_lines;
        RETURN NEXT;
        m := (m + interval '1 month')::date;
    END LOOP;
END $fn$;

CREATE OR REPLACE FUNCTION close_due(p_grace interval, p_by text DEFAULT 'close-due')
RETURNS TABLE (month date, status text, invoices integer, total_cents bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $fn$
DECLARE
    -- the last month whose end + grace has passed
    target date := (month_of(now() - p_grace) - interval '1 month')::date;
BEGIN
    -- ... in every account's zone
    IF month_end_everywhere(target) + p_grace > now() THEN
        target := (target - interval '1 month')::date;
    END IF;
    IF EXISTS (SELECT 1 FROM closed_months c WHERE c.month >= target) THEN
        RETURN;
    END IF;
    -- nothing to close before any usage exists
    IF NOT EXISTS (SELECT 1 FROM closed_months) AND first_open_month() > target THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM close_month(target, p_by);
END $fn$;

CREATE OR REPLACE FUNCTION invoice_preview_lines(p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, month date, line_no integer, kind text, meter text, for_month date,
               quantity_base numeric, quantity numeric, unit text, exact_num numeric, exact_den numeric,
               amount_nanodollars bigint, amount_cents bigint, credit_running_ns bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT l.account_id, l.month, l.line_no, l.kind, l.meter, l.for_month, l.quantity_base, l.quantity, l.unit,
           l.exact_num, l.exact_den, l.amount_nanodollars, l.amount_cents, l.credit_running_ns
      FROM invoice_lines_compute(first_open_month(), (month_of(now() + interval '14 hours') + interval '1 month')::date, p_account) l
     WHERE l.key_id IS NULL
$$;

CREATE OR REPLACE FUNCTION invoice_preview_key_lines(p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, month date, key_id text, kind text, meter text, for_month date,
               quantity_base numeric, quantity numeric, unit text, exact_num numeric, exact_den numeric,
               amount_nanodollars bigint, amount_cents bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT l.account_id, l.month, l.key_id, l.kind, l.meter, l.for_month, l.quantity_base, l.quantity, l.unit,
           l.exact_num, l.exact_den, l.amount_nanodollars, l.amount_cents
      FROM invoice_lines_compute(first_open_month(), (month_of(now() + interval '14 hours') + interval '1 month')::date, p_account) l
     WHERE l.key_id IS NOT NULL
$$;

CREATE OR REPLACE FUNCTION invoice_projection_lines(p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, month date, line_no integer, kind text, meter text, for_month date,
               quantity_base numeric, quantity numeric, unit text, exact_num numeric, exact_den numeric,
               amount_nanodollars bigint, amount_cents bigint, elapsed_s bigint, month_s bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    WITH p AS (SELECT * FROM invoice_preview_lines(p_account)),
         -- free time an account has left after every open month's preview
         room AS (SELECT a.id AS account_id,
                         greatest(0, a.free_sandbox_hours::numeric * 3600000000000
                                     - coalesce((SELECT sum(ci.credit_running_ns) FROM closed_invoices ci
                                                  WHERE ci.account_id = a.id), 0)
                                     - coalesce((SELECT sum(p.credit_running_ns) FROM p WHERE p.account_id = a.id), 0))
                           AS left_ns
                    FROM accounts a WHERE p_account IS NULL OR a.id = p_account),
         s AS (SELECT p.*, t.elapsed, t.len,
                      -- the scale as a fraction fn / fd
                      CASE WHEN p.kind = 'adjustment' THEN 1::numeric
                           WHEN p.kind = 'credit' AND p.quantity_base > 0
                                AND (p.quantity_base + coalesce(r.left_ns, 0)) * t.elapsed < p.quantity_base * t.len
                           THEN p.quantity_base + coalesce(r.left_ns, 0)
                           ELSE t.len::numeric END AS fn,
                      CASE WHEN p.kind = 'adjustment' THEN 1::numeric
                           WHEN p.kind = 'credit' AND p.quantity_base > 0
                                AND (p.quantity_base + coalesce(r.left_ns, 0)) * t.elapsed < p.quantity_base * t.len
                           THEN p.quantity_base
                           ELSE t.elapsed::numeric END AS fd
                 FROM p
                -- the account's current month: its length and how much of it has passed
                CROSS JOIN LATERAL (
                      SELECT x.m, greatest(1, floor(extract(epoch FROM now() - x.s)))::bigint AS elapsed,
                             extract(epoch FROM x.e - x.s)::bigint AS len
                        FROM (SELECT c.m, zone_day_start(c.z, c.m) AS s,
                                     zone_day_start(c.z, (c.m + interval '1 month')::date) AS e
                                FROM (SELECT date_trunc('month', zone_day(z.z, now()))::date AS m, z.z
                                        FROM (SELECT account_zone(p.account_id) AS z) z) c) x) t
                 LEFT JOIN room r ON r.account_id = p.account_id
                WHERE p.month = t.m)
    SELECT s.account_id, s.month, s.line_no, s.kind, s.meter, s.for_month,
           tally_round_div(s.quantity_base * s.fn, s.fd),
           billing_units(tally_round_div(s.quantity_base * s.fn, s.fd),
                         CASE s.meter WHEN 'credit' THEN 3600000000000::numeric ELSE meter_unit_base(s.meter) END),
           s.unit, s.exact_num * s.fn, s.exact_den * s.fd,
           tally_round_div(s.exact_num * s.fn, s.exact_den * s.fd)::bigint,
           tally_round_div(s.exact_num * s.fn, s.exact_den * s.fd * 10000000)::bigint,
           s.elapsed, s.len
      FROM s
$$;
-- The finance views (sql/008) by the account's days and months.
CREATE OR REPLACE VIEW finance.charges_daily AS
WITH split AS MATERIALIZED (SELECT zone, day FROM zone_rate_split_days),
src AS (
    SELECT d.account_id, d.key_id, d.day, (d.day + time '12:00') AT TIME ZONE coalesce(a.time_zone, 'UTC') AS at,
           d.cpu_ns, d.mem_byte_ns, d.storage_byte_ns
      FROM usage_key_daily d LEFT JOIN accounts a ON a.id = d.account_id
     WHERE NOT EXISTS (SELECT 1 FROM split s WHERE s.zone = coalesce(a.time_zone, 'UTC') AND s.day = d.day)
    UNION ALL
    SELECT u.account_id, u.key_id, x.day, u.hour, u.cpu_ns, u.mem_byte_ns, u.storage_byte_ns
      FROM usage_key_hourly u LEFT JOIN accounts a ON a.id = u.account_id
     CROSS JOIN LATERAL (SELECT zone_day(coalesce(a.time_zone, 'UTC'), u.hour) AS day) x
     WHERE EXISTS (SELECT 1 FROM split s WHERE s.zone = coalesce(a.time_zone, 'UTC') AND s.day = x.day)),
s AS (
    SELECT src.account_id, src.key_id, src.day, rb.b[width_bucket(src.at, rb.b)] AS seg,
           sum(src.cpu_ns) AS cpu, sum(src.mem_byte_ns) AS mem, sum(src.storage_byte_ns) AS sto
      FROM src CROSS JOIN rate_bounds rb
     GROUP BY 1, 2, 3, 4),
g AS (
    SELECT s.account_id, s.key_id, s.day, m.meter, sum(m.q) AS quantity_base, sum(m.q * coalesce(rp.rate, 0)) AS rated
      FROM s
      LEFT JOIN accounts a ON a.id = s.account_id
     CROSS JOIN LATERAL (VALUES ('cpu', s.cpu), ('memory', s.mem), ('storage', s.sto)) AS m(meter, q)
      LEFT JOIN rate_periods rp ON rp.plan_id = coalesce(a.plan_id, 'default') AND rp.meter = m.meter
                               AND s.seg >= rp.since AND s.seg < rp.until
     GROUP BY 1, 2, 3, 4)
SELECT g.account_id, g.key_id, g.day, g.meter, g.quantity_base, meter_base_unit(g.meter) AS base_unit,
       billing_units(g.quantity_base, meter_unit_base(g.meter)) AS quantity, meter_unit(g.meter) AS unit,
       tally_round_div(g.rated, meter_unit_base(g.meter))::bigint AS amount_nanodollars,
       tally_round_div(g.rated, meter_unit_base(g.meter) * 10000000)::bigint AS amount_cents
  FROM g;


CREATE OR REPLACE VIEW finance.sandbox_daily AS
WITH s AS (
    SELECT u.account_id, u.key_id, u.sandbox_id, zone_day(coalesce(za.time_zone, 'UTC'), u.hour) AS day,
           rb.b[width_bucket(u.hour, rb.b)] AS seg,
           sum(u.cpu_ns)::numeric AS cpu_ns, sum(u.mem_byte_ns) AS mem_byte_ns,
           sum(u.storage_byte_ns) AS storage_byte_ns
      FROM usage_hourly u CROSS JOIN rate_bounds rb LEFT JOIN accounts za ON za.id = u.account_id
     GROUP BY 1, 2, 3, 4, 5),
d AS (
    SELECT s.account_id, s.key_id, s.sandbox_id, s.day,
           sum(s.cpu_ns) AS cpu_ns, sum(s.mem_byte_ns) AS mem_byte_ns, sum(s.storage_byte_ns) AS storage_byte_ns,
           sum(s.cpu_ns * coalesce(rc.rate, 0)) AS cpu_rated,
           sum(s.mem_byte_ns * coalesce(rm.rate, 0)) AS memory_rated,
           sum(s.storage_byte_ns * coalesce(rs.rate, 0)) AS storage_rated
      FROM s
      LEFT JOIN accounts a ON a.id = s.account_id
      LEFT JOIN rate_periods rc ON rc.plan_id = coalesce(a.plan_id, 'default') AND rc.meter = 'cpu'
                               AND s.seg >= rc.since AND s.seg < rc.until
      LEFT JOIN rate_periods rm ON rm.plan_id = coalesce(a.plan_id, 'default') AND rm.meter = 'memory'
                               AND s.seg >= rm.since AND s.seg < rm.until
      LEFT JOIN rate_periods rs ON rs.plan_id = coalesce(a.plan_id, 'default') AND rs.meter = 'storage'
                               AND s.seg >= rs.since AND s.seg < rs.until
     GROUP BY 1, 2, 3, 4)
SELECT d.account_id, d.key_id, d.sandbox_id, d.day, coalesce(sb.labels, '{}'::jsonb) AS labels,
       sb.vcpus, sb.mem_size_bytes,
       billing_units(d.cpu_ns, meter_unit_base('cpu')) AS cpu_vcpu_hours,
       billing_units(d.mem_byte_ns, meter_unit_base('memory')) AS memory_gib_hours,
       billing_units(d.storage_byte_ns, meter_unit_base('storage')) AS storage_gb_months,
       d.cpu_ns, d.mem_byte_ns, d.storage_byte_ns,
       tally_round_div(d.cpu_rated, meter_unit_base('cpu'))::bigint AS cpu_nanodollars,
       tally_round_div(d.memory_rated, meter_unit_base('memory'))::bigint AS memory_nanodollars,
       tally_round_div(d.storage_rated, meter_unit_base('storage'))::bigint AS storage_nanodollars,
       tally_round_div(d.cpu_rated * 1073741824 * (1000000000::numeric * 2592000000000000)
                       + d.memory_rated * (1000000000::numeric * 2592000000000000)
                       + d.storage_rated * (1073741824::numeric * 3600000000000),
                       (1073741824::numeric * 3600000000000) * (1000000000::numeric * 2592000000000000))::bigint
           AS total_nanodollars,
       tally_round_div(d.cpu_rated * 1073741824 * (1000000000::numeric * 2592000000000000)
                       + d.memory_rated * (1000000000::numeric * 2592000000000000)
                       + d.storage_rated * (1073741824::numeric * 3600000000000),
                       (1073741824::numeric * 3600000000000) * (1000000000::numeric * 2592000000000000)
                       * 10000000)::bigint AS total_cents
  FROM d LEFT JOIN sandboxes sb ON sb.id = d.sandbox_id;


CREATE OR REPLACE VIEW finance.usage_by_label AS
WITH s AS (
    SELECT u.account_id, date_trunc('month', zone_day(coalesce(za.time_zone, 'UTC'), u.hour))::date AS month,
           u.sandbox_id, rb.b[width_bucket(u.hour, rb.b)] AS seg,
           sum(u.cpu_ns)::numeric AS cpu, sum(u.mem_byte_ns) AS mem, sum(u.storage_byte_ns) AS sto
      FROM usage_hourly u CROSS JOIN rate_bounds rb LEFT JOIN accounts za ON za.id = u.account_id
     GROUP BY 1, 2, 3, 4),
d AS (
    SELECT s.account_id, s.month, s.sandbox_id, m.meter, sum(m.q) AS q, sum(m.q * coalesce(rp.rate, 0)) AS rated
      FROM s
      LEFT JOIN accounts a ON a.id = s.account_id
     CROSS JOIN LATERAL (VALUES ('cpu', s.cpu), ('memory', s.mem), ('storage', s.sto)) AS m(meter, q)
      LEFT JOIN rate_periods rp ON rp.plan_id = coalesce(a.plan_id, 'default') AND rp.meter = m.meter
                               AND s.seg >= rp.since AND s.seg < rp.until
     GROUP BY 1, 2, 3, 4)
SELECT d.account_id, d.month, l.key AS label_key, l.value AS label_value, d.meter,
       count(DISTINCT d.sandbox_id) AS sandboxes,
       sum(d.q) AS quantity_base, meter_base_unit(d.meter) AS base_unit,
       billing_units(sum(d.q), meter_unit_base(d.meter)) AS quantity, meter_unit(d.meter) AS unit,
       tally_round_div(sum(d.rated), meter_unit_base(d.meter))::bigint AS amount_nanodollars,
       tally_round_div(sum(d.rated), meter_unit_base(d.meter) * 10000000)::bigint AS amount_cents
  FROM d LEFT JOIN sandboxes s ON s.id = d.sandbox_id
 CROSS JOIN LATERAL (SELECT e.key, e.value FROM jsonb_each_text(coalesce(s.labels, '{}'::jsonb)) e
                     UNION ALL
                     SELECT '', '' WHERE coalesce(s.labels, '{}'::jsonb) = '{}'::jsonb) AS l
 GROUP BY d.account_id, d.month, l.key, l.value, d.meter;

CREATE OR REPLACE VIEW finance.invoices AS
SELECT ci.account_id, ci.month, 'closed' AS status, zone_day_start(coalesce(za.time_zone, 'UTC'), ci.month) AS period_start,
       zone_day_start(coalesce(za.time_zone, 'UTC'), (ci.month + interval '1 month')::date) AS period_end, ci.plan_id,
       ci.line_count, ci.credit_running_ns, ci.total_nanodollars, ci.total_cents, ci.closed_at
  FROM closed_invoices ci LEFT JOIN accounts za ON za.id = ci.account_id
UNION ALL
SELECT p.account_id, p.month, 'preview', zone_day_start(coalesce(a.time_zone, 'UTC'), p.month),
       zone_day_start(coalesce(a.time_zone, 'UTC'), (p.month + interval '1 month')::date),
       coalesce(a.plan_id, 'default'), p.line_count, p.credit_running_ns, p.total_nanodollars, p.total_cents,
       NULL::timestamptz
  FROM (SELECT l.account_id, l.month, count(*)::integer AS line_count, sum(l.credit_running_ns)::bigint AS credit_running_ns,
               sum(l.amount_nanodollars)::bigint AS total_nanodollars, sum(l.amount_cents)::bigint AS total_cents
          FROM invoice_preview_lines(NULL) l GROUP BY l.account_id, l.month) p
  LEFT JOIN accounts a ON a.id = p.account_id;

-- The account's zone, for finance.
CREATE VIEW finance.account_time_zones AS SELECT id AS account_id, time_zone FROM accounts;
GRANT SELECT ON finance.account_time_zones TO finance;

-- finance.limit_waivers (sql/016) finds a waiver's hours by the account's day:
-- from accounts' own column, which the view (its owner's rights) reads, not
-- through spend_day (the caller's rights: the finance role cannot read
-- accounts).
CREATE OR REPLACE VIEW finance.limit_waivers AS
SELECT w.account_id, w.key_id, w.sandbox_id, w.day, w.blocked_at,
       coalesce(sum(u.storage_waived_byte_ns), 0) AS storage_waived_byte_ns,
       billing_units(coalesce(sum(u.storage_waived_byte_ns), 0), meter_unit_base('storage')) AS storage_gb_months,
       tally_round_div(coalesce(sum(u.storage_waived_byte_ns * coalesce(r.rate, 0)), 0),
                       meter_unit_base('storage'))::bigint AS waived_nanodollars
  FROM limit_waivers w
  LEFT JOIN accounts a ON a.id = w.account_id
  LEFT JOIN usage_hourly u ON u.sandbox_id = w.sandbox_id AND u.key_id = w.key_id AND u.storage_waived_byte_ns > 0
                          -- (a coarse range any day of any zone is inside, for the index; then the day itself)
                          AND u.hour >= w.day - 1 AND u.hour < w.day + 2
                          AND zone_day(coalesce(a.time_zone, 'UTC'), u.hour) = w.day
  -- the rate in force at the hour's start (rate_at's rule)
  LEFT JOIN rate_periods r ON r.plan_id = coalesce(a.plan_id, 'default') AND r.meter = 'storage'
                          AND u.hour >= r.since AND u.hour < r.until
 GROUP BY w.account_id, w.key_id, w.sandbox_id, w.day, w.blocked_at;
