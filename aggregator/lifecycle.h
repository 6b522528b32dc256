/* lifecycle.h — lifecycle events into the ledger's sandboxes table, inside
 * a batch's transaction (store.h).
 *
 * The `created` events that are the first event of their sandbox in the
 * batch are staged (COPY) and written in one statement, not one each: at
 * 10,000 a batch the statements took 420 ms, a round trip's share and an
 * executor start each. Any other event (a second `created`, `paused`,
 * `resumed`, `stopped`, or a `created` after another event of its sandbox)
 * keeps its place, in batch order, as one statement in the commit's
 * pipeline (lifecycle_send). Written first, the staged ones come before
 * every later event of their sandbox, as they would in order, and before
 * the commit syncs the rows' state and host from the fold: a new sandbox's
 * row is written once, with its `created` event's account and key. */
#pragma once

#include "batch.h"
#include "ledger.h"
#include "text.h"

#include <stdbool.h>
#include <stddef.h>

/* The events of b that are `created` and the first event of their sandbox in
 * the batch (what lifecycle_stage_created writes), in sandbox id order
 * (strcmp's), those before `from` left out: their indexes in *idx (free
 * it), *n of them. 0 or -ENOMEM. */
int lifecycle_first_created(const struct batch *b, size_t from, size_t **idx, size_t *n);

/* Writes the batch's first-of-their-sandbox `created` events (COPY into
 * stage_created, then one upsert), using t as scratch, but for those
 * committed ahead (b->announced). *staged (free it) marks them all per
 * event, *n counts them. 0, or -EIO (last_error says why), -ENOMEM. */
int lifecycle_stage_created(struct ledger *l, const struct batch *b, struct text *t, bool **staged, size_t *n);

/* The rows (stage_created's COPY text, into t) of the `created` events of
 * the open batch b from b->events_scanned on that are the first event of
 * their sandbox in it: what lifecycle_announce commits ahead of the batch.
 * Their indexes in *idx (free it), *n of them. 0 or -ENOMEM. */
int lifecycle_announce_rows(const struct batch *b, struct text *t, size_t **idx, size_t *n);

/* Appends ev's row (a `created` event) to t in stage_created's COPY text.
 * 0 or -ENOMEM. */
int lifecycle_created_row(struct text *t, const struct usage_event *ev);

/* Stages the rows t holds (lifecycle_created_row's) and writes them with the
 * one upsert, in the caller's transaction. 0, or -EIO (last_error says why). */
int lifecycle_write_created(struct ledger *l, const struct text *t);

/* Commits rows (lifecycle_announce_rows) to the sandboxes table in a
 * transaction of their own, ahead of their batch: a `created` event's row
 * says only what the sandbox was made with (never its state or host once
 * written), so writing it again when the batch is read again changes
 * nothing. The batch (lifecycle_stage_created) then skips those marked in
 * b->announced. 0, or -EIO (last_error says why), -ENOMEM. */
int lifecycle_announce(struct ledger *l, const struct text *rows);

/* Sends ev's statement for the sandboxes table in the caller's pipeline:
 * 1; 0 when the event needs none (forked: each copy has its own `created`);
 * -EIO. */
int lifecycle_send(struct ledger *l, const struct usage_event *ev);
