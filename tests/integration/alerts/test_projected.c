/* Integration: the warning before the limit, through the real aggregator.
 *
 * Two keys of one account get a sample a second, in real time, through the
 * development broker and tally-aggregator (its batch transaction upserts
 * spend_daily; sql/009's trigger watches it):
 *  - fast, a daily limit of 600,000 nd: a busy 2 vCPU / 4 GiB sandbox,
 *    22,222.2 nd a second with the default plan (test_limits.c works it by
 *    hand): the limit is reached about 27 s from the start, seconds after
 *    the warning (15 and 21 s measured; 147 s with the former 5,000,000 nd
 *    limit), inside the hour and (the test waits out a day about to end) the
 *    UTC day: one spend.limit_projected alert. Its 12 s of samples spend
 *    266,666 nd: below the limit and its 50 % threshold;
 *  - slow, a daily limit of 5,000,000 nd ($0.005): 1 vCPU at 0.05 busy and
 *    256 MiB: 25,000,000 x 0.05 / 3600 + 0.25 x 7,500,000 / 3600 = 347.2 +
 *    520.8 = 868 nd a second: the limit is 5,760 s away, past the hour: none.
 * The rate is measured over 2 s (alert_settings). Once per key per day: the
 * fast key keeps burning and gets no second warning. */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GiB (UINT64_C(1) << 30)
#define MiB (UINT64_C(1) << 20)
/* This test's run, a generous bound (it takes about 20 s): meson.build's timeout is this more. */
#define RUN_S 120

static struct aggtest t;

static char *q(const char *sql)
{
        char *v = aggtest_query(&t, sql);
        return v ? v : calloc(1, 1);
}

static void sample(const char *key, const char *sandbox, int s, uint64_t cpu_ns_per_s, uint64_t mem, uint32_t vcpus,
                   int64_t wall)
{
        struct usage_event ev = aggtest_sample("proj", key, sandbox, 1, (uint64_t)s + 1, wall, STATE_RUNNING,
                                               (uint64_t)s * cpu_ns_per_s, mem, 0, vcpus);
        ev.held_known = true;
        ev.running_ns = (uint64_t)s * NS_PER_SEC;
        aggtest_produce(&t, &ev);
}

static void sleep_until(int64_t wall)
{
        int64_t d = wall - time_wall_ns();
        if (d > 0)
                nanosleep(&(struct timespec){ d / NS_PER_SEC, d % NS_PER_SEC }, NULL);
}

int main(void)
{
        /* One UTC day for the samples, the spend and the warning's horizon. */
        test_wait_out_utc_day(RUN_S);
        aggtest_start(&t, "alerts_proj", 1);
        aggtest_exec(&t, "INSERT INTO accounts (id, name) VALUES ('proj', 'projected');"
                         "INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars, limit_policy) VALUES"
                         " ('kfast', 'proj', sha256('kfast'), 600000, 'pause'),"
                         " ('kslow', 'proj', sha256('kslow'), 5000000, 'pause');"
                         "UPDATE alert_settings SET rate_window = '2 seconds', rate_min_window = '2 seconds'");
        const char *const extra[] = { "--batch-ms=200", NULL };
        pid_t agg = aggtest_spawn(&t, extra);

        int64_t t0 = time_wall_ns();
        int64_t fired_at = 0;
        for (int s = 0; s <= 12; s++) {
                sleep_until(t0 + s * NS_PER_SEC);
                int64_t wall = time_wall_ns();
                sample("kfast", "sb-fast", s, 2 * NS_PER_SEC, 4 * GiB, 2, wall);
                sample("kslow", "sb-slow", s, NS_PER_SEC / 20, 256 * MiB, 1, wall);
                aggtest_flush(&t);
                if (!fired_at) {
                        char *n = q("SELECT count(*) FROM alerts WHERE key_id = 'kfast' AND type = 'spend.limit_projected'");
                        if (strcmp(n, "1") == 0)
                                fired_at = s;
                        free(n);
                }
        }
        CHECK(aggtest_wait_caught_up(&t, 20) == 0, "the aggregator did not catch up");
        char *fast = q("SELECT count(*) FROM alerts WHERE key_id = 'kfast' AND type = 'spend.limit_projected'");
        char *slow = q("SELECT count(*) FROM alerts WHERE key_id = 'kslow' AND type = 'spend.limit_projected'");
        CHECK(strcmp(fast, "1") == 0, "the fast key has %s warnings, want 1", fast);
        CHECK(strcmp(slow, "0") == 0, "the slow key has %s warnings, want 0", slow);
        fprintf(stderr, "fast key warned after the sample of second %" PRId64 "\n", fired_at);
        /* When it would reach the limit: in the future, within the hour. */
        char *ahead = q("SELECT extract(epoch FROM projected_at - created_at)::bigint FROM alerts"
                        " WHERE key_id = 'kfast' AND type = 'spend.limit_projected'");
        int64_t ahead_s = strtoll(ahead, NULL, 10);
        fprintf(stderr, "its limit projected %" PRId64 " s after the warning\n", ahead_s);
        CHECK(ahead_s > 0 && ahead_s <= 120, "projected_at is %" PRId64 " s after the warning (want seconds)",
              ahead_s);
        /* The warning records the key's spend when it fired: its total after
         * some whole second s of samples, s x 200,000 / 9 nano-dollars
         * rounded once (22,222; 44,444; 66,667; ...), never 0 or the limit. */
        char *recorded = q("SELECT spend_nanodollars FROM alerts WHERE key_id = 'kfast' AND type = 'spend.limit_projected'");
        int64_t rec = strtoll(recorded, NULL, 10);
        bool whole = false;
        for (int64_t s = 1; s <= 12 && !whole; s++)
                whole = rec == (s * 200000 + 4) / 9; /* half away from zero: +4.5/9, and no ninth is a half */
        CHECK(whole, "the warning recorded spend %s nd: not the key's spend after any second of samples", recorded);
        free(recorded);
        char *spend = q("SELECT nanodollars FROM spend_daily WHERE key_id = 'kslow'");
        CHECK(strtoll(spend, NULL, 10) > 0, "the slow key spent nothing (%s): the test proves nothing", spend);
        free(fast);
        free(slow);
        free(ahead);
        free(spend);

        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        aggtest_stop(&t);
        return test_result();
}
