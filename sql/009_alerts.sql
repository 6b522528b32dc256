-- 009_alerts: spend alerts reach the account's owners (docs/alerts.md).
--
-- The aggregator records each (key, day, threshold) alert once in `alerts`
-- (002). Here:
--   * destinations: where a person of the account wants alerts (webhook URL
--     with its signing secret, or an email address), each enabled or not;
--   * an outbox, alert_deliveries: one row per alert per enabled destination,
--     written by a trigger on `alerts` in the very transaction that records
--     the alert, so no alert can be recorded without its deliveries;
--     tally-notifier claims due rows (FOR UPDATE SKIP LOCKED), sends them and
--     records the outcome; the event id is the alert's, the same on every
--     retry and on a resend, so a receiver can deduplicate;
--   * the warning before the limit (spend.limit_projected): a trigger on
--     spend_daily, which the aggregator updates in its batch transaction
--     before it inserts the threshold alerts, so the warning's row (and its
--     deliveries) always comes before the thresholds it precedes.
-- Nothing here depends on 008.

-- The warning is an alert like the thresholds: one per key per day, kept
-- unique by 002's UNIQUE (key_id, day, threshold_pct) with threshold_pct 0
-- (the aggregator's ON CONFLICT names exactly those columns, so that unique
-- constraint must stay as it is).
ALTER TABLE alerts ADD COLUMN type text NOT NULL DEFAULT 'spend.threshold_reached'
    CHECK (type IN ('spend.threshold_reached', 'spend.limit_projected'));
ALTER TABLE alerts ADD COLUMN event_id uuid NOT NULL DEFAULT gen_random_uuid();
-- When the key's spend rate would reach the limit (spend.limit_projected only).
ALTER TABLE alerts ADD COLUMN projected_at timestamptz;
ALTER TABLE alerts DROP CONSTRAINT alerts_threshold_pct_check;
ALTER TABLE alerts ADD CONSTRAINT alerts_threshold_pct_check CHECK (
    (type = 'spend.threshold_reached' AND threshold_pct IN (50, 80, 100))
    OR (type = 'spend.limit_projected' AND threshold_pct = 0));
CREATE UNIQUE INDEX alerts_event_id ON alerts (event_id);

-- How the warning is computed. One row. The rate is the spend added between
-- a reference point between rate_window and twice rate_window old (or, early
-- in a day, the first point seen, once it is rate_min_window old) and now.
CREATE TABLE alert_settings (
    id                 boolean PRIMARY KEY DEFAULT true CHECK (id),
    projection_horizon interval NOT NULL DEFAULT '1 hour' CHECK (projection_horizon > '0'),
    rate_window        interval NOT NULL DEFAULT '5 minutes' CHECK (rate_window > '0'),
    rate_min_window    interval NOT NULL DEFAULT '1 minute' CHECK (rate_min_window > '0')
);
INSERT INTO alert_settings DEFAULT VALUES;

-- Where an account's alerts go. A webhook's secret signs every request
-- (docs/alerts.md); the API shows it once, at creation; the notifier reads it.
CREATE TABLE alert_destinations (
    id          text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    account_id  text NOT NULL REFERENCES accounts (id),
    kind        text NOT NULL CHECK (kind IN ('webhook', 'email')),
    url         text CHECK (length(url) <= 2048),
    email       text CHECK (length(email) <= 254),
    secret      text,
    enabled     boolean NOT NULL DEFAULT true,
    created_by  text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    disabled_at timestamptz,
    CHECK ((kind = 'webhook' AND url IS NOT NULL AND secret IS NOT NULL AND email IS NULL)
           OR (kind = 'email' AND email IS NOT NULL AND url IS NULL AND secret IS NULL))
);
CREATE INDEX alert_destinations_account ON alert_destinations (account_id) WHERE enabled;

-- The outbox. payload is the event's JSON as sent (its text is the signed
-- body); event_id is the alert's (a test event's own). A resend is a new row
-- with the same event id and payload (resend_of: the row it repeats).
CREATE TABLE alert_deliveries (
    id              bigserial PRIMARY KEY,
    alert_id        bigint REFERENCES alerts (id),
    destination_id  text NOT NULL REFERENCES alert_destinations (id),
    account_id      text NOT NULL,
    event_id        uuid NOT NULL,
    type            text NOT NULL,
    payload         jsonb NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    resend_of       bigint REFERENCES alert_deliveries (id),
    requested_by    text
);
-- The notifier claims pending rows in id order, and sleeps until the next due.
CREATE INDEX alert_deliveries_pending ON alert_deliveries (id) WHERE state = 'pending';
CREATE INDEX alert_deliveries_due ON alert_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX alert_deliveries_alert ON alert_deliveries (alert_id);
CREATE INDEX alert_deliveries_account ON alert_deliveries (account_id, id);

-- The event of an alert, version 1 (docs/alerts.md).
CREATE FUNCTION alert_event(p_event_id uuid, p_type text, p_account text, p_key text, p_day date, p_pct integer,
                            p_spend bigint, p_limit bigint, p_at timestamptz, p_projected_at timestamptz)
RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'version', 1, 'id', p_event_id::text, 'type', p_type, 'account', p_account, 'key', p_key,
        'day', p_day::text,
        'threshold_pct', CASE WHEN p_type = 'spend.threshold_reached' THEN p_pct END,
        'spend_nanodollars', p_spend, 'limit_nanodollars', p_limit,
        'time', to_char(p_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
        'projected_at', to_char(p_projected_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'))
$$;

-- Every alert, in the transaction that records it: one delivery per enabled
-- destination of its account, then a wake-up for the notifiers (sent at commit).
CREATE FUNCTION alerts_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO alert_deliveries (alert_id, destination_id, account_id, event_id, type, payload)
    SELECT n.id, d.id, n.account_id, n.event_id, n.type,
           alert_event(n.event_id, n.type, n.account_id, n.key_id, n.day, n.threshold_pct, n.spend_nanodollars,
                       n.limit_nanodollars, n.created_at, n.projected_at)
      FROM new_alerts n JOIN alert_destinations d ON d.account_id = n.account_id AND d.enabled
     ORDER BY n.id, d.id;
    IF FOUND THEN
        PERFORM pg_notify('tally_alert_deliveries', '');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER alerts_outbox AFTER INSERT ON alerts REFERENCING NEW TABLE AS new_alerts
    FOR EACH STATEMENT EXECUTE FUNCTION alerts_outbox();

-- Two points of a key's spend today: b, the newest kept, moves every
-- rate_window; a is the b before it.
CREATE TABLE spend_rate_points (
    key_id        text NOT NULL,
    day           date NOT NULL,
    a_at          timestamptz,
    a_nanodollars bigint,
    b_at          timestamptz NOT NULL,
    b_nanodollars bigint NOT NULL,
    PRIMARY KEY (key_id, day)
);

-- After each statement that changes spend (the aggregator's one upsert of
-- spend_daily per batch), for the keys it touched that have a limit today
-- and no warning yet: move their reference points, then record the warning
-- for each whose rate since its reference point would reach the limit before
-- min(now + horizon, the end of the UTC day). Set-based, on the commit path:
-- one statement for every key of the batch. Exact arithmetic (numeric) on
-- money: spend_left x elapsed <= spent_since x time_left.
CREATE FUNCTION spend_projection() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    WITH cand AS (
        SELECT n.key_id, n.day, n.account_id, n.nanodollars, k.daily_limit_nanodollars AS lim
          FROM new_spend n JOIN api_keys k ON k.id = n.key_id
         WHERE n.day = (now() AT TIME ZONE 'UTC')::date AND n.nanodollars > 0
           AND k.revoked_at IS NULL AND n.nanodollars < k.daily_limit_nanodollars
           AND NOT EXISTS (SELECT 1 FROM alerts a WHERE a.key_id = n.key_id AND a.day = n.day AND a.threshold_pct = 0)),
    -- b moves to now every rate_window, a keeps the b before it; a new
    -- point (a first sight today) is returned too.
    moved AS (
        INSERT INTO spend_rate_points AS p (key_id, day, b_at, b_nanodollars)
        SELECT key_id, day, now(), nanodollars FROM cand
        ON CONFLICT (key_id, day) DO UPDATE SET a_at = p.b_at, a_nanodollars = p.b_nanodollars,
                                                b_at = now(), b_nanodollars = EXCLUDED.b_nanodollars
         WHERE now() - p.b_at >= (SELECT rate_window FROM alert_settings)
        RETURNING p.*),
    -- A point not moved keeps the values this statement's snapshot sees.
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
                                                         (c.day + 1)::timestamp AT TIME ZONE 'UTC') - now()) AS left_s) r
     WHERE now() - coalesce(p.a_at, p.b_at) >= st.rate_min_window AND c.nanodollars > r.base_nd
       AND (c.lim - c.nanodollars)::numeric * r.elapsed <= (c.nanodollars - r.base_nd)::numeric * r.left_s
     ORDER BY c.key_id
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
-- One trigger per event: a statement trigger with a transition table names one.
CREATE TRIGGER spend_projection_insert AFTER INSERT ON spend_daily REFERENCING NEW TABLE AS new_spend
    FOR EACH STATEMENT EXECUTE FUNCTION spend_projection();
CREATE TRIGGER spend_projection_update AFTER UPDATE ON spend_daily REFERENCING NEW TABLE AS new_spend
    FOR EACH STATEMENT EXECUTE FUNCTION spend_projection();
