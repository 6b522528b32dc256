/* Integration: poison messages never stall. Through the
 * development broker, a real tally-aggregator and the ledger:
 *  1. a `created` event whose label key is long and multi-byte, so the
 *     decoder's reason is cut inside a character (the dead-letter INSERT was
 *     refused by the database as invalid UTF-8 and retried forever);
 *  2. an account on a price plan with no storage rate (`null value in column
 *     storage_rated`, every batch with its paused time refused): the usage is
 *     kept exactly, rating refuses loudly (rating_gaps, log, metric);
 *  3. (our own) a key whose day's spend would exceed bigint nano-dollars
 *     (sandboxes holding 2^63 - 1 bytes for a day): the database refuses the
 *     batch; it is split until the samples at fault are dead letters.
 * In each, other partitions and the other messages of the same partition
 * keep being billed, exactly. */
#include "aggtest.h"
#include "storetest.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GOOD 6
#define HUGE_SANDBOXES 8
#define MIB (UINT64_C(1) << 20)

static void good_samples(struct aggtest *t, int round, int64_t t0)
{
        for (int i = 0; i < GOOD; i++) {
                char acct[32], key[32], sb[32];
                snprintf(acct, sizeof(acct), "acct_g%d", i);
                snprintf(key, sizeof(key), "key_g%d", i);
                snprintf(sb, sizeof(sb), "sb_good_%d", i);
                struct usage_event ev = aggtest_sample(acct, key, sb, 1, (uint64_t)round + 1,
                                                       t0 + round * 60 * NS_PER_SEC, STATE_RUNNING,
                                                       (uint64_t)round * 10 * NS_PER_SEC, 256 * MIB, 0, 2);
                aggtest_produce(t, &ev);
        }
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_store_poison", 4);
        aggtest_exec(&t, "INSERT INTO price_plans (id, name) VALUES ('nostorage', 'no storage rate');"
                         "INSERT INTO plan_rates VALUES ('nostorage', 'cpu', '2020-01-01', 25000000, 'vCPU-hour'),"
                         " ('nostorage', 'memory', '2020-01-01', 7500000, 'GiB-hour');"
                         "INSERT INTO accounts (id, name, plan_id) VALUES ('acct_norate', 'n', 'nostorage')");
        int port = test_free_port();
        char ports[16];
        snprintf(ports, sizeof(ports), "%d", port);
        const char *extra[] = { "--batch-messages", "1000", "--batch-ms", "200", "--metrics-port", ports, NULL };

        /* Recent times (the aggregator may check sample clocks against its own). */
        int64_t now = time_wall_ns();
        int64_t t0 = now - 20 * 60 * NS_PER_SEC;
        int64_t day = (now / (86400 * NS_PER_SEC) - 1) * 86400 * NS_PER_SEC; /* yesterday 00:00 UTC */

        good_samples(&t, 0, t0);
        /* 1: the label key: 150 x "é" (2 bytes each); the decoder says
         * "label <key> is not a string", cut at 255 bytes: inside an "é". */
        {
                struct usage_event ev = aggtest_sample("acct_g0", "key_g0", "sb_label", 0, 0, t0, STATE_RUNNING, 0,
                                                       256 * MIB, 0, 1);
                ev.type = EVENT_CREATED;
                char buf[8192];
                int n = event_encode(&ev, buf, sizeof(buf));
                CHECK(n > 0, "encode");
                buf[n - 1] = '\0'; /* drop the closing brace */
                char raw[16384];
                int len = snprintf(raw, sizeof(raw), "%s,\"labels\":{\"", buf);
                for (int i = 0; i < 150; i++)
                        len += snprintf(raw + len, sizeof(raw) - (size_t)len, "\xc3\xa9");
                len += snprintf(raw + len, sizeof(raw) - (size_t)len, "\":1}}");
                aggtest_produce_raw(&t, "acct_g0", raw, (size_t)len);
        }
        /* 2: no storage rate: running, then paused for a minute (5 GiB + 1 GiB disk). */
        uint64_t nr_mem = 4096 * MIB, nr_disk = 1024 * MIB;
        for (int i = 0; i < 3; i++) {
                struct usage_event ev = aggtest_sample("acct_norate", "key_norate", "sb_norate", 1, (uint64_t)i + 1,
                                                       t0 + i * 60 * NS_PER_SEC, i == 0 ? STATE_RUNNING : STATE_PAUSED,
                                                       (uint64_t)i * NS_PER_SEC, nr_mem, nr_disk, 1);
                aggtest_produce(&t, &ev);
        }
        /* 3: eight sandboxes of one key holding INT64_MAX bytes for a day. */
        for (int round = 0; round < 2; round++)
                for (int i = 0; i < HUGE_SANDBOXES; i++) {
                        char sb[32];
                        snprintf(sb, sizeof(sb), "sb_huge_%d", i);
                        struct usage_event ev = aggtest_sample("acct_huge", "key_huge", sb, 1, (uint64_t)round + 1,
                                                               day + (round ? 86399 : 1) * NS_PER_SEC, STATE_RUNNING, 0,
                                                               INT64_MAX, 0, 1);
                        aggtest_produce(&t, &ev);
                }
        good_samples(&t, 1, t0);
        good_samples(&t, 2, t0);
        aggtest_flush(&t);

        pid_t agg = aggtest_spawn(&t, extra);
        CHECK(aggtest_wait_caught_up(&t, 90) == 0, "poison messages stalled the aggregator");

        /* Every good sandbox billed exactly: 20 CPU-s, 120 s x 256 MiB. */
        for (int i = 0; i < GOOD; i++) {
                char q[512];
                snprintf(q, sizeof(q),
                         "SELECT (sum(cpu_ns) = 20000000000 AND sum(mem_byte_ns) = 120 * 1000000000::numeric * 268435456)::text"
                         " FROM usage_hourly WHERE sandbox_id = 'sb_good_%d'", i);
                char *v = aggtest_query(&t, q);
                CHECK(v && strcmp(v, "true") == 0, "sb_good_%d is not billed 20 CPU-s and 120 s x 256 MiB", i);
                free(v);
        }
        /* 1: a dead letter with the reason, valid UTF-8 cut on a character. */
        CHECK(store_int(&t, "SELECT count(*) FROM dead_letters WHERE reason LIKE 'label éé%'"
                            " AND octet_length(reason) BETWEEN 250 AND 255") == 1,
              "the long label key is not one dead letter with its reason");
        /* 2: the usage kept exactly, rated loudly. */
        /* 60 s paused x (4 GiB + 1 GiB) */
        char *sto = aggtest_query(&t, "SELECT (sum(storage_byte_ns) = 60 * 1000000000::numeric * 5368709120)::text"
                                      " FROM usage_hourly WHERE sandbox_id = 'sb_norate'");
        CHECK(sto && strcmp(sto, "true") == 0, "storage of the plan without a rate is not 60 s x 5 GiB");
        free(sto);
        CHECK(store_int(&t, "SELECT count(*) FROM usage_hourly WHERE sandbox_id = 'sb_norate' AND cpu_ns > 0") >= 1,
              "the CPU of the plan without a storage rate was not billed");
        CHECK(store_int(&t, "SELECT count(*) FROM rating_gaps WHERE account_id = 'acct_norate' AND meter = 'storage'"
                            " AND plan_id = 'nostorage'") >= 1, "no rating gap recorded");
        CHECK(store_int(&t, "SELECT count(*) FROM spend_daily WHERE key_id = 'key_norate' AND cpu_rated > 0"
                            " AND storage_rated = 0") >= 1, "spend of the plan without a storage rate");
        CHECK(store_log_has(&t, 0, "usage without a rate") && store_log_has(&t, 0, "meter=storage"),
              "the missing rate was not logged");
        /* 3: the first five sandboxes billed (1.55e18 nano-dollars each: five
         * fit in a bigint, six do not), the last three second samples set
         * aside with the database's reason. */
        CHECK(store_int(&t, "SELECT count(*) FROM dead_letters WHERE reason LIKE 'database refused: 22003 %'") ==
                      HUGE_SANDBOXES - 5,
              "the samples over bigint spend are not %d dead letters", HUGE_SANDBOXES - 5);
        char *huge = aggtest_query(&t, "SELECT (sum(mem_byte_ns) = 5 * 9223372036854775807::numeric * 86398000000000)::text"
                                       " FROM usage_hourly WHERE key_id = 'key_huge'");
        CHECK(huge && strcmp(huge, "true") == 0, "key_huge's memory is not exactly five sandbox-days");
        free(huge);
        char *spend = aggtest_query(&t, "SELECT (nanodollars = round(5 * 9223372036854775807::numeric * 86398000000000"
                                        " * 7500000 / (1073741824::numeric * 3600000000000)))::text"
                                        " FROM spend_daily WHERE key_id = 'key_huge'");
        CHECK(spend && strcmp(spend, "true") == 0, "key_huge's spend");
        free(spend);
        CHECK(store_log_has(&t, 0, "set aside as a dead letter"), "no log line for the isolated message");

        /* Still billing after all that: one more round. */
        good_samples(&t, 3, t0);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 30) == 0, "the aggregator stopped billing after the poison");
        CHECK(store_int(&t, "SELECT sum(cpu_ns) FROM usage_hourly WHERE sandbox_id LIKE 'sb_good_%'") ==
                      GOOD * 30 * NS_PER_SEC, "the last round was not billed");

        char *page = store_metrics(port);
        CHECK(page != NULL, "no /metrics on port %d", port);
        if (page) {
                CHECK(store_metric(page, "tally_aggregator_dead_letters_total{cause=\"database\"}") ==
                              HUGE_SANDBOXES - 5, "database dead letters in /metrics");
                CHECK(store_metric(page, "tally_aggregator_dead_letters_total{cause=\"decode\"}") == 1,
                      "decode dead letters in /metrics");
                CHECK(store_metric(page, "tally_aggregator_batch_splits_total") >= 1, "no batch split counted");
                CHECK(store_metric(page, "tally_aggregator_rating_gaps_total") >= 1, "no rating gap counted");
                CHECK(store_metric(page, "tally_aggregator_batches_committed_total") >= 1, "no batch counted");
                CHECK(store_metric(page, "tally_aggregator_commit_seconds_count") >= 1, "no commit latency");
        }
        free(page);
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        aggtest_stop(&t);
        return test_result();
}
