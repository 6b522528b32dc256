/* kafka.c — the Kafka a test runs against: see support.h. */
#include "support.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

int test_kafka_is_apache(void)
{
        const char *k = getenv("TALLY_TEST_KAFKA");
        return k && strcmp(k, "apache") == 0;
}

/* ---- Credentials: see support.h. */

char *test_kafka_password(const char *user)
{
        const char *path = getenv("TALLY_KAFKA_CREDENTIALS");
        FILE *f = path && *path ? fopen(path, "re") : NULL;
        if (!f)
                return NULL;
        char line[512], *pw = NULL;
        size_t n = strlen(user);
        while (!pw && fgets(line, sizeof(line), f)) {
                line[strcspn(line, "\n")] = '\0';
                if (strncmp(line, user, n) == 0 && line[n] == ' ' && line[n + 1])
                        pw = strdup(line + n + 1);
        }
        fclose(f);
        return pw;
}

/* kafka_settings for user, as a daemon takes them (scripts/lib.sh kafka_client_settings says the
 * same for scripts/up's daemons; test_kafka_conf_as sets the same on a conf). */
static void client_settings(char *out, size_t size, const char *user)
{
        snprintf(out, size, "security.protocol=SASL_PLAINTEXT,sasl.mechanisms=PLAIN,sasl.username=%s", user);
}

rd_kafka_conf_t *test_kafka_conf_as(rd_kafka_conf_t *conf, const char *user)
{
        if (!conf)
                conf = rd_kafka_conf_new();
        if (!test_kafka_is_apache())
                return conf;
        char *pw = test_kafka_password(user);
        if (!pw) {
                fprintf(stderr, "FAIL: no Kafka password for %s in TALLY_KAFKA_CREDENTIALS (%s): run through "
                                "scripts/test --kafka apache\n", user, getenv("TALLY_KAFKA_CREDENTIALS") ?: "unset");
                exit(1);
        }
        const char *pairs[][2] = { { "security.protocol", "SASL_PLAINTEXT" }, { "sasl.mechanisms", "PLAIN" },
                                   { "sasl.username", user }, { "sasl.password", pw } };
        char err[256];
        for (size_t i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
                if (rd_kafka_conf_set(conf, pairs[i][0], pairs[i][1], err, sizeof(err)) != RD_KAFKA_CONF_OK) {
                        fprintf(stderr, "FAIL: Kafka client setting %s: %s\n", pairs[i][0], err);
                        exit(1);
                }
        }
        free(pw);
        return conf;
}

rd_kafka_conf_t *test_kafka_conf(rd_kafka_conf_t *conf)
{
        return test_kafka_conf_as(conf, "admin");
}

static const char *program_principal(const char *program)
{
        const char *base = strrchr(program, '/');
        base = base ? base + 1 : program;
        if (strcmp(base, "tally-aggregator") == 0)
                return "aggregator";
        if (strcmp(base, "tally-vmm") == 0 || strcmp(base, "tally-collector") == 0)
                return "host-test";
        return NULL;
}

char **test_kafka_environ(const char *program)
{
        const char *user = program_principal(program);
        if (!test_kafka_is_apache() || !user || getenv("TALLY_KAFKA_SETTINGS"))
                return NULL;
        char *pw = test_kafka_password(user);
        if (!pw)
                return NULL; /* the daemon then fails to authenticate, loudly, in its log */
        size_t n = 0;
        while (environ[n])
                n++;
        char **env = calloc(n + 3, sizeof(*env));
        char settings[256];
        client_settings(settings, sizeof(settings), user);
        if (!env || asprintf(&env[0], "TALLY_KAFKA_SETTINGS=%s", settings) < 0 ||
            asprintf(&env[1], "TALLY_KAFKA_SASL_PASSWORD=%s", pw) < 0)
                abort();
        free(pw);
        for (size_t i = 0; i < n; i++)
                env[i + 2] = environ[i];
        return env;
}

void test_kafka_environ_free(char **env)
{
        if (!env)
                return;
        free(env[0]);
        free(env[1]);
        free(env);
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
                /* Outside scripts/test: this cluster's credentials are the run's. */
                if (!getenv("TALLY_KAFKA_CREDENTIALS") || !*getenv("TALLY_KAFKA_CREDENTIALS")) {
                        snprintf(file, sizeof(file), "%s/credentials", dir);
                        setenv("TALLY_KAFKA_CREDENTIALS", file, 1);
                }
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
