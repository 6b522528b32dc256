/* Integration: two aggregators in one consumer group split the partitions
 * and together bill exactly once. Midway one leaves (SIGTERM): its partitions
 * move to the other, which starts from the offsets the ledger holds. The
 * totals must equal the generator's ground truth exactly. */
#include "aggtest.h"
#include "streamgen.h"
#include "support.h"
#include "timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static bool log_has(struct aggtest *t, int n, const char *what)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/aggregator.%d.log", t->dir, n);
        char *text = test_read_file(path);
        bool found = text && strstr(text, what);
        free(text);
        return found;
}

int main(void)
{
        unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
        fprintf(stderr, "seed %u\n", seed);
        struct aggtest t;
        aggtest_start(&t, "agg_group", 4);
        struct gen_stream g;
        gen_stream_make(&g, seed, 30, 80, aggtest_utc(2026, 8, 31, 22, 0, 0));

        const char *extra[] = { "--batch-messages", "200", "--batch-ms", "30", "--consumer-settings",
                                "session.timeout.ms=6000,heartbeat.interval.ms=500", NULL };
        pid_t a = aggtest_spawn(&t, extra);
        pid_t b = aggtest_spawn(&t, extra);
        /* Both members hold partitions before the stream starts. */
        for (int i = 0; i < 300 && !(log_has(&t, 0, "partition assigned") && log_has(&t, 1, "partition assigned")); i++)
                time_sleep_ns(100 * NS_PER_MS);
        CHECK(log_has(&t, 0, "partition assigned") && log_has(&t, 1, "partition assigned"),
              "the two aggregators did not split the partitions");

        size_t half = g.nmessages / 2;
        for (size_t i = 0; i < half; i++)
                aggtest_produce(&t, g.messages[i]);
        aggtest_flush(&t);
        for (int i = 0; i < 100 && aggtest_committed(&t) < (int64_t)half / 2; i++)
                time_sleep_ns(100 * NS_PER_MS);
        CHECK(aggtest_terminate(b) == 0, "the second aggregator did not leave cleanly");
        for (size_t i = half; i < g.nmessages; i++)
                aggtest_produce(&t, g.messages[i]);
        aggtest_flush(&t);

        CHECK(aggtest_wait_caught_up(&t, 120) == 0, "the group did not catch up");
        gen_stream_verify(&t, &g);
        CHECK(log_has(&t, 1, "msg=\"aggregator stopped\" messages=") &&
              !log_has(&t, 1, "msg=\"aggregator stopped\" messages=0 "), "the second aggregator billed nothing");
        char *v = aggtest_query(&t, "SELECT count(*) FROM consumer_offsets WHERE generation > 1");
        CHECK(v && atoi(v) > 0, "no partition changed hands");
        free(v);
        CHECK(aggtest_terminate(a) == 0, "the first aggregator did not stop cleanly");
        gen_stream_free(&g);
        aggtest_stop(&t);
        return test_result();
}
