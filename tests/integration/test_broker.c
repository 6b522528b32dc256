/* Integration: tally-broker as a separate process speaks the Kafka protocol.
 * An idempotent producer and a consumer group in this process exchange
 * messages through it, and nothing is lost or duplicated across a broker
 * down/up fault. */
#include "support.h"
#include "kafka.h"

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BATCH 1000

static int delivered, delivery_errors;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
        if (m->err)
                delivery_errors++;
        else
                delivered++;
}

struct broker {
        pid_t pid;
        char *bootstrap;
        char sock[512];
};

static struct broker start_broker(const char *dir, const char *name, const char *port)
{
        struct broker b = { 0 };
        char file[512], log[512];
        snprintf(file, sizeof(file), "%s/%s.bootstrap", dir, name);
        snprintf(b.sock, sizeof(b.sock), "%s/%s.sock", dir, name);
        snprintf(log, sizeof(log), "%s/%s.log", dir, name);
        char *argv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--port", (char *)port, "--partitions", "3",
                         "--bootstrap-file", file, "--control-socket", b.sock, NULL };
        b.pid = test_spawn(argv, NULL, log);
        if (test_wait_file(file, 10000) < 0) {
                fprintf(stderr, "FAIL: broker %s did not start; its log:\n", name);
                char *l = test_read_file(log);
                fprintf(stderr, "%s\n", l ? l : "");
                exit(1);
        }
        b.bootstrap = test_read_file(file);
        return b;
}

static int ctl(struct broker *b, const char *cmd)
{
        char *out = NULL;
        char *argv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--control-socket", b->sock, "ctl", (char *)cmd, NULL };
        int rc = test_run(argv, &out, NULL);
        CHECK(rc == 0 && strncmp(out, "ok", 2) == 0, "ctl %s: rc=%d reply=%s", cmd, rc, out);
        free(out);
        return rc;
}

static void stop_broker(struct broker *b)
{
        kill(b->pid, SIGTERM);
        int st;
        waitpid(b->pid, &st, 0);
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "broker did not stop cleanly on SIGTERM (status %d)", st);
        free(b->bootstrap);
}

static void produce(rd_kafka_t *p, int from, int to)
{
        for (int i = from; i < to; i++) {
                char key[32], val[64];
                snprintf(key, sizeof(key), "acct_%d", i % 7);
                int n = snprintf(val, sizeof(val), "message %d", i);
                rd_kafka_resp_err_t e;
                while ((e = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_KEY(key, strlen(key)),
                                              RD_KAFKA_V_VALUE(val, (size_t)n), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                              RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                        rd_kafka_poll(p, 10);
                CHECK(e == 0, "produce: %s", rd_kafka_err2str(e));
        }
}

/* Consumes until `want` distinct messages arrived or 60 s passed; counts duplicates. */
static void consume(const char *bootstrap, const char *group, int want, int *ret_distinct, int *ret_dups)
{
        char err[512];
        rd_kafka_t *c = kafka_consumer_new(bootstrap, group, NULL, NULL, err, sizeof(err));
        CHECK(c != NULL, "consumer: %s", err);
        if (!c)
                return;
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, TOPIC_USAGE, RD_KAFKA_PARTITION_UA);
        rd_kafka_subscribe(c, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        char *seen = calloc((size_t)want + 1, 1);
        int distinct = 0, dups = 0;
        time_t deadline = time(NULL) + 60;
        while (distinct < want && time(NULL) < deadline) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 200);
                if (!m)
                        continue;
                if (!m->err) {
                        int i = -1;
                        sscanf((const char *)m->payload, "message %d", &i);
                        if (i >= 0 && i < want) {
                                if (seen[i])
                                        dups++;
                                else
                                        distinct++;
                                seen[i] = 1;
                        }
                }
                rd_kafka_message_destroy(m);
        }
        rd_kafka_consumer_close(c);
        rd_kafka_destroy(c);
        free(seen);
        *ret_distinct = distinct;
        *ret_dups = dups;
}

static rd_kafka_t *producer(const char *bootstrap)
{
        char err[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        const char *const extra[] = { "message.timeout.ms=120000", NULL };
        rd_kafka_t *p = kafka_producer_new(bootstrap, conf, extra, err, sizeof(err));
        if (!p) {
                fprintf(stderr, "FAIL: producer: %s\n", err);
                exit(1);
        }
        return p;
}

int main(void)
{
        char *dir = test_tmpdir("broker");
        struct broker b = start_broker(dir, "picked", "0");
        CHECK(strncmp(b.bootstrap, "127.0.0.1:", 10) == 0, "bootstrap is not on loopback: %s", b.bootstrap);

        rd_kafka_t *p = producer(b.bootstrap);
        produce(p, 0, BATCH);
        CHECK(rd_kafka_flush(p, 30000) == 0, "flush before the fault timed out");
        CHECK(delivered == BATCH && delivery_errors == 0, "delivered %d, errors %d", delivered, delivery_errors);

        /* The fault: every broker refuses connections for 3 s while we produce. */
        ctl(&b, "down");
        produce(p, BATCH, 2 * BATCH);
        rd_kafka_flush(p, 3000);
        CHECK(delivered < 2 * BATCH, "messages were acknowledged while the broker was down");
        ctl(&b, "up");
        CHECK(rd_kafka_flush(p, 60000) == 0, "flush after the broker came back timed out");
        CHECK(delivered == 2 * BATCH && delivery_errors == 0, "after down/up: delivered %d, errors %d", delivered,
              delivery_errors);

        /* Request errors injected on Produce (ApiKey 0): retried, still exactly once. */
        ctl(&b, "error 0 6 3"); /* NOT_LEADER_FOR_PARTITION, three times */
        produce(p, 2 * BATCH, 3 * BATCH);
        CHECK(rd_kafka_flush(p, 60000) == 0, "flush after request errors timed out");
        CHECK(delivered == 3 * BATCH && delivery_errors == 0, "after request errors: delivered %d, errors %d",
              delivered, delivery_errors);
        rd_kafka_destroy(p);

        int distinct = 0, dups = 0;
        consume(b.bootstrap, "test-group", 3 * BATCH, &distinct, &dups);
        CHECK(distinct == 3 * BATCH, "consumed %d distinct of %d", distinct, 3 * BATCH);
        CHECK(dups == 0, "%d duplicates after faults with an idempotent producer", dups);
        stop_broker(&b);

        /* A port the user chooses: the relay forwards bootstrap to broker 1. */
        char port[16];
        snprintf(port, sizeof(port), "%d", test_free_port());
        struct broker fixed = start_broker(dir, "chosen", port);
        char want[32];
        snprintf(want, sizeof(want), "127.0.0.1:%s", port);
        CHECK(strcmp(fixed.bootstrap, want) == 0, "bootstrap %s, wanted %s", fixed.bootstrap, want);
        delivered = 0;
        p = producer(fixed.bootstrap);
        produce(p, 0, 100);
        CHECK(rd_kafka_flush(p, 30000) == 0 && delivered == 100, "chosen port: delivered %d", delivered);
        rd_kafka_destroy(p);
        consume(fixed.bootstrap, "test-group-2", 100, &distinct, &dups);
        CHECK(distinct == 100 && dups == 0, "chosen port: consumed %d, duplicates %d", distinct, dups);

        /* Its memory limit is said when it starts, and when it drops messages
         * (about 5 MiB per partition): 7 MB of 100 kB messages to partition 0. */
        char logpath[512];
        snprintf(logpath, sizeof(logpath), "%s/chosen.log", dir);
        char *log = test_read_file(logpath);
        CHECK(log && strstr(log, "keep_bytes_per_partition=5242880"), "the start line does not say the limit");
        free(log);
        delivered = 0;
        p = producer(fixed.bootstrap);
        char *big = calloc(1, 100000);
        memset(big, 'x', 99999);
        for (int i = 0; i < 70; i++)
                CHECK(rd_kafka_producev(p, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_PARTITION(0),
                                        RD_KAFKA_V_VALUE(big, 100000), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                        RD_KAFKA_V_END) == 0, "produce a big message");
        free(big);
        CHECK(rd_kafka_flush(p, 30000) == 0 && delivered == 70, "big messages: delivered %d", delivered);
        rd_kafka_destroy(p);
        char *out = NULL;
        char *wargv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--control-socket", fixed.sock, "ctl", "watermarks", NULL };
        CHECK(test_run(wargv, &out, NULL) == 0 && out && strncmp(out, "ok 0=", 5) == 0, "ctl watermarks: %s",
              out ? out : "?");
        long long lo = -1;
        CHECK(out && sscanf(out, "ok 0=%lld..", &lo) == 1 && lo > 0, "partition 0 kept everything: %s",
              out ? out : "?");
        free(out);
        bool said = false;
        for (int i = 0; i < 50 && !said; i++) {
                log = test_read_file(logpath);
                said = log && strstr(log, "dropped messages to stay within its memory limit") &&
                       strstr(log, "partition=0");
                free(log);
                if (!said)
                        usleep(100000);
        }
        CHECK(said, "the broker did not log the messages it dropped");
        stop_broker(&fixed);
        free(dir);
        return test_result();
}
