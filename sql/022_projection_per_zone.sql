-- 022_projection_per_zone.sql — the projected-limit trigger asks each zone's
-- day once per statement, not each spend row's twice.
--
-- sql/016's spend_projection() found "today" and "the end of today" with
-- spend_day(account, now()) for every row of new_spend, twice: each call
-- reads the account's zone and searches zone_day_start's hours. A commit of
-- 10,000 keys' spend made 20,000 such calls (97.7 ms of a 200 ms commit in
-- `scripts/bench aggregator`). Here the zones of the statement's accounts are
-- listed once, each zone's day and day end found once, and the rows joined to
-- them: the same days (an account not in accounts is UTC, as account_zone
-- says), so the same points and the same alerts.
CREATE OR REPLACE FUNCTION spend_projection() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    WITH spend AS (
        SELECT n.key_id, n.day, n.account_id, n.nanodollars, coalesce(a.time_zone, 'UTC') AS zone
          FROM new_spend n LEFT JOIN accounts a ON a.id = n.account_id),
    zones AS (
        SELECT z.zone, z.day, zone_day_start(z.zone, z.day + 1) AS day_end
          FROM (SELECT d.zone, zone_day(d.zone, now()) AS day FROM (SELECT DISTINCT zone FROM spend) d) z),
    today AS (
        SELECT s.key_id, s.day, s.account_id, s.nanodollars, z.day_end
          FROM spend s JOIN zones z ON z.zone = s.zone AND z.day = s.day),
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
