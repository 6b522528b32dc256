/* publish.h — getting samples to Kafka's usage topic, keyed by account, and
 * never losing a final one: the producer, the on-disk spool of final samples
 * (spool.h) re-sent until the broker acknowledges each, the `restarted` event
 * that announces an epoch of the collector's own before any sample under it,
 * and each sandbox's newest sample kept aside while the queue is full.
 *
 * The publisher owns the producer and the spool. It reads the table it is
 * given (never adds or removes) and writes only the pending and announced
 * fields of a sandbox. Delivery reports are served by publisher_poll and
 * publisher_flush, on the caller's thread. */
#pragma once

#include "collector.h"
#include "kafka.h"
#include "sample_batch.h"
#include "spool.h"
#include "table.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A usage batch being built for one partition this tick (format v2). */
struct batch_out {
        uint8_t *buf;                 /* SAMPLE_BATCH_MAX_BYTES, allocated when first used */
        size_t len, count;            /* bytes, samples */
        int64_t wall_base, mono_base; /* its header's */
        char host[EVENT_ID_MAX + 1];  /* its header's */
        char key[EVENT_ID_MAX + 1];   /* the account of its first sample: the message's key */
};

struct publisher {
        rd_kafka_t *rk;
        /* Readable once librdkafka has queued something for publisher_poll
         * (a delivery report, an error): an eventfd its main queue writes to
         * when it stops being empty. -1 until publisher_connect. */
        int wake_fd;
        struct spool spool;
        int64_t queue_max;            /* ordinary samples waiting for the broker, at most */
        const char *host_id;          /* borrowed: used when a record names no host */
        struct collector_metrics *m;  /* borrowed */
        /* librdkafka's queue length (rd_kafka_outq_len) without asking it per sample: it falls only
         * when delivery reports are served (publisher_poll, which reads it again), and each produce
         * adds one. */
        size_t outq;
        size_t npending;              /* sandboxes whose newest sample waits in its pending_buf */
        size_t pending_next;          /* where publish_pending resumes, so no sandbox starves */
        bool fatal;                   /* the producer failed for good */
        /* Format v2 (docs/events.md, "Usage batches"): samples go out in one
         * message per partition per tick, each holding the accounts librdkafka's
         * partitioner sends to that partition. */
        bool v2;
        _Atomic int32_t partitions;   /* usage's partition count as the partitioner last saw it; 0: not yet */
        struct batch_out *out;        /* one per partition, nout of them */
        int32_t nout;
        size_t batched;               /* samples in out, not produced yet */
        size_t batch_messages, batch_samples; /* batches in librdkafka's queue, and their samples */
};

/* Opens the spool under state_dir (loading what an earlier run left); no
 * producer yet. host_id and m are borrowed. Returns 0 or -errno. */
int publisher_open_spool(struct publisher *p, const char *state_dir, const char *host_id,
                         struct collector_metrics *m);

/* Creates the producer (TLS/SASL from opt->kafka). Returns 0 or -EINVAL with
 * a reason in err. */
int publisher_connect(struct publisher *p, const struct collector_options *opt, char *err, size_t errlen);

/* Destroys the producer, closes wake_fd and frees the spool's list (its files stay). */
void publisher_close(struct publisher *p);

/* Publishes buf (an encoded sample of s, len bytes), or keeps it as s's
 * newest sample when the queue is full. */
void publish_sample(struct publisher *p, struct sandbox *s, const char *buf, int len);

/* Format v2: adds s's sample ev to the batch of its account's partition
 * (producing that batch first when it is full). Returns 0, or -EAGAIN when
 * the sample is to go as a v1 message instead (publish_sample): the
 * partition count is not known yet, the queue is full, an epoch
 * announcement could not be queued, or ev does not fit a batch. */
int publish_batched(struct publisher *p, struct sandbox *s, const struct usage_event *ev);

/* Format v2: produces every batch built this tick. A batch the producer
 * refuses is dropped, logged and counted: its samples are cumulative, the
 * next tick's carry the truth. */
void publish_batches(struct publisher *p);

/* Publishes the newest samples kept aside, round robin over t while the
 * queue has room. */
void publish_pending(struct publisher *p, const struct sandbox_table *t);

/* Produces every spooled final not in flight (after its sandbox's epoch
 * announcement, when t still has it). */
void publish_spool(struct publisher *p, const struct sandbox_table *t);

/* Produces s's spooled final e if it is not in flight already. */
void publish_final(struct publisher *p, struct sandbox *s, struct spool_entry *e);

/* Forgets s's kept sample (s leaves the table). */
void publish_forget(struct publisher *p, struct sandbox *s);

/* Serves delivery reports without waiting and updates the queue's gauges. */
void publisher_poll(struct publisher *p);

/* At shutdown: waits up to timeout_ms for the broker to acknowledge what is
 * queued; logs what is left (the spool keeps finals). */
void publisher_flush(struct publisher *p, int timeout_ms);
