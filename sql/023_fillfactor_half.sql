-- 023_fillfactor_half.sql — the rows every batch rewrites get pages with
-- room for a second version of each.
--
-- A batch rewrites the usage_hourly row of each sandbox-hour it touched and
-- the sandbox's fold_state row. At fillfactor 70 (sql/002, 003) a page keeps
-- 30 % free: enough for the new versions of about a third of its rows. The
-- first batch that updates a page's rows after they were inserted therefore
-- wrote most new versions to other pages, each with a new entry in every
-- index (usage_hourly has three), until pruning freed the old versions for
-- later batches. `scripts/bench aggregator` saw it as commits of 5,000 fresh
-- sandboxes taking 93, then 67, then 37 ms in usage_hourly's statement. At
-- fillfactor 50 a page keeps room for a new version of every row inserted
-- in it, so those first updates stay on the page (HOT) too. New pages only:
-- rows written before keep their pages.
ALTER TABLE fold_state SET (fillfactor = 50);

DO $$
DECLARE
    p regclass;
BEGIN
    FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'usage_hourly'::regclass LOOP
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 50)', p);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION usage_hourly_add_month(p_month date) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    m date := date_trunc('month', p_month)::date;
    name text := format('usage_hourly_%s', to_char(m, 'YYYY_MM'));
BEGIN
    IF to_regclass(name) IS NULL THEN
        -- Rows of the current hours are updated in place every batch: room for a new version of each (HOT).
        EXECUTE format('CREATE TABLE %I PARTITION OF usage_hourly FOR VALUES FROM (%L) TO (%L) WITH (fillfactor = 50)',
                       name, m::timestamp AT TIME ZONE 'UTC', (m + interval '1 month')::timestamp AT TIME ZONE 'UTC');
    END IF;
END $$;
