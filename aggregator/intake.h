/* intake.h — taking each message into the batch: decode it, fold a reading
 * into its sandbox's state (fold.h), take a `created` or `restarted`
 * announcement, and hold what has no provenance yet (held.h), replaying it
 * once its announcement comes (docs/billing.md, "Provenance").
 *
 * A message never fails on its content: what cannot be billed becomes a
 * dead letter in the batch. take_message fails (-ENOMEM, -EIO, -EPROTO) only
 * when memory or the ledger fails; the caller then drops the batch and reads
 * it again. The intake owns nothing but the rate limits of its log notes; it
 * borrows the cache, batch, partitions and ledger of the aggregator. */
#pragma once

#include "batch.h"
#include "cache.h"
#include "ledger.h"
#include "metrics.h"
#include "partitions.h"

#include <librdkafka/rdkafka.h>
#include <stdint.h>

struct intake {
        struct sandbox_cache *cache;
        struct batch *batch;
        struct partitions *parts;
        struct ledger *ledger;
        struct agg_metrics *metrics;
        int64_t max_ahead_ns, max_behind_ns; /* readings dated further off our clock are placed at it */
        /* Rate limits of the fold's notes in the log (its counts are in metrics). */
        int64_t note_logged_ns[3];
        uint64_t note_suppressed[3];
        struct aside *aside; /* while a usage batch's samples are taken (intake.c) */
        int64_t now_wall_ns; /* our clock, read once per message: a usage batch's samples share it */
};

/* Takes one message of a partition this aggregator owns (others, and those
 * before its position, are skipped) into the batch, and moves the
 * partition's position past it. */
int take_message(struct intake *it, const rd_kafka_message_t *m);
