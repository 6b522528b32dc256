/* test_acls.c — who may write and read which topic on Apache Kafka (kafka-acls).
 *
 * A cluster as scripts/kafka starts it (its own, one node) and clients that
 * try what a neighbour on the network, a compromised host or a misbehaving
 * aggregator might: a client with no credentials, one with a wrong password,
 * the host principal (a host's collector and vmm) and the aggregator
 * principal, each producing to and reading from `usage` and `control`.
 *
 * Verdicts come from what the topics hold, read afterwards by the super user
 * (admin), never from the refused client's own errors alone: a forged message
 * must not be in its topic, and a refused reader must not have received the
 * canary admin wrote. Every refusal has its control: the principal allowed to
 * do the same thing does it in the same test (its message lands, it reads the
 * canary), so a broken cluster or a wrong address cannot make this pass.
 * Apache Kafka only (suite kafka): the development broker authenticates no one. */
#include "kafka.h"
#include "support.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static struct test_kafka K;

/* Who a client is: a principal of the cluster, or none. */
enum who { ANONYMOUS, WRONG_PASSWORD, HOST, AGGREGATOR, ADMIN };
static const char *who_name[] = { "no credentials", "a wrong password", "host-test", "aggregator", "admin" };

static rd_kafka_conf_t *conf_of(enum who w)
{
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        char err[256];
        switch (w) {
        case ANONYMOUS:
                return conf; /* PLAINTEXT: what any process that can reach the port can do */
        case WRONG_PASSWORD:
                if (rd_kafka_conf_set(conf, "security.protocol", "SASL_PLAINTEXT", err, sizeof(err)) ||
                    rd_kafka_conf_set(conf, "sasl.mechanisms", "PLAIN", err, sizeof(err)) ||
                    rd_kafka_conf_set(conf, "sasl.username", "host-test", err, sizeof(err)) ||
                    rd_kafka_conf_set(conf, "sasl.password", "not-the-password", err, sizeof(err))) {
                        fprintf(stderr, "FAIL: %s\n", err);
                        exit(1);
                }
                return conf;
        case HOST: return test_kafka_conf_as(conf, "host-test");
        case AGGREGATOR: return test_kafka_conf_as(conf, "aggregator");
        case ADMIN: return test_kafka_conf_as(conf, "admin");
        }
        return conf;
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
        (void)rk;
        (void)opaque;
        *(rd_kafka_resp_err_t *)m->_private = m->err;
}

/* Produces one message (key "acl-test") as w, an idempotent producer as every tally daemon's;
 * returns the delivery's error (0: the broker has it). */
static rd_kafka_resp_err_t produce(enum who w, const char *topic, const char *payload)
{
        rd_kafka_conf_t *conf = conf_of(w);
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        /* A refused connection is retried until the message times out: 15 s, however loaded the machine. */
        const char *const extra[] = { "message.timeout.ms=15000", NULL };
        char err[512];
        rd_kafka_t *p = kafka_producer_new(K.bootstrap, conf, extra, err, sizeof(err));
        if (!p) {
                fprintf(stderr, "FAIL: producer as %s: %s\n", who_name[w], err);
                exit(1);
        }
        rd_kafka_resp_err_t result = RD_KAFKA_RESP_ERR__IN_PROGRESS;
        rd_kafka_resp_err_t r = rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY("acl-test", 8),
                                                  RD_KAFKA_V_VALUE((void *)payload, strlen(payload)),
                                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(&result),
                                                  RD_KAFKA_V_END);
        if (r != RD_KAFKA_RESP_ERR_NO_ERROR)
                result = r;
        for (int i = 0; i < 600 && result == RD_KAFKA_RESP_ERR__IN_PROGRESS; i++)
                rd_kafka_poll(p, 100);
        char fatal[256];
        rd_kafka_resp_err_t f = rd_kafka_fatal_error(p, fatal, sizeof(fatal));
        fprintf(stderr, "%s → %s: %s%s%s\n", who_name[w], topic, rd_kafka_err2name(result), f ? "; fatal: " : "",
                f ? fatal : "");
        rd_kafka_purge(p, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_destroy(p);
        return result;
}

/* Reads topic as w in group for up to wait_s seconds or until want (a payload) arrives,
 * or until the broker refuses the topic or the group by its ACLs (then nothing can
 * arrive: the reader stops there rather than wait out wait_s).
 * Returns whether want arrived; *ret_err: the last error the consumer reported (0: none). */
static int read_until(enum who w, const char *group, const char *topic, const char *want, int wait_s,
                      rd_kafka_resp_err_t *ret_err)
{
        char err[512];
        rd_kafka_t *c = kafka_consumer_new(K.bootstrap, group, conf_of(w), NULL, err, sizeof(err));
        if (!c) {
                fprintf(stderr, "FAIL: consumer as %s: %s\n", who_name[w], err);
                exit(1);
        }
        rd_kafka_topic_partition_list_t *sub = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(sub, topic, RD_KAFKA_PARTITION_UA);
        rd_kafka_subscribe(c, sub);
        rd_kafka_topic_partition_list_destroy(sub);
        int found = 0;
        rd_kafka_resp_err_t last = 0;
        time_t end = time(NULL) + wait_s;
        while (!found && time(NULL) < end) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 200);
                if (!m)
                        continue;
                if (m->err && m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                        last = m->err;
                        if (last == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
                            last == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED) {
                                rd_kafka_message_destroy(m);
                                break;
                        }
                }
                else if (!m->err && m->len == strlen(want) && memcmp(m->payload, want, m->len) == 0)
                        found = 1;
                rd_kafka_message_destroy(m);
        }
        fprintf(stderr, "%s reads %s in group %s: %s (last error %s)\n", who_name[w], topic, group,
                found ? "read the canary" : "nothing", rd_kafka_err2name(last));
        rd_kafka_consumer_close(c);
        rd_kafka_destroy(c);
        *ret_err = last;
        return found;
}

/* Whether topic holds payload, read by admin from the beginning of every partition to its end. */
static int topic_holds(const char *topic, const char *payload)
{
        char err[512];
        rd_kafka_t *c = kafka_consumer_new(K.bootstrap, "acl-test-admin-check", conf_of(ADMIN),
                                           (const char *const[]){ "enable.partition.eof=true", NULL }, err,
                                           sizeof(err));
        if (!c) {
                fprintf(stderr, "FAIL: admin consumer: %s\n", err);
                exit(1);
        }
        rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(2);
        for (int p = 0; p < 2; p++)
                rd_kafka_topic_partition_list_add(parts, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
        rd_kafka_assign(c, parts);
        rd_kafka_topic_partition_list_destroy(parts);
        int eofs = 0, found = 0;
        time_t end = time(NULL) + 60;
        while (eofs < 2 && time(NULL) < end) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 200);
                if (!m)
                        continue;
                if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
                        eofs++;
                else if (!m->err && m->len == strlen(payload) && memcmp(m->payload, payload, m->len) == 0)
                        found = 1;
                rd_kafka_message_destroy(m);
        }
        CHECK(eofs == 2, "admin could not read %s to its end", topic);
        rd_kafka_consumer_close(c);
        rd_kafka_destroy(c);
        return found;
}

static int authz_error(rd_kafka_resp_err_t e)
{
        return e == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED || e == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED;
}

int main(void)
{
        char *dir = test_tmpdir("kafka-acls");
        test_kafka_start(&K, dir, 2, 1);
        CHECK(K.apache, "the development broker has no authentication: run with --kafka apache");
        rd_kafka_resp_err_t e;

        /* No credentials: nothing written. */
        CHECK(produce(ANONYMOUS, TOPIC_USAGE, "forged-sample-anonymous") != 0,
              "a client without credentials wrote usage");
        CHECK(produce(ANONYMOUS, TOPIC_CONTROL, "forged-command-anonymous") != 0,
              "a client without credentials wrote control");
        CHECK(produce(WRONG_PASSWORD, TOPIC_USAGE, "forged-sample-wrong-password") != 0,
              "a client with a wrong password wrote usage");

        /* The canaries, written by the super user: what a refused reader must never see. */
        CHECK(produce(ADMIN, TOPIC_USAGE, "canary-usage") == 0, "admin could not write usage");
        CHECK(produce(ADMIN, TOPIC_CONTROL, "canary-control") == 0, "admin could not write control");

        /* Allowed, each the control of a refusal below. */
        CHECK(produce(HOST, TOPIC_USAGE, "sample-by-host") == 0, "the host principal could not write usage");
        CHECK(produce(AGGREGATOR, TOPIC_CONTROL, "command-by-aggregator") == 0,
              "the aggregator principal could not write control");
        CHECK(read_until(AGGREGATOR, "tally-aggregator", TOPIC_USAGE, "canary-usage", 60, &e),
              "the aggregator principal could not read usage in its group");
        CHECK(read_until(HOST, "tally-vmm-test-acl-host", TOPIC_CONTROL, "canary-control", 60, &e),
              "the host principal could not read control in its vmm's group");

        /* No credentials: nothing read (below) and nothing written. */
        CHECK(!read_until(ANONYMOUS, "tally-aggregator", TOPIC_USAGE, "canary-usage", 20, &e),
              "a client without credentials read usage");
        CHECK(!read_until(ANONYMOUS, "tally-vmm-test-acl-host", TOPIC_CONTROL, "canary-control", 20, &e),
              "a client without credentials read control");

        /* A host (its collector and vmm) writes usage and reads control, nothing else: no
         * commands to other hosts' sandboxes, no reading other tenants' usage. */
        e = produce(HOST, TOPIC_CONTROL, "forged-command-by-host");
        CHECK(e != 0, "the host principal wrote control");
        CHECK(authz_error(e) || e == RD_KAFKA_RESP_ERR__FATAL, "the host principal's write to control failed with %s, "
              "not an authorization error", rd_kafka_err2name(e));
        CHECK(!read_until(HOST, "tally-aggregator", TOPIC_USAGE, "canary-usage", 30, &e),
              "the host principal read usage in the aggregators' group");
        CHECK(authz_error(e), "the host principal's read of usage ended with %s, not an authorization error",
              rd_kafka_err2name(e));
        CHECK(!read_until(HOST, "tally-vmm-test-acl-host", TOPIC_USAGE, "canary-usage", 30, &e),
              "the host principal read usage in its own group");
        CHECK(authz_error(e), "the host principal's read of usage ended with %s, not an authorization error",
              rd_kafka_err2name(e));

        /* The aggregator reads usage and writes control, nothing else: it forges no samples. */
        e = produce(AGGREGATOR, TOPIC_USAGE, "forged-sample-by-aggregator");
        CHECK(e != 0, "the aggregator principal wrote usage");
        CHECK(!read_until(AGGREGATOR, "tally-aggregator", TOPIC_CONTROL, "canary-control", 30, &e),
              "the aggregator principal read control");

        /* What the topics hold, read by admin: the allowed messages, none of the forged ones. */
        CHECK(topic_holds(TOPIC_USAGE, "sample-by-host"), "usage lacks the host's sample");
        CHECK(topic_holds(TOPIC_CONTROL, "command-by-aggregator"), "control lacks the aggregator's command");
        const char *forged_usage[] = { "forged-sample-anonymous", "forged-sample-wrong-password",
                                       "forged-sample-by-aggregator" };
        for (size_t i = 0; i < sizeof(forged_usage) / sizeof(forged_usage[0]); i++)
                CHECK(!topic_holds(TOPIC_USAGE, forged_usage[i]), "usage holds %s", forged_usage[i]);
        const char *forged_control[] = { "forged-command-anonymous", "forged-command-by-host" };
        for (size_t i = 0; i < sizeof(forged_control) / sizeof(forged_control[0]); i++)
                CHECK(!topic_holds(TOPIC_CONTROL, forged_control[i]), "control holds %s", forged_control[i]);

        test_kafka_stop(&K);
        free(dir);
        return test_result();
}
