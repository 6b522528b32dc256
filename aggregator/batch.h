/* batch.h — what one batch holds until it commits: the usage the fold
 * produced, the sandboxes it changed, the lifecycle events, dead letters and
 * held readings it took, and a whole copy of its first message.
 *
 * The batch owns its events (event_clear), the raw copies in its dead letters
 * and held readings, and the first message's copy; it points at sandboxes the
 * cache owns (which is why nothing is evicted while a batch is open).
 * batch_clear forgets all of it, committed or not. Functions that add return
 * 0 or -ENOMEM, and add nothing on failure. */
#pragma once

#include "cache.h"
#include "event.h"
#include "fold.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Usage of one sandbox and hour: everything the fold reported for that
 * (sandbox, hour) in this batch, summed as it came (so a batch holds one
 * piece per sandbox-hour it touched, however many samples it took). */
struct piece {
        struct sandbox *sb;
        struct fold_usage u;
        size_t prev;            /* the sandbox's piece before this one in the batch, + 1; 0: none */
};

struct dead_letter {
        int32_t partition;
        int64_t offset;
        char *raw;
        size_t len;
        char reason[256];
};

/* A reading waiting for its sandbox's provenance (docs/billing.md,
 * "Provenance"): held in this batch, or a row of held_readings an earlier
 * batch held, read back when an announcement for its sandbox came. */
struct waiting {
        char sandbox[EVENT_ID_MAX + 1];
        int32_t partition;
        int64_t offset;
        char *raw;
        size_t len;
        char reason[200];
        bool stored;            /* a row of held_readings: deleted at commit once done */
        bool reason_moved;      /* held again, for another reason: the row's reason is rewritten */
        bool done;              /* billed or refused in this batch */
};

/* One message as the batch sees it (from Kafka, or read back from held_readings). */
struct raw {
        int32_t partition;
        int64_t offset;
        const void *payload;
        size_t len;
};

struct batch {
        struct piece *pieces;
        size_t npieces, cappieces;
        struct sandbox **dirty;         /* sandboxes whose fold state this batch writes */
        size_t ndirty, capdirty;
        struct usage_event *events;     /* lifecycle events for the sandboxes table */
        size_t nevents, capevents;
        /* Per event: a `created` row committed ahead of the batch, while it
         * was folded (lifecycle_announce); events_scanned: how many of the
         * events were looked at for that. */
        bool *announced;
        size_t capannounced, events_scanned;
        uint64_t gen;                   /* moves on at every batch_clear */
        struct dead_letter *dead;
        size_t ndead, capdead;
        struct waiting *waiting;        /* held readings, this batch's and those read back */
        size_t nwaiting, capwaiting;
        size_t messages;
        int64_t started_ns;             /* monotonic time of its first message */
        struct stamp {                  /* for the latency figures, per sample (docs/operations.md) */
                int64_t kafka_ms;       /* a message's Kafka create time */
                uint32_t samples;       /* what it carried: a usage batch's samples; 1 for any other */
        } *stamps;
        size_t nstamps, capstamps;
        /* The batch's first message, kept whole: a batch of one that the
         * database keeps refusing becomes a dead letter. */
        int32_t first_partition;
        int64_t first_offset;
        char *first_raw;
        size_t first_len, first_cap;
        bool released;                  /* batch_written: pieces and dirty no longer point at live sandboxes */
};

/* Adds usage the fold reported for sb: summed into the batch's piece of
 * (sb, u->hour_ns), or a new piece (peaks: the higher kept). */
int batch_add_piece(struct batch *b, struct sandbox *sb, const struct fold_usage *u);

/* Sets a message aside with why (copied, made valid UTF-8). */
int add_dead(struct batch *b, int32_t partition, int64_t offset, const void *raw, size_t len, const char *why);

/* Lists sb among the sandboxes the batch writes (once). */
int mark_dirty(struct batch *b, struct sandbox *sb);

/* Adds a lifecycle event; on success the batch owns it, on failure the
 * caller still does. */
int batch_add_event(struct batch *b, const struct usage_event *ev);

/* Counts one message taken (with its Kafka timestamp in ms, if > 0). */
void batch_count_message(struct batch *b, int64_t kafka_ms, uint32_t samples);

/* Keeps a whole copy of the batch's first message (see poison.h). */
void keep_first(struct batch *b, const struct raw *m);

/* Once the batch's rows are written out (store_prepare): its sandboxes are set as
 * the ledger holds them once the transaction commits (their row's state and
 * host, their fold state's version), and released, so the next batch can
 * take them while this one commits. Should the commit fail, the caller
 * drops every sandbox (resync): nothing set here outlives a failure. */
void batch_written(struct batch *b, struct sandbox_cache *c, int64_t now_mono_ns);

/* Forgets the batch's content (not the first message's buffer). */
void batch_clear(struct batch *b);

void batch_free(struct batch *b);
