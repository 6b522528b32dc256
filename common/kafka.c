/* kafka.c — see kafka.h. */
#include "kafka.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static rd_kafka_t *client_new(rd_kafka_type_t type, const char *const *base, const char *brokers,
                              rd_kafka_conf_t *conf, const char *const *pairs, char *err, size_t errlen)
{
        if (!conf)
                conf = rd_kafka_conf_new();
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
