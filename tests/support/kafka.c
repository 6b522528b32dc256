/* kafka.c — the Kafka a test runs against: see support.h. */
#include "support.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int test_kafka_is_apache(void)
{
        const char *k = getenv("TALLY_TEST_KAFKA");
        return k && strcmp(k, "apache") == 0;
}

static int script(struct test_kafka *k, const char *cmd, const char *a1, const char *a2, const char *a3,
                  char **err)
{
        char *argv[] = { (char *)test_env("TALLY_KAFKA_SCRIPT"), (char *)cmd, k->dir, (char *)a1, (char *)a2,
                         (char *)a3, NULL };
        return test_run(argv, NULL, err);
}

/* On Apache Kafka the broker's and topics' settings that scripts/kafka takes
 * from the environment reach it from the test's own environment: a test sets
 * TALLY_KAFKA_RETENTION_CHECK_MS, TALLY_KAFKA_SEGMENT_BYTES,
 * TALLY_KAFKA_TOPIC_CONFIG or TALLY_KAFKA_RETENTION_MS before starting
 * (kafka-retention-gap checks retention every 250 ms). */
void test_kafka_start(struct test_kafka *k, const char *dir, int partitions, int nodes)
{
        memset(k, 0, sizeof(*k));
        snprintf(k->dir, sizeof(k->dir), "%s", dir);
        if (nodes <= 0) {
                const char *n = getenv("TALLY_TEST_KAFKA_NODES");
                nodes = n && *n ? atoi(n) : 1;
        }
        k->nodes = nodes;
        char file[600], parts[16];
        snprintf(parts, sizeof(parts), "%d", partitions);
        if (test_kafka_is_apache()) {
                k->apache = 1;
                char *err = NULL;
                setenv("TALLY_KAFKA_BROKERS_N", nodes == 3 ? "3" : "1", 1);
                if (script(k, "start", "--partitions", parts, NULL, &err) != 0) {
                        fprintf(stderr, "FAIL: Apache Kafka did not start in %s: %s\n", dir, err ? err : "");
                        exit(1);
                }
                fprintf(stderr, "%s", err ? err : "");
                free(err);
                snprintf(file, sizeof(file), "%s/bootstrap", dir);
        } else {
                if (nodes != 1) {
                        fprintf(stderr, "FAIL: the development broker has no %d-node cluster: run with "
                                        "TALLY_TEST_KAFKA=apache\n", nodes);
                        exit(1);
                }
                char log[600];
                snprintf(file, sizeof(file), "%s/broker.bootstrap", dir);
                snprintf(log, sizeof(log), "%s/broker.log", dir);
                char *argv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--port", "0", "--partitions", parts,
                                 "--bootstrap-file", file, NULL };
                k->pid = test_spawn(argv, NULL, log);
                if (test_wait_file(file, 10000) < 0) {
                        fprintf(stderr, "FAIL: the development broker did not start (log %s)\n", log);
                        exit(1);
                }
        }
        char *b = test_read_file(file);
        if (!b) {
                fprintf(stderr, "FAIL: no bootstrap list in %s\n", file);
                exit(1);
        }
        snprintf(k->bootstrap, sizeof(k->bootstrap), "%s", b);
        free(b);
}

void test_kafka_stop(struct test_kafka *k)
{
        if (k->apache && test_failures) {
                /* What the topic held, for the failure's reader: the order producers' messages reached it. */
                char *out = NULL;
                char *argv[] = { (char *)test_env("TALLY_KAFKA_SCRIPT"), "dump", k->dir, "usage", NULL };
                test_run(argv, &out, NULL);
                fprintf(stderr, "---- usage topic on Apache Kafka (partition, offset, create time, key, value)\n%s",
                        out ? out : "");
                free(out);
        }
        if (k->apache) {
                script(k, "stop", NULL, NULL, NULL, NULL);
        } else if (k->pid > 0) {
                kill(k->pid, SIGTERM);
                waitpid(k->pid, NULL, 0);
                k->pid = 0;
        }
}

void test_kafka_kill_node(struct test_kafka *k, int node)
{
        char n[16];
        snprintf(n, sizeof(n), "%d", node);
        CHECK(k->apache && script(k, "kill", n, NULL, NULL, NULL) == 0, "could not kill Kafka node %d", node);
}

void test_kafka_restart_node(struct test_kafka *k, int node)
{
        char n[16];
        char *err = NULL;
        snprintf(n, sizeof(n), "%d", node);
        int rc = k->apache ? script(k, "restart", n, NULL, NULL, &err) : -1;
        CHECK(rc == 0, "could not restart Kafka node %d: %s", node, err ? err : "");
        free(err);
}

pid_t test_kafka_node_pid(struct test_kafka *k, int node)
{
        char path[600];
        snprintf(path, sizeof(path), "%s/node.%d/pid", k->dir, node);
        char *s = test_read_file(path);
        pid_t pid = s ? (pid_t)atoi(s) : 0;
        free(s);
        return test_pid_running(pid) ? pid : 0;
}
