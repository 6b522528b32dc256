/* Integration: usage is split exactly at hour, day and month boundaries, by
 * each side's share of the time, while the sandbox runs. The expected pieces
 * are worked out by hand below from the samples' times. */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <stdlib.h>
#include <string.h>

#define GiB (UINT64_C(1) << 30)

static char *q(struct aggtest *t, const char *sql)
{
        char *v = aggtest_query(t, sql);
        return v ? v : calloc(1, 1);
}

static void expect(struct aggtest *t, const char *sql, const char *want, const char *what)
{
        char *v = q(t, sql);
        CHECK(strcmp(v, want) == 0, "%s: got %s, want %s", what, v, want);
        free(v);
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_bounds", 2);

        /* Across midnight and a month's end: 23:30 May 31 -> 00:30 June 1, one
         * vCPU busy (3600 CPU-s), 2 GiB held. It has not stopped: its usage is
         * billed anyway. Each side: 1800 CPU-s and 1800 s x 2 GiB. */
        struct usage_event a = aggtest_sample("acct", "key", "sb-midnight", 1, 1, aggtest_utc(2026, 5, 31, 23, 30, 0),
                                              STATE_RUNNING, 0, 2 * GiB, 0, 1);
        struct usage_event b = a;
        b.seq = 2;
        b.wall_ns = aggtest_utc(2026, 6, 1, 0, 30, 0);
        b.cpu_ns = 3600 * NS_PER_SEC;
        aggtest_produce(&t, &a);
        aggtest_produce(&t, &b);

        /* A gap of 3.5 hours between samples (22:15 -> 01:45 across midnight
         * Dec 31 -> Jan 1; a past year end, as the aggregator checks sample times
         * against its own clock), 7000 CPU-s: the hours get 45 min, 60, 60, 45 of it:
         * 1500, 2000, 2000, 1500 CPU-s. Paused the whole time: storage of
         * (1 GiB + 1e9 disk bytes) for each piece. */
        struct usage_event c = aggtest_sample("acct", "key", "sb-gap", 1, 1, aggtest_utc(2025, 12, 31, 22, 15, 0),
                                              STATE_PAUSED, 0, GiB, 1000000000, 2);
        struct usage_event d = c;
        d.seq = 9;
        d.wall_ns = aggtest_utc(2026, 1, 1, 1, 45, 0);
        d.cpu_ns = 7000 * NS_PER_SEC;
        aggtest_produce(&t, &c);
        aggtest_produce(&t, &d);
        /* A late sample (older seq) for the first hour changes nothing. */
        struct usage_event late = c;
        late.cpu_ns = 99;
        aggtest_produce(&t, &late);
        aggtest_flush(&t);

        pid_t agg = aggtest_spawn(&t, NULL);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");

        expect(&t, "SELECT string_agg(to_char(hour, 'YYYY-MM-DD HH24') || '=' || cpu_ns || '/' || mem_byte_ns, ' '"
                   " ORDER BY hour) FROM usage_hourly WHERE sandbox_id = 'sb-midnight'",
               "2026-05-31 23=1800000000000/3865470566400000000000 2026-06-01 00=1800000000000/3865470566400000000000",
               "midnight split");
        expect(&t, "SELECT string_agg(to_char(month, 'YYYY-MM') || ':' || quantity, ' ' ORDER BY month)"
                   " FROM invoice_lines WHERE meter = 'cpu' AND month >= '2026-05-01'",
               "2026-05:1800000000000 2026-06:1800000000000", "each month's invoice gets its share");
        expect(&t, "SELECT string_agg(day || '=' || cpu_rated, ' ' ORDER BY day) FROM spend_daily"
                   " WHERE day IN ('2026-05-31', '2026-06-01')",
               "2026-05-31=45000000000000000000 2026-06-01=45000000000000000000", "each day's spend gets its share");
        expect(&t, "SELECT string_agg(to_char(hour, 'YYYY-MM-DD HH24') || '=' || cpu_ns || '/' || storage_byte_ns || '/'"
                   " || mem_byte_ns, ' ' ORDER BY hour) FROM usage_hourly WHERE sandbox_id = 'sb-gap'",
               "2025-12-31 22=1500000000000/5599102924800000000000/0 "
               "2025-12-31 23=2000000000000/7465470566400000000000/0 "
               "2026-01-01 00=2000000000000/7465470566400000000000/0 "
               "2026-01-01 01=1500000000000/5599102924800000000000/0",
               "a gap is covered by the next counter, hour by hour");
        CHECK(aggtest_terminate(agg) == 0, "unclean stop");
        aggtest_stop(&t);
        return test_result();
}
