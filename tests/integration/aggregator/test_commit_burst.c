/* Integration: when batches take one commit group, and how many a burst
 * makes (aggregator/loop.c, "commit groups" and commit_due). Through the
 * development broker, a real tally-aggregator (commit_groups 2) and
 * PostgreSQL:
 *
 *   1. A burst of fresh messages is not a backlog: 1,600 new sandboxes of 8
 *      accounts (two on each of 4 partitions), each a `created` event and a
 *      sample, 3,200 messages produced at once while the aggregator is idle.
 *      Its batches take one group each (never every partition: the
 *      aggregator logs each change of what a batch takes, the first one
 *      too, and says `partitions=` of each batch, those it touched). How many
 *      there are is printed, not checked (it follows how the broker's
 *      fetches split the burst): 2 in four runs at batch_ms 1, against 4
 *      with a group's batch cut at batch_ms while messages of its group
 *      already polled waited to be taken (commit_due).
 *   2. A backlog is: the aggregator stopped, a second sample of each sandbox
 *      produced, then a fresh aggregator started 2 s later. Its first batch
 *      takes every partition (the message opening it over a second old),
 *      whichever partitions its first polls happen to hold.
 *   3. A producer's clock set wrong moves only that choice, never what is
 *      billed: a third sample each, dated an hour back by its Kafka
 *      timestamp (a collector's clock behind), to a fresh idle aggregator,
 *      is taken as a backlog (every partition); a fourth, dated an hour
 *      ahead and waiting 2 s for a fresh aggregator, a group at a time.
 *
 * Every sandbox is billed its last counters exactly (worked out by hand). */
#include "aggtest.h"
#include "storetest.h"
#include "support.h"
#include "timeutil.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PARTITIONS 4
#define ACCOUNTS 8
#define PER_ACCOUNT 200
#define MIB (UINT64_C(1) << 20)

static char accounts[ACCOUNTS][32];

/* Sample r (1 or 2) of every sandbox: 10 s apart, 4 s of CPU each, 256 MiB;
 * before the first, its created event (aggtest_produce). */
static void produce_round(struct aggtest *t, int64_t t0, int r)
{
        for (int a = 0; a < ACCOUNTS; a++)
                for (int i = 0; i < PER_ACCOUNT; i++) {
                        char key[48], sb[48];
                        snprintf(key, sizeof(key), "%.31s-key", accounts[a]);
                        snprintf(sb, sizeof(sb), "%.31s-sb%d", accounts[a], i);
                        struct usage_event ev = aggtest_sample(accounts[a], key, sb, 1, (uint64_t)r,
                                                               t0 + r * 10 * NS_PER_SEC, STATE_RUNNING,
                                                               (uint64_t)r * 4 * NS_PER_SEC, 256 * MIB, 0, 1);
                        aggtest_produce(t, &ev);
                }
        aggtest_flush(t);
}

/* "batch committed" lines in aggregator n's log, and the partitions of the first. */
static int batches(struct aggtest *t, int n, int *first_partitions)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/aggregator.%d.log", t->dir, n);
        char *log = test_read_file(path);
        int count = 0;
        *first_partitions = -1;
        for (const char *p = log; p && (p = strstr(p, "msg=\"batch committed\"")); p++) {
                const char *q = strstr(p, " partitions=");
                if (*first_partitions < 0)
                        *first_partitions = q ? atoi(q + 12) : -1;
                count++;
        }
        free(log);
        return count;
}

/* Aggregator n's first choice of what a batch takes, as logged (each
 * change of it is, the first one too): 1 every partition, 0 one commit
 * group, -1 none logged. */
static int first_choice(struct aggtest *t, int n)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/aggregator.%d.log", t->dir, n);
        char *log = test_read_file(path);
        const char *all = log ? strstr(log, "msg=\"batches take every partition\"") : NULL;
        const char *one = log ? strstr(log, "msg=\"batches take one commit group\"") : NULL;
        int r = !all && !one ? -1 : all && (!one || all < one);
        free(log);
        return r;
}

static void wait_assigned(struct aggtest *t, int n)
{
        for (int i = 0; i < 600 && !store_log_has(t, n, "partition assigned"); i++)
                time_sleep_ns(50 * NS_PER_MS);
        CHECK(store_log_has(t, n, "partition assigned"), "aggregator %d was never assigned its partitions", n);
        time_sleep_ns(NS_PER_SEC); /* (all four: one rebalance assigns them together) */
}

static void expect_billed(struct aggtest *t, int r, const char *what)
{
        char want[96];
        snprintf(want, sizeof(want), "%llu/%llu/0", (unsigned long long)r * 4000000000ULL,
                 (unsigned long long)(r - 1) * 2684354560000000000ULL);
        for (int a = 0; a < ACCOUNTS; a++)
                for (int i = 0; i < PER_ACCOUNT; i++) {
                        char sb[48];
                        snprintf(sb, sizeof(sb), "%.31s-sb%d", accounts[a], i);
                        aggtest_expect_billed(t, sb, want, what);
                }
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_commit_burst", PARTITIONS);
        aggtest_accounts_on_partitions(accounts, ACCOUNTS, PARTITIONS, "acct-burst"); /* (two on each) */
        /* batch_ms 1: shorter than taking the burst's messages of one group */
        const char *extra[] = { "--commit-groups", "2", "--batch-ms", "1", "--log-level", "debug", NULL };
        pid_t agg = aggtest_spawn(&t, extra);
        wait_assigned(&t, 0);
        int64_t t0 = time_wall_ns() - 10 * 60 * NS_PER_SEC;

        /* The producer ready first: an idempotent producer that waits for its
         * id from a broker still loading (Apache Kafka's "coordinator load in
         * progress") sends what it holds seconds after its timestamps, and the
         * burst would rightly look a backlog. One created event, committed. */
        struct usage_event warm = aggtest_sample(accounts[0], "acct-burst-warm-key", "acct-burst-warm", 1, 1, t0,
                                                 STATE_RUNNING, 0, 256 * MIB, 0, 1);
        warm = aggtest_created_for(&warm);
        aggtest_produce(&t, &warm);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the first message was not taken");

        /* 1 */
        produce_round(&t, t0, 1);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the burst was not billed");
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly"); /* (its log whole) */
        int first, n = batches(&t, 0, &first);
        fprintf(stderr, "the burst of %d messages: %d batches\n", 2 * ACCOUNTS * PER_ACCOUNT, n);
        CHECK(first_choice(&t, 0) == 0 && !store_log_has(&t, 0, "msg=\"batches take every partition\""),
              "a burst of fresh messages was taken as a backlog (a batch took every partition)");
        CHECK(n >= 2, "the burst took %d batches, want one of each group at least", n);
        expect_billed(&t, 1, "after a burst of new sandboxes");

        /* 2 */
        produce_round(&t, t0, 2);
        time_sleep_ns(2 * NS_PER_SEC);
        agg = aggtest_spawn(&t, extra);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the backlog was not billed");
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        n = batches(&t, 1, &first);
        fprintf(stderr, "the backlog: %d batches, the first of %d partitions\n", n, first);
        CHECK(first_choice(&t, 1) == 1, "the first batch of a backlog 2 s old did not take every partition (its"
                                        " log's first choice: %d)", first_choice(&t, 1));
        expect_billed(&t, 2, "after a backlog");

        /* 3: a collector's clock an hour behind, a fresh burst to an idle aggregator */
        agg = aggtest_spawn(&t, extra);
        wait_assigned(&t, 2);
        t.kafka_timestamp_ms = time_wall_ns() / NS_PER_MS - 3600 * 1000;
        produce_round(&t, t0, 3);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the burst dated an hour back was not billed");
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        CHECK(first_choice(&t, 2) == 1, "a burst dated an hour back did not take every partition (first choice %d)",
              first_choice(&t, 2));
        expect_billed(&t, 3, "after a burst dated an hour back");

        /* 4: a clock an hour ahead, a backlog 2 s old */
        t.kafka_timestamp_ms = time_wall_ns() / NS_PER_MS + 3600 * 1000;
        produce_round(&t, t0, 4);
        t.kafka_timestamp_ms = 0;
        time_sleep_ns(2 * NS_PER_SEC);
        agg = aggtest_spawn(&t, extra);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the backlog dated an hour ahead was not billed");
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        CHECK(first_choice(&t, 3) == 0, "a backlog dated an hour ahead did not take one commit group (first choice"
                                        " %d)", first_choice(&t, 3));
        expect_billed(&t, 4, "after a backlog dated an hour ahead");
        CHECK(store_int(&t, "SELECT count(*) FROM dead_letters") == 0, "dead letters");
        if (test_result() != 0)
                store_log_dump(&t, 0, 6000);
        aggtest_stop(&t);
        return test_result();
}
