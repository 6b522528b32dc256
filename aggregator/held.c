/* held.c — see held.h. */
#include "held.h"

#include "log.h"
#include "text.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int held_add(struct batch *b, const struct raw *m, const char *sandbox, const char *why)
{
        if (grow((void **)&b->waiting, &b->capwaiting, b->nwaiting + 1, sizeof(*b->waiting)) < 0)
                return -ENOMEM;
        struct waiting *w = &b->waiting[b->nwaiting];
        *w = (struct waiting){ .partition = m->partition, .offset = m->offset, .len = m->len };
        if (!(w->raw = malloc(m->len ? m->len : 1)))
                return -ENOMEM;
        if (m->len)
                memcpy(w->raw, m->payload, m->len);
        snprintf(w->sandbox, sizeof(w->sandbox), "%s", sandbox);
        utf8_copy(w->reason, sizeof(w->reason), why);
        b->nwaiting++;
        return 0;
}

/* A held reading replayed and still held: it waits now for what `why` says
 * (a `created` event came, but not its epoch's announcement), and says so
 * when its grace runs out. */
void rehold(struct batch *b, const struct raw *m, const char *why)
{
        for (size_t i = 0; i < b->nwaiting; i++) {
                struct waiting *w = &b->waiting[i];
                if (w->partition != m->partition || w->offset != m->offset || strcmp(w->reason, why) == 0)
                        continue;
                utf8_copy(w->reason, sizeof(w->reason), why);
                w->reason_moved = true;
        }
}

int held_load(struct ledger *l, struct batch *b, const char *sandbox)
{
        if (db_ensure(l) < 0)
                return -EIO;
        const char *params[] = { sandbox };
        PGresult *res = ledger_exec(l, STMT_HELD_READ, 1, params, NULL, NULL);
        int r = query_ok(l, res, PGRES_TUPLES_OK, "held readings");
        size_t first_new = b->nwaiting;
        for (int i = 0; r == 0 && i < PQntuples(res); i++) {
                int32_t p = (int32_t)strtol(PQgetvalue(res, i, 0), NULL, 10);
                int64_t o = strtoll(PQgetvalue(res, i, 1), NULL, 10);
                bool have = false;
                for (size_t k = 0; k < first_new && !have; k++)
                        have = b->waiting[k].stored && b->waiting[k].partition == p && b->waiting[k].offset == o;
                if (have)
                        continue;
                size_t len = 0;
                unsigned char *raw = PQunescapeBytea((const unsigned char *)PQgetvalue(res, i, 2), &len);
                if (!raw || grow((void **)&b->waiting, &b->capwaiting, b->nwaiting + 1, sizeof(*b->waiting)) < 0) {
                        PQfreemem(raw);
                        r = -ENOMEM;
                        break;
                }
                struct waiting *w = &b->waiting[b->nwaiting];
                *w = (struct waiting){ .partition = p, .offset = o, .len = len, .stored = true };
                if (!(w->raw = malloc(len ? len : 1))) {
                        PQfreemem(raw);
                        r = -ENOMEM;
                        break;
                }
                memcpy(w->raw, raw, len);
                PQfreemem(raw);
                snprintf(w->sandbox, sizeof(w->sandbox), "%s", sandbox);
                utf8_copy(w->reason, sizeof(w->reason), PQgetvalue(res, i, 3));
                b->nwaiting++;
        }
        PQclear(res);
        return r;
}

int waiting_send(struct ledger *l, const struct waiting *w)
{
        if (w->stored != w->done && !(w->stored && w->reason_moved))
                return 0; /* an earlier batch's still waiting, or this batch's already taken */
        char p[16], o[32];
        snprintf(p, sizeof(p), "%d", w->partition);
        snprintf(o, sizeof(o), "%" PRId64, w->offset);
        int sent;
        if (w->stored && !w->done) {
                const char *params[] = { p, o, w->reason };
                sent = ledger_send(l, STMT_HELD_REASON, 3, params, NULL, NULL);
        } else if (w->stored) {
                const char *params[] = { p, o };
                sent = ledger_send(l, STMT_HELD_DELETE, 2, params, NULL, NULL);
        } else {
                const char *params[] = { p, o, w->sandbox, w->raw, w->reason };
                int lens[] = { 0, 0, 0, (int)w->len, 0 };
                int fmts[] = { 0, 0, 0, 1, 0 };
                sent = ledger_send(l, STMT_HELD_INSERT, 5, params, lens, fmts);
        }
        return sent;
}

int waiting_read(struct ledger *l, const struct waiting *w, PGresult *res)
{
        int r = query_ok(l, res, PGRES_COMMAND_OK, "held reading");
        if (r == 0 && w->stored && atoi(PQcmdTuples(res)) != 1)
                r = -EBUSY;
        if (r == 0 && !w->stored) {
                char q[600];
                log_info("reading held: its sandbox's provenance is not known yet", "sandbox=%s partition=%d offset=%"
                         PRId64 " reason=%s", w->sandbox, w->partition, w->offset,
                         log_quote(q, sizeof(q), w->reason));
        }
        return r;
}

/* Dead-letters the readings held longer than provenance_grace_ms (by the
 * database's clock), in one statement: whichever aggregator runs it first
 * moves each row once. */
uint64_t expire_held(struct ledger *l, int64_t grace_ms, struct agg_metrics *metrics)
{
        if (db_ensure(l) < 0)
                return 0;
        uint64_t expired = 0;
        char grace[32];
        snprintf(grace, sizeof(grace), "%" PRId64, grace_ms);
        const char *params[] = { grace };
        PGresult *res = PQexecParams(
                l->db,
                "WITH gone AS (DELETE FROM held_readings WHERE held_at < now() - $1::bigint * interval '1 millisecond'"
                "  RETURNING partition, \"offset\", sandbox_id, raw, reason)"
                " INSERT INTO dead_letters (topic, partition, \"offset\", raw, reason)"
                " SELECT 'usage', partition, \"offset\", raw, reason || ' (held ' || $1 || ' ms)' FROM gone"
                " ON CONFLICT DO NOTHING RETURNING partition, \"offset\", reason",
                1, NULL, params, NULL, NULL, 0);
        if (query_ok(l, res, PGRES_TUPLES_OK, "expire held readings") == 0) {
                for (int i = 0; i < PQntuples(res); i++) {
                        char q[600];
                        log_warn("held reading dead-lettered: no provenance within the grace period",
                                 "partition=%s offset=%s reason=%s", PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
                                 log_quote(q, sizeof(q), PQgetvalue(res, i, 2)));
                }
                atomic_fetch_add_explicit(&metrics->readings_expired, (uint64_t)PQntuples(res), memory_order_relaxed);
                atomic_fetch_add_explicit(&metrics->dead_letters[AGG_DEAD_DECODE], (uint64_t)PQntuples(res),
                                          memory_order_relaxed);
                expired = (uint64_t)PQntuples(res);
        }
        PQclear(res);
        return expired;
}
