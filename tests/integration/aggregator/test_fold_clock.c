/* Integration: sample times are checked against the
 * aggregator's own clock. A 30-minute sandbox (samples every 60 s, 0.5 vCPU
 * busy, 2 GiB) with one sample whose host clock jumped +1 h, +10 years or to
 * 2199, or back 401 days or to 2020 (beyond max_clock_behind_ms, 400 days),
 * is billed exactly its 1,800 s and 900 CPU-s — not 4,500 s for 1,800, nor
 * 87,601 hourly rows, nor usage placed years in the past — in a handful of
 * rows, and billing does not stall: a good sample sent afterwards is
 * committed within seconds.
 *
 * Through the real development broker and a real tally-aggregator writing to
 * PostgreSQL. Truth by hand: 1,800 s x 2 GiB = 3865470566400000000000
 * byte-ns; 30 minutes x 0.5 vCPU = 900 CPU-s. */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <stdlib.h>
#include <string.h>

#define GiB (UINT64_C(1) << 30)
#define SEC NS_PER_SEC

static const char *const truth = "900000000000/3865470566400000000000/0";

/* One life: 31 samples, k = 0..30 at base + k minutes; sample 15 dated `odd`. */
static void life(struct aggtest *t, const char *sb, int64_t base, int64_t odd, bool held)
{
        for (int k = 0; k <= 30; k++) {
                int64_t wall = k == 15 ? odd : base + k * 60 * SEC;
                struct usage_event ev = aggtest_sample("acct-fc", "key-fc", sb, 1, (uint64_t)k + 1, wall,
                                                       k == 30 ? STATE_STOPPED : STATE_RUNNING,
                                                       (uint64_t)k * 30 * SEC, 2 * GiB, 0, 1);
                ev.final = k == 30;
                if (held)
                        ev = aggtest_held(ev, (uint64_t)k * 60 * SEC, 0);
                aggtest_produce(t, &ev);
        }
}

static void expect(struct aggtest *t, const char *sb, const char *what)
{
        char *got = aggtest_billed(t, sb);
        char *slash = strrchr(got, '/');
        int rows = slash ? atoi(slash + 1) : -1;
        if (slash)
                *slash = '\0';
        CHECK(strcmp(got, truth) == 0, "%s (%s): billed %s, want %s (cpu_ns/mem_byte_ns/storage_byte_ns)", what, sb,
              got, truth);
        /* the life spans at most two UTC hours; the odd sample's usage may
         * be placed in the aggregator's current hour */
        CHECK(rows >= 1 && rows <= 3, "%s (%s): %d hourly rows, want 1..3", what, sb, rows);
        free(got);
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_fold_clock", 2);
        int64_t now = time_wall_ns();
        int64_t base = now - 1900 * SEC; /* the life ended 100 s ago */
        int64_t mid = base + 15 * 60 * SEC;

        life(&t, "sb-fc-hour", base, mid + NS_PER_HOUR, true);
        life(&t, "sb-fc-decade", base, mid + 10 * 365 * NS_PER_DAY, true);
        life(&t, "sb-fc-decade-interval", base, mid + 10 * 365 * NS_PER_DAY, false);
        life(&t, "sb-fc-2199", base, aggtest_utc(2199, 6, 1, 12, 0, 0), true);
        life(&t, "sb-fc-behind", base, mid - 401 * NS_PER_DAY, true);
        life(&t, "sb-fc-behind-interval", base, mid - 401 * NS_PER_DAY, false);
        life(&t, "sb-fc-2020", base, aggtest_utc(2020, 1, 1, 0, 0, 0), true);
        aggtest_flush(&t);

        pid_t agg = aggtest_spawn(&t, NULL);
        CHECK(aggtest_wait_caught_up(&t, 30) == 0, "billing stalled: not caught up in 30 s");

        expect(&t, "sb-fc-hour", "+1 h on one sample");
        expect(&t, "sb-fc-decade", "+10 years on one sample");
        expect(&t, "sb-fc-decade-interval", "+10 years on one sample, no held counters");
        expect(&t, "sb-fc-2199", "2199 on one sample");
        expect(&t, "sb-fc-behind", "-401 days on one sample");
        expect(&t, "sb-fc-behind-interval", "-401 days on one sample, no held counters");
        expect(&t, "sb-fc-2020", "2020 on one sample");
        char *v = aggtest_query(&t, "SELECT count(*) FROM usage_hourly WHERE hour > now() + interval '1 hour'");
        CHECK(v && strcmp(v, "0") == 0, "no usage placed in the future: %s rows", v ? v : "?");
        free(v);
        v = aggtest_query(&t, "SELECT count(*) FROM usage_hourly WHERE hour < now() - interval '1 day'");
        CHECK(v && strcmp(v, "0") == 0, "no usage placed at a clock far behind: %s rows", v ? v : "?");
        free(v);
        v = aggtest_query(&t, "SELECT count(*) FROM dead_letters");
        CHECK(v && strcmp(v, "0") == 0, "no dead letters (a wrong clock is not a bad message): %s", v ? v : "?");
        free(v);

        /* No stall: a good sample now is committed promptly. */
        struct usage_event good = aggtest_sample("acct-fc", "key-fc", "sb-fc-after", 1, 1, time_wall_ns(), STATE_RUNNING,
                                                 7 * SEC, 2 * GiB, 0, 1);
        int64_t t0 = time_mono_ns();
        aggtest_produce(&t, &good);
        aggtest_flush(&t);
        CHECK(aggtest_wait_committed(&t, aggtest_topic_end(&t), 5000) == 0, "a good sample was not committed in 5 s");
        v = aggtest_billed(&t, "sb-fc-after");
        CHECK(strncmp(v, "7000000000/", 11) == 0, "the good sample billed: %s", v);
        free(v);
        printf("good sample committed in %lld ms\n", (long long)((time_mono_ns() - t0) / NS_PER_MS));

        char log[1024];
        snprintf(log, sizeof(log), "%s/aggregator.0.log", t.dir);
        char *text = test_read_file(log);
        CHECK(text && strstr(text, "ahead of the aggregator's clock"), "the clock jump is logged");
        CHECK(text && strstr(text, "too far behind the aggregator's clock"), "the clock far behind is logged");
        free(text);

        CHECK(aggtest_terminate(agg) == 0, "unclean stop");
        aggtest_stop(&t);
        return test_result();
}
