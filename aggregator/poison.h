/* poison.h — the poison rule (docs/billing.md, "Dead letters"): one bad
 * message never stalls the others. A batch the ledger refuses for its
 * content is retried once as it was; refused again for the same reason it is
 * halved, and halved again while it keeps failing so; a batch of one message
 * refused for that reason is the message at fault and becomes a dead letter
 * (with the batch's first message, batch.h keeps a whole copy of it).
 *
 * Owns the reason of the previous failure and the split batch size. A
 * refusal that is not the content's (connection, deadlock, serialization,
 * resources, a grant the role lacks) is never searched: it is retried. */
#pragma once

#include "batch.h"
#include "ledger.h"
#include "metrics.h"
#include "partitions.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct poison {
        char fail_reason[256];  /* the reason the previous commit failed for, "" if it did not */
        int64_t split_limit;    /* 0, or the batch size while a failing batch is being split */
        int64_t split_left;     /* messages to commit before batches grow back */
};

/* Is the last failure (r, and the ledger's last_error) one the database
 * would repeat for the same batch (its content)? */
bool content_error(const struct ledger *l, int r);

/* After a commit refused for the batch's content, before the batch is
 * cleared: the next step of the rule. Returns 1 when it set a message aside
 * as a dead letter (in a transaction of its own, fenced like any commit),
 * else 0. */
int poison_step(struct poison *po, struct ledger *l, const struct batch *b, struct partitions *parts,
                struct agg_metrics *metrics);

/* After a batch of that many messages committed: batches grow back once the
 * split batch is through, and the previous failure is forgotten. */
void poison_committed(struct poison *po, size_t messages);

/* Is a failing batch being retried or split (batches are then taken whole)? */
bool poison_searching(const struct poison *po);

/* The batch size now: batch_messages, or smaller while a failing batch is
 * being split. */
int64_t batch_limit(const struct poison *po, int64_t batch_messages);
