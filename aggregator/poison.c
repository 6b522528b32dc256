/* poison.c — see poison.h. */
#include "poison.h"

#include "log.h"
#include "store.h"
#include "text.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Is the last failure one the database would repeat for the same batch (its
 * content), rather than the connection, a deadlock, a serialization conflict,
 * the server's resources or a right the aggregator's role lacks (42501: the
 * set-up's fault, retried until an administrator grants it, never a message
 * set aside)? Only those are searched for a poison message. */
bool content_error(const struct ledger *l, int r)
{
        if (r != -EIO || !l->db || PQstatus(l->db) != CONNECTION_OK || !l->last_error[0])
                return false;
        if (strncmp(l->last_error, "42501", 5) == 0)
                return false;
        static const char *const transient[] = { "08", "40", "53", "55", "57", "58", "XX", "??" };
        for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
                if (strncmp(l->last_error, transient[i], 2) == 0)
                        return false;
        return true;
}

/* The batch was one message and the database refused it twice for the same
 * reason: it goes to dead_letters with that reason, and its partition's
 * offset moves past it, in one transaction (fenced like any commit). */
static int dead_letter_alone(struct ledger *l, const struct batch *b, struct partitions *ps,
                             struct agg_metrics *metrics, const char *reason)
{
        struct partition *p = part(ps, b->first_partition);
        if (!p || !p->owned)
                return -ESTALE;
        struct dead_letter d = { .partition = b->first_partition, .offset = b->first_offset, .raw = b->first_raw,
                                 .len = b->first_len };
        char why[sizeof(d.reason)];
        snprintf(why, sizeof(why), "database refused: %s", reason);
        utf8_copy(d.reason, sizeof(d.reason), why);
        PGresult *res = PQexec(l->db, "BEGIN");
        int r = query_ok(l, res, PGRES_COMMAND_OK, "begin");
        PQclear(res);
        if (r < 0)
                return r;
        if ((r = store_dead(l, &d)) == 0) {
                char pn[16], o[32], next[32], g[32];
                snprintf(pn, sizeof(pn), "%d", d.partition);
                snprintf(o, sizeof(o), "%" PRId64, d.offset);
                snprintf(next, sizeof(next), "%" PRId64, d.offset + 1);
                snprintf(g, sizeof(g), "%" PRId64, p->generation);
                const char *params[] = { ps->group, pn, o, next, g };
                res = PQexecParams(l->db,
                                   "UPDATE consumer_offsets SET next_offset = $4, updated_at = now()"
                                   " WHERE group_id = $1 AND topic = 'usage' AND partition = $2 AND next_offset = $3"
                                   "   AND generation = $5",
                                   5, NULL, params, NULL, NULL, 0);
                r = query_ok(l, res, PGRES_COMMAND_OK, "offsets");
                if (r == 0 && atoi(PQcmdTuples(res)) != 1)
                        r = -ESTALE;
                PQclear(res);
        }
        res = PQexec(l->db, r == 0 ? "COMMIT" : "ROLLBACK");
        if (r == 0)
                r = query_ok(l, res, PGRES_COMMAND_OK, "commit");
        PQclear(res);
        if (r == 0)
                atomic_fetch_add_explicit(&metrics->dead_letters[AGG_DEAD_DATABASE], 1, memory_order_relaxed);
        return r;
}

/* After a commit the database refused for the batch's content (the poison
 * rule, docs/billing.md "Dead letters"): the first failure is retried as it
 * was; a batch that fails again for the same reason is halved, and halved
 * again while it keeps failing so; a batch of one message that fails for
 * that reason is the message at fault and becomes a dead letter. Called
 * before the batch is cleared. */
int poison_step(struct poison *po, struct ledger *l, const struct batch *b, struct partitions *parts,
                struct agg_metrics *metrics)
{
        char reason[sizeof(l->last_error)];
        memcpy(reason, l->last_error, sizeof(reason));
        bool same = strcmp(reason, po->fail_reason) == 0;
        char q[600];
        if (same && b->messages == 1 && b->first_raw) {
                int r = dead_letter_alone(l, b, parts, metrics, reason);
                if (r == 0) {
                        log_error("message the ledger keeps refusing set aside as a dead letter",
                                  "partition=%d offset=%" PRId64 " reason=%s", b->first_partition, b->first_offset,
                                  log_quote(q, sizeof(q), reason));
                        po->fail_reason[0] = '\0';
                        po->split_limit = po->split_left = 0;
                } else {
                        log_error("could not set a refused message aside", "partition=%d offset=%" PRId64,
                                  b->first_partition, b->first_offset);
                }
                return r == 0;
        }
        if (same && b->messages > 1) {
                po->split_limit = (int64_t)b->messages / 2;
                if (po->split_left < (int64_t)b->messages)
                        po->split_left = (int64_t)b->messages;
                atomic_fetch_add_explicit(&metrics->batch_splits, 1, memory_order_relaxed);
                log_warn("batch refused twice for the same reason; splitting it", "messages=%zu next_batch=%" PRId64
                         " reason=%s", b->messages, po->split_limit, log_quote(q, sizeof(q), reason));
                return 0;
        }
        memcpy(po->fail_reason, reason, sizeof(po->fail_reason));
        return 0;
}

void poison_committed(struct poison *po, size_t messages)
{
        if (po->split_limit) {
                po->split_left -= (int64_t)messages;
                if (po->split_left <= 0) {
                        po->split_limit = po->split_left = 0;
                        po->fail_reason[0] = '\0';
                }
        } else {
                po->fail_reason[0] = '\0';
        }
}

int64_t batch_limit(const struct poison *po, int64_t batch_messages)
{
        return po->split_limit ? po->split_limit : batch_messages;
}

bool poison_searching(const struct poison *po)
{
        return po->fail_reason[0] || po->split_limit;
}
