/* kafkatest.c — see kafkatest.h. */
#include "kafkatest.h"

#include "kafka.h"
#include "support.h"
#include "timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const rd_kafka_metadata_topic_t *usage_md(struct aggtest *t, const struct rd_kafka_metadata **md)
{
        rd_kafka_topic_t *topic = rd_kafka_topic_new(t->producer, TOPIC_USAGE, NULL);
        rd_kafka_resp_err_t e = rd_kafka_metadata(t->producer, 0, topic, md, 10000);
        rd_kafka_topic_destroy(topic);
        if (e != 0 || (*md)->topic_cnt != 1) {
                CHECK(0, "no metadata for usage: %s", rd_kafka_err2str(e));
                return NULL;
        }
        return &(*md)->topics[0];
}

int kt_leader(struct aggtest *t, int32_t partition)
{
        const struct rd_kafka_metadata *md = NULL;
        const rd_kafka_metadata_topic_t *tp = usage_md(t, &md);
        int leader = -1;
        for (int i = 0; tp && i < tp->partition_cnt; i++)
                if (tp->partitions[i].id == partition)
                        leader = tp->partitions[i].leader;
        if (md)
                rd_kafka_metadata_destroy(md);
        return leader;
}

void kt_print_leaders(struct aggtest *t, const char *when)
{
        const struct rd_kafka_metadata *md = NULL;
        const rd_kafka_metadata_topic_t *tp = usage_md(t, &md);
        fprintf(stderr, "usage partitions %s:", when);
        for (int i = 0; tp && i < tp->partition_cnt; i++) {
                fprintf(stderr, " p%d leader=%d isr=", tp->partitions[i].id, tp->partitions[i].leader);
                for (int k = 0; k < tp->partitions[i].isr_cnt; k++)
                        fprintf(stderr, "%s%d", k ? "," : "", tp->partitions[i].isrs[k]);
        }
        fputc('\n', stderr);
        if (md)
                rd_kafka_metadata_destroy(md);
}

void kt_produce_paced(struct aggtest *t, const struct gen_stream *g, size_t from, size_t to, int steps, int step_ms)
{
        size_t per = (to - from + (size_t)steps - 1) / (size_t)steps;
        for (size_t i = from; i < to;) {
                for (size_t k = 0; k < per && i < to; k++)
                        aggtest_produce(t, g->messages[i++]);
                rd_kafka_poll(t->producer, 0);
                time_sleep_ns((int64_t)step_ms * NS_PER_MS);
        }
        aggtest_flush(t);
}

void kt_compare(struct aggtest *t, const struct gen_stream *g, int64_t produced)
{
        int64_t end = aggtest_topic_end(t), committed = aggtest_committed(t);
        uint64_t cpu = 0;
        u128 mem = 0, sto = 0;
        for (size_t i = 0; i < g->nsandboxes; i++) {
                cpu += g->sandboxes[i].truth_cpu_ns;
                mem += g->sandboxes[i].truth_mem_byte_ns;
                sto += g->sandboxes[i].truth_storage_byte_ns;
        }
        char truth_cpu[48], truth_mem[48], truth_sto[48];
        snprintf(truth_cpu, sizeof(truth_cpu), "%llu", (unsigned long long)cpu);
        gen_u128s(mem, truth_mem);
        gen_u128s(sto, truth_sto);
        char *billed_cpu = aggtest_query(t, "SELECT coalesce(sum(cpu_ns), 0)::text FROM usage_hourly");
        char *billed_mem = aggtest_query(t, "SELECT coalesce(sum(mem_byte_ns), 0)::text FROM usage_hourly");
        char *billed_sto = aggtest_query(t, "SELECT coalesce(sum(storage_byte_ns), 0)::text FROM usage_hourly");
        char *sandboxes = aggtest_query(t, "SELECT count(DISTINCT sandbox_id) FROM usage_hourly");
        char *dead = aggtest_query(t, "SELECT count(*) FROM dead_letters");
        fprintf(stderr, "messages produced %lld, end of topic %lld, offsets committed %lld\n", (long long)produced,
                (long long)end, (long long)committed);
        fprintf(stderr, "cpu_ns: ledger %s, truth %s\n", billed_cpu ? billed_cpu : "?", truth_cpu);
        fprintf(stderr, "mem_byte_ns: ledger %s, truth %s\n", billed_mem ? billed_mem : "?", truth_mem);
        fprintf(stderr, "storage_byte_ns: ledger %s, truth %s\n", billed_sto ? billed_sto : "?", truth_sto);
        fprintf(stderr, "sandboxes: ledger %s, stream %zu; dead letters %s\n", sandboxes ? sandboxes : "?",
                g->nsandboxes, dead ? dead : "?");
        CHECK(end == produced, "the topic holds %lld messages, %lld were produced", (long long)end, (long long)produced);
        CHECK(committed == end, "offsets committed %lld, end of topic %lld", (long long)committed, (long long)end);
        CHECK(billed_cpu && strcmp(billed_cpu, truth_cpu) == 0, "cpu_ns billed %s, truth %s", billed_cpu, truth_cpu);
        CHECK(billed_mem && strcmp(billed_mem, truth_mem) == 0, "mem_byte_ns billed %s, truth %s", billed_mem, truth_mem);
        CHECK(billed_sto && strcmp(billed_sto, truth_sto) == 0, "storage_byte_ns billed %s, truth %s", billed_sto,
              truth_sto);
        CHECK(dead && atoi(dead) == 0, "valid samples were dead-lettered: %s", dead ? dead : "?");
        free(billed_cpu);
        free(billed_mem);
        free(billed_sto);
        free(sandboxes);
        free(dead);
        gen_stream_verify(t, g);
}

int kt_log_count(struct aggtest *t, int n, const char *what)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/aggregator.%d.log", t->dir, n);
        char *text = test_read_file(path);
        int count = 0;
        for (const char *s = text; s && (s = strstr(s, what)); s += strlen(what))
                count++;
        free(text);
        return count;
}
