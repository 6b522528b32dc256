-- 008_finance: monthly invoices with the free-hours credit, month-end close
-- with adjustments, and a read-only `finance` schema for SQL exports
-- (docs/finance.md, docs/billing.md "Invoices", "The free credit", "Closing a month").
--
-- Money stays exact: every line keeps its exact amount as a fraction
-- (exact_num / exact_den nano-dollars) and rounds it once, half away from zero,
-- with tally_round_div (sql/006), to nano-dollars and to cents. An invoice's
-- totals are the sums of its lines' rounded amounts: always equal to its lines.
--
-- Closed invoices are rows that never change: UPDATE, DELETE and TRUNCATE on
-- them are refused by triggers, whoever asks (the owner too). Usage that
-- reaches a closed month later is caught by a statement trigger on
-- usage_hourly (late_usage) and billed as adjustment lines, naming its month,
-- on the account's next open invoice.

-- ---------------------------------------------------------------------------
-- Rating at read time, without per-row function calls: each plan rate with the
-- instant it stops (the next rate of the same plan and meter).
CREATE VIEW rate_periods AS
SELECT plan_id, meter, effective_from AS since,
       coalesce(lead(effective_from) OVER (PARTITION BY plan_id, meter ORDER BY effective_from),
                'infinity'::timestamptz) AS until,
       nanodollars_per_unit AS rate, unit
  FROM plan_rates;

-- The instants rates change at (with -infinity first): usage between two of
-- them is rated alike, so the views below sum usage per segment before they
-- rate it (sum(q) x r = sum(q x r), exactly), instead of joining every hour
-- to its rate.
CREATE VIEW rate_bounds AS
SELECT array_agg(b ORDER BY b) AS b
  FROM (SELECT '-infinity'::timestamptz AS b UNION SELECT effective_from FROM plan_rates) x;

-- The UTC days a rate starts inside of (not at midnight): their usage is
-- rated hour by hour; any other day's usage at the rate in force at midnight.
CREATE VIEW rate_split_days AS
SELECT coalesce(array_agg(DISTINCT (effective_from AT TIME ZONE 'UTC')::date), '{}') AS d
  FROM plan_rates
 WHERE effective_from <> ((effective_from AT TIME ZONE 'UTC')::date)::timestamp AT TIME ZONE 'UTC';

-- A month (its first day, a date) as the UTC instant it starts.
CREATE FUNCTION month_start(p_month date) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN date_trunc('month', p_month)::timestamp AT TIME ZONE 'UTC';

-- The month (first day) of a UTC instant.
CREATE FUNCTION month_of(p_at timestamptz) RETURNS date
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN date_trunc('month', p_at AT TIME ZONE 'UTC')::date;

-- A quantity in base units as billing units, 12 decimals, rounded once
-- (vCPU-hours, GiB-hours and GB-months have no finite decimal expansion in
-- general: a vCPU-hour is 3,600 x 10^9 CPU-ns). Money is never computed from
-- this figure, only from the base units.
CREATE FUNCTION billing_units(p_base numeric, p_per_unit numeric) RETURNS numeric
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN tally_round_div(p_base * 1000000000000, p_per_unit) * 0.000000000001;

CREATE FUNCTION meter_unit(p_meter text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE p_meter WHEN 'cpu' THEN 'vCPU-hour' WHEN 'memory' THEN 'GiB-hour'
                        WHEN 'storage' THEN 'GB-month' WHEN 'credit' THEN 'sandbox-hour' END;

CREATE FUNCTION meter_base_unit(p_meter text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE p_meter WHEN 'cpu' THEN 'CPU-ns' WHEN 'credit' THEN 'running-ns' ELSE 'byte-ns' END;

-- ---------------------------------------------------------------------------
-- Closed months and their invoices: written once by close_month(), never changed.

CREATE TABLE closed_months (
    month       date PRIMARY KEY CHECK (month = date_trunc('month', month)::date),
    closed_at   timestamptz NOT NULL DEFAULT now(),
    closed_by   text NOT NULL DEFAULT ''
);

CREATE TABLE closed_invoices (
    account_id          text NOT NULL,
    month               date NOT NULL REFERENCES closed_months (month),
    plan_id             text NOT NULL,
    -- the free running time (ns) this invoice's credit line used
    credit_running_ns   bigint NOT NULL DEFAULT 0 CHECK (credit_running_ns >= 0),
    total_nanodollars   bigint NOT NULL,
    total_cents         bigint NOT NULL,
    line_count          integer NOT NULL,
    closed_at           timestamptz NOT NULL,
    PRIMARY KEY (account_id, month)
);

CREATE TABLE closed_invoice_lines (
    account_id          text NOT NULL,
    month               date NOT NULL,
    line_no             integer NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('usage', 'credit', 'adjustment')),
    meter               text NOT NULL CHECK (meter IN ('cpu', 'memory', 'storage', 'credit')),
    for_month           date NOT NULL, -- the month the usage happened in (earlier than month for adjustments)
    quantity_base       numeric NOT NULL,
    quantity            numeric NOT NULL,
    exact_num           numeric NOT NULL,
    exact_den           numeric NOT NULL CHECK (exact_den > 0),
    amount_nanodollars  bigint NOT NULL,
    amount_cents        bigint NOT NULL,
    PRIMARY KEY (account_id, month, line_no),
    FOREIGN KEY (account_id, month) REFERENCES closed_invoices (account_id, month) DEFERRABLE INITIALLY DEFERRED
);

-- The account's own breakdown per API key (usage and adjustments; the credit
-- is the account's). Each row rounds once, so key rows need not add up to the
-- invoice's lines to the last nano-dollar: the invoice is its lines.
CREATE TABLE closed_invoice_key_lines (
    account_id          text NOT NULL,
    month               date NOT NULL,
    key_id              text NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('usage', 'adjustment')),
    meter               text NOT NULL CHECK (meter IN ('cpu', 'memory', 'storage')),
    for_month           date NOT NULL,
    quantity_base       numeric NOT NULL,
    quantity            numeric NOT NULL,
    exact_num           numeric NOT NULL,
    exact_den           numeric NOT NULL CHECK (exact_den > 0),
    amount_nanodollars  bigint NOT NULL,
    amount_cents        bigint NOT NULL,
    PRIMARY KEY (account_id, month, key_id, kind, meter, for_month),
    FOREIGN KEY (account_id, month) REFERENCES closed_invoices (account_id, month) DEFERRABLE INITIALLY DEFERRED
);

CREATE FUNCTION closed_rows_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'closed invoices are immutable: % on % refused', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'late usage becomes an adjustment line on the next open invoice (docs/billing.md)';
END $$;

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['closed_months', 'closed_invoices', 'closed_invoice_lines', 'closed_invoice_key_lines'] LOOP
        EXECUTE format('CREATE TRIGGER %I BEFORE UPDATE OR DELETE ON %I FOR EACH ROW EXECUTE FUNCTION closed_rows_immutable()',
                       t || '_immutable', t);
        EXECUTE format('CREATE TRIGGER %I BEFORE TRUNCATE ON %I FOR EACH STATEMENT EXECUTE FUNCTION closed_rows_immutable()',
                       t || '_no_truncate', t);
    END LOOP;
END $$;

-- ---------------------------------------------------------------------------
-- Late usage: what usage_hourly gains (or loses) for hours of closed months,
-- per (account, key, hour), captured in the writer's own transaction. Rows
-- with billed_in NULL are pending: they are adjustment lines on the
-- account's next open invoice; close_month() stamps billed_in with the
-- month whose invoice carried them, and such a row never changes again.
CREATE TABLE late_usage (
    id              bigserial PRIMARY KEY,
    account_id      text NOT NULL,
    key_id          text NOT NULL,
    hour            timestamptz NOT NULL,
    cpu_ns          numeric NOT NULL DEFAULT 0,
    mem_byte_ns     numeric NOT NULL DEFAULT 0,
    storage_byte_ns numeric NOT NULL DEFAULT 0,
    billed_in       date REFERENCES closed_months (month),
    first_seen      timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX late_usage_pending ON late_usage (account_id, key_id, hour) WHERE billed_in IS NULL;

CREATE FUNCTION late_usage_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.billed_in IS NOT NULL THEN
        RAISE EXCEPTION 'late usage billed in % is immutable', OLD.billed_in USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END $$;
CREATE TRIGGER late_usage_guard BEFORE UPDATE OR DELETE ON late_usage
    FOR EACH ROW EXECUTE FUNCTION late_usage_guard();

-- The end of the closed months (months close in order: everything before it
-- is closed), NULL when none is.
CREATE FUNCTION closed_through() RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT month_start((max(month) + interval '1 month')::date) FROM closed_months
$$;

CREATE FUNCTION usage_late_capture() RETURNS trigger LANGUAGE plpgsql AS $fn$
DECLARE
    through timestamptz := closed_through();
    src text;
BEGIN
    IF through IS NULL THEN
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
        SELECT account_id, key_id, hour, sum(cpu), sum(mem), sum(sto) FROM (%s) r
         GROUP BY account_id, key_id, hour
        HAVING sum(cpu) <> 0 OR sum(mem) <> 0 OR sum(sto) <> 0
        ON CONFLICT (account_id, key_id, hour) WHERE billed_in IS NULL DO UPDATE SET
            cpu_ns = l.cpu_ns + EXCLUDED.cpu_ns, mem_byte_ns = l.mem_byte_ns + EXCLUDED.mem_byte_ns,
            storage_byte_ns = l.storage_byte_ns + EXCLUDED.storage_byte_ns
    $q$, src) USING through;
    RETURN NULL;
END $fn$;

CREATE TRIGGER usage_late_insert AFTER INSERT ON usage_hourly
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_late_capture();
CREATE TRIGGER usage_late_update AFTER UPDATE ON usage_hourly
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_late_capture();
CREATE TRIGGER usage_late_delete AFTER DELETE ON usage_hourly
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION usage_late_capture();

-- ---------------------------------------------------------------------------
-- What an invoice charges, per (account, key, month, meter): usage of the
-- months [p_from, p_to), rated by hour with the plan rate in force, plus —
-- on the month p_from, which must be the first open month — the pending late
-- usage of closed months as adjustments naming their month. rated is the
-- exact sum of quantity x rate (divide by meter_unit_base for nano-dollars).
CREATE FUNCTION invoice_charges(p_from date, p_to date, p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, key_id text, month date, kind text, meter text, for_month date,
               quantity_base numeric, rated numeric)
LANGUAGE sql STABLE AS $$
    -- Rates change only at plan_rates' instants: the hours between two of them
    -- are rated alike, so usage is summed per segment first and each sum is
    -- multiplied by its rate (sum(q) x r = sum(q x r), exactly). A UTC day no
    -- rate starts inside of is read from the per-day rollup (usage_key_daily,
    -- 24 times fewer rows), a day a rate starts inside of from the hours.
    WITH bounds AS (SELECT b FROM rate_bounds),
         split_days AS (SELECT d FROM rate_split_days),
         src AS (
             SELECT d.account_id, d.key_id, month_of(month_start(d.day)) AS month, 'usage' AS kind,
                    d.day::timestamp AT TIME ZONE 'UTC' AS at, d.cpu_ns, d.mem_byte_ns, d.storage_byte_ns
               FROM usage_key_daily d, split_days sd
              WHERE d.day >= p_from AND d.day < p_to AND NOT (d.day = ANY (sd.d))
                AND (p_account IS NULL OR d.account_id = p_account)
             UNION ALL
             SELECT u.account_id, u.key_id, month_of(u.hour), 'usage', u.hour, u.cpu_ns, u.mem_byte_ns, u.storage_byte_ns
               FROM usage_key_hourly u, split_days sd
              WHERE cardinality(sd.d) > 0 AND (u.hour AT TIME ZONE 'UTC')::date = ANY (sd.d)
                AND u.hour >= month_start(p_from) AND u.hour < month_start(p_to)
                AND (p_account IS NULL OR u.account_id = p_account)
             UNION ALL
             SELECT l.account_id, l.key_id, p_from, 'adjustment', l.hour, l.cpu_ns, l.mem_byte_ns, l.storage_byte_ns
               FROM late_usage l
              WHERE l.billed_in IS NULL AND p_from < p_to AND (p_account IS NULL OR l.account_id = p_account)),
         g AS (
             SELECT s.account_id, s.key_id, s.month, s.kind,
                    CASE s.kind WHEN 'usage' THEN s.month ELSE month_of(s.at) END AS for_month,
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

-- The free credit (docs/billing.md, "The free credit"): one free sandbox hour
-- is one hour of one sandbox's running time, and covers what that time cost
-- (its CPU and its memory; not storage, which is billed while paused). An
-- account has accounts.free_sandbox_hours of them; they are used in order of
-- usage — by UTC hour, then sandbox id — over the months [p_from, p_to), after
-- what closed invoices used, until none is left. A (sandbox, hour)'s running
-- time is its mem_byte_ns / the sandbox's memory size; the hour where the
-- credit runs out is covered by its share (left / running), kept exact as a
-- fraction: per month, credit = num / den nano-dollars.
CREATE FUNCTION invoice_credit(p_from date, p_to date, p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, month date, running_ns numeric, num numeric, den numeric)
LANGUAGE plpgsql STABLE AS $fn$
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
        SELECT a.id, a.plan_id,
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
        after_hour := month_start(p_from);
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
                USING acc.id, after_hour, month_start(p_to), acc.plan_id, after_sb
            LOOP
                got := got + 1;
                after_hour := r.hour;
                after_sb := r.sandbox_id;
                m := month_of(r.hour);
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

-- An invoice's lines for the months [p_from, p_to) (p_from the first open
-- month, or the month being closed): per account and month, one usage line
-- per meter, the credit line when any free time was used, an adjustment line
-- per (month it belongs to, meter) of late usage. Each line rounds its exact
-- amount once. The same call gives the per-key breakdown (key_id not NULL,
-- line_no NULL: usage and adjustments per key and meter, each rounded once),
-- so that a close computes the month's charges once.
CREATE FUNCTION invoice_lines_compute(p_from date, p_to date, p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, month date, line_no integer, kind text, meter text, for_month date,
               quantity_base numeric, quantity numeric, unit text, exact_num numeric, exact_den numeric,
               amount_nanodollars bigint, amount_cents bigint, credit_running_ns bigint, key_id text)
LANGUAGE sql STABLE AS $$
    WITH c AS MATERIALIZED (SELECT * FROM invoice_charges(p_from, p_to, p_account)),
         usage_months AS (SELECT DISTINCT c.account_id, c.month FROM c WHERE c.kind = 'usage'),
         lines AS (
             SELECT um.account_id, um.month, 'usage' AS kind, mt.meter, um.month AS for_month,
                    coalesce(sum(c.quantity_base), 0) AS q, coalesce(sum(c.rated), 0) AS num,
                    meter_unit_base(mt.meter) AS den, 0::numeric AS credit_ns
               FROM usage_months um
              CROSS JOIN (VALUES ('cpu'), ('memory'), ('storage')) AS mt(meter)
               LEFT JOIN c ON c.account_id = um.account_id AND c.month = um.month AND c.kind = 'usage'
                          AND c.meter = mt.meter
              GROUP BY um.account_id, um.month, mt.meter
             UNION ALL
             SELECT cr.account_id, cr.month, 'credit', 'credit', cr.month, cr.running_ns, -cr.num, cr.den, cr.running_ns
               FROM invoice_credit(p_from, p_to, p_account) cr
              WHERE cr.running_ns > 0 OR cr.num > 0
             UNION ALL
             SELECT c.account_id, c.month, 'adjustment', c.meter, c.for_month, sum(c.quantity_base), sum(c.rated),
                    meter_unit_base(c.meter), 0
               FROM c WHERE c.kind = 'adjustment'
              GROUP BY c.account_id, c.month, c.meter, c.for_month
             HAVING sum(c.quantity_base) <> 0 OR sum(c.rated) <> 0),
         -- Each line rounded once; the credit line is then held to the CPU and
         -- memory lines it covers as rounded, and is exactly minus them when it
         -- covers all their exact cost, so an invoice the credit covers whole
         -- is zero, never a cent either side (docs/billing.md).
         r AS (SELECT l.*, tally_round_div(l.num, l.den)::bigint AS nd,
                      (max(l.num) FILTER (WHERE l.kind = 'usage' AND l.meter = 'cpu') OVER w) AS cpu_num,
                      (max(l.den) FILTER (WHERE l.kind = 'usage' AND l.meter = 'cpu') OVER w) AS cpu_den,
                      (max(l.num) FILTER (WHERE l.kind = 'usage' AND l.meter = 'memory') OVER w) AS mem_num,
                      (max(l.den) FILTER (WHERE l.kind = 'usage' AND l.meter = 'memory') OVER w) AS mem_den,
                      tally_round_div(l.num, l.den * 10000000)::bigint AS ct,
                      sum(tally_round_div(l.num, l.den)) FILTER (WHERE l.kind = 'usage' AND l.meter IN ('cpu', 'memory'))
                          OVER w AS covered_nd,
                      sum(tally_round_div(l.num, l.den * 10000000)) FILTER (WHERE l.kind = 'usage'
                                                                           AND l.meter IN ('cpu', 'memory'))
                          OVER w AS covered_ct
                 FROM lines l
               WINDOW w AS (PARTITION BY l.account_id, l.month)),
         rc AS (SELECT r.*, r.kind = 'credit' AND r.cpu_den IS NOT NULL AND r.mem_den IS NOT NULL
                            AND -r.num * r.cpu_den * r.mem_den = (r.cpu_num * r.mem_den + r.mem_num * r.cpu_den) * r.den
                              AS covers_all
                  FROM r)
    SELECT l.account_id, l.month,
           (row_number() OVER (PARTITION BY l.account_id, l.month
                               ORDER BY CASE l.kind WHEN 'usage' THEN 0 WHEN 'credit' THEN 1 ELSE 2 END, l.for_month,
                                        CASE l.meter WHEN 'cpu' THEN 0 WHEN 'memory' THEN 1 ELSE 2 END))::integer,
           l.kind, l.meter, l.for_month, l.q,
           billing_units(l.q, CASE l.meter WHEN 'credit' THEN 3600000000000::numeric ELSE meter_unit_base(l.meter) END),
           meter_unit(l.meter), l.num, l.den,
           CASE WHEN l.covers_all THEN -l.covered_nd
                WHEN l.kind = 'credit' THEN greatest(l.nd, -coalesce(l.covered_nd, 0)) ELSE l.nd END::bigint,
           CASE WHEN l.covers_all THEN -l.covered_ct
                WHEN l.kind = 'credit' THEN greatest(l.ct, -coalesce(l.covered_ct, 0)) ELSE l.ct END::bigint,
           l.credit_ns::bigint, NULL::text
      FROM rc l
    UNION ALL
    SELECT c.account_id, c.month, NULL, c.kind, c.meter, c.for_month, c.quantity_base,
           billing_units(c.quantity_base, meter_unit_base(c.meter)), meter_unit(c.meter),
           c.rated, meter_unit_base(c.meter),
           tally_round_div(c.rated, meter_unit_base(c.meter))::bigint,
           tally_round_div(c.rated, meter_unit_base(c.meter) * 10000000)::bigint, 0, c.key_id
      FROM c
     WHERE c.kind = 'usage' OR c.quantity_base <> 0 OR c.rated <> 0
$$;

-- The first month not closed: after the last closed one, else the first
-- month with usage, else the current month.
CREATE FUNCTION first_open_month() RETURNS date LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT (max(month) + interval '1 month')::date FROM closed_months),
                    (SELECT date_trunc('month', min(day))::date FROM usage_key_daily),
                    month_of(now()))
$$;

-- ---------------------------------------------------------------------------
-- Closing. close_month(M) freezes the invoices of M — and first of every
-- earlier month not closed yet, in order — into the closed_* tables, with the
-- pending late usage as adjustments on the first of them. A month that has
-- not ended is refused; a closed month is a no-op. It holds usage_hourly in
-- SHARE mode while it runs, so no usage commits between what it reads and
-- the moment the month counts as closed (an aggregator's commit waits for it).
CREATE FUNCTION close_month(p_month date, p_by text DEFAULT '')
RETURNS TABLE (month date, status text, invoices integer, total_cents bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    target constant date := date_trunc('month', p_month)::date;
    m date;
BEGIN
    IF month_start((target + interval '1 month')::date) > now() THEN
        RAISE EXCEPTION 'month % has not ended (it ends %)', to_char(target, 'YYYY-MM'),
              month_start((target + interval '1 month')::date) USING ERRCODE = 'object_not_in_prerequisite_state';
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

-- Closes every month that ended at least p_grace ago (the automatic close:
-- `tally-admin close-due`, run by a timer). Returns what close_month did, no
-- rows when nothing is due.
CREATE FUNCTION close_due(p_grace interval, p_by text DEFAULT 'close-due')
RETURNS TABLE (month date, status text, invoices integer, total_cents bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    -- the last month whose end + grace has passed
    target date := (month_of(now() - p_grace) - interval '1 month')::date;
BEGIN
    IF EXISTS (SELECT 1 FROM closed_months c WHERE c.month >= target) THEN
        RETURN;
    END IF;
    -- nothing to close before any usage exists
    IF NOT EXISTS (SELECT 1 FROM closed_months) AND first_open_month() > target THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM close_month(target, p_by);
END $fn$;

-- ---------------------------------------------------------------------------
-- The open months as they would be if closed now (previews), and the current
-- month's end-of-month projection at its rate so far (an estimate).
CREATE FUNCTION invoice_preview_lines(p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, month date, line_no integer, kind text, meter text, for_month date,
               quantity_base numeric, quantity numeric, unit text, exact_num numeric, exact_den numeric,
               amount_nanodollars bigint, amount_cents bigint, credit_running_ns bigint)
LANGUAGE sql STABLE AS $$
    SELECT l.account_id, l.month, l.line_no, l.kind, l.meter, l.for_month, l.quantity_base, l.quantity, l.unit,
           l.exact_num, l.exact_den, l.amount_nanodollars, l.amount_cents, l.credit_running_ns
      FROM invoice_lines_compute(first_open_month(), (month_of(now()) + interval '1 month')::date, p_account) l
     WHERE l.key_id IS NULL
$$;

CREATE FUNCTION invoice_preview_key_lines(p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, month date, key_id text, kind text, meter text, for_month date,
               quantity_base numeric, quantity numeric, unit text, exact_num numeric, exact_den numeric,
               amount_nanodollars bigint, amount_cents bigint)
LANGUAGE sql STABLE AS $$
    SELECT l.account_id, l.month, l.key_id, l.kind, l.meter, l.for_month, l.quantity_base, l.quantity, l.unit,
           l.exact_num, l.exact_den, l.amount_nanodollars, l.amount_cents
      FROM invoice_lines_compute(first_open_month(), (month_of(now()) + interval '1 month')::date, p_account) l
     WHERE l.key_id IS NOT NULL
$$;

-- The current month's projection: each usage line at its rate so far over the
-- whole month (exact: num x month seconds / (den x elapsed seconds)); the
-- credit line grows at the same rate, but never beyond the free time the
-- account has left. Adjustment lines are carried as they are.
CREATE FUNCTION invoice_projection_lines(p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, month date, line_no integer, kind text, meter text, for_month date,
               quantity_base numeric, quantity numeric, unit text, exact_num numeric, exact_den numeric,
               amount_nanodollars bigint, amount_cents bigint, elapsed_s bigint, month_s bigint)
LANGUAGE sql STABLE AS $$
    WITH t AS (SELECT month_of(now()) AS m,
                      greatest(1, floor(extract(epoch FROM now() - month_start(month_of(now())))))::bigint AS elapsed,
                      extract(epoch FROM month_start((month_of(now()) + interval '1 month')::date)
                                         - month_start(month_of(now())))::bigint AS len),
         p AS (SELECT * FROM invoice_preview_lines(p_account)),
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
                 FROM p CROSS JOIN t LEFT JOIN room r ON r.account_id = p.account_id
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

-- ---------------------------------------------------------------------------
-- The finance schema: what a finance person reads, with stable names and
-- units a person reads (docs/finance.md). Views run with their owner's
-- rights; the functions they call read only billing rows and are
-- SECURITY DEFINER so that the finance role needs no right on any table.
CREATE SCHEMA finance;

ALTER FUNCTION invoice_charges(date, date, text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION invoice_credit(date, date, text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION invoice_lines_compute(date, date, text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION first_open_month() SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION invoice_preview_lines(text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION invoice_preview_key_lines(text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION invoice_projection_lines(text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION close_month(date, text) SECURITY DEFINER SET search_path = public, pg_temp;
ALTER FUNCTION close_due(interval, text) SECURITY DEFINER SET search_path = public, pg_temp;
REVOKE EXECUTE ON FUNCTION close_month(date, text), close_due(interval, text) FROM PUBLIC;

-- Accounts without secrets.
CREATE VIEW finance.accounts AS
SELECT id AS account_id, name, plan_id, free_sandbox_hours, created_at FROM accounts;

-- The price plans' rates, with when each holds.
CREATE VIEW finance.rates AS
SELECT plan_id, meter, since AS effective_from, nullif(until, 'infinity') AS effective_until,
       rate AS nanodollars_per_unit, unit FROM rate_periods;

-- Charges per account, API key, meter and UTC day, rated by hour (per day
-- from usage_key_daily, per hour from usage_key_hourly on a day a rate starts
-- inside of), rounded once per row.
CREATE VIEW finance.charges_daily AS
WITH src AS (
    SELECT d.account_id, d.key_id, d.day, d.day::timestamp AT TIME ZONE 'UTC' AS at,
           d.cpu_ns, d.mem_byte_ns, d.storage_byte_ns
      FROM usage_key_daily d, rate_split_days sd
     WHERE NOT (d.day = ANY (sd.d))
    UNION ALL
    SELECT u.account_id, u.key_id, (u.hour AT TIME ZONE 'UTC')::date, u.hour, u.cpu_ns, u.mem_byte_ns, u.storage_byte_ns
      FROM usage_key_hourly u, rate_split_days sd
     WHERE cardinality(sd.d) > 0 AND (u.hour AT TIME ZONE 'UTC')::date = ANY (sd.d)),
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

-- Per sandbox and UTC day, with its labels: the three meters and their cost,
-- each rounded once, and the day's total over one common denominator.
CREATE VIEW finance.sandbox_daily AS
WITH s AS (
    SELECT u.account_id, u.key_id, u.sandbox_id, (u.hour AT TIME ZONE 'UTC')::date AS day,
           rb.b[width_bucket(u.hour, rb.b)] AS seg,
           sum(u.cpu_ns)::numeric AS cpu_ns, sum(u.mem_byte_ns) AS mem_byte_ns,
           sum(u.storage_byte_ns) AS storage_byte_ns
      FROM usage_hourly u CROSS JOIN rate_bounds rb
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

-- Usage by label: per account, UTC month, label (key = value) and meter, each
-- rounded once. A sandbox with several labels counts under each; one with none
-- is under label_key '' (so a label's rows add up to the account's usage).
CREATE VIEW finance.usage_by_label AS
WITH s AS (
    SELECT u.account_id, month_of(u.hour) AS month, u.sandbox_id, rb.b[width_bucket(u.hour, rb.b)] AS seg,
           sum(u.cpu_ns)::numeric AS cpu, sum(u.mem_byte_ns) AS mem, sum(u.storage_byte_ns) AS sto
      FROM usage_hourly u CROSS JOIN rate_bounds rb
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

-- Invoice lines: closed invoices' rows, and the open months' previews.
CREATE VIEW finance.invoice_lines AS
SELECT l.account_id, l.month, 'closed' AS status, l.line_no, l.kind, l.meter, l.for_month,
       l.quantity, meter_unit(l.meter) AS unit, l.quantity_base, meter_base_unit(l.meter) AS base_unit,
       l.amount_nanodollars, l.amount_cents, l.exact_num, l.exact_den
  FROM closed_invoice_lines l
UNION ALL
SELECT p.account_id, p.month, 'preview', p.line_no, p.kind, p.meter, p.for_month,
       p.quantity, p.unit, p.quantity_base, meter_base_unit(p.meter),
       p.amount_nanodollars, p.amount_cents, p.exact_num, p.exact_den
  FROM invoice_preview_lines(NULL) p;

-- Invoices: one per account and month (closed, or a preview of an open
-- month); the totals are the sums of the lines.
CREATE VIEW finance.invoices AS
SELECT ci.account_id, ci.month, 'closed' AS status, month_start(ci.month) AS period_start,
       month_start((ci.month + interval '1 month')::date) AS period_end, ci.plan_id,
       ci.line_count, ci.credit_running_ns, ci.total_nanodollars, ci.total_cents, ci.closed_at
  FROM closed_invoices ci
UNION ALL
SELECT p.account_id, p.month, 'preview', month_start(p.month), month_start((p.month + interval '1 month')::date),
       coalesce(a.plan_id, 'default'), p.line_count, p.credit_running_ns, p.total_nanodollars, p.total_cents,
       NULL::timestamptz
  FROM (SELECT l.account_id, l.month, count(*)::integer AS line_count, sum(l.credit_running_ns)::bigint AS credit_running_ns,
               sum(l.amount_nanodollars)::bigint AS total_nanodollars, sum(l.amount_cents)::bigint AS total_cents
          FROM invoice_preview_lines(NULL) l GROUP BY l.account_id, l.month) p
  LEFT JOIN accounts a ON a.id = p.account_id;

-- The per-key breakdown of every invoice (closed and preview).
CREATE VIEW finance.invoice_key_lines AS
SELECT k.account_id, k.month, 'closed' AS status, k.key_id, k.kind, k.meter, k.for_month, k.quantity,
       meter_unit(k.meter) AS unit, k.quantity_base, meter_base_unit(k.meter) AS base_unit,
       k.amount_nanodollars, k.amount_cents
  FROM closed_invoice_key_lines k
UNION ALL
SELECT k.account_id, k.month, 'preview', k.key_id, k.kind, k.meter, k.for_month, k.quantity, k.unit,
       k.quantity_base, meter_base_unit(k.meter), k.amount_nanodollars, k.amount_cents
  FROM invoice_preview_key_lines(NULL) k;

-- Adjustments: late usage of closed months, on the invoice that carries it.
CREATE VIEW finance.adjustments AS
SELECT account_id, month AS billed_in_month, status, for_month, meter, quantity, unit, quantity_base, base_unit,
       amount_nanodollars, amount_cents
  FROM finance.invoice_lines WHERE kind = 'adjustment';

-- The current month's end-of-month projection (status 'estimate').
CREATE VIEW finance.invoice_projection_lines AS
SELECT account_id, month, 'estimate' AS status, line_no, kind, meter, for_month, quantity, unit, quantity_base,
       meter_base_unit(meter) AS base_unit, amount_nanodollars, amount_cents, elapsed_s, month_s
  FROM invoice_projection_lines(NULL);

CREATE VIEW finance.invoice_projections AS
SELECT account_id, month, 'estimate' AS status, min(elapsed_s) AS elapsed_s, min(month_s) AS month_s,
       sum(amount_nanodollars)::bigint AS total_nanodollars, sum(amount_cents)::bigint AS total_cents
  FROM invoice_projection_lines(NULL)
 GROUP BY account_id, month;

-- The free credit per account: hours granted, used (closed invoices, then the
-- open months' previews) and left.
CREATE VIEW finance.credit AS
WITH used AS (
    SELECT a.id AS account_id,
           coalesce((SELECT sum(ci.credit_running_ns) FROM closed_invoices ci WHERE ci.account_id = a.id), 0)
               AS closed_ns
      FROM accounts a),
     open AS (SELECT p.account_id, sum(p.credit_running_ns) AS open_ns
                FROM invoice_preview_lines(NULL) p GROUP BY p.account_id)
SELECT a.id AS account_id, a.free_sandbox_hours,
       billing_units(u.closed_ns, 3600000000000) AS used_closed_hours,
       billing_units(coalesce(o.open_ns, 0), 3600000000000) AS used_open_hours,
       billing_units(greatest(0, a.free_sandbox_hours::numeric * 3600000000000 - u.closed_ns
                                 - coalesce(o.open_ns, 0)), 3600000000000) AS left_hours
  FROM accounts a JOIN used u ON u.account_id = a.id LEFT JOIN open o ON o.account_id = a.id;

-- Which months are closed, when and by whom.
CREATE VIEW finance.closed_months AS
SELECT month, closed_at, closed_by FROM closed_months;

-- ---------------------------------------------------------------------------
-- The finance role: a NOLOGIN group that reads the finance views and nothing
-- else (docs/finance.md shows how to make a login in it). Roles belong to the
-- cluster, not the database: made once, granted here per database.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'finance') THEN
        CREATE ROLE finance NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL; -- made meanwhile by another database's migration
END $$;
GRANT USAGE ON SCHEMA finance TO finance;
GRANT SELECT ON ALL TABLES IN SCHEMA finance TO finance;
REVOKE EXECUTE ON FUNCTION invoice_charges(date, date, text), invoice_credit(date, date, text),
    invoice_lines_compute(date, date, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION invoice_charges(date, date, text), invoice_credit(date, date, text),
    invoice_lines_compute(date, date, text),
    invoice_preview_lines(text), invoice_preview_key_lines(text), invoice_projection_lines(text)
    TO finance;
