-- 006_exact_rounding: divide and round once, exactly.
--
-- PostgreSQL's numeric division keeps only about 16 significant digits, so
-- round(a / b) can round twice: a quotient of 1,000,000,000,000.49999999999999806
-- is first cut to 1,000,000,000,000.5000, then rounded up to ...001. The rule
-- of docs/billing.md is one rounding of the EXACT quotient, half away from
-- zero: tally_round_div does that in integer arithmetic (div() truncates the
-- exact quotient).
CREATE FUNCTION tally_round_div(a numeric, b numeric) RETURNS numeric
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN sign(a) * sign(b) * div(2 * abs(a) + abs(b), 2 * abs(b));

-- A key's spend of a day: the three meters over one common denominator,
-- (GiB-hour base) x (GB-month base); the vCPU-hour base divides the GiB-hour
-- base 2^30 times.
ALTER TABLE spend_daily DROP COLUMN nanodollars;
ALTER TABLE spend_daily ADD COLUMN nanodollars bigint GENERATED ALWAYS AS (
    tally_round_div(cpu_rated * 1073741824 * (1000000000::numeric * 2592000000000000)
                    + memory_rated * (1000000000::numeric * 2592000000000000)
                    + storage_rated * (1073741824::numeric * 3600000000000),
                    (1073741824::numeric * 3600000000000) * (1000000000::numeric * 2592000000000000))::bigint) STORED;

CREATE OR REPLACE VIEW invoice_lines AS
SELECT u.account_id,
       date_trunc('month', u.hour, 'UTC') AS month,
       m.meter,
       sum(m.quantity) AS quantity,
       (SELECT unit FROM plan_rates WHERE meter = m.meter LIMIT 1) AS unit,
       tally_round_div(sum(m.quantity * rate_at(account_plan(u.account_id), m.meter, u.hour)),
                       meter_unit_base(m.meter))::bigint AS amount_nanodollars,
       tally_round_div(sum(m.quantity * rate_at(account_plan(u.account_id), m.meter, u.hour)),
                       meter_unit_base(m.meter) * 10000000)::bigint AS amount_cents
  FROM usage_hourly u
 CROSS JOIN LATERAL (VALUES ('cpu', u.cpu_ns::numeric), ('memory', u.mem_byte_ns),
                            ('storage', u.storage_byte_ns)) AS m(meter, quantity)
 GROUP BY u.account_id, date_trunc('month', u.hour, 'UTC'), m.meter;
