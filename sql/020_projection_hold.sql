-- 020_projection_hold.sql — the current month's projection holds its credit
-- line as an invoice does. Each projected line is its preview line scaled to
-- the whole month and rounded once; the credit line was not then held to the
-- CPU and memory lines it covers, so a month the free credit covers whole
-- could project -$0.01 (CPU 0.4 ¢ → 0, memory 0.4 ¢ → 0, credit −0.8 ¢ → −1 ¢)
-- or +$0.01, where its invoice is zero (docs/billing.md, "The free credit").
--
-- invoice_projection_lines_at(account, instant) is the projection with the
-- month's elapsed time taken at that instant (the usage is the preview's, as
-- of now): the test `finance` reads it at the month's end, where each line is
-- its preview line, to check the hold to the cent. invoice_projection_lines
-- (the finance views' and the API's) is it at now().
CREATE FUNCTION invoice_projection_lines_at(p_account text, p_at timestamptz)
RETURNS TABLE (account_id text, month date, line_no integer, kind text, meter text, for_month date,
               quantity_base numeric, quantity numeric, unit text, exact_num numeric, exact_den numeric,
               amount_nanodollars bigint, amount_cents bigint, elapsed_s bigint, month_s bigint)
LANGUAGE sql STABLE SET search_path = public, pg_temp AS $$
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
                      SELECT x.m, greatest(1, floor(extract(epoch FROM p_at - x.s)))::bigint AS elapsed,
                             extract(epoch FROM x.e - x.s)::bigint AS len
                        FROM (SELECT c.m, zone_day_start(c.z, c.m) AS s,
                                     zone_day_start(c.z, (c.m + interval '1 month')::date) AS e
                                FROM (SELECT date_trunc('month', zone_day(z.z, p_at))::date AS m, z.z
                                        FROM (SELECT account_zone(p.account_id) AS z) z) c) x) t
                 LEFT JOIN room r ON r.account_id = p.account_id
                WHERE p.month = t.m),
         -- each line scaled and rounded once, as before
         o AS (SELECT s.account_id, s.month, s.line_no, s.kind, s.meter, s.for_month,
                      tally_round_div(s.quantity_base * s.fn, s.fd) AS q,
                      s.unit, s.exact_num * s.fn AS num, s.exact_den * s.fd AS den,
                      tally_round_div(s.exact_num * s.fn, s.exact_den * s.fd)::bigint AS nd,
                      tally_round_div(s.exact_num * s.fn, s.exact_den * s.fd * 10000000)::bigint AS ct,
                      s.elapsed, s.len
                 FROM s),
         -- then the credit line held to the CPU and memory lines it covers as
         -- rounded, exactly as an invoice's (sql/008 invoice_lines_compute)
         r AS (SELECT o.*,
                      (max(o.num) FILTER (WHERE o.kind = 'usage' AND o.meter = 'cpu') OVER w) AS cpu_num,
                      (max(o.den) FILTER (WHERE o.kind = 'usage' AND o.meter = 'cpu') OVER w) AS cpu_den,
                      (max(o.num) FILTER (WHERE o.kind = 'usage' AND o.meter = 'memory') OVER w) AS mem_num,
                      (max(o.den) FILTER (WHERE o.kind = 'usage' AND o.meter = 'memory') OVER w) AS mem_den,
                      sum(o.nd) FILTER (WHERE o.kind = 'usage' AND o.meter IN ('cpu', 'memory')) OVER w AS covered_nd,
                      sum(o.ct) FILTER (WHERE o.kind = 'usage' AND o.meter IN ('cpu', 'memory')) OVER w AS covered_ct
                 FROM o
               WINDOW w AS (PARTITION BY o.account_id, o.month)),
         rc AS (SELECT r.*, r.kind = 'credit' AND r.cpu_den IS NOT NULL AND r.mem_den IS NOT NULL
                            AND -r.num * r.cpu_den * r.mem_den = (r.cpu_num * r.mem_den + r.mem_num * r.cpu_den) * r.den
                              AS covers_all
                  FROM r)
    SELECT l.account_id, l.month, l.line_no, l.kind, l.meter, l.for_month, l.q,
           billing_units(l.q, CASE l.meter WHEN 'credit' THEN 3600000000000::numeric ELSE meter_unit_base(l.meter) END),
           l.unit, l.num, l.den,
           CASE WHEN l.covers_all THEN -l.covered_nd
                WHEN l.kind = 'credit' THEN greatest(l.nd, -coalesce(l.covered_nd, 0)) ELSE l.nd END::bigint,
           CASE WHEN l.covers_all THEN -l.covered_ct
                WHEN l.kind = 'credit' THEN greatest(l.ct, -coalesce(l.covered_ct, 0)) ELSE l.ct END::bigint,
           l.elapsed, l.len
      FROM rc l
$$;

REVOKE ALL ON FUNCTION invoice_projection_lines_at(text, timestamptz) FROM PUBLIC;

CREATE OR REPLACE FUNCTION invoice_projection_lines(p_account text DEFAULT NULL)
RETURNS TABLE (account_id text, month date, line_no integer, kind text, meter text, for_month date,
               quantity_base numeric, quantity numeric, unit text, exact_num numeric, exact_den numeric,
               amount_nanodollars bigint, amount_cents bigint, elapsed_s bigint, month_s bigint)
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT * FROM invoice_projection_lines_at(p_account, now())
$$;
