/* bench-aggregator — the programs behind tests/bench/aggregator.sh.
 *
 *   produce [--format v1|v2] [--created with|only|none] BROKERS SANDBOXES SAMPLES RATE [PREFIX]
 *                                            produce SANDBOXES x SAMPLES usage samples (RATE per second, 0: flat
 *                                            out) of sandboxes PREFIX-0.. (default bench-sb): a prefix not used
 *                                            before gives sandboxes the aggregator has never billed. v1 (the
 *                                            default): a JSON message per sample; v2: each round's samples in
 *                                            usage batches, one per partition (as tally-collector's
 *                                            usage_format v2 sends them; docs/events.md). --created: each
 *                                            sandbox's created event just before its first sample (with, the
 *                                            default), the created events alone (only), or the samples alone
 *                                            (none: their created events were produced before)
 *   fold SAMPLES                             the fold stage alone, one core: samples folded per second
 *   watermarks BROKERS                       each partition's high watermark of usage: o0,o1,...
 *   consume BROKERS FROM UNTIL               the ceiling: a plain consumer (the aggregator's fetch settings)
 *                                            reads usage from the offsets FROM to UNTIL (o0,o1,...) and
 *                                            discards it; the time from its assignment to the last message,
 *                                            and the CPU time it used
 *   freeze BROKERS TRIALS VMM STATE PARENT   limit crossed -> pause command -> a tally-vmm sandbox's
 *                                            freezer cgroup FROZEN; prints one latency (ms) per trial
 * Figures go to stdout as name=value lines. */
#include "control.h"
#include "event.h"
#include "fold.h"
#include "kafka.h"
#include "sample_batch.h"
#include "timeutil.h"

#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define GiB (UINT64_C(1) << 30)

static void die(const char *msg)
{
        fprintf(stderr, "bench-aggregator: %s\n", msg);
        exit(1);
}

/* A client conf with the cluster's settings (SASL: an Apache Kafka cluster of scripts/kafka) from
 * BENCH_KAFKA_SETTINGS (name=value,...) and BENCH_KAFKA_PASSWORD; none for the development broker. */
static rd_kafka_conf_t *bench_conf(void)
{
        char err[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        struct kafka_client_settings s = { .settings = getenv("BENCH_KAFKA_SETTINGS"),
                                           .sasl_password = getenv("BENCH_KAFKA_PASSWORD") };
        if (kafka_conf_set_client(conf, &s, err, sizeof(err)) < 0)
                die(err);
        return conf;
}

/* paced: as a collector produces (its linger.ms, 5: common/kafka.c), for the
 * latency figures; else a preload, in as few produce requests as it can. */
static rd_kafka_t *producer(const char *brokers, bool paced)
{
        char err[512];
        const char *const extra[] = { "batch.size=1000000", paced ? "linger.ms=5" : "linger.ms=50",
                                      "queue.buffering.max.messages=1000000", NULL };
        rd_kafka_t *p = kafka_producer_new(brokers, bench_conf(), extra, err, sizeof(err));
        if (!p)
                die(err);
        return p;
}

static void produce(rd_kafka_t *p, const struct usage_event *ev)
{
        char buf[2048];
        int n = event_encode(ev, buf, sizeof(buf));
        if (n < 0)
                die("encode");
        while (rd_kafka_producev(p, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_KEY(ev->account, strlen(ev->account)),
                                 RD_KAFKA_V_VALUE(buf, (size_t)n), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                 RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(p, 5);
}

static struct usage_event sample(const char *prefix, int sandbox, int k, int64_t t0)
{
        struct usage_event ev = { .type = EVENT_SAMPLE, .epoch = 1, .seq = (uint64_t)k + 1,
                                  .wall_ns = t0 + (int64_t)k * NS_PER_SEC, .state = STATE_RUNNING,
                                  .cpu_ns = (uint64_t)k * 700 * NS_PER_MS, .mem_bytes = GiB, .mem_size_bytes = 4 * GiB,
                                  .vcpus = 2,
                                  /* held time as the vmm keeps it (docs/events.md), matching wall_ns */
                                  .held_known = true, .running_ns = (uint64_t)k * NS_PER_SEC };
        snprintf(ev.host, sizeof(ev.host), "bench-host");
        snprintf(ev.sandbox, sizeof(ev.sandbox), "%s-%d", prefix, sandbox);
        snprintf(ev.account, sizeof(ev.account), "bench-acct-%d", sandbox % 97);
        snprintf(ev.key, sizeof(ev.key), "bench-key-%d", sandbox % 97);
        return ev;
}

/* Usage batches for the v2 producer: one being built per partition. */
struct batches {
        rd_kafka_t *p;
        int32_t n;
        struct { uint8_t *buf; size_t len, count; int64_t wall, mono; char key[EVENT_ID_MAX + 1]; } *b;
};

static int32_t usage_partitions(rd_kafka_t *p)
{
        rd_kafka_topic_t *t = rd_kafka_topic_new(p, TOPIC_USAGE, NULL);
        const struct rd_kafka_metadata *md = NULL;
        if (!t || rd_kafka_metadata(p, 0, t, &md, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR || md->topic_cnt != 1 ||
            md->topics[0].partition_cnt < 1)
                die("could not read the usage topic's partition count");
        int32_t n = md->topics[0].partition_cnt;
        rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(t);
        return n;
}

static void batch_send(struct batches *bs, int32_t i)
{
        if (!bs->b[i].count)
                return;
        while (rd_kafka_producev(bs->p, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_KEY(bs->b[i].key, strlen(bs->b[i].key)),
                                 RD_KAFKA_V_VALUE(bs->b[i].buf, bs->b[i].len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                 RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(bs->p, 5);
        bs->b[i].len = bs->b[i].count = 0;
}

static void batch_add(struct batches *bs, const struct usage_event *ev)
{
        int32_t i = rd_kafka_msg_partitioner_consistent_random(NULL, ev->account, strlen(ev->account), bs->n, NULL, NULL);
        if (bs->b[i].count && bs->b[i].len + SAMPLE_BATCH_RECORD_MAX > SAMPLE_BATCH_MAX_BYTES)
                batch_send(bs, i);
        if (!bs->b[i].count) {
                int h = sample_batch_begin(bs->b[i].buf, SAMPLE_BATCH_MAX_BYTES, ev->host, ev->wall_ns, ev->mono_ns);
                if (h < 0)
                        die("batch header");
                bs->b[i].len = (size_t)h;
                bs->b[i].wall = ev->wall_ns;
                bs->b[i].mono = ev->mono_ns;
                snprintf(bs->b[i].key, sizeof(bs->b[i].key), "%s", ev->account);
        }
        int r = sample_batch_record(bs->b[i].buf + bs->b[i].len, SAMPLE_BATCH_MAX_BYTES - bs->b[i].len, bs->b[i].wall,
                                    bs->b[i].mono, ev);
        if (r < 0)
                die("batch record");
        bs->b[i].len += (size_t)r;
        bs->b[i].count++;
}

enum created_mode { CREATED_WITH, CREATED_ONLY, CREATED_NONE };

static int cmd_produce(const char *brokers, int sandboxes, int samples, int rate, const char *prefix, bool v2,
                       enum created_mode created)
{
        rd_kafka_t *p = producer(brokers, rate > 0);
        struct batches bs = { .p = p };
        if (v2) {
                bs.n = usage_partitions(p);
                if (!(bs.b = calloc((size_t)bs.n, sizeof(*bs.b))))
                        die("out of memory");
                for (int32_t i = 0; i < bs.n; i++)
                        if (!(bs.b[i].buf = malloc(SAMPLE_BATCH_MAX_BYTES)))
                                die("out of memory");
        }
        int64_t t0 = time_hour_start(time_wall_ns()) - NS_PER_HOUR, start = time_mono_ns();
        long n = 0;
        if (created == CREATED_ONLY)
                samples = 1;
        for (int k = 0; k < samples; k++)
                for (int s = 0; s < sandboxes; s++) {
                        struct usage_event ev = sample(prefix, s, k, t0);
                        if (k == 0 && created != CREATED_NONE) {
                                /* the vmm's created event first: aggregators bill no reading before it */
                                struct usage_event c = ev;
                                c.type = EVENT_CREATED;
                                c.held_known = false;
                                c.wall_ns = t0 - NS_PER_SEC;
                                snprintf(c.backend, sizeof(c.backend), "process");
                                produce(p, &c);
                                if (created == CREATED_ONLY)
                                        continue;
                        }
                        if (v2)
                                batch_add(&bs, &ev);
                        else
                                produce(p, &ev);
                        n++;
                        if (rate > 0 && n % 1000 == 0) {
                                int64_t due = start + n * NS_PER_SEC / rate;
                                while (time_mono_ns() < due)
                                        rd_kafka_poll(p, 1);
                        }
                        if (v2 && s == sandboxes - 1) /* the round's batches, as a collector's tick */
                                for (int32_t i = 0; i < bs.n; i++)
                                        batch_send(&bs, i);
                }
        for (int32_t i = 0; i < bs.n; i++)
                free(bs.b[i].buf);
        free(bs.b);
        if (rd_kafka_flush(p, 120000) != 0)
                die("flush timed out");
        int64_t ns = time_mono_ns() - start;
        printf("produced=%ld produce_ms=%lld produce_per_s=%lld\n", n, (long long)(ns / NS_PER_MS),
               (long long)((int64_t)n * NS_PER_SEC / (ns ? ns : 1)));
        rd_kafka_destroy(p);
        return 0;
}

static uint64_t sink;
static void count(void *ctx, const struct fold_usage *u) { sink += u->cpu_ns; }

static int cmd_fold(long samples)
{
        enum { SANDBOXES = 10000 };
        struct fold_state *st = calloc(SANDBOXES, sizeof(*st));
        for (int s = 0; s < SANDBOXES; s++) /* each created (its created event taken), epoch 1 announced */
                st[s] = (struct fold_state){ .created = true, .created_vcpus = 2,
                                             .epoch_max = 1 };
        int64_t t0 = time_hour_start(time_wall_ns());
        int64_t start = time_mono_ns();
        for (long i = 0; i < samples; i++) {
                int s = (int)(i % SANDBOXES);
                struct usage_event ev = { .type = EVENT_SAMPLE, .epoch = 1, .seq = (uint64_t)(i / SANDBOXES) + 1,
                                          .wall_ns = t0 + (i / SANDBOXES) * NS_PER_SEC, .state = STATE_RUNNING,
                                          .cpu_ns = (uint64_t)(i / SANDBOXES) * 700 * NS_PER_MS,
                                          .mem_size_bytes = 4 * GiB, .vcpus = 2 };
                fold_apply(&st[s], &ev, count, NULL);
        }
        int64_t ns = time_mono_ns() - start;
        printf("fold_samples_per_s_per_core=%lld\n", (long long)(samples * NS_PER_SEC / (ns ? ns : 1)));
        free(st);
        return 0;
}

/* ---- the consume-only ceiling ---- */

/* The offsets of a comma-separated list, one per partition; how many. */
static int offsets_parse(const char *list, int64_t *off, int max)
{
        int n = 0;
        for (const char *p = list; *p && n < max; n++) {
                char *end;
                off[n] = strtoll(p, &end, 10);
                p = *end == ',' ? end + 1 : end;
        }
        return n;
}

/* Prints each partition's high watermark of usage, comma-separated, in partition order. */
static int cmd_watermarks(const char *brokers)
{
        char err[512];
        rd_kafka_t *c = kafka_consumer_new(brokers, "bench-watermarks", bench_conf(), NULL, err, sizeof(err));
        if (!c)
                die(err);
        const struct rd_kafka_metadata *md;
        rd_kafka_topic_t *t = rd_kafka_topic_new(c, TOPIC_USAGE, NULL);
        if (rd_kafka_metadata(c, 0, t, &md, 10000) || md->topic_cnt != 1)
                die("no metadata for usage");
        int n = md->topics[0].partition_cnt;
        rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(t);
        for (int p = 0; p < n; p++) {
                int64_t lo, hi;
                if (rd_kafka_query_watermark_offsets(c, TOPIC_USAGE, p, &lo, &hi, 10000))
                        die("could not read a watermark");
                printf("%s%lld", p ? "," : "", (long long)hi);
        }
        printf("\n");
        rd_kafka_destroy(c);
        return 0;
}

/* Reads usage from the offsets FROM to UNTIL (per partition) with the
 * aggregator's own fetch settings (aggregator/loop.c), discarding every
 * message: what the machine gives a consumer with no work to do. */
static int cmd_consume(const char *brokers, const char *from, const char *until)
{
        int64_t start[256], end[256];
        int n = offsets_parse(from, start, 256);
        if (offsets_parse(until, end, 256) != n || n == 0)
                die("consume: FROM and UNTIL need one offset per partition");
        char err[512];
        const char *const settings[] = { "fetch.max.bytes=16777216", "max.partition.fetch.bytes=4194304",
                                         "fetch.wait.max.ms=20", "queued.min.messages=200000", NULL };
        rd_kafka_t *c = kafka_consumer_new(brokers, "bench-consume-only", bench_conf(), settings, err, sizeof(err));
        if (!c)
                die(err);
        long want = 0;
        rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(n);
        for (int p = 0; p < n; p++) {
                want += (long)(end[p] - start[p]);
                if (end[p] > start[p])
                        rd_kafka_topic_partition_list_add(parts, TOPIC_USAGE, p)->offset = start[p];
        }
        int64_t t0 = time_mono_ns(), deadline = t0 + 600 * NS_PER_SEC, last = t0;
        if (rd_kafka_assign(c, parts))
                die("assign");
        rd_kafka_topic_partition_list_destroy(parts);
        long got = 0;
        uint64_t bytes = 0;
        while (got < want && time_mono_ns() < deadline) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
                if (!m)
                        continue;
                if (!m->err && m->offset < end[m->partition]) {
                        got++;
                        bytes += m->len;
                        last = time_mono_ns();
                }
                rd_kafka_message_destroy(m);
        }
        if (got < want)
                die("the consumer did not read every message within 600 s");
        int64_t ns = last - t0;
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        long long cpu_us = (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000 + ru.ru_utime.tv_usec +
                           ru.ru_stime.tv_usec;
        printf("consumed=%ld bytes=%llu consume_ms=%lld consume_messages_per_s=%lld consume_cpu_ms=%lld\n", got,
               (unsigned long long)bytes, (long long)(ns / NS_PER_MS),
               (long long)((int64_t)got * NS_PER_SEC / (ns ? ns : 1)), cpu_us / 1000);
        rd_kafka_destroy(c);
        return 0;
}

/* ---- freeze ---- */

static bool frozen(const char *cg)
{
        char path[600], buf[64] = "";
        snprintf(path, sizeof(path), "%s/freezer.state", cg);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return false;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        return n > 0 && strncmp(buf, "FROZEN", 6) == 0;
}

/* Runs `tally-vmm --state-dir STATE ARGS` and returns the "id" of its JSON answer. */
static int vmm_cli(const char *vmm, const char *state, const char *args, char *id, size_t idlen)
{
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "%s --state-dir %s %s", vmm, state, args);
        FILE *f = popen(cmd, "r");
        if (!f)
                return -errno;
        json_error_t jerr;
        json_t *j = json_loadf(f, JSON_DISABLE_EOF_CHECK, &jerr);
        int rc = pclose(f);
        const char *v = j ? json_string_value(json_object_get(j, "id")) : NULL;
        if (id && v)
                snprintf(id, idlen, "%s", v);
        json_decref(j);
        return rc == 0 && (!id || v) ? 0 : -EIO;
}

/* Per trial: a real tally-vmm process sandbox for a key of its own; the sample
 * that crosses the key's daily limit is produced; the clock stops when the
 * sandbox's freezer cgroup reads FROZEN (the aggregator's pause command, carried
 * out by tally-vmm). */
static int cmd_freeze(const char *brokers, int trials, const char *vmm, const char *state, const char *parent)
{
        rd_kafka_t *p = producer(brokers, true);
        int64_t day0 = time_day_start(time_wall_ns());
        for (int t = 0; t < trials; t++) {
                char path[512], key[32], account[32], sandbox[EVENT_ID_MAX + 1], args[256];
                snprintf(key, sizeof(key), "bench-freeze-%d", t);
                snprintf(account, sizeof(account), "bench-freeze-acct");
                snprintf(args, sizeof(args), "create --account %s --key %s --memory-mib 64 -- sleep 600", account, key);
                if (vmm_cli(vmm, state, args, sandbox, sizeof(sandbox)) < 0)
                        die("tally-vmm create failed");
                snprintf(path, sizeof(path), "/sys/fs/cgroup/freezer/%s/%s", parent, sandbox);
                /* A busy 2 vCPU / 4 GiB sandbox: $0.08/h; the key's limit ($0.01, set by
                 * the script) is crossed by the sample of minute 8, and not before. The
                 * samples carry the real sandbox's id, its host (the script starts tally-vmm
                 * as host bench-host) and the epoch tally-vmm announced in its created event
                 * (1), as the collector's would: any other host or epoch is set aside by the
                 * aggregator's provenance rule (docs/events.md), and nothing would freeze. */
                int64_t crossed = 0;
                for (int k = 0; k <= 8; k++) {
                        struct usage_event ev = { .type = EVENT_SAMPLE, .epoch = 1, .seq = (uint64_t)k + 1,
                                                  .wall_ns = day0 + k * 60 * NS_PER_SEC, .state = STATE_RUNNING,
                                                  .cpu_ns = (uint64_t)k * 120 * NS_PER_SEC, .mem_size_bytes = 4 * GiB,
                                                  .vcpus = 2 };
                        strcpy(ev.host, "bench-host");
                        strcpy(ev.sandbox, sandbox);
                        strcpy(ev.account, account);
                        strcpy(ev.key, key);
                        if (k == 8) {
                                rd_kafka_flush(p, 10000);
                                /* the earlier samples are committed (batch_ms is 500 by default) */
                                time_sleep_ns(800 * NS_PER_MS);
                                crossed = time_mono_ns();
                        }
                        produce(p, &ev);
                }
                rd_kafka_flush(p, 10000);
                int64_t deadline = crossed + 30 * NS_PER_SEC, done = 0;
                while (!done && time_mono_ns() < deadline) {
                        if (frozen(path))
                                done = time_mono_ns();
                        else
                                time_sleep_ns(NS_PER_MS);
                }
                snprintf(args, sizeof(args), "stop %s", sandbox);
                vmm_cli(vmm, state, args, NULL, 0);
                if (!done)
                        die("the sandbox was not frozen within 30 s");
                printf("freeze_ms=%lld\n", (long long)((done - crossed) / NS_PER_MS));
                fflush(stdout);
        }
        rd_kafka_destroy(p);
        return 0;
}

int main(int argc, char **argv)
{
        if (argc >= 2 && strcmp(argv[1], "produce") == 0) {
                bool v2 = false;
                enum created_mode created = CREATED_WITH;
                int i = 2;
                for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
                        if (strcmp(argv[i], "--format") == 0 && (!strcmp(argv[i + 1], "v1") || !strcmp(argv[i + 1], "v2")))
                                v2 = strcmp(argv[i + 1], "v2") == 0;
                        else if (strcmp(argv[i], "--created") == 0 && strcmp(argv[i + 1], "with") == 0)
                                created = CREATED_WITH;
                        else if (strcmp(argv[i], "--created") == 0 && strcmp(argv[i + 1], "only") == 0)
                                created = CREATED_ONLY;
                        else if (strcmp(argv[i], "--created") == 0 && strcmp(argv[i + 1], "none") == 0)
                                created = CREATED_NONE;
                        else
                                die("--format is v1 or v2; --created is with, only or none");
                }
                if (argc - i >= 4)
                        return cmd_produce(argv[i], atoi(argv[i + 1]), atoi(argv[i + 2]), atoi(argv[i + 3]),
                                           argc - i >= 5 ? argv[i + 4] : "bench-sb", v2, created);
        }
        if (argc >= 5 && strcmp(argv[1], "consume") == 0)
                return cmd_consume(argv[2], argv[3], argv[4]);
        if (argc >= 3 && strcmp(argv[1], "watermarks") == 0)
                return cmd_watermarks(argv[2]);
        if (argc >= 3 && strcmp(argv[1], "fold") == 0)
                return cmd_fold(atol(argv[2]));
        if (argc >= 7 && strcmp(argv[1], "freeze") == 0)
                return cmd_freeze(argv[2], atoi(argv[3]), argv[4], argv[5], argv[6]);
        fprintf(stderr, "Usage: bench-aggregator produce [--format v1|v2] [--created with|only|none] BROKERS SANDBOXES SAMPLES RATE [PREFIX] | fold SAMPLES | "
                        "watermarks BROKERS | consume BROKERS FROM UNTIL | "
                        "freeze BROKERS TRIALS VMM STATE_DIR CGROUP_PARENT\n");
        return 2;
}
