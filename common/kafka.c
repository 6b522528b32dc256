/* kafka.c — see kafka.h. */
#include "kafka.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

int kafka_conf_set_all(rd_kafka_conf_t *conf, const char *const *pairs, char *err, size_t errlen)
{
        for (; pairs && *pairs; pairs++) {
                char name[128];
                const char *eq = strchr(*pairs, '=');
                if (!eq || (size_t)(eq - *pairs) >= sizeof(name)) {
                        snprintf(err, errlen, "bad Kafka setting \"%s\" (want name=value)", *pairs);
                        return -EINVAL;
                }
                memcpy(name, *pairs, (size_t)(eq - *pairs));
                name[eq - *pairs] = '\0';
                if (rd_kafka_conf_set(conf, name, eq + 1, err, errlen) != RD_KAFKA_CONF_OK)
                        return -EINVAL;
        }
        return 0;
}

int kafka_conf_set_list(rd_kafka_conf_t *conf, const char *list, char *err, size_t errlen)
{
        if (!list || !*list)
                return 0;
        char *copy = strdup(list);
        if (!copy) {
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        int r = 0;
        char *save = NULL;
        for (char *item = strtok_r(copy, ",", &save); item && r == 0; item = strtok_r(NULL, ",", &save)) {
                const char *pairs[] = { item, NULL };
                r = kafka_conf_set_all(conf, pairs, err, errlen);
        }
        free(copy);
        return r;
}

int kafka_conf_set_client(rd_kafka_conf_t *conf, const struct kafka_client_settings *s, char *err, size_t errlen)
{
        if (!s)
                return 0;
        int r = kafka_conf_set_list(conf, s->settings, err, errlen);
        if (r == 0 && s->sasl_password && *s->sasl_password &&
            rd_kafka_conf_set(conf, "sasl.password", s->sasl_password, err, errlen) != RD_KAFKA_CONF_OK)
                r = -EINVAL;
        return r;
}

int kafka_client_settings_check(const struct kafka_client_settings *s, char *err, size_t errlen)
{
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        int r = kafka_conf_set_client(conf, s, err, errlen);
        rd_kafka_conf_destroy(conf);
        return r;
}

/* librdkafka 2.0 (Debian 12's) sleeps its main thread ("rdk:main") until the
 * next of its timers in whole milliseconds rounded down, then serves its queue
 * with a timeout of 0 in a loop until the timer is due: up to a millisecond of
 * busy waiting at every timer (later releases round the sleep up). Its
 * 1-second timer alone cost 837-924 us of CPU a second in an idle
 * tally-collector (the thread's /proc/PID/task/TID/schedstat over 15-20 s),
 * as much again as the collector's own idle loop, in every tally daemon's
 * every client. With a timer slack of 5 ms on that thread the kernel may end
 * its sleep up to 5 ms late, past the timer, and the loop finds it due:
 * 29-105 us a second. Its timers are housekeeping (that 1 s scan, metadata
 * refreshes, group heartbeats, the idempotent producer's id), to which 5 ms
 * late is nothing; an operation queued for it still wakes it at once. */
#define MAIN_THREAD_TIMER_SLACK_NS 5000000

static rd_kafka_resp_err_t on_thread_start(rd_kafka_t *rk, rd_kafka_thread_type_t type, const char *name, void *opaque)
{
        (void)rk, (void)name, (void)opaque;
        if (type == RD_KAFKA_THREAD_MAIN)
                prctl(PR_SET_TIMERSLACK, MAIN_THREAD_TIMER_SLACK_NS, 0, 0, 0);
        return RD_KAFKA_RESP_ERR_NO_ERROR;
}

static rd_kafka_resp_err_t on_new(rd_kafka_t *rk, const rd_kafka_conf_t *conf, void *opaque, char *err, size_t errlen)
{
        (void)conf, (void)opaque, (void)err, (void)errlen;
        return rd_kafka_interceptor_add_on_thread_start(rk, "tally-main-thread-slack", on_thread_start, NULL);
}

static rd_kafka_t *client_new(rd_kafka_type_t type, const char *const *base, const char *brokers,
                              rd_kafka_conf_t *conf, const char *const *pairs, char *err, size_t errlen)
{
        if (!conf)
                conf = rd_kafka_conf_new();
        rd_kafka_resp_err_t e = rd_kafka_conf_interceptor_add_on_new(conf, "tally-main-thread-slack", on_new, NULL);
        if (e && e != RD_KAFKA_RESP_ERR__CONFLICT) { /* (a conflict: this configuration has it already) */
                snprintf(err, errlen, "could not add an interceptor: %s", rd_kafka_err2str(e));
                rd_kafka_conf_destroy(conf);
                return NULL;
        }
        if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, errlen) != RD_KAFKA_CONF_OK ||
            kafka_conf_set_all(conf, base, err, errlen) < 0 || kafka_conf_set_all(conf, pairs, err, errlen) < 0) {
                rd_kafka_conf_destroy(conf);
                return NULL;
        }
        rd_kafka_t *rk = rd_kafka_new(type, conf, err, errlen);
        if (!rk)
                rd_kafka_conf_destroy(conf);
        return rk;
}

rd_kafka_t *kafka_producer_new(const char *brokers, rd_kafka_conf_t *conf, const char *const *pairs,
                               char *err, size_t errlen)
{
        static const char *const base[] = { "enable.idempotence=true", "linger.ms=5", NULL };
        return client_new(RD_KAFKA_PRODUCER, base, brokers, conf, pairs, err, errlen);
}

rd_kafka_t *kafka_consumer_new(const char *brokers, const char *group, rd_kafka_conf_t *conf,
                               const char *const *pairs, char *err, size_t errlen)
{
        static const char *const base[] = { "enable.auto.commit=false", "enable.auto.offset.store=false",
                                            "auto.offset.reset=earliest", NULL };
        if (!conf)
                conf = rd_kafka_conf_new();
        if (rd_kafka_conf_set(conf, "group.id", group, err, errlen) != RD_KAFKA_CONF_OK) {
                rd_kafka_conf_destroy(conf);
                return NULL;
        }
        rd_kafka_t *rk = client_new(RD_KAFKA_CONSUMER, base, brokers, conf, pairs, err, errlen);
        if (rk)
                rd_kafka_poll_set_consumer(rk);
        return rk;
}
