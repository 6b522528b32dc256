-- 016_limits_hold: a `pause` limit caps spend, and one projection of spend.
--
--   * spend_day: the day a moment belongs to for an account, with its bounds.
--     The one place this migration computes a day (UTC days today);
--   * limit waivers (docs/billing.md, "Daily spend limits"): the sandboxes a
--     `pause` block found running, and the paused storage they hold after it
--     on the blocked day, kept in usage_hourly.storage_waived_byte_ns instead
--     of storage_byte_ns. Nothing that charges (spend_daily, invoices, the
--     finance views) reads the waived column, so they all agree without a
--     change; the ledger keeps every byte-ns measured;
--   * spend_projection_of: the burn rate of a key and when it reaches its
--     limit, from the two points of spend_rate_points (the reference point
--     and the last spend change). The projected alert (spend_projection(),
--     replaced here) and GET /v1/spend (api/spend.c) both call it, so they
--     predict the same instant from the same ledger.

-- The day p_at belongs to for account p_account, and the instants it starts
-- and ends. UTC days: replace this function to give accounts their own days.
CREATE FUNCTION spend_day(p_account text, p_at timestamptz, OUT day date, OUT day_start timestamptz,
                          OUT day_end timestamptz)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT d, d::timestamp AT TIME ZONE 'UTC', (d + 1)::timestamp AT TIME ZONE 'UTC'
      FROM (SELECT (p_at AT TIME ZONE 'UTC')::date AS d) x
$$;

-- ---------------------------------------------------------------------------
-- Limit waivers.

-- Paused storage measured but not charged (a limit-paused sandbox on its
-- blocked day). Exact byte-ns, like storage_byte_ns; 0 for everything else.
ALTER TABLE usage_hourly ADD COLUMN storage_waived_byte_ns numeric NOT NULL DEFAULT 0;

-- One row per sandbox a `pause` block of (key, day) found running (per
-- `sandboxes`, in the aggregator's transaction that wrote the block). While
-- that block stands, the sandbox's paused storage in hours of that day is
-- waived. A person lifting the block ends the waiver (the block is gone); a
-- new block the same day adds the sandboxes running then.
CREATE TABLE limit_waivers (
    key_id      text NOT NULL,
    day         date NOT NULL,
    sandbox_id  text NOT NULL,
    account_id  text NOT NULL,
    blocked_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key_id, day, sandbox_id)
);
CREATE INDEX limit_waivers_sandbox ON limit_waivers (sandbox_id, day);

GRANT SELECT, INSERT ON limit_waivers TO tally_aggregator;
GRANT SELECT ON limit_waivers TO tally_api, tally_admin;

-- Finance's view of them (docs/finance.md): per waiver, the storage it waived
-- and what that storage would have cost (each hour at the storage rate in
-- force, rounded once). No invoice holds these amounts.
-- (Rates through 008's rate_periods, as its views do: functions a view calls
-- run with the reader's rights, and the finance role reads no table.)
CREATE VIEW finance.limit_waivers AS
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
                          AND (spend_day(u.account_id, u.hour)).day = w.day
  -- the rate in force at the hour's start (rate_at's rule)
  LEFT JOIN rate_periods r ON r.plan_id = coalesce(a.plan_id, 'default') AND r.meter = 'storage'
                          AND u.hour >= r.since AND u.hour < r.until
 GROUP BY w.account_id, w.key_id, w.sandbox_id, w.day, w.blocked_at;
GRANT SELECT ON finance.limit_waivers TO finance;

-- ---------------------------------------------------------------------------
-- One projection.

-- The last spend change of the key's day (every statement that changes
-- spend_daily moves it, whether the value moved or not).
ALTER TABLE spend_rate_points ADD COLUMN last_at timestamptz;
ALTER TABLE spend_rate_points ADD COLUMN last_nanodollars bigint;

-- A key's burn rate and when it reaches its limit, as of p_now, from its
-- reference point (p_ref_at, p_ref_nd) and its last spend change
-- (p_last_at, p_last_nd):
--   burn = (last − ref) × 3,600,000,000 / (last_at − ref_at in µs), rounded
--          half away from zero: nano-dollars an hour;
--   reaches_limit_us = last_at + ⌈(limit − last) × (last_at − ref_at) /
--          (last − ref)⌉ µs, as Unix µs (exact; NULL without a limit, once
--          reached, or after 9999-12-31);
-- both 0 / NULL while the window is shorter than rate_min_window, when spend
-- did not grow in it, or once spend has not changed for longer than
-- rate_window (nothing of the key is metered any more). Integer arithmetic
-- in numeric; nothing is rounded but the burn.
CREATE FUNCTION spend_projection_of(p_ref_at timestamptz, p_ref_nd bigint, p_last_at timestamptz, p_last_nd bigint,
                                    p_limit bigint, p_now timestamptz,
                                    OUT burn_nanodollars_per_hour bigint, OUT window_start timestamptz,
                                    OUT reaches_limit_us numeric, OUT reaches_limit_at timestamptz)
LANGUAGE sql STABLE SET TimeZone = 'UTC' AS $$
    SELECT CASE WHEN ok THEN tally_round_div((p_last_nd - p_ref_nd)::numeric * 3600000000, w_us)::bigint ELSE 0 END,
           CASE WHEN ok THEN p_ref_at END,
           r_us,
           -- whole days, then the µs left: exact (the day is 24 h in UTC)
           timestamptz 'epoch' + (div(r_us, 86400000000))::int * interval '1 day'
               + (mod(r_us, 86400000000))::bigint * interval '1 microsecond'
      FROM (SELECT ok, w_us,
                   CASE WHEN r <= 253402300799999999 THEN r END AS r_us
              FROM (SELECT ok, w_us,
                           CASE WHEN ok AND p_limit IS NOT NULL AND p_last_nd < p_limit
                                THEN (extract(epoch FROM p_last_at) * 1000000)
                                     + div((p_limit - p_last_nd)::numeric * w_us + (p_last_nd - p_ref_nd) - 1,
                                           p_last_nd - p_ref_nd) END AS r
                      FROM (SELECT w_us,
                                   coalesce(p_last_nd > p_ref_nd AND p_last_at - p_ref_at >= st.rate_min_window
                                            AND p_now - p_last_at <= st.rate_window, false) AS ok
                              FROM alert_settings st,
                                   LATERAL (SELECT extract(epoch FROM p_last_at - p_ref_at) * 1000000 AS w_us) w) a) b) c
$$;

-- The warning before the limit (sql/009), on the one projection: after each
-- statement that changes spend, every key of it today moves its points (the
-- reference point every rate_window as before, the last change always);
-- a limited key without a warning today gets one when its projection reaches
-- the limit before min(now + projection_horizon, the end of its day).
CREATE OR REPLACE FUNCTION spend_projection() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    WITH today AS (
        SELECT n.key_id, n.day, n.account_id, n.nanodollars, (spend_day(n.account_id, now())).day_end
          FROM new_spend n
         WHERE n.day = (spend_day(n.account_id, now())).day),
    moved AS (
        INSERT INTO spend_rate_points AS p (key_id, day, b_at, b_nanodollars, last_at, last_nanodollars)
        SELECT key_id, day, now(), nanodollars, now(), nanodollars FROM today ORDER BY key_id
        ON CONFLICT (key_id, day) DO UPDATE SET
            a_at = CASE WHEN now() - p.b_at >= (SELECT rate_window FROM alert_settings) THEN p.b_at ELSE p.a_at END,
            a_nanodollars = CASE WHEN now() - p.b_at >= (SELECT rate_window FROM alert_settings)
                                 THEN p.b_nanodollars ELSE p.a_nanodollars END,
            b_at = CASE WHEN now() - p.b_at >= (SELECT rate_window FROM alert_settings) THEN now() ELSE p.b_at END,
            b_nanodollars = CASE WHEN now() - p.b_at >= (SELECT rate_window FROM alert_settings)
                                 THEN EXCLUDED.b_nanodollars ELSE p.b_nanodollars END,
            last_at = now(), last_nanodollars = EXCLUDED.last_nanodollars
        RETURNING p.*)
    INSERT INTO alerts (key_id, day, threshold_pct, account_id, spend_nanodollars, limit_nanodollars, type, projected_at)
    SELECT m.key_id, m.day, 0, t.account_id, m.last_nanodollars, k.daily_limit_nanodollars, 'spend.limit_projected',
           pr.reaches_limit_at
      FROM moved m
      JOIN today t ON t.key_id = m.key_id AND t.day = m.day
      JOIN api_keys k ON k.id = m.key_id
     CROSS JOIN alert_settings st
     CROSS JOIN LATERAL spend_projection_of(coalesce(m.a_at, m.b_at), coalesce(m.a_nanodollars, m.b_nanodollars),
                                            m.last_at, m.last_nanodollars, k.daily_limit_nanodollars, now()) pr
     WHERE k.revoked_at IS NULL AND k.daily_limit_nanodollars IS NOT NULL AND m.last_nanodollars > 0
       AND pr.reaches_limit_at <= least(now() + st.projection_horizon, t.day_end)
       AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.key_id = m.key_id AND a.day = m.day AND a.threshold_pct = 0)
     ORDER BY m.key_id
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;

-- GET /v1/spend reads the points and the settings of the projection (the
-- points' row security, sql/013, let only tally-notifier's prune through).
GRANT SELECT ON spend_rate_points, alert_settings TO tally_api;
CREATE POLICY spend_rate_points_read ON spend_rate_points FOR SELECT TO tally_api USING (true);
