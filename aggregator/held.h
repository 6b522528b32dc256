/* held.h — held readings (docs/billing.md, "Provenance"): a reading of a
 * sandbox whose `created` event has not come, or under an epoch its host has
 * not announced, waits in the batch's waiting list and, at commit, in the
 * held_readings table, until an announcement lets it be billed (intake.h
 * replays it) or provenance_grace_ms runs out (expire_held dead-letters it).
 *
 * The waiting list belongs to the batch (batch.h); these functions add to
 * it, read held_readings rows back into it, and write it to the ledger.
 * Errors: -ENOMEM, -EIO (logged by query_ok), -EBUSY (see waiting_read). */
#pragma once

#include "batch.h"
#include "ledger.h"
#include "metrics.h"

#include <stdint.h>

/* Adds a reading of this batch to the waiting list (copies m and why). */
int held_add(struct batch *b, const struct raw *m, const char *sandbox, const char *why);

/* A held reading replayed and still held: it waits now for what `why` says
 * (a `created` event came, but not its epoch's announcement), and says so
 * when its grace runs out. */
void rehold(struct batch *b, const struct raw *m, const char *why);

/* Reads the held_readings rows of sandbox, oldest first, into the waiting
 * list (those not there already), marked stored. */
int held_load(struct ledger *l, struct batch *b, const char *sandbox);

/* A held reading: this batch's still waiting goes into held_readings; an
 * earlier batch's now taken leaves it; one held again for another reason has
 * its reason rewritten. waiting_send sends that statement (in the caller's
 * pipeline, store.c) and returns 1, or 0 when w needs none, or -EIO;
 * waiting_read checks its result: 0, -EIO, or -EBUSY when that row is gone
 * (another aggregator took it, or its grace ran out meanwhile): the batch is
 * read again. */
int waiting_send(struct ledger *l, const struct waiting *w);
int waiting_read(struct ledger *l, const struct waiting *w, PGresult *res);

/* Dead-letters the readings held longer than grace_ms (by the database's
 * clock), in one statement: whichever aggregator runs it first moves each
 * row once. Returns how many it moved (0 when the ledger refused). */
uint64_t expire_held(struct ledger *l, int64_t grace_ms, struct agg_metrics *metrics);
