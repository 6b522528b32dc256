/* enforce.h — spend-limit enforcement (DESIGN.md invariant 5): the commands
 * a committed batch asks for (pause or stop a key's sandboxes, keyed by
 * account on the control topic), throttled to one a second per key unless a
 * key was newly blocked, and the producer that publishes them.
 *
 * Which keys are blocked is decided in the ledger, inside the batch's
 * transaction (store.c: the limits and enforce statements); commands are
 * published only after that transaction committed. Owns the control
 * producer and the throttle table. */
#pragma once

#include "control.h"
#include "event.h"
#include "kafka.h"

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct command {
        char key[EVENT_ID_MAX + 1];
        char account[EVENT_ID_MAX + 1];
        enum control_action action;
};

struct key_throttle {
        char key[EVENT_ID_MAX + 1];
        int64_t last_ns;
};

struct enforce {
        rd_kafka_t *producer;
        rd_kafka_topic_t *control;      /* held so its metadata stays known */
        struct key_throttle *throttle;
        size_t nthrottle;
};

/* Creates the control producer and looks the control topic up at once (up
 * to 2 s; a broker not up yet is only logged): librdkafka holds a producer's
 * first message to a topic it has no metadata for until its next metadata
 * request, 250-1,000 ms later, and a key's first pause waited that long.
 * 0, or -EIO (logged). */
int enforce_open(struct enforce *e, const char *brokers, const struct kafka_client_settings *kafka);

/* Publishes the n commands of a committed batch: each key at most once a
 * second, unless the batch newly blocked a key (then all). Failures are
 * logged; the next batch of a still-running key asks again. */
void enforce_publish(struct enforce *e, const struct command *cmds, int n, bool blocked);

/* Serves the producer's delivery reports. */
void enforce_poll(struct enforce *e);

/* Flushes (up to 10 s) and destroys the producer and its topic; NULL-safe parts. */
void enforce_close(struct enforce *e);
