/* aggregator.h — the usage topic's consumer: fold, rate, ledger, spend limits.
 *
 * One aggregator is one member of a Kafka consumer group on `usage`. Kafka
 * offsets live in Postgres (consumer_offsets) and commit in the same
 * transaction as the usage, fold state, dead letters and alerts they produced;
 * a partition's owner is fenced by a generation bumped at every assignment, so
 * a revoked or lost partition never commits stale work. Several instances
 * share the partitions. It must never exit on bad input: an unusable message
 * becomes a dead letter and the offset moves on. */
#pragma once

#include "kafka.h"

#include <signal.h>
#include <stdint.h>

struct aggregator_config {
        char *database_url;
        char *kafka_brokers;
        struct kafka_client_settings kafka; /* TLS/SASL for the consumer and the control producer */
        char *group;
        int64_t batch_messages;  /* commit after this many messages... */
        int64_t batch_ms;        /* ...or this long after the batch's first */
        int64_t commit_groups;   /* while keeping up, batches take the partitions owned in turn, this many groups */
        char *consumer_settings; /* extra librdkafka consumer settings: name=value,name=value */
        int64_t metrics_port;    /* /metrics on this port; 0: off */
        int64_t keep_stopped_ms; /* a stopped sandbox leaves memory this long after its last commit */
        int64_t keep_idle_ms;    /* any sandbox leaves memory after this long without a commit */
        char *metrics_address;   /* IPv4 address /metrics listens on */
        char *log_level;
        int64_t max_clock_ahead_ms;  /* a reading dated further ahead of our clock is not trusted for time */
        int64_t max_clock_behind_ms; /* ...nor one dated further behind it */
        int64_t provenance_grace_ms; /* a reading without provenance is held this long, then dead-lettered */
};

/* Runs until *stop becomes non-zero, then commits what it holds and leaves
 * the group. Returns 0, or a negative errno when it could not start. */
int aggregator_run(const struct aggregator_config *cfg, volatile sig_atomic_t *stop);
