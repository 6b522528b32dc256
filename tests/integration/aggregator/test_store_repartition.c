/* Integration: fold state follows the sandbox, not the partition.
 * The usage topic "grows" from 4 to 8 partitions under two real
 * aggregators: producers' partitioners map keys modulo the partition count,
 * so when the count doubles an account's messages either stay on partition p
 * or move to p + 4 — here produced to those partitions explicitly, because
 * the development broker (librdkafka 2.0's mock cluster) cannot add
 * partitions to a topic: it has no CreatePartitions and no call to grow one
 * (kafka-repartition, tests/integration/kafka/, grows one on Apache Kafka).
 * The group owns all 8 from the start, range-assigned: 0-3 to one
 * aggregator, 4-7 to the other, so the moved accounts change aggregator.
 * Then they move back for one sample: the first aggregator still holds their
 * old state in memory, and must be fenced rather than bill from it.
 * Billed CPU and held memory must equal the truth exactly. */
#include "aggtest.h"
#include "kafka.h"
#include "storetest.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ACCOUNTS 8
#define MIB (UINT64_C(1) << 20)

/* Sample seq (1-based) of account i: every 60 s, 50 CPU-s more each time. */
static void sample(struct aggtest *t, int i, int seq, int partitions, int64_t t0)
{
        char acct[32], key[32], sb[32];
        snprintf(acct, sizeof(acct), "acct_rp%d", i);
        snprintf(key, sizeof(key), "key_rp%d", i);
        snprintf(sb, sizeof(sb), "sb_rp%d", i);
        struct usage_event ev = aggtest_sample(acct, key, sb, 1, (uint64_t)seq, t0 + (seq - 1) * 60 * NS_PER_SEC,
                                               STATE_RUNNING, (uint64_t)(seq - 1) * 50 * NS_PER_SEC, 512 * MIB, 0, 2);
        store_produce_to(t, i % partitions, &ev);
}

/* The highest generation at which aggregator n was assigned partition 0 (its log), or 0. */
static long owner_generation(struct aggtest *t, int n)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/aggregator.%d.log", t->dir, n);
        char *text = test_read_file(path);
        long best = 0;
        static const char what[] = "msg=\"partition assigned\" partition=0 ";
        for (const char *p = text; p && (p = strstr(p, what)); p += sizeof(what) - 1) {
                const char *g = strstr(p, "generation=");
                const char *eol = strchr(p, '\n');
                if (g && (!eol || g < eol) && strtol(g + 11, NULL, 10) > best)
                        best = strtol(g + 11, NULL, 10);
        }
        free(text);
        return best;
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_store_repart", 8);
        const char *extra[] = { "--batch-messages", "100", "--batch-ms", "30", "--consumer-settings",
                                "session.timeout.ms=6000,heartbeat.interval.ms=500", NULL };
        pid_t a = aggtest_spawn(&t, extra);
        pid_t b = aggtest_spawn(&t, extra);
        for (int i = 0; i < 300 && !(store_log_has(&t, 0, "partition assigned") &&
                                     store_log_has(&t, 1, "partition assigned"));
             i++)
                time_sleep_ns(100 * NS_PER_MS);
        CHECK(store_log_has(&t, 0, "partition assigned") && store_log_has(&t, 1, "partition assigned"),
              "the two aggregators did not split the partitions");
        /* Partition 0's owner is the one given it last (the highest generation):
         * on Apache Kafka the first to join holds all 8 until the second joins. */
        bool a_low = owner_generation(&t, 0) > owner_generation(&t, 1);
        fprintf(stderr, "aggregator %d owns partitions 0-3\n", a_low ? 0 : 1);

        int64_t t0 = time_wall_ns() - 30 * 60 * NS_PER_SEC;
        /* 4 partitions: samples 1-3 */
        for (int seq = 1; seq <= 3; seq++)
                for (int i = 0; i < ACCOUNTS; i++)
                        sample(&t, i, seq, 4, t0);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "phase 1 not billed");
        /* 8 partitions: samples 4-6; accounts 4-7 move to partitions 4-7 */
        for (int seq = 4; seq <= 6; seq++)
                for (int i = 0; i < ACCOUNTS; i++)
                        sample(&t, i, seq, 8, t0);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "phase 2 not billed");
        /* back to 4 for sample 7: their old owner still has sample 3 in memory */
        for (int i = 0; i < ACCOUNTS; i++)
                sample(&t, i, 7, 4, t0);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "phase 3 not billed");

        /* Truth, by hand: 6 x 50 = 300 CPU-s; 6 x 60 s = 360 s x 512 MiB held. */
        for (int i = 0; i < ACCOUNTS; i++) {
                char q[512];
                snprintf(q, sizeof(q),
                         "SELECT sum(cpu_ns) || ' ' || (sum(mem_byte_ns) = 360 * 1000000000::numeric * 536870912)"
                         " FROM usage_hourly WHERE sandbox_id = 'sb_rp%d'", i);
                char *v = aggtest_query(&t, q);
                CHECK(v && strcmp(v, "300000000000 true") == 0, "sb_rp%d billed %s, want 300000000000 CPU-ns and"
                      " 360 s held", i, v ? v : "?");
                free(v);
        }
        CHECK(store_int(&t, "SELECT sum(cpu_ns) FROM usage_hourly") == ACCOUNTS * 300 * NS_PER_SEC,
              "total CPU billed is not %d x 300 CPU-s", ACCOUNTS);
        CHECK(store_int(&t, "SELECT count(*) FROM fold_state WHERE version >= 1") == ACCOUNTS,
              "fold state is not one row per sandbox");
        CHECK(store_log_has(&t, a_low ? 0 : 1, "sandbox fenced"),
              "the old owner was not fenced when the moved sandboxes came back");
        CHECK(aggtest_terminate(a) == 0 && aggtest_terminate(b) == 0, "the aggregators did not stop cleanly");
        aggtest_stop(&t);
        return test_result();
}
