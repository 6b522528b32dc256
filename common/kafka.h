/* kafka.h — building librdkafka clients the way tally needs them.
 *
 * Producers are idempotent (acks=all, ordered, no duplicates on retry).
 * Topic names: TOPIC_USAGE carries samples and lifecycle events keyed by account;
 * TOPIC_CONTROL carries pause/stop commands to the hosts' vmm daemons. */
#pragma once

#include <librdkafka/rdkafka.h>
#include <stddef.h>

#define TOPIC_USAGE   "usage"
#define TOPIC_CONTROL "control"
/* Every client's default, before kafka_settings (which may change it):
 * partitions added to a topic are produced to and consumed within 30 s, not
 * librdkafka's 5 min (docs/kafka.md, "Adding partitions"). */
#define KAFKA_METADATA_REFRESH "topic.metadata.refresh.interval.ms=30000"

/* Settings every Kafka client of a daemon gets, for production clusters:
 * TLS and SASL (docs/configuration.md, "Kafka security"). Both strings are
 * owned by the daemon's config struct; NULL or "" means none. */
struct kafka_client_settings {
        char *settings;      /* librdkafka "name=value,name=value", e.g. security.protocol=SASL_SSL */
        char *sasl_password; /* sasl.password, kept apart so it can come from the environment alone */
};

/* Applies "name=value,name=value" (commas separate items; a value cannot hold
 * one) to conf. Returns 0, or -EINVAL / -ENOMEM with the reason in err. */
int kafka_conf_set_list(rd_kafka_conf_t *conf, const char *list, char *err, size_t errlen);

/* Applies s (may be NULL) to conf. Returns 0 or -EINVAL with the reason in err. */
int kafka_conf_set_client(rd_kafka_conf_t *conf, const struct kafka_client_settings *s, char *err, size_t errlen);

/* Checks s against a throwaway conf, for a daemon to refuse bad settings at
 * start (exit status 2, like any bad setting). Returns 0 or -EINVAL with the
 * reason in err. */
int kafka_client_settings_check(const struct kafka_client_settings *s, char *err, size_t errlen);

/* Sets each "name=value" of pairs (NULL-terminated, may be NULL) on conf.
 * Returns 0, or -EINVAL with librdkafka's reason in err. */
int kafka_conf_set_all(rd_kafka_conf_t *conf, const char *const *pairs, char *err, size_t errlen);

/* An idempotent producer for brokers, with extra settings in pairs.
 * The caller sets callbacks on a conf of its own by passing conf (consumed, even
 * on failure), or NULL for a fresh one. Returns NULL with the reason in err. */
rd_kafka_t *kafka_producer_new(const char *brokers, rd_kafka_conf_t *conf, const char *const *pairs,
                               char *err, size_t errlen);

/* A consumer in group (auto commit off unless pairs says otherwise). */
rd_kafka_t *kafka_consumer_new(const char *brokers, const char *group, rd_kafka_conf_t *conf,
                               const char *const *pairs, char *err, size_t errlen);
