/* Integration: retention gaps are loud. The aggregator
 * bills a few samples of one partition and stops (then, second, is frozen
 * while it runs); then the development
 * broker's memory limit (about 5 MiB per partition: librdkafka's mock drops
 * the oldest batches beyond it) removes messages the ledger's stored offset
 * points at, never billed. Restarted, the aggregator must record the lost
 * range in offset_gaps (in the transaction that moves the offset), log it at
 * error, count it in /metrics, and carry on billing after the gap — not
 * silently start over from the earliest offset. */
#include "aggtest.h"
#include "kafka.h"
#include "storetest.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PART 1
#define FILLER (100 * 1000)
#define FILLERS 70 /* 7 MB: more than the broker keeps */
#define MIB (UINT64_C(1) << 20)

static struct usage_event sample(int seq, int64_t t0)
{
        return aggtest_sample("acct_gap", "key_gap", "sb_gap", 1, (uint64_t)seq, t0 + seq * 60 * NS_PER_SEC,
                              STATE_RUNNING, (uint64_t)seq * 10 * NS_PER_SEC, 256 * MIB, 0, 1);
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_store_gap", 4);
        int port = test_free_port();
        char ports[16];
        snprintf(ports, sizeof(ports), "%d", port);
        const char *extra[] = { "--batch-ms", "50", "--metrics-port", ports, NULL };
        int64_t t0 = time_wall_ns() - 30 * 60 * NS_PER_SEC;

        pid_t agg = aggtest_spawn(&t, extra);
        for (int seq = 1; seq <= 3; seq++) {
                struct usage_event ev = sample(seq, t0);
                store_produce_to(&t, PART, &ev);
        }
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the first samples were not billed");
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        int64_t stored = store_int(&t, "SELECT next_offset FROM consumer_offsets WHERE partition = 1");
        CHECK(stored == 4, "stored next offset %" PRId64 ", want 4 (the sandbox's created event, 3 samples)", stored);

        /* While it is down: samples 4 and 5 (never billed, lost below), then
         * more filler than the broker keeps, then sample 6. */
        for (int seq = 4; seq <= 5; seq++) {
                struct usage_event ev = sample(seq, t0);
                store_produce_to(&t, PART, &ev);
        }
        char *filler = malloc(FILLER);
        memset(filler, 'x', FILLER);
        for (int i = 0; i < FILLERS; i++)
                store_produce_raw_to(&t, PART, "acct_gap", filler, FILLER);
        free(filler);
        struct usage_event last = sample(6, t0);
        store_produce_to(&t, PART, &last);
        aggtest_flush(&t);
        int64_t lo = -1, hi = -1;
        CHECK(rd_kafka_query_watermark_offsets(t.producer, TOPIC_USAGE, PART, &lo, &hi, 10000) == 0, "watermarks");
        fprintf(stderr, "partition %d now holds offsets %" PRId64 "..%" PRId64 "\n", PART, lo, hi - 1);
        CHECK(lo > stored, "the broker kept everything (first offset %" PRId64 "): no gap to test", lo);

        agg = aggtest_spawn(&t, extra);
        if (aggtest_wait_caught_up(&t, 60) < 0) {
                CHECK(0, "the aggregator did not carry on after the gap");
                store_log_dump(&t, 1, 3000);
        }
        char want[128], q[256];
        snprintf(want, sizeof(want), "1 %" PRId64 " %" PRId64 " behind", stored, lo - 1);
        snprintf(q, sizeof(q), "SELECT count(*) || ' ' || min(from_offset) || ' ' || max(to_offset) || ' ' || min(kind)"
                               " FROM offset_gaps WHERE partition = %d AND group_id = 'tally-aggregator'", PART);
        char *v = aggtest_query(&t, q);
        CHECK(v && strcmp(v, want) == 0, "offset_gaps says %s, want %s", v ? v : "?", want);
        free(v);
        CHECK(store_log_has(&t, 1, "level=error") && store_log_has(&t, 1, "offsets lost") &&
                      store_log_has(&t, 1, "found=at_assignment"),
              "the gap was not logged at error when the partition was assigned");
        char *page = store_metrics(port);
        CHECK(page && store_metric(page, "tally_aggregator_offset_gaps_total") == 1, "offset gaps in /metrics");
        CHECK(page && store_metric(page, "tally_aggregator_offsets_lost_total") == lo - stored,
              "offsets lost in /metrics");
        free(page);
        /* After the gap: sample 6 billed from sample 3 (the counter carries
         * the lost samples' CPU: 60 CPU-s in all), never from zero again. */
        CHECK(store_int(&t, "SELECT sum(cpu_ns) FROM usage_hourly WHERE sandbox_id = 'sb_gap'") == 60 * NS_PER_SEC,
              "CPU billed across the gap");

        /* While it runs: frozen (SIGSTOP) behind the broker's limit, its
         * fetch position goes out of range; the consumer reports it and the
         * same rule applies. */
        kill(agg, SIGSTOP);
        /* read once it is frozen, and any commit it had sent has landed (a
         * full run once read 77 here, before a commit of offsets up to 81) */
        time_sleep_ns(NS_PER_SEC);
        int64_t stored2 = store_int(&t, "SELECT next_offset FROM consumer_offsets WHERE partition = 1");
        for (int seq = 7; seq <= 8; seq++) {
                struct usage_event ev = sample(seq, t0);
                store_produce_to(&t, PART, &ev);
        }
        filler = malloc(FILLER);
        memset(filler, 'y', FILLER);
        for (int i = 0; i < FILLERS; i++)
                store_produce_raw_to(&t, PART, "acct_gap", filler, FILLER);
        free(filler);
        struct usage_event last2 = sample(9, t0);
        store_produce_to(&t, PART, &last2);
        aggtest_flush(&t);
        int64_t lo2 = -1;
        CHECK(rd_kafka_query_watermark_offsets(t.producer, TOPIC_USAGE, PART, &lo2, &hi, 10000) == 0, "watermarks");
        CHECK(lo2 > stored2, "the broker kept everything the second time (first offset %" PRId64 ")", lo2);
        kill(agg, SIGCONT);
        if (aggtest_wait_caught_up(&t, 60) < 0) {
                CHECK(0, "the running aggregator did not carry on after the gap");
                store_log_dump(&t, 1, 3000);
        }
        snprintf(want, sizeof(want), "%" PRId64 " %" PRId64, stored2, lo2 - 1);
        snprintf(q, sizeof(q), "SELECT from_offset || ' ' || to_offset FROM offset_gaps WHERE partition = %d"
                               " ORDER BY id DESC LIMIT 1", PART);
        v = aggtest_query(&t, q);
        CHECK(v && strcmp(v, want) == 0, "the second gap is %s, want %s", v ? v : "?", want);
        CHECK(store_log_has(&t, 1, "found=while_consuming"), "the second gap was not logged as found while consuming");
        free(v);
        page = store_metrics(port);
        CHECK(page && store_metric(page, "tally_aggregator_offset_gaps_total") == 2, "offset gaps in /metrics");
        CHECK(page && store_metric(page, "tally_aggregator_offsets_lost_total") == (lo - stored) + (lo2 - stored2),
              "offsets lost in /metrics");
        free(page);
        CHECK(store_int(&t, "SELECT sum(cpu_ns) FROM usage_hourly WHERE sandbox_id = 'sb_gap'") == 90 * NS_PER_SEC,
              "CPU billed across the second gap");
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");

        /* A normal restart (./scripts/up's): the development broker keeps its
         * messages in memory, so its topic starts again at offset 0, behind the
         * ledger's stored offset. No message the broker holds is skipped: the
         * move is recorded (kind ahead, from the partition's new end to the old
         * stored offset), billing goes on from offset 0, and nothing is logged at
         * error. */
        if (!t.kafka.apache) {
                int64_t stored3 = store_int(&t, "SELECT next_offset FROM consumer_offsets WHERE partition = 1");
                aggtest_restart_broker(&t, 4);
                struct usage_event after = sample(10, t0);
                store_produce_to(&t, PART, &after);
                aggtest_flush(&t);
                agg = aggtest_spawn(&t, extra); /* aggregator.2.log */
                if (aggtest_wait_caught_up(&t, 60) < 0) {
                        CHECK(0, "the aggregator did not carry on after the broker's restart");
                        store_log_dump(&t, 2, 3000);
                }
                snprintf(want, sizeof(want), "1 %" PRId64 " ahead 0", stored3 - 1);
                snprintf(q, sizeof(q), "SELECT from_offset || ' ' || to_offset || ' ' || kind || ' ' ||"
                                       " (SELECT next_offset FROM consumer_offsets WHERE partition = %d) - 1"
                                       " FROM offset_gaps WHERE partition = %d ORDER BY id DESC LIMIT 1", PART, PART);
                v = aggtest_query(&t, q);
                CHECK(v && strcmp(v, want) == 0, "the restart's move is %s, want %s", v ? v : "?", want);
                free(v);
                CHECK(store_log_has(&t, 2, "kind=ahead") && store_log_has(&t, 2, "lost=0"),
                      "the restart's move was not logged");
                CHECK(!store_log_has(&t, 2, "level=error") && !store_log_has(&t, 2, "offsets lost"),
                      "a normal restart logged an error");
                if (store_log_has(&t, 2, "level=error"))
                        store_log_dump(&t, 2, 3000);
                CHECK(store_int(&t, "SELECT sum(cpu_ns) FROM usage_hourly WHERE sandbox_id = 'sb_gap'") ==
                              100 * NS_PER_SEC,
                      "CPU billed after the broker's restart");
                CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly after the broker's restart");
        }
        aggtest_stop(&t);
        return test_result();
}
