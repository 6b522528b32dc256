/* Integration: a ledger that refuses the aggregator's role a right it needs (a
 * migration that forgot a grant, an administrator's REVOKE) is the set-up's
 * fault, never a message's: tally-aggregator retries the batch, sets nothing
 * aside as a dead letter, and bills it exactly once the right is back. Real
 * tally-aggregator (as tally_aggregator), development broker, PostgreSQL. */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"
#include "vmmtest.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SAMPLES 5

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_grant", 2);
        /* This database only: the role's grants elsewhere are untouched. */
        aggtest_exec(&t, "REVOKE INSERT ON usage_hourly FROM tally_aggregator");
        const char *extra[] = { "--batch-messages", "100", "--batch-ms", "100", NULL };
        pid_t agg = aggtest_spawn(&t, extra);

        int64_t t0 = time_wall_ns() - 10 * 60 * NS_PER_SEC;
        for (int i = 0; i < SAMPLES; i++) {
                struct usage_event ev = aggtest_sample("acct_grant", "key_grant", "sb_grant", 1, (uint64_t)i + 1,
                                                       t0 + i * 10 * NS_PER_SEC, STATE_RUNNING,
                                                       (uint64_t)i * 3 * NS_PER_SEC, 0, 0, 1);
                aggtest_produce(&t, &ev);
        }
        aggtest_flush(&t);
        /* Long enough for the batch to be refused, retried, refused again and (before)
         * split down to single messages set aside. */
        test_sleep_ms(8000);
        char *dead = aggtest_query(&t, "SELECT count(*) FROM dead_letters");
        CHECK(dead && strcmp(dead, "0") == 0, "%s message(s) set aside while the ledger lacked a grant", dead);
        free(dead);
        CHECK(aggtest_committed(&t) == 0, "offsets moved while nothing could be billed: %" PRId64,
              aggtest_committed(&t));

        aggtest_exec(&t, "GRANT INSERT ON usage_hourly TO tally_aggregator");
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the aggregator did not catch up once the grant was back");
        /* The last sample's counter: (SAMPLES - 1) x 3 s of CPU. */
        char *cpu = aggtest_query(&t, "SELECT sum(cpu_ns) FROM usage_hourly WHERE sandbox_id = 'sb_grant'");
        char want[32];
        snprintf(want, sizeof(want), "%" PRId64, (int64_t)(SAMPLES - 1) * 3 * NS_PER_SEC);
        CHECK(cpu && strcmp(cpu, want) == 0, "billed %s ns of CPU, want %s", cpu ? cpu : "(none)", want);
        free(cpu);
        dead = aggtest_query(&t, "SELECT count(*) FROM dead_letters");
        CHECK(dead && strcmp(dead, "0") == 0, "%s dead letter(s) in the end", dead);
        free(dead);

        CHECK(aggtest_terminate(agg) == 0, "tally-aggregator did not exit cleanly");
        aggtest_stop(&t);
        return test_result();
}
