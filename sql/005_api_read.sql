-- 005_api_read: daily rollups of usage_hourly that GET /v1/usage reads for whole
-- days (docs/api-usage.md). A month by day of 1,000 sandboxes is 720,000 hourly
-- rows; its rollups are 30,000 (per sandbox) and 30 (per key) rows.
--
-- Each rollup row holds, per UTC day, the exact sums of usage_hourly's base
-- units and of (quantity x rate in force at each hour for the account's plan)
-- per meter, undivided — as spend_daily does — so a usage row's cost is still
-- its exact sum divided once and rounded once. They are kept by statement
-- triggers on usage_hourly, in the writer's own transaction (the aggregator's
-- batch, with its Kafka offsets): a rollup never differs from the hours it
-- sums. Like spend_daily, an hour is rated when it is written: a rate or plan
-- changed afterwards for past hours does not re-rate them here, and an hour
-- its plan has no rate for (sql/003's rating_gaps) counts as nothing, as in
-- spend_daily.

CREATE TABLE usage_daily (
    account_id      text NOT NULL,
    day             date NOT NULL,
    key_id          text NOT NULL,
    sandbox_id      text NOT NULL,
    cpu_ns          numeric NOT NULL DEFAULT 0,
    mem_byte_ns     numeric NOT NULL DEFAULT 0,
    storage_byte_ns numeric NOT NULL DEFAULT 0,
    cpu_rated       numeric NOT NULL DEFAULT 0,
    memory_rated    numeric NOT NULL DEFAULT 0,
    storage_rated   numeric NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, day, key_id, sandbox_id)
) WITH (fillfactor = 70);
CREATE INDEX usage_daily_key_day ON usage_daily (key_id, day);

CREATE TABLE usage_key_daily (
    account_id      text NOT NULL,
    day             date NOT NULL,
    key_id          text NOT NULL,
    cpu_ns          numeric NOT NULL DEFAULT 0,
    mem_byte_ns     numeric NOT NULL DEFAULT 0,
    storage_byte_ns numeric NOT NULL DEFAULT 0,
    cpu_rated       numeric NOT NULL DEFAULT 0,
    memory_rated    numeric NOT NULL DEFAULT 0,
    storage_rated   numeric NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, day, key_id)
) WITH (fillfactor = 70);

-- Per key and hour: what GET /v1/spend's burn rate reads (the last one or two hours).
CREATE TABLE usage_key_hourly (
    account_id      text NOT NULL,
    key_id          text NOT NULL,
    hour            timestamptz NOT NULL,
    cpu_ns          numeric NOT NULL DEFAULT 0,
    mem_byte_ns     numeric NOT NULL DEFAULT 0,
    storage_byte_ns numeric NOT NULL DEFAULT 0,
    cpu_rated       numeric NOT NULL DEFAULT 0,
    memory_rated    numeric NOT NULL DEFAULT 0,
    storage_rated   numeric NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, key_id, hour)
) WITH (fillfactor = 70);

-- One function for the three statement triggers below: the statement's
-- change (rows inserted, updated rows' new minus old values, rows deleted taken
-- away), rated per (account, hour), added to both rollups in one statement.
-- Transition tables are visible to EXECUTE in the trigger's own call.
CREATE FUNCTION usage_rollup() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    cols constant text := 'account_id, key_id, sandbox_id, hour';
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
        WITH g AS (SELECT account_id, key_id, sandbox_id, hour, sum(cpu) AS cpu, sum(mem) AS mem, sum(sto) AS sto
                     FROM (%s) r GROUP BY account_id, key_id, sandbox_id, hour),
             -- Rates once per (account, hour), not per sandbox.
             rt AS (SELECT account_id, hour, coalesce(rate_at(plan, 'cpu', hour), 0) AS rc,
                           coalesce(rate_at(plan, 'memory', hour), 0) AS rm,
                           coalesce(rate_at(plan, 'storage', hour), 0) AS rs
                      FROM (SELECT account_id, hour, account_plan(account_id) AS plan
                              FROM (SELECT DISTINCT account_id, hour FROM g) ah) p),
             gr AS (SELECT g.account_id, g.key_id, g.sandbox_id, g.hour, g.cpu, g.mem, g.sto,
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
                        storage_rated = u.storage_rated + EXCLUDED.storage_rated),
             d AS (SELECT account_id, (hour AT TIME ZONE 'UTC')::date AS day, key_id, sandbox_id,
                          sum(cpu) AS cpu, sum(mem) AS mem, sum(sto) AS sto,
                          sum(cpu_r) AS cpu_r, sum(mem_r) AS mem_r, sum(sto_r) AS sto_r
                     FROM gr GROUP BY 1, 2, 3, 4),
             k AS (INSERT INTO usage_key_daily AS u (account_id, day, key_id, cpu_ns, mem_byte_ns, storage_byte_ns,
                                                    cpu_rated, memory_rated, storage_rated)
                   SELECT account_id, day, key_id, sum(cpu), sum(mem), sum(sto), sum(cpu_r), sum(mem_r), sum(sto_r)
                     FROM d GROUP BY account_id, day, key_id
                   ON CONFLICT (account_id, day, key_id) DO UPDATE SET
                       cpu_ns = u.cpu_ns + EXCLUDED.cpu_ns, mem_byte_ns = u.mem_byte_ns + EXCLUDED.mem_byte_ns,
                       storage_byte_ns = u.storage_byte_ns + EXCLUDED.storage_byte_ns,
                       cpu_rated = u.cpu_rated + EXCLUDED.cpu_rated,
                       memory_rated = u.memory_rated + EXCLUDED.memory_rated,
                       storage_rated = u.storage_rated + EXCLUDED.storage_rated)
        INSERT INTO usage_daily AS u (account_id, day, key_id, sandbox_id, cpu_ns, mem_byte_ns, storage_byte_ns,
                                      cpu_rated, memory_rated, storage_rated)
        SELECT account_id, day, key_id, sandbox_id, cpu, mem, sto, cpu_r, mem_r, sto_r FROM d
        ON CONFLICT (account_id, day, key_id, sandbox_id) DO UPDATE SET
            cpu_ns = u.cpu_ns + EXCLUDED.cpu_ns, mem_byte_ns = u.mem_byte_ns + EXCLUDED.mem_byte_ns,
            storage_byte_ns = u.storage_byte_ns + EXCLUDED.storage_byte_ns,
            cpu_rated = u.cpu_rated + EXCLUDED.cpu_rated, memory_rated = u.memory_rated + EXCLUDED.memory_rated,
            storage_rated = u.storage_rated + EXCLUDED.storage_rated
    $q$, src);
    RETURN NULL;
END $fn$;

CREATE TRIGGER usage_rollup_insert AFTER INSERT ON usage_hourly
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_rollup();
CREATE TRIGGER usage_rollup_update AFTER UPDATE ON usage_hourly
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_rollup();
CREATE TRIGGER usage_rollup_delete AFTER DELETE ON usage_hourly
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_rollup();

-- The hours written before this migration.
INSERT INTO usage_key_hourly (account_id, key_id, hour, cpu_ns, mem_byte_ns, storage_byte_ns,
                              cpu_rated, memory_rated, storage_rated)
SELECT account_id, key_id, hour, cpu, mem, sto, cpu * coalesce(rate_at(plan, 'cpu', hour), 0), mem * coalesce(rate_at(plan, 'memory', hour), 0),
       sto * coalesce(rate_at(plan, 'storage', hour), 0)
  FROM (SELECT account_id, key_id, hour, account_plan(account_id) AS plan, sum(cpu_ns)::numeric AS cpu,
               sum(mem_byte_ns) AS mem, sum(storage_byte_ns) AS sto
          FROM usage_hourly GROUP BY account_id, key_id, hour) g;
INSERT INTO usage_daily (account_id, day, key_id, sandbox_id, cpu_ns, mem_byte_ns, storage_byte_ns,
                         cpu_rated, memory_rated, storage_rated)
SELECT account_id, (hour AT TIME ZONE 'UTC')::date, key_id, sandbox_id, sum(cpu_ns), sum(mem_byte_ns),
       sum(storage_byte_ns), sum(cpu_ns::numeric * coalesce(rate_at(account_plan(account_id), 'cpu', hour), 0)),
       sum(mem_byte_ns * coalesce(rate_at(account_plan(account_id), 'memory', hour), 0)),
       sum(storage_byte_ns * coalesce(rate_at(account_plan(account_id), 'storage', hour), 0))
  FROM usage_hourly GROUP BY 1, 2, 3, 4;
INSERT INTO usage_key_daily (account_id, day, key_id, cpu_ns, mem_byte_ns, storage_byte_ns,
                             cpu_rated, memory_rated, storage_rated)
SELECT account_id, day, key_id, sum(cpu_ns), sum(mem_byte_ns), sum(storage_byte_ns),
       sum(cpu_rated), sum(memory_rated), sum(storage_rated)
  FROM usage_daily GROUP BY 1, 2, 3;
