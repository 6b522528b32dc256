/* events.h — the vmm's Kafka side: the producer of lifecycle events (usage
 * topic, keyed by account) and the consumer of the control topic, whose
 * commands it hands to the function given at open on a thread of its own.
 *
 * Lifecycle events are never given up on: delivery retries until the broker
 * takes them, and a `stopped` event's acknowledgement is what lets the tick
 * remove the sandbox's cgroup (sandbox->stop_acked). The producer's delivery
 * callbacks run on whichever thread polls it (events_poll: the tick's). */
#pragma once

#include "control.h"
#include "event.h"
#include "records.h"
#include "vmm.h"

#include <librdkafka/rdkafka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* Carries out one control command; returns how many sandboxes it changed. */
typedef int (*events_apply_fn)(void *arg, const struct control_command *c);

struct events {
        rd_kafka_t *producer;
        rd_kafka_t *consumer;
        struct records *table;           /* borrowed: whose sandboxes' stop_acked the deliveries set */
        events_apply_fn apply;
        void *apply_arg;
        pthread_t control_thread;
        bool control_started;
        atomic_bool quit;                /* ends the control thread */
        atomic_bool control_ready;       /* the control topic's partitions are assigned */
};

/* Opens the producer and subscribes the consumer (group tally-vmm-<host>) to
 * the control topic; starts nothing. table must outlive e. Returns 0 or
 * -errno with the reason in err; on failure e holds nothing to free. */
int events_open(struct events *e, const struct vmm_settings *s, struct records *table, events_apply_fn apply,
                void *apply_arg, char *err, size_t errlen);
/* Starts the thread that reads the control topic. 0 or -EAGAIN. */
int events_start_control(struct events *e);
/* Ends the control thread and closes the consumer. */
void events_stop_control(struct events *e);
/* Serves the producer's delivery callbacks, waiting up to timeout_ms. */
void events_poll(struct events *e, int timeout_ms);
/* Waits up to timeout_ms for queued events to reach the broker; logs what is left. */
void events_flush(struct events *e, int64_t timeout_ms);
/* As events_flush, then gives up what is still queued (a stopped event lost
 * here is published again by the next run: its record says stopped). */
void events_flush_or_purge(struct events *e, int64_t timeout_ms);
/* Destroys the producer (after events_stop_control). Accepts an e never opened. */
void events_free(struct events *e);

/* Fills the fields every lifecycle event of rec shares; its time is the moment m. */
void event_from_record(struct usage_event *ev, enum event_type type, const struct sandbox_record *rec,
                       const struct moment *m);
/* Queues ev keyed by its account. For a stopped event (track_stop), the
 * sandbox's stop_acked is set when the broker acknowledges it. 0 or -errno
 * (logged). */
int events_publish(struct events *e, const struct usage_event *ev, bool track_stop);
/* The sandbox's paused or resumed event at its moment. */
void events_publish_simple(struct events *e, struct sandbox *sb, enum event_type type);
/* Its created event, with its spec and labels, at its created moment (also
 * when published again after a restart). */
void events_publish_created(struct events *e, struct sandbox *sb);
/* Its stopped event: the final counter, its epoch and the final held totals,
 * everything the aggregator needs to close the bill without the collector. */
void events_publish_stopped(struct events *e, struct sandbox *sb);
