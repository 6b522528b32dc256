-- 002_ledger: what was used, what it costs, and who may spend more today.
-- Written by tally-aggregator in one transaction per batch together with the
-- Kafka offsets the batch came from (consumer_offsets). Usage is integers in
-- base units (ns, byte-ns); money is integer nano-dollars until an invoice
-- line rounds it once (docs/billing.md). No float anywhere.

-- The sandboxes the usage topic has told us about. A sandbox first seen by a
-- sample (its `created` event not seen yet) gets a row from the sample's own
-- fields; the event fills in the spec and labels when it arrives.
CREATE TABLE sandboxes (
    id              text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    account_id      text NOT NULL,
    key_id          text NOT NULL,
    host            text NOT NULL DEFAULT '',
    parent_id       text,
    backend         text,
    vcpus           integer NOT NULL CHECK (vcpus BETWEEN 1 AND 1024),
    mem_size_bytes  bigint NOT NULL CHECK (mem_size_bytes >= 0),
    disk_size_bytes bigint,
    labels          jsonb NOT NULL DEFAULT '{}',
    state           text NOT NULL CHECK (state IN ('running', 'paused', 'stopped')),
    created_at      timestamptz,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sandboxes_account ON sandboxes (account_id);
CREATE INDEX sandboxes_key_state ON sandboxes (key_id, state);

-- Usage per sandbox per UTC hour. Memory and storage are byte-nanoseconds:
-- over an hour a big sandbox exceeds 64 bits, so they are numeric (exact).
-- Partitioned by month; usage_hourly_add_month() adds a month, the default
-- partition catches anything outside the months made.
CREATE TABLE usage_hourly (
    sandbox_id      text NOT NULL,
    hour            timestamptz NOT NULL,
    account_id      text NOT NULL,
    key_id          text NOT NULL,
    cpu_ns          bigint NOT NULL DEFAULT 0 CHECK (cpu_ns >= 0),
    mem_byte_ns     numeric NOT NULL DEFAULT 0 CHECK (mem_byte_ns >= 0 AND scale(mem_byte_ns) = 0),
    storage_byte_ns numeric NOT NULL DEFAULT 0 CHECK (storage_byte_ns >= 0 AND scale(storage_byte_ns) = 0),
    mem_peak_bytes  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (sandbox_id, hour)
) PARTITION BY RANGE (hour);
CREATE INDEX usage_hourly_account_hour ON usage_hourly (account_id, hour);
CREATE INDEX usage_hourly_key_hour ON usage_hourly (key_id, hour);
CREATE TABLE usage_hourly_default PARTITION OF usage_hourly DEFAULT WITH (fillfactor = 70);

CREATE FUNCTION usage_hourly_add_month(p_month date) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    m date := date_trunc('month', p_month)::date;
    name text := format('usage_hourly_%s', to_char(m, 'YYYY_MM'));
BEGIN
    IF to_regclass(name) IS NULL THEN
        -- Rows of the current hours are updated in place every batch: room for HOT updates.
        EXECUTE format('CREATE TABLE %I PARTITION OF usage_hourly FOR VALUES FROM (%L) TO (%L) WITH (fillfactor = 70)',
                       name, m::timestamp AT TIME ZONE 'UTC', (m + interval '1 month')::timestamp AT TIME ZONE 'UTC');
    END IF;
END $$;
SELECT usage_hourly_add_month(d::date)
  FROM generate_series(date '2025-01-01', date '2028-12-01', interval '1 month') AS d;

-- The rate of a plan's meter in force at a moment.
CREATE FUNCTION rate_at(p_plan text, p_meter text, p_at timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT nanodollars_per_unit FROM plan_rates
     WHERE plan_id = p_plan AND meter = p_meter AND effective_from <= p_at
     ORDER BY effective_from DESC LIMIT 1
$$;

-- An account's plan; usage of an account not (yet) in accounts is rated with the default plan.
CREATE FUNCTION account_plan(p_account text) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT plan_id FROM accounts WHERE id = p_account), 'default')
$$;

-- Each meter's billing unit in its base units: vCPU-hour = 3600e9 CPU-ns,
-- GiB-hour = 2^30 * 3600e9 byte-ns, GB-month = 1e9 * 30 * 86400e9 byte-ns.
CREATE FUNCTION meter_unit_base(p_meter text) RETURNS numeric LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE p_meter WHEN 'cpu' THEN 3600000000000::numeric
                        WHEN 'memory' THEN 1073741824::numeric * 3600000000000
                        WHEN 'storage' THEN 1000000000::numeric * 2592000000000000 END
$$;

-- Spend per API key per UTC day. The *_rated columns hold the exact sum of
-- (usage in base units x nano-dollars per unit) of each meter, undivided, so
-- the sum is exact whatever the batches; nanodollars divides and rounds once.
CREATE TABLE spend_daily (
    key_id          text NOT NULL,
    day             date NOT NULL,
    account_id      text NOT NULL,
    cpu_rated       numeric NOT NULL DEFAULT 0,
    memory_rated    numeric NOT NULL DEFAULT 0,
    storage_rated   numeric NOT NULL DEFAULT 0,
    nanodollars     bigint GENERATED ALWAYS AS (
        round(cpu_rated / 3600000000000::numeric
              + memory_rated / (1073741824::numeric * 3600000000000)
              + storage_rated / (1000000000::numeric * 2592000000000000))::bigint) STORED,
    PRIMARY KEY (key_id, day)
);
CREATE INDEX spend_daily_account_day ON spend_daily (account_id, day);

-- One row per (key, day, threshold) that spend crossed: fires once.
CREATE TABLE alerts (
    id              bigserial PRIMARY KEY,
    key_id          text NOT NULL,
    day             date NOT NULL,
    threshold_pct   integer NOT NULL CHECK (threshold_pct IN (50, 80, 100)),
    account_id      text NOT NULL,
    spend_nanodollars bigint NOT NULL,
    limit_nanodollars bigint NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    UNIQUE (key_id, day, threshold_pct)
);
CREATE INDEX alerts_account ON alerts (account_id, created_at);
CREATE INDEX alerts_undelivered ON alerts (id) WHERE delivered_at IS NULL;

-- A key whose spend reached its daily limit is blocked for that UTC day: no
-- new sandbox may start for it (key_blocked). A new day lifts it.
CREATE TABLE key_blocks (
    key_id          text NOT NULL,
    day             date NOT NULL,
    account_id      text NOT NULL,
    policy          text NOT NULL CHECK (policy IN ('pause', 'stop')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key_id, day)
);

CREATE FUNCTION key_blocked(p_key text, p_at timestamptz DEFAULT now()) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM key_blocks WHERE key_id = p_key AND day = (p_at AT TIME ZONE 'UTC')::date)
$$;

-- Messages the aggregator could not use, with their raw bytes and why. Their
-- offset moves on in the same transaction as the row.
CREATE TABLE dead_letters (
    id              bigserial PRIMARY KEY,
    topic           text NOT NULL,
    partition       integer NOT NULL,
    "offset"        bigint NOT NULL,
    raw             bytea NOT NULL,
    reason          text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (topic, partition, "offset")
);

-- Where each consumer group is in each partition, and which assignment owns
-- it: a consumer bumps generation when assigned and commits only while the
-- generation is still its own.
CREATE TABLE consumer_offsets (
    group_id        text NOT NULL,
    topic           text NOT NULL,
    partition       integer NOT NULL,
    next_offset     bigint NOT NULL CHECK (next_offset >= 0),
    generation      bigint NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);

-- The last sample billed per sandbox (the fold's state), committed with the
-- usage it produced; loaded by partition when a partition is assigned.
CREATE TABLE fold_state (
    sandbox_id      text PRIMARY KEY,
    partition       integer NOT NULL,
    account_id      text NOT NULL,
    key_id          text NOT NULL,
    epoch           bigint NOT NULL,
    seq             bigint NOT NULL,
    cpu_ns          bigint NOT NULL,
    wall_ns         bigint NOT NULL,
    state           text NOT NULL CHECK (state IN ('running', 'paused', 'stopped')),
    mem_size_bytes  bigint NOT NULL,
    disk_bytes      bigint NOT NULL
);
ALTER TABLE fold_state SET (fillfactor = 70); -- updated in place every batch: leave room for HOT updates
CREATE INDEX fold_state_partition ON fold_state (partition);

-- Invoice lines: per account, UTC month and meter, the exact usage and its
-- price. Each hour is rated with the plan rate in force for that hour; the
-- line's amount is the exact sum divided once and rounded once, half away from
-- zero, to nano-dollars (amount_nanodollars) and to cents (amount_cents).
CREATE VIEW invoice_lines AS
SELECT u.account_id,
       date_trunc('month', u.hour, 'UTC') AS month,
       m.meter,
       sum(m.quantity) AS quantity,
       (SELECT unit FROM plan_rates WHERE meter = m.meter LIMIT 1) AS unit,
       round(sum(m.quantity * rate_at(account_plan(u.account_id), m.meter, u.hour)) / meter_unit_base(m.meter))::bigint
           AS amount_nanodollars,
       round(sum(m.quantity * rate_at(account_plan(u.account_id), m.meter, u.hour))
             / (meter_unit_base(m.meter) * 10000000))::bigint AS amount_cents
  FROM usage_hourly u
 CROSS JOIN LATERAL (VALUES ('cpu', u.cpu_ns::numeric), ('memory', u.mem_byte_ns),
                            ('storage', u.storage_byte_ns)) AS m(meter, quantity)
 GROUP BY u.account_id, date_trunc('month', u.hour, 'UTC'), m.meter;

-- An invoice is the sum of its lines (in cents).
CREATE VIEW invoices AS
SELECT account_id, month, sum(amount_cents)::bigint AS total_cents
  FROM invoice_lines GROUP BY account_id, month;
