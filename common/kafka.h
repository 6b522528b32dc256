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
