/* announce.h — the `created` rows of the open batch, committed ahead of it
 * by the idle writer while the batch is still being folded (the loop's
 * thread calls these; lifecycle.h says why writing them early is safe).
 * A batch of 5,000 new sandboxes spent 47 ms of its commit on them (a
 * staging COPY and an upsert of 5,000 rows), every sample of the batch
 * waiting; committed ahead, the batch skips them (batch.h: announced). */
#pragma once

#include "batch.h"
#include "ledger.h"
#include "writer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct announcer {
        bool running;           /* the writer holds an announcement */
        struct batch *batch;    /* whose events, at which generation */
        uint64_t gen;
        size_t *idx, n;         /* the events' indexes in it */
        int64_t t0;
};

/* When ANNOUNCE_MIN events or more came into b since it was last looked at,
 * and at least as many as were looked at before (each look sorts all of b's
 * events: a batch of n events is looked at log2(n) times at most, not n/64):
 * the rows of its `created` events among them that are the first event of
 * their sandbox in b (lifecycle_announce_rows) go to the writer, which must
 * be idle, to commit on l. */
#define ANNOUNCE_MIN 64
/* Not while catching up (the batch's newest message was produced more than
 * ANNOUNCE_BEHIND_MS ago): its samples are late already, and the writer's
 * time goes to the commits that catch up. (In `scripts/bench aggregator`'s
 * preload of 10,000 created events, rows ahead made one run take five
 * batches, 740,230 samples/s against 1,135,063-1,326,772 without.) */
#define ANNOUNCE_BEHIND_MS 1000
void announce_start(struct announcer *an, struct writer *w, struct ledger *l, struct batch *b);

/* Waits for the announcement the writer holds, if any; once through, its
 * events are marked in their batch (unless the batch was cleared since). A
 * failure is only logged: the batch writes those rows itself. */
void announce_settle(struct announcer *an, struct writer *w);
