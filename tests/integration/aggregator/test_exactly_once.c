/* Integration: exactly once, against ground truth. A random stream with
 * duplicates, resent older samples and a replay is produced to a development
 * broker while a real tally-aggregator consumes it and is killed with SIGKILL
 * at random moments, many times, and restarted. When it has caught up, every
 * sandbox's CPU, held memory and kept storage in the ledger must equal the
 * ground truth the generator summed, exactly. */
#include "aggtest.h"
#include "streamgen.h"
#include "support.h"
#include "timeutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KILLS 10

int main(void)
{
        unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
        fprintf(stderr, "seed %u\n", seed);
        struct aggtest t;
        aggtest_start(&t, "agg_once", 4);
        struct gen_stream g;
        gen_stream_make(&g, seed, 40, 100, aggtest_utc(2026, 5, 31, 21, 0, 0));
        fprintf(stderr, "%zu messages for %zu sandboxes\n", g.nmessages, g.nsandboxes);

        /* Small batches, so that kills land inside and between commits. */
        const char *extra[] = { "--batch-messages", "150", "--batch-ms", "30", "--consumer-settings",
                                "session.timeout.ms=6000,heartbeat.interval.ms=500", NULL };
        unsigned r = seed;
        size_t sent = 0;
        for (int k = 0; k < KILLS; k++) {
                pid_t agg = aggtest_spawn(&t, extra);
                size_t chunk = g.nmessages / KILLS + 1;
                for (size_t i = 0; i < chunk && sent < g.nmessages; i++)
                        aggtest_produce(&t, g.messages[sent++]);
                aggtest_flush(&t);
                /* Once it is consuming (it has committed something new), kill it at a random moment. */
                int64_t before = aggtest_committed(&t);
                for (int w = 0; w < 300 && aggtest_committed(&t) == before; w++)
                        time_sleep_ns(50 * NS_PER_MS);
                r = r * 1103515245u + 12345u;
                time_sleep_ns((int64_t)((r >> 8) % 400) * NS_PER_MS);
                kill(agg, SIGKILL);
                waitpid(agg, NULL, 0);
        }
        while (sent < g.nmessages)
                aggtest_produce(&t, g.messages[sent++]);
        aggtest_flush(&t);

        pid_t agg = aggtest_spawn(&t, extra);
        CHECK(aggtest_wait_caught_up(&t, 120) == 0, "the aggregator did not catch up after %d kills", KILLS);
        gen_stream_verify(&t, &g);
        char *dead = aggtest_query(&t, "SELECT count(*) FROM dead_letters");
        CHECK(dead && atoi(dead) == 0, "valid samples were dead-lettered: %s", dead ? dead : "?");
        free(dead);
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        gen_stream_free(&g);
        aggtest_stop(&t);
        return test_result();
}
