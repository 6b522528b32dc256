/* bench-aggregator — the programs behind tests/bench/aggregator.sh.
 *
 *   produce BROKERS SANDBOXES SAMPLES RATE  produce SANDBOXES x SAMPLES usage samples (RATE per second, 0: flat out)
 *   fold SAMPLES                             the fold stage alone, one core: samples folded per second
 *   freeze BROKERS TRIALS                    limit crossed -> pause command -> a real process frozen in a
 *                                            cgroup v1 freezer; prints one latency (ms) per trial
 * Figures go to stdout as name=value lines. */
#include "control.h"
#include "event.h"
#include "fold.h"
#include "kafka.h"
#include "timeutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define GiB (UINT64_C(1) << 30)

static void die(const char *msg)
{
        fprintf(stderr, "bench-aggregator: %s\n", msg);
        exit(1);
}

static rd_kafka_t *producer(const char *brokers)
{
        char err[512];
        const char *const extra[] = { "batch.size=1000000", "linger.ms=50", "queue.buffering.max.messages=1000000",
                                      NULL };
        rd_kafka_t *p = kafka_producer_new(brokers, NULL, extra, err, sizeof(err));
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

static struct usage_event sample(int sandbox, int k, int64_t t0)
{
        struct usage_event ev = { .type = EVENT_SAMPLE, .epoch = 1, .seq = (uint64_t)k + 1,
                                  .wall_ns = t0 + (int64_t)k * NS_PER_SEC, .state = STATE_RUNNING,
                                  .cpu_ns = (uint64_t)k * 700 * NS_PER_MS, .mem_bytes = GiB, .mem_size_bytes = 4 * GiB,
                                  .vcpus = 2 };
        snprintf(ev.host, sizeof(ev.host), "bench-host");
        snprintf(ev.sandbox, sizeof(ev.sandbox), "bench-sb-%d", sandbox);
        snprintf(ev.account, sizeof(ev.account), "bench-acct-%d", sandbox % 97);
        snprintf(ev.key, sizeof(ev.key), "bench-key-%d", sandbox % 97);
        return ev;
}

static int cmd_produce(const char *brokers, int sandboxes, int samples, int rate)
{
        rd_kafka_t *p = producer(brokers);
        int64_t t0 = time_hour_start(time_wall_ns()) - NS_PER_HOUR, start = time_mono_ns();
        long n = 0;
        for (int k = 0; k < samples; k++)
                for (int s = 0; s < sandboxes; s++) {
                        struct usage_event ev = sample(s, k, t0);
                        produce(p, &ev);
                        n++;
                        if (rate > 0 && n % 1000 == 0) {
                                int64_t due = start + n * NS_PER_SEC / rate;
                                while (time_mono_ns() < due)
                                        rd_kafka_poll(p, 1);
                        }
                }
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

/* ---- freeze ---- */

static int write_file(const char *path, const char *text)
{
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        ssize_t n = write(fd, text, strlen(text));
        int e = n < 0 ? -errno : 0;
        close(fd);
        return e;
}

static bool frozen(const char *cg)
{
        char path[512], buf[64] = "";
        snprintf(path, sizeof(path), "%s/freezer.state", cg);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return false;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        return n > 0 && strncmp(buf, "FROZEN", 6) == 0;
}

static int cmd_freeze(const char *brokers, int trials)
{
        char err[512];
        rd_kafka_t *p = producer(brokers);
        char group[64];
        snprintf(group, sizeof(group), "bench-freezer-%d", (int)getpid());
        /* A control consumer wants commands at once, not full fetches. */
        const char *const fast[] = { "fetch.wait.max.ms=10", NULL };
        rd_kafka_t *c = kafka_consumer_new(brokers, group, NULL, fast, err, sizeof(err));
        if (!c)
                die(err);
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, TOPIC_CONTROL, RD_KAFKA_PARTITION_UA);
        rd_kafka_subscribe(c, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        /* wait for the control partitions to be assigned */
        for (int i = 0; i < 100; i++) {
                rd_kafka_topic_partition_list_t *a = NULL;
                rd_kafka_assignment(c, &a);
                int n = a ? a->cnt : 0;
                if (a)
                        rd_kafka_topic_partition_list_destroy(a);
                if (n > 0)
                        break;
                rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 100);
                if (m)
                        rd_kafka_message_destroy(m);
        }
        int64_t day0 = time_day_start(time_wall_ns());
        for (int t = 0; t < trials; t++) {
                char cg[256], path[512], key[32], account[32], sandbox[32];
                snprintf(cg, sizeof(cg), "/sys/fs/cgroup/freezer/tally-bench-aggregator-%d-%d", (int)getpid(), t);
                if (mkdir(cg, 0755) < 0)
                        die("could not create a freezer cgroup (cgroup v1 freezer, as root)");
                pid_t child = fork();
                if (child == 0) {
                        char pid[32];
                        snprintf(path, sizeof(path), "%s/cgroup.procs", cg);
                        snprintf(pid, sizeof(pid), "%d", (int)getpid());
                        if (write_file(path, pid) < 0)
                                _exit(1);
                        execlp("sleep", "sleep", "600", (char *)NULL);
                        _exit(1);
                }
                snprintf(key, sizeof(key), "bench-freeze-%d", t);
                snprintf(account, sizeof(account), "bench-freeze-acct");
                snprintf(sandbox, sizeof(sandbox), "bench-freeze-sb-%d-%d", (int)getpid(), t);
                /* A busy 2 vCPU / 4 GiB sandbox: $0.08/h; the key's limit ($0.01, set by
                 * the script) is crossed by the sample of minute 8, and not before. */
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
                        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 5);
                        if (!m)
                                continue;
                        struct control_command cmd;
                        char why[256];
                        if (!m->err && control_decode(m->payload, m->len, &cmd, why, sizeof(why)) == 0 &&
                            cmd.action == CONTROL_PAUSE && strcmp(cmd.key, key) == 0) {
                                snprintf(path, sizeof(path), "%s/freezer.state", cg);
                                write_file(path, "FROZEN");
                                while (!frozen(cg))
                                        time_sleep_ns(100 * NS_PER_US);
                                done = time_mono_ns();
                        }
                        rd_kafka_message_destroy(m);
                }
                snprintf(path, sizeof(path), "%s/freezer.state", cg);
                write_file(path, "THAWED");
                kill(child, SIGKILL);
                waitpid(child, NULL, 0);
                rmdir(cg);
                if (!done)
                        die("no pause command within 30 s");
                printf("freeze_ms=%lld\n", (long long)((done - crossed) / NS_PER_MS));
                fflush(stdout);
        }
        rd_kafka_consumer_close(c);
        rd_kafka_destroy(c);
        rd_kafka_destroy(p);
        return 0;
}

int main(int argc, char **argv)
{
        if (argc >= 6 && strcmp(argv[1], "produce") == 0)
                return cmd_produce(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
        if (argc >= 3 && strcmp(argv[1], "fold") == 0)
                return cmd_fold(atol(argv[2]));
        if (argc >= 4 && strcmp(argv[1], "freeze") == 0)
                return cmd_freeze(argv[2], atoi(argv[3]));
        fprintf(stderr, "Usage: bench-aggregator produce BROKERS SANDBOXES SAMPLES RATE | fold SAMPLES | "
                        "freeze BROKERS TRIALS\n");
        return 2;
}
