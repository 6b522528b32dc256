/* Integration: memory stays bounded. A stopped sandbox's
 * state leaves the aggregator's memory keep_stopped_ms after its final
 * reading (1 s here); a late, resent sample of it must then be read back by
 * id from fold_state and billed as the duplicate it is — not as a first
 * sample billing its whole counter again. A sandbox still running stays.
 *
 * Then under a steady stream (about 10,000 messages a second for 6 s, a
 * batch committing while the next is folded): 50 sandboxes that stopped at
 * its start leave memory while the stream still flows, and are billed
 * exactly. (The sweep's rule before, "no batch open and none committing",
 * passes this too, at up to 40,000 messages a second: quiet polls left
 * such moments. The rule now needs none.) */
#include "aggtest.h"
#include "storetest.h"
#include "support.h"
#include "timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (UINT64_C(1) << 20)

static struct usage_event sample(const char *sb, int seq, int64_t t0, enum sandbox_state st)
{
        return aggtest_sample("acct_mem", "key_mem", sb, 1, (uint64_t)seq, t0 + seq * 10 * NS_PER_SEC, st,
                              (uint64_t)seq * 5 * NS_PER_SEC, 64 * MIB, 0, 1);
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_store_memory", 4);
        int port = test_free_port();
        char ports[16];
        snprintf(ports, sizeof(ports), "%d", port);
        const char *extra[] = { "--batch-ms", "50", "--metrics-port", ports, "--keep-stopped-ms", "1000", NULL };
        pid_t agg = aggtest_spawn(&t, extra);
        int64_t t0 = time_wall_ns() - 10 * 60 * NS_PER_SEC;
        for (int seq = 1; seq <= 4; seq++) {
                struct usage_event a = sample("sb_mem_stop", seq, t0, seq == 4 ? STATE_STOPPED : STATE_RUNNING);
                struct usage_event b = sample("sb_mem_run", seq, t0, STATE_RUNNING);
                aggtest_produce(&t, &a);
                aggtest_produce(&t, &b);
        }
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 30) == 0, "not caught up");
        int64_t evicted = -1, held = -1;
        for (int i = 0; i < 100 && evicted < 1; i++) {
                time_sleep_ns(100 * NS_PER_MS);
                char *page = store_metrics(port);
                evicted = page ? store_metric(page, "tally_aggregator_sandboxes_evicted_total") : -1;
                held = page ? store_metric(page, "tally_aggregator_sandboxes") : -1;
                free(page);
        }
        CHECK(evicted == 1, "evicted %lld sandboxes, want the stopped one", (long long)evicted);
        CHECK(held == 1, "%lld sandboxes in memory, want the running one", (long long)held);

        /* A late resend of the stopped sandbox's samples 2 and 4: duplicates. */
        struct usage_event late2 = sample("sb_mem_stop", 2, t0, STATE_RUNNING);
        struct usage_event late4 = sample("sb_mem_stop", 4, t0, STATE_STOPPED);
        aggtest_produce(&t, &late2);
        aggtest_produce(&t, &late4);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 30) == 0, "not caught up after the late samples");
        /* By hand: 4 x 5 = 20 CPU-s, 30 s x 64 MiB held. */
        char *v = aggtest_query(&t, "SELECT (sum(cpu_ns) = 20000000000 AND sum(mem_byte_ns) = 30 * 1000000000::numeric"
                                    " * 67108864)::text FROM usage_hourly WHERE sandbox_id = 'sb_mem_stop'");
        CHECK(v && strcmp(v, "true") == 0, "the evicted sandbox was billed again by its late samples");
        free(v);
        char *page = store_metrics(port);
        CHECK(page && store_metric(page, "tally_aggregator_sandboxes_loaded_total") >= 1,
              "the evicted sandbox was not read back by id");
        free(page);
        CHECK(store_int(&t, "SELECT count(*) FROM fold_state WHERE sandbox_id = 'sb_mem_stop' AND stopped") == 1,
              "fold_state does not mark the stopped sandbox");

        /* 2: the stream. Samples 10 ms of wall time apart, 5 ms of CPU each. */
        page = store_metrics(port);
        int64_t before = page ? store_metric(page, "tally_aggregator_sandboxes_evicted_total") : -1;
        free(page);
        CHECK(before >= 1, "no evictions counted before the stream: %lld", (long long)before);
        int64_t t1 = time_wall_ns() - 60 * NS_PER_SEC, start = time_mono_ns(), during = -1;
        char sb[32];
        for (int k = 0; k < 50; k++)
                for (int seq = 1; seq <= 2; seq++) {
                        snprintf(sb, sizeof(sb), "sb_flow_stop_%d", k);
                        struct usage_event ev = aggtest_sample("acct_mem", "key_mem", sb, 1, (uint64_t)seq,
                                                               t1 + seq * 10 * NS_PER_MS,
                                                               seq == 2 ? STATE_STOPPED : STATE_RUNNING,
                                                               (uint64_t)seq * 5 * NS_PER_MS, 64 * MIB, 0, 1);
                        aggtest_produce(&t, &ev);
                }
        for (int round = 1; time_mono_ns() - start < 6 * NS_PER_SEC; round++) {
                for (int j = 0; j < 100; j++) {
                        snprintf(sb, sizeof(sb), "sb_flow_run_%d", j);
                        struct usage_event ev = aggtest_sample("acct_mem", "key_mem", sb, 1, (uint64_t)round,
                                                               t1 + round * 10 * NS_PER_MS, STATE_RUNNING,
                                                               (uint64_t)round * 5 * NS_PER_MS, 64 * MIB, 0, 1);
                        aggtest_produce(&t, &ev);
                }
                int64_t due = start + round * 10 * NS_PER_MS;
                if (due > time_mono_ns())
                        time_sleep_ns(due - time_mono_ns());
                if (round % 50 == 0) { /* twice a second: what the aggregator has evicted so far */
                        page = store_metrics(port);
                        during = page ? store_metric(page, "tally_aggregator_sandboxes_evicted_total") - before : -1;
                        free(page);
                }
        }
        CHECK(during >= 50, "%lld sandboxes evicted while the stream flowed, want the 50 that stopped at its start",
              (long long)during);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up after the stream");
        /* By hand: each stopped one its last counter, 10 ms of CPU, and 10 ms x 64 MiB between its two samples. */
        v = aggtest_query(&t, "SELECT (count(DISTINCT sandbox_id) = 50 AND sum(cpu_ns) = 50 * 10000000"
                              " AND sum(mem_byte_ns) = 50 * 10000000::numeric * 67108864)::text"
                              " FROM usage_hourly WHERE sandbox_id LIKE 'sb\\_flow\\_stop\\_%'");
        CHECK(v && strcmp(v, "true") == 0, "the sandboxes stopped during the stream were not billed exactly");
        free(v);
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        aggtest_stop(&t);
        return test_result();
}
