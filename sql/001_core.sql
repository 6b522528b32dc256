-- 001_core: who is billed and at what price.
-- Money is integer nano-dollars (10^-9 USD) everywhere; never numeric(…,2) or float.
-- Ids are the same [A-Za-z0-9_.:-]{1,64} strings the usage events carry.

CREATE TABLE price_plans (
    id          text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    name        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- A plan's rate for a meter holds from effective_from until the next row for the
-- same plan and meter. Usage is rated with the row in force for its hour.
CREATE TABLE plan_rates (
    plan_id        text NOT NULL REFERENCES price_plans (id),
    meter          text NOT NULL CHECK (meter IN ('cpu', 'memory', 'storage')),
    effective_from timestamptz NOT NULL,
    nanodollars_per_unit bigint NOT NULL CHECK (nanodollars_per_unit >= 0),
    unit           text NOT NULL CHECK (unit IN ('vCPU-hour', 'GiB-hour', 'GB-month')),
    PRIMARY KEY (plan_id, meter, effective_from)
);

-- The default plan is DESIGN.md's table, from the product pages (seeds/):
-- $0.025 per vCPU-hour of measured CPU, $0.0075 per GiB-hour of memory held while
-- running, $0.08 per GB (10^9 bytes) per 30-day month of storage kept while paused.
INSERT INTO price_plans (id, name) VALUES ('default', 'Default plan');
INSERT INTO plan_rates (plan_id, meter, effective_from, nanodollars_per_unit, unit) VALUES
    ('default', 'cpu',     '2020-01-01 00:00:00+00', 25000000, 'vCPU-hour'),
    ('default', 'memory',  '2020-01-01 00:00:00+00',  7500000, 'GiB-hour'),
    ('default', 'storage', '2020-01-01 00:00:00+00', 80000000, 'GB-month');

CREATE TABLE accounts (
    id          text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    name        text NOT NULL,
    plan_id     text NOT NULL DEFAULT 'default' REFERENCES price_plans (id),
    -- New accounts get 50 free sandbox hours (seeds: "50 free sandbox hours, no card"),
    -- applied as a credit on the invoice.
    free_sandbox_hours integer NOT NULL DEFAULT 50 CHECK (free_sandbox_hours >= 0),
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- The people who own an account: they sign in to the dashboard, set spend
-- limits and receive alerts.
CREATE TABLE people (
    id          text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    account_id  text NOT NULL REFERENCES accounts (id),
    email       text NOT NULL UNIQUE,
    role        text NOT NULL DEFAULT 'owner' CHECK (role IN ('owner')),
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX people_account ON people (account_id);

-- API keys: only a hash is kept. A daily limit (UTC day) of NULL is unlimited;
-- only a person may set or raise it, never a key.
CREATE TABLE api_keys (
    id          text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    account_id  text NOT NULL REFERENCES accounts (id),
    name        text NOT NULL DEFAULT '',
    key_hash    bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),  -- SHA-256
    daily_limit_nanodollars bigint CHECK (daily_limit_nanodollars >= 0),
    limit_policy text NOT NULL DEFAULT 'pause' CHECK (limit_policy IN ('pause', 'stop')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_account ON api_keys (account_id);
