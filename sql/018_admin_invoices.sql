-- 018_admin_invoices.sql — an operator reads invoices and per-sandbox usage
-- from a terminal (tally-admin invoice, tally-admin usage --by sandbox or
-- label:NAME) as tally-api reads them for a person: the closed invoices'
-- lines, the open months' previews and the current month's projection, and
-- the rate periods the finance views rate usage with. Reading only.
GRANT SELECT ON closed_invoice_lines, closed_invoice_key_lines, rate_periods, rate_bounds TO tally_admin;
GRANT EXECUTE ON FUNCTION invoice_preview_lines(text), invoice_preview_key_lines(text),
    invoice_projection_lines(text), first_open_month() TO tally_admin;
