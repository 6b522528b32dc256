/* Integration, Apache Kafka: a retention gap made for real
 * (test_store_gap's on Apache Kafka). The aggregator bills the first samples of a sandbox on
 * partition 1 of `usage` and stops. Then the topic's retention is shortened
 * (an operator's AlterConfigs, from the test's own client) and more samples
 * go in while it is down; Kafka's log cleaner deletes whole segments past
 * their retention, the ledger's stored offset among them. Restarted, the
 * aggregator must record exactly the lost range in offset_gaps (partition,
 * first and last offset lost: the stored offset up to the broker's low
 * watermark minus one, read here by the test's own client), log it at
 * error, count it in /metrics, and go on billing from the earliest offset
 * Kafka still has, with nothing billed twice. A second partition whose
 * billed messages were deleted (nothing lost) must record no gap. Then the
 * same while it runs: frozen (SIGSTOP) while retention deletes what it has
 * not fetched yet, it must find the gap when Kafka answers its next fetch
 * with OFFSET_OUT_OF_RANGE (auto.offset.reset=error), not reset silently.
 *
 * Time is what retention measures, and retention is by each segment's
 * newest record timestamp: the messages meant to age out carry a CreateTime
 * two hours old (the aggregator down for two hours), the ones meant to stay
 * carry now. segment.ms (1 min) rolls a new segment before each old-stamped
 * record, so each is a segment of its own; the broker checks retention every
 * 250 ms (log.retention.check.interval.ms, TALLY_KAFKA_RETENTION_CHECK_MS).
 * Nothing here depends on how fast the machine is. */
#include "aggtest.h"
#include "kafka.h"
#include "storetest.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PART 1    /* the partition that loses messages */
#define CTL 2     /* the partition whose billed messages are deleted: no gap */
#define MIB (UINT64_C(1) << 20)
#define RETENTION_MS "600000" /* 10 min: the two-hour-old segments are past it, the fresh one is not */

static struct usage_event sample(const char *sb, int seq, int64_t t0)
{
        return aggtest_sample("acct_rgap", "key_rgap", sb, 1, (uint64_t)seq, t0 + seq * 60 * NS_PER_SEC,
                              STATE_RUNNING, (uint64_t)seq * 10 * NS_PER_SEC, 256 * MIB, 0, 1);
}

/* One sample to one partition with the record's CreateTime given (ms). A
 * sandbox's `created` event goes first, to partition CREATED (the aggregator
 * takes provenance by sandbox id, whatever the partition): the offsets of PART
 * and CTL stay the samples' own. */
#define CREATED 3
static void produce_at(struct aggtest *t, int32_t partition, const struct usage_event *ev, int64_t ts_ms)
{
        char buf[8192];
        struct usage_event created;
        if (aggtest_needs_created(t, ev, &created)) {
                int c = event_encode(&created, buf, sizeof(buf));
                CHECK(c > 0, "encode");
                CHECK(rd_kafka_producev(t->producer, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_PARTITION(CREATED),
                                        RD_KAFKA_V_KEY(created.account, strlen(created.account)),
                                        RD_KAFKA_V_VALUE(buf, (size_t)c), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                        RD_KAFKA_V_END) == 0,
                      "produce the created event");
        }
        int n = event_encode(ev, buf, sizeof(buf));
        CHECK(n > 0, "encode");
        rd_kafka_resp_err_t e = rd_kafka_producev(t->producer, RD_KAFKA_V_TOPIC(TOPIC_USAGE),
                                                  RD_KAFKA_V_PARTITION(partition),
                                                  RD_KAFKA_V_KEY(ev->account, strlen(ev->account)),
                                                  RD_KAFKA_V_VALUE(buf, (size_t)n), RD_KAFKA_V_TIMESTAMP(ts_ms),
                                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        CHECK(e == 0, "produce: %s", rd_kafka_err2str(e));
        /* One record per produce request: each is appended (and may roll a segment) on its own. */
        aggtest_flush(t);
}

static void watermarks(struct aggtest *t, int32_t partition, int64_t *lo, int64_t *hi)
{
        *lo = *hi = -1;
        rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(t->producer, TOPIC_USAGE, partition, lo, hi, 10000);
        CHECK(e == 0, "watermarks of partition %d: %s", partition, rd_kafka_err2str(e));
}

/* AlterConfigs on the usage topic (the whole set of its overrides). */
static void alter_usage(struct aggtest *t, const char *const *kv)
{
        rd_kafka_ConfigResource_t *res = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, TOPIC_USAGE);
        for (int i = 0; kv[i]; i += 2)
                rd_kafka_ConfigResource_set_config(res, kv[i], kv[i + 1]);
        rd_kafka_queue_t *q = rd_kafka_queue_new(t->producer);
        rd_kafka_AdminOptions_t *opt = rd_kafka_AdminOptions_new(t->producer, RD_KAFKA_ADMIN_OP_ALTERCONFIGS);
        char err[256];
        rd_kafka_AdminOptions_set_request_timeout(opt, 30000, err, sizeof(err));
        rd_kafka_AlterConfigs(t->producer, &res, 1, opt, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 60000);
        const char *why = !ev ? "no answer" : rd_kafka_event_error(ev) ? rd_kafka_event_error_string(ev) : NULL;
        if (ev && !why) {
                size_t n = 0;
                const rd_kafka_ConfigResource_t **r =
                        rd_kafka_AlterConfigs_result_resources(rd_kafka_event_AlterConfigs_result(ev), &n);
                if (n != 1 || rd_kafka_ConfigResource_error(r[0]))
                        why = n == 1 ? rd_kafka_ConfigResource_error_string(r[0]) : "no result";
        }
        CHECK(why == NULL, "could not alter the usage topic's config: %s", why ? why : "");
        if (ev)
                rd_kafka_event_destroy(ev);
        rd_kafka_AdminOptions_destroy(opt);
        rd_kafka_queue_destroy(q);
        rd_kafka_ConfigResource_destroy(res);
}

/* The value of one config of the usage topic as the broker describes it (malloc'd), or NULL. */
static char *describe_usage(struct aggtest *t, const char *name)
{
        rd_kafka_ConfigResource_t *res = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, TOPIC_USAGE);
        rd_kafka_queue_t *q = rd_kafka_queue_new(t->producer);
        rd_kafka_DescribeConfigs(t->producer, &res, 1, NULL, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
        char *out = NULL;
        if (ev && !rd_kafka_event_error(ev)) {
                size_t n = 0, nc = 0;
                const rd_kafka_ConfigResource_t **r =
                        rd_kafka_DescribeConfigs_result_resources(rd_kafka_event_DescribeConfigs_result(ev), &n);
                const rd_kafka_ConfigEntry_t **c = n == 1 ? rd_kafka_ConfigResource_configs(r[0], &nc) : NULL;
                for (size_t i = 0; i < nc; i++)
                        if (strcmp(rd_kafka_ConfigEntry_name(c[i]), name) == 0 && rd_kafka_ConfigEntry_value(c[i]))
                                out = strdup(rd_kafka_ConfigEntry_value(c[i]));
        }
        if (ev)
                rd_kafka_event_destroy(ev);
        rd_kafka_queue_destroy(q);
        rd_kafka_ConfigResource_destroy(res);
        return out;
}

static char *billed_cpu(struct aggtest *t, const char *sb)
{
        char q[256];
        snprintf(q, sizeof(q), "SELECT coalesce(sum(cpu_ns), 0)::text FROM usage_hourly WHERE sandbox_id = '%s'", sb);
        return aggtest_query(t, q);
}

int main(void)
{
        /* The broker looks for segments past retention every 250 ms (tests/support/kafka.c passes it on). */
        setenv("TALLY_KAFKA_RETENTION_CHECK_MS", "250", 1);
        struct aggtest t;
        aggtest_start(&t, "kafka_retention_gap", 4);
        CHECK(t.kafka.apache, "not Apache Kafka (this test is the real engine's retention)");
        int port = test_free_port();
        char ports[16];
        snprintf(ports, sizeof(ports), "%d", port);
        /* A group session longer than the freeze below: the partitions stay where they are. */
        const char *extra[] = { "--batch-ms", "50", "--metrics-port", ports, "--consumer-settings",
                                "session.timeout.ms=120000,heartbeat.interval.ms=1000", NULL };
        int64_t t0 = time_wall_ns() - 30 * 60 * NS_PER_SEC;
        int64_t old_ms = time_wall_ns() / NS_PER_MS - 2 * 3600 * 1000; /* two hours ago */

        /* Billed: samples 1-3 of sb_rgap on PART, 1-2 of sb_rgap_ctl on CTL. */
        pid_t agg = aggtest_spawn(&t, extra);
        for (int seq = 1; seq <= 3; seq++) {
                struct usage_event ev = sample("sb_rgap", seq, t0);
                produce_at(&t, PART, &ev, old_ms);
        }
        for (int seq = 1; seq <= 2; seq++) {
                struct usage_event ev = sample("sb_rgap_ctl", seq, t0);
                produce_at(&t, CTL, &ev, old_ms);
        }
        CHECK(aggtest_wait_caught_up(&t, 120) == 0, "the first samples were not billed");
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        char q[512];
        snprintf(q, sizeof(q), "SELECT next_offset FROM consumer_offsets WHERE topic = 'usage' AND partition = %d", PART);
        int64_t stored = store_int(&t, q);
        snprintf(q, sizeof(q), "SELECT next_offset FROM consumer_offsets WHERE topic = 'usage' AND partition = %d", CTL);
        int64_t stored_ctl = store_int(&t, q);
        fprintf(stderr, "aggregator stopped: ledger's next offset %" PRId64 " on partition %d, %" PRId64
                        " on partition %d\n", stored, PART, stored_ctl, CTL);
        CHECK(stored == 3 && stored_ctl == 2, "stored next offsets %" PRId64 " and %" PRId64 ", want 3 and 2", stored,
              stored_ctl);
        int64_t lo, hi;
        watermarks(&t, PART, &lo, &hi);
        CHECK(lo == 0 && hi == 3, "partition %d holds %" PRId64 "..%" PRId64 " before the retention change", PART, lo,
              hi);

        /* While it is down: the operator shortens retention; samples 4 and 5
         * (never billed) go in two hours old, sample 6 now. */
        const char *const cfg[] = { "retention.ms", RETENTION_MS, "segment.ms", "60000", "min.insync.replicas", "1",
                                    NULL };
        alter_usage(&t, cfg);
        char *seg = NULL;
        for (int i = 0; i < 100; i++) {
                free(seg);
                seg = describe_usage(&t, "segment.ms");
                if (seg && strcmp(seg, "60000") == 0)
                        break;
                time_sleep_ns(100 * NS_PER_MS);
        }
        CHECK(seg && strcmp(seg, "60000") == 0, "the broker describes segment.ms=%s", seg ? seg : "?");
        free(seg);
        time_sleep_ns(NS_PER_SEC); /* the brokers' logs take the new config from the metadata log */
        for (int seq = 4; seq <= 5; seq++) {
                struct usage_event ev = sample("sb_rgap", seq, t0);
                produce_at(&t, PART, &ev, old_ms);
        }
        struct usage_event ev6 = sample("sb_rgap", 6, t0);
        produce_at(&t, PART, &ev6, time_wall_ns() / NS_PER_MS);
        struct usage_event ctl3 = sample("sb_rgap_ctl", 3, t0);
        produce_at(&t, CTL, &ctl3, time_wall_ns() / NS_PER_MS);

        /* Kafka deletes the old segments: the low watermark, read by this
         * test's own client, moves past the ledger's offset. */
        int64_t lo_ctl = -1, hi_ctl = -1;
        for (int i = 0; i < 600; i++) {
                watermarks(&t, PART, &lo, &hi);
                watermarks(&t, CTL, &lo_ctl, &hi_ctl);
                if (lo == hi - 1 && lo_ctl == hi_ctl - 1)
                        break;
                time_sleep_ns(100 * NS_PER_MS);
        }
        fprintf(stderr, "after retention: partition %d holds offsets %" PRId64 "..%" PRId64 " (ledger's next %" PRId64
                        "); partition %d holds %" PRId64 "..%" PRId64 " (ledger's next %" PRId64 ")\n",
                PART, lo, hi - 1, stored, CTL, lo_ctl, hi_ctl - 1, stored_ctl);
        CHECK(lo == 5 && hi == 6, "retention left partition %d at %" PRId64 "..%" PRId64 ", want 5..5", PART, lo, hi - 1);
        CHECK(lo_ctl == 2 && hi_ctl == 3, "retention left partition %d at %" PRId64 "..%" PRId64 ", want 2..2", CTL,
              lo_ctl, hi_ctl - 1);

        /* Restarted: the gap is found at assignment. */
        agg = aggtest_spawn(&t, extra);
        if (aggtest_wait_caught_up(&t, 120) < 0) {
                CHECK(0, "the aggregator did not carry on after the gap");
                store_log_dump(&t, 1, 3000);
        }
        char want[128];
        snprintf(want, sizeof(want), "1 %d %" PRId64 " %" PRId64 " behind", PART, stored, lo - 1);
        char *v = aggtest_query(&t, "SELECT count(*) || ' ' || min(partition) || ' ' || min(from_offset) || ' ' ||"
                                    " max(to_offset) || ' ' || min(kind) FROM offset_gaps"
                                    " WHERE group_id = 'tally-aggregator' AND topic = 'usage'");
        fprintf(stderr, "offset_gaps: %s (want %s)\n", v ? v : "?", want);
        CHECK(v && strcmp(v, want) == 0, "offset_gaps says %s, want %s", v ? v : "?", want);
        free(v);
        CHECK(store_log_has(&t, 1, "level=error") && store_log_has(&t, 1, "offsets lost"),
              "the gap was not logged at error");
        snprintf(want, sizeof(want), "partition=%d kind=behind from_offset=%" PRId64 " to_offset=%" PRId64 " lost=%" PRId64,
                 PART, stored, lo - 1, lo - stored);
        CHECK(store_log_has(&t, 1, want) && store_log_has(&t, 1, "found=at_assignment"),
              "the error line does not say %s found=at_assignment", want);
        char *page = store_metrics(port);
        int64_t gaps = page ? store_metric(page, "tally_aggregator_offset_gaps_total") : -1;
        int64_t lost = page ? store_metric(page, "tally_aggregator_offsets_lost_total") : -1;
        fprintf(stderr, "/metrics: offset_gaps_total %" PRId64 ", offsets_lost_total %" PRId64 "\n", gaps, lost);
        CHECK(gaps == 1, "offset gaps in /metrics: %" PRId64 ", want 1", gaps);
        CHECK(lost == lo - stored, "offsets lost in /metrics: %" PRId64 ", want %" PRId64, lost, lo - stored);
        free(page);

        /* Billing went on from the earliest offset Kafka has: sample 6 billed
         * from sample 3 (the counter carries the lost samples' CPU: 60 CPU-s),
         * the control sandbox's sample 3 from its sample 2 (30 CPU-s), nothing
         * twice; the ledger's offsets are at the end of both partitions. */
        char *cpu = billed_cpu(&t, "sb_rgap"), *cpu_ctl = billed_cpu(&t, "sb_rgap_ctl");
        fprintf(stderr, "billed cpu_ns: sb_rgap %s (want 60e9), sb_rgap_ctl %s (want 30e9)\n", cpu ? cpu : "?",
                cpu_ctl ? cpu_ctl : "?");
        CHECK(cpu && strcmp(cpu, "60000000000") == 0, "CPU billed across the gap: %s, want 60 s", cpu ? cpu : "?");
        CHECK(cpu_ctl && strcmp(cpu_ctl, "30000000000") == 0, "CPU billed on the partition without a gap: %s, want 30 s",
              cpu_ctl ? cpu_ctl : "?");
        free(cpu);
        free(cpu_ctl);
        snprintf(q, sizeof(q), "SELECT next_offset FROM consumer_offsets WHERE topic = 'usage' AND partition = %d", PART);
        CHECK(store_int(&t, q) == hi, "the ledger's offset on partition %d is not the end (%" PRId64 ")", PART, hi);
        CHECK(store_int(&t, "SELECT count(*) FROM dead_letters") == 0, "samples were dead-lettered");

        /* And on: one more sample, billed once from sample 6. */
        struct usage_event ev7 = sample("sb_rgap", 7, t0);
        produce_at(&t, PART, &ev7, time_wall_ns() / NS_PER_MS);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the sample after the gap was not billed");
        cpu = billed_cpu(&t, "sb_rgap");
        CHECK(cpu && strcmp(cpu, "70000000000") == 0, "CPU billed after the gap: %s, want 70 s", cpu ? cpu : "?");
        free(cpu);
        CHECK(store_int(&t, "SELECT count(*) FROM offset_gaps") == 1, "a second gap was recorded");

        /* While it runs: frozen (SIGSTOP; its group session outlasts the
         * freeze), its fetch position goes out of range as retention deletes
         * what it has not read. Retention now 5 s and a segment per record:
         * samples 6 and 7 (billed) age out in 5 s, 8 and 9 (never billed) go
         * in two hours old, 10 ten minutes ahead (the active segment, kept).
         * Kafka answers the fetch with OFFSET_OUT_OF_RANGE, the consumer
         * (auto.offset.reset=error) reports it, and the same rule applies. */
        snprintf(q, sizeof(q), "SELECT next_offset FROM consumer_offsets WHERE topic = 'usage' AND partition = %d", PART);
        int64_t stored2 = store_int(&t, q);
        kill(agg, SIGSTOP);
        int64_t frozen = time_mono_ns();
        const char *const cfg2[] = { "retention.ms", "5000", "segment.ms", "1", "min.insync.replicas", "1", NULL };
        alter_usage(&t, cfg2);
        for (int i = 0; i < 100; i++) {
                seg = describe_usage(&t, "segment.ms");
                bool done = seg && strcmp(seg, "1") == 0;
                free(seg);
                if (done)
                        break;
                time_sleep_ns(100 * NS_PER_MS);
        }
        time_sleep_ns(NS_PER_SEC);
        for (int seq = 8; seq <= 9; seq++) {
                struct usage_event ev = sample("sb_rgap", seq, t0);
                produce_at(&t, PART, &ev, old_ms);
        }
        struct usage_event ev10 = sample("sb_rgap", 10, t0);
        produce_at(&t, PART, &ev10, time_wall_ns() / NS_PER_MS + 10 * 60 * 1000);
        int64_t lo2 = -1, hi2 = -1;
        for (int i = 0; i < 600; i++) {
                watermarks(&t, PART, &lo2, &hi2);
                if (lo2 == hi2 - 1)
                        break;
                time_sleep_ns(100 * NS_PER_MS);
        }
        fprintf(stderr, "aggregator frozen at next offset %" PRId64 "; after retention partition %d holds %" PRId64
                        "..%" PRId64 "; thawed after %" PRId64 " ms\n",
                stored2, PART, lo2, hi2 - 1, (time_mono_ns() - frozen) / NS_PER_MS);
        CHECK(stored2 == 7 && lo2 == 9 && hi2 == 10, "want next offset 7 and offsets 9..9 kept, have %" PRId64
              " and %" PRId64 "..%" PRId64, stored2, lo2, hi2 - 1);
        kill(agg, SIGCONT);
        if (aggtest_wait_caught_up(&t, 120) < 0) {
                CHECK(0, "the running aggregator did not carry on after the gap");
                store_log_dump(&t, 1, 3000);
        }
        snprintf(want, sizeof(want), "2 %d %" PRId64 " %" PRId64 " behind", PART, stored2, lo2 - 1);
        v = aggtest_query(&t, "SELECT (SELECT count(*) FROM offset_gaps) || ' ' || partition || ' ' || from_offset"
                              " || ' ' || to_offset || ' ' || kind FROM offset_gaps ORDER BY id DESC LIMIT 1");
        fprintf(stderr, "offset_gaps, the second: %s (want %s)\n", v ? v : "?", want);
        CHECK(v && strcmp(v, want) == 0, "offset_gaps says %s, want %s", v ? v : "?", want);
        free(v);
        snprintf(want, sizeof(want), "partition=%d kind=behind from_offset=%" PRId64 " to_offset=%" PRId64 " lost=%" PRId64,
                 PART, stored2, lo2 - 1, lo2 - stored2);
        CHECK(store_log_has(&t, 1, want) && store_log_has(&t, 1, "found=while_consuming"),
              "the error line does not say %s found=while_consuming", want);
        page = store_metrics(port);
        gaps = page ? store_metric(page, "tally_aggregator_offset_gaps_total") : -1;
        lost = page ? store_metric(page, "tally_aggregator_offsets_lost_total") : -1;
        fprintf(stderr, "/metrics: offset_gaps_total %" PRId64 ", offsets_lost_total %" PRId64 "\n", gaps, lost);
        CHECK(gaps == 2, "offset gaps in /metrics: %" PRId64 ", want 2", gaps);
        CHECK(lost == (lo - stored) + (lo2 - stored2), "offsets lost in /metrics: %" PRId64 ", want %" PRId64, lost,
              (lo - stored) + (lo2 - stored2));
        free(page);
        cpu = billed_cpu(&t, "sb_rgap");
        fprintf(stderr, "billed cpu_ns: sb_rgap %s (want 100e9)\n", cpu ? cpu : "?");
        CHECK(cpu && strcmp(cpu, "100000000000") == 0, "CPU billed across the second gap: %s, want 100 s",
              cpu ? cpu : "?");
        free(cpu);
        CHECK(store_int(&t, "SELECT count(*) FROM dead_letters") == 0, "samples were dead-lettered");
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        aggtest_stop(&t);
        return test_result();
}
