/* Unit tests of common/kafka.c's settings: what a daemon's kafka_settings and
 * kafka_sasl_password say reaches librdkafka, and a bad setting is refused
 * with librdkafka's own reason (the daemon then stops at start). The values
 * are read back from librdkafka's conf, not from tally's structs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "config.h"
#include "kafka.h"

#include <dirent.h>
#include <stdbool.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

static void get(rd_kafka_conf_t *conf, const char *name, char *buf, size_t size)
{
        size_t n = size;
        assert_int_equal(rd_kafka_conf_get(conf, name, buf, &n), RD_KAFKA_CONF_OK);
}

static void test_security_settings_reach_librdkafka(void **state)
{
        (void)state;
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        char err[512], v[256];
        struct kafka_client_settings s = {
                .settings = "security.protocol=sasl_plaintext,sasl.mechanisms=SCRAM-SHA-512,sasl.username=tally-collector",
                .sasl_password = "s3cret,with=comma",
        };
        assert_int_equal(kafka_conf_set_client(conf, &s, err, sizeof(err)), 0);
        get(conf, "security.protocol", v, sizeof(v));
        assert_string_equal(v, "sasl_plaintext");
        get(conf, "sasl.mechanisms", v, sizeof(v));
        assert_string_equal(v, "SCRAM-SHA-512");
        get(conf, "sasl.username", v, sizeof(v));
        assert_string_equal(v, "tally-collector");
        get(conf, "sasl.password", v, sizeof(v));
        assert_string_equal(v, "s3cret,with=comma");
        rd_kafka_conf_destroy(conf);
}

static void test_empty_and_null_change_nothing(void **state)
{
        (void)state;
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        char err[512], before[64], after[64];
        get(conf, "security.protocol", before, sizeof(before));
        struct kafka_client_settings empty = { "", "" };
        assert_int_equal(kafka_conf_set_client(conf, NULL, err, sizeof(err)), 0);
        assert_int_equal(kafka_conf_set_client(conf, &empty, err, sizeof(err)), 0);
        get(conf, "security.protocol", after, sizeof(after));
        assert_string_equal(before, after);
        rd_kafka_conf_destroy(conf);
}

static void test_bad_settings_are_refused_with_a_reason(void **state)
{
        (void)state;
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        char err[512] = "";
        struct kafka_client_settings unknown = { "security.protocol=ssl,no.such.setting=1", NULL };
        assert_int_equal(kafka_conf_set_client(conf, &unknown, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "no.such.setting"));
        struct kafka_client_settings bad_value = { "security.protocol=carrier-pigeon", NULL };
        err[0] = '\0';
        assert_int_equal(kafka_conf_set_client(conf, &bad_value, err, sizeof(err)), -EINVAL);
        assert_true(strlen(err) > 0);
        struct kafka_client_settings no_equals = { "security.protocol", NULL };
        err[0] = '\0';
        assert_int_equal(kafka_conf_set_client(conf, &no_equals, err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "name=value"));
        rd_kafka_conf_destroy(conf);
}

/* The settings table entries: both settings exist, default to empty, and
 * land in the struct the daemon passes to kafka_conf_set_client. */
struct cfg {
        struct kafka_client_settings kafka;
};

static const struct setting table[] = {
        SETTING_KAFKA_CLIENT(struct cfg, kafka),
        SETTINGS_END,
};

static void test_settings_table(void **state)
{
        (void)state;
        static const struct program_info prog = { "tally-test", "a test", "[options]", NULL };
        struct cfg c = { 0 };
        char err[256];
        char *argv[] = { "tally-test", "--kafka-settings=security.protocol=ssl", NULL };
        setenv("TALLY_KAFKA_SASL_PASSWORD", "from-env", 1);
        assert_int_equal(config_load(&prog, table, &c, 2, argv, NULL, err, sizeof(err)), 0);
        unsetenv("TALLY_KAFKA_SASL_PASSWORD");
        assert_string_equal(c.kafka.settings, "security.protocol=ssl");
        assert_string_equal(c.kafka.sasl_password, "from-env");
        config_free(table, &c);
}

/* The timer slack of this process's thread named name, in ns; -1 when it has none. */
static long thread_slack(const char *name)
{
        DIR *d = opendir("/proc/self/task");
        assert_non_null(d);
        long slack = -1;
        for (struct dirent *e; slack < 0 && (e = readdir(d));) {
                char path[300], comm[64] = "";
                snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
                FILE *f = fopen(path, "r");
                if (!f)
                        continue;
                bool match = fgets(comm, sizeof(comm), f) && strcspn(comm, "\n") == strlen(name) &&
                             strncmp(comm, name, strlen(name)) == 0;
                fclose(f);
                snprintf(path, sizeof(path), "/proc/%s/timerslack_ns", e->d_name); /* (a thread's id works there) */
                if (match && (f = fopen(path, "r"))) {
                        assert_int_equal(fscanf(f, "%ld", &slack), 1);
                        fclose(f);
                }
        }
        closedir(d);
        return slack;
}

/* Every client's librdkafka main thread sleeps with a 5 ms timer slack
 * (common/kafka.c: librdkafka 2.0 busy-waits up to a millisecond before each
 * of its timers otherwise); the thread that made the client keeps its own. */
static void test_main_thread_timer_slack(void **state)
{
        (void)state;
        char err[512];
        long own = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
        /* No broker needed: librdkafka starts its threads at once and connects in the background. */
        rd_kafka_t *producer = kafka_producer_new("127.0.0.1:9", NULL, NULL, err, sizeof(err));
        assert_non_null(producer);
        assert_int_equal(thread_slack("rdk:main"), 5000000);
        rd_kafka_destroy(producer);
        assert_int_equal(thread_slack("rdk:main"), -1); /* (gone with its client) */
        rd_kafka_t *consumer = kafka_consumer_new("127.0.0.1:9", "slack-test", NULL, NULL, err, sizeof(err));
        assert_non_null(consumer);
        assert_int_equal(thread_slack("rdk:main"), 5000000);
        rd_kafka_destroy(consumer);
        assert_int_equal(prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0), own);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_security_settings_reach_librdkafka),
                cmocka_unit_test(test_empty_and_null_change_nothing),
                cmocka_unit_test(test_bad_settings_are_refused_with_a_reason),
                cmocka_unit_test(test_settings_table),
                cmocka_unit_test(test_main_thread_timer_slack),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
