/* partitions.h — the usage topic's partitions this aggregator owns: their
 * generation (the fence), their next offsets, and the gaps in what Kafka
 * still holds.
 *
 * Ownership: claim bumps a partition's generation in consumer_offsets and
 * reads its next offset; every commit moves an offset only where that
 * generation still owns it, so a revoked or lost partition never commits
 * stale work. After a failed commit resync reads the positions back and
 * seeks the consumer to them. Offsets the broker no longer has are recorded
 * in offset_gaps, moved past in the same statement, logged and counted —
 * never a silent reset (docs/billing.md). Hosts that stop sampling are
 * watched through the metering_gaps view.
 *
 * seek_gen grows whenever the consumer's positions are reset (claim, resync,
 * release, an offset reset): messages polled before are stale then.
 * Functions return 0 or a negative errno, and log their failures. */
#pragma once

#include "cache.h"
#include "ledger.h"
#include "metrics.h"

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

struct partition {
        bool owned;
        int64_t generation;
        int64_t position;       /* next offset to process */
        bool touched;           /* moved in this batch */
        int group;              /* its commit group (loop.c): the partitions owned, numbered in order, modulo the groups */
};

struct partitions {
        const char *group;              /* borrowed: the consumer group (consumer_offsets.group_id) */
        rd_kafka_t *consumer;           /* borrowed: seeks, assignments, watermarks */
        struct ledger *ledger;          /* borrowed */
        struct sandbox_cache *cache;    /* borrowed: dropped for partitions claimed, released, resynced */
        struct agg_metrics *metrics;    /* borrowed */
        volatile sig_atomic_t *stop;    /* borrowed: resync gives up once it is set */
        struct partition *parts;        /* by partition number, grown on demand */
        int32_t nparts;
        uint64_t seek_gen;
        int64_t last_gap_log_ns;        /* last metering gap logged */
        struct ledger *watch;           /* borrowed: the connection of check_metering_gaps */
        bool gaps_asked;                /* its query sent, the answer not read yet */
};

/* Partition p's entry (grown to hold it), or NULL (out of range, memory). */
struct partition *part(struct partitions *ps, int32_t p);

/* Claims partitions: bumps their generation, reads their next offsets (moving
 * past offsets the broker lost meanwhile) and sets each tp->offset to it. */
int claim(struct partitions *ps, rd_kafka_topic_partition_list_t *parts);

/* After a failed commit: reads back the positions of what is still owned,
 * seeks there, and forgets every sandbox. Retries until it works or stop is
 * set (-ECANCELED). */
int resync(struct partitions *ps);

/* Revoked or lost partitions: no longer owned; their sandboxes are dropped. */
void release(struct partitions *ps, const rd_kafka_topic_partition_list_t *parts);

/* The consumer found partition pn's position gone from the broker
 * (auto.offset.reset=error). Call once the batch is committed. */
void offset_reset(struct partitions *ps, int32_t pn);

/* Logs and counts hosts with running sandboxes and no recent sample (the
 * metering_gaps view), on the watch connection and without waiting for it:
 * the view reads every running sandbox (17-32 ms at 35,000 of them in
 * `scripts/bench aggregator`, every 5 s), which the loop must not wait
 * for. Call it on every pass: it takes the answer to the question asked
 * once there is one, and with due set asks again (unless the question is
 * still out). */
void check_metering_gaps(struct partitions *ps, bool due);

/* Messages the broker holds beyond those taken, in the partitions owned
 * (of commit group `group` only; PARTITION_GROUP_ALL: in all of them). */
#define PARTITION_GROUP_ALL (-1)
int64_t backlog(struct partitions *ps, int group);

/* Numbers the partitions owned in order and sets each one's group to its
 * number modulo ngroups (>= 1). Call when ownership changes. */
void partitions_group(struct partitions *ps, int ngroups);

/* Marks every partition untouched (the batch was committed or dropped). */
void partitions_untouch(struct partitions *ps);

void partitions_free(struct partitions *ps);
