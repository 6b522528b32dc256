/* store.c — see store.h. */
#include "store.h"

#include "held.h"
#include "lifecycle.h"
#include "log.h"
#include "text.h"
#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The fold state of the batch's sandboxes, fenced per sandbox: a row is
 * written only where its version is still the one this aggregator read, so
 * the count tells whether another owner moved any of them on meanwhile.
 * In id order (strcmp's: store_prepare sorts the rows, and a COPY's rows
 * scan back in the order they came; an ORDER BY here sorted 5,000 rows
 * again in 3.5 ms): two aggregators sharing sandboxes lock their rows in
 * one order. */
static const char *const fold_sql =
        "WITH w AS (INSERT INTO fold_state AS f (sandbox_id, account_id, key_id, fold, version, stopped)"
        "  SELECT sandbox_id, account_id, key_id, fold, version + 1, stopped FROM stage_fold"
        "  ON CONFLICT (sandbox_id) DO UPDATE SET account_id = EXCLUDED.account_id, key_id = EXCLUDED.key_id,"
        "   fold = EXCLUDED.fold, version = EXCLUDED.version, stopped = EXCLUDED.stopped, updated_at = now()"
        "   WHERE f.version = EXCLUDED.version - 1 RETURNING 1)"
        " SELECT count(*) FROM w";

/* Per host, when a collector's sample of it was last committed (in host
 * order, so that aggregators sharing a host lock its row in one order):
 * lifecycle events and the vmm's `stopped` event are not samples, and a host
 * whose collector is down must not look metered because its vmm still talks. */
static const char *const hosts_sql =
        "INSERT INTO hosts AS h (host, last_sample_at, last_sample_wall)"
        " SELECT host, now(), max(wall) FROM stage_fold WHERE host <> '' AND sampled GROUP BY host ORDER BY host"
        " ON CONFLICT (host) DO UPDATE SET last_sample_at = EXCLUDED.last_sample_at,"
        "  last_sample_wall = greatest(h.last_sample_wall, EXCLUDED.last_sample_wall)";

/* Everything a batch writes from its staging tables, in one round trip.
 * First the limit waivers (docs/billing.md, "Daily spend limits"): the paused
 * storage of a sandbox a standing `pause` block of its key found running
 * (limit_waivers), in hours of that blocked day, moves to the waived column,
 * so neither usage_hourly's storage nor the rating below charges it. */
static const char *const apply_sql =
        "UPDATE stage_usage u SET storage_waived_byte_ns = u.storage_byte_ns, storage_byte_ns = 0"
        "  FROM limit_waivers w JOIN key_blocks b ON b.key_id = w.key_id AND b.day = w.day"
        " WHERE u.storage_byte_ns > 0 AND w.sandbox_id = u.sandbox_id AND w.key_id = u.key_id"
        "   AND w.day = (spend_day(u.account_id, u.hour)).day;"
        "INSERT INTO usage_hourly AS u (sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns,"
        "  storage_byte_ns, mem_peak_bytes, storage_waived_byte_ns)"
        " SELECT sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns, storage_byte_ns, mem_peak_bytes,"
        "        storage_waived_byte_ns"
        "   FROM stage_usage"
        " ON CONFLICT (sandbox_id, hour) DO UPDATE SET cpu_ns = u.cpu_ns + EXCLUDED.cpu_ns,"
        "  mem_byte_ns = u.mem_byte_ns + EXCLUDED.mem_byte_ns,"
        "  storage_byte_ns = u.storage_byte_ns + EXCLUDED.storage_byte_ns,"
        "  storage_waived_byte_ns = u.storage_waived_byte_ns + EXCLUDED.storage_waived_byte_ns,"
        "  mem_peak_bytes = greatest(u.mem_peak_bytes, EXCLUDED.mem_peak_bytes);"
        "INSERT INTO sandboxes AS s (id, account_id, key_id, host, vcpus, mem_size_bytes, state, net_rx_bytes,"
        "  net_tx_bytes)"
        " SELECT sandbox_id, account_id, key_id, host, vcpus, mem_size_bytes, state, net_rx, net_tx FROM stage_fold"
        "  WHERE sync"
        " ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, host = EXCLUDED.host, updated_at = now(),"
        "  net_rx_bytes = greatest(s.net_rx_bytes, EXCLUDED.net_rx_bytes),"
        "  net_tx_bytes = greatest(s.net_tx_bytes, EXCLUDED.net_tx_bytes)"
        "  WHERE s.state IS DISTINCT FROM EXCLUDED.state OR s.host IS DISTINCT FROM EXCLUDED.host"
        "   OR s.net_rx_bytes < EXCLUDED.net_rx_bytes OR s.net_tx_bytes < EXCLUDED.net_tx_bytes;";

/* Rating, in one statement that looks each rate up once: spend per key and
 * day of the key's account (account_day, sql/017: its zone's day of the
 * hour's start; the exact sums of quantity x rate), and the usage its plan has no
 * rate for, recorded once per (account, meter, hour) in rating_gaps and
 * returned so the aggregator can say so loudly. Such usage adds nothing to
 * spend (docs/billing.md, "Dead letters"); invoices price it when read. */
static const char *const rate_sql =
        "WITH g AS ("
        "  SELECT key_id, account_id, hour, plan, cpu, mem, sto, rate_at(plan, 'cpu', hour) AS rc,"
        "         rate_at(plan, 'memory', hour) AS rm, rate_at(plan, 'storage', hour) AS rs,"
        "         account_day(account_id, hour) AS day"
        "    FROM (SELECT key_id, account_id, hour, account_plan(account_id) AS plan, sum(cpu_ns)::numeric AS cpu,"
        "                 sum(mem_byte_ns) AS mem, sum(storage_byte_ns) AS sto"
        "            FROM stage_usage GROUP BY key_id, account_id, hour) x),"
        " spend AS ("
        "  INSERT INTO spend_daily AS s (key_id, day, account_id, cpu_rated, memory_rated, storage_rated)"
        "  SELECT key_id, day, min(account_id), sum(cpu * coalesce(rc, 0)),"
        "         sum(mem * coalesce(rm, 0)), sum(sto * coalesce(rs, 0))"
        "    FROM g GROUP BY key_id, day"
        "  ON CONFLICT (key_id, day) DO UPDATE SET cpu_rated = s.cpu_rated + EXCLUDED.cpu_rated,"
        "   memory_rated = s.memory_rated + EXCLUDED.memory_rated,"
        "   storage_rated = s.storage_rated + EXCLUDED.storage_rated)"
        " INSERT INTO rating_gaps (account_id, plan_id, meter, hour)"
        " SELECT DISTINCT account_id, plan, m.meter, hour FROM g"
        "  CROSS JOIN LATERAL (VALUES ('cpu', cpu, rc), ('memory', mem, rm), ('storage', sto, rs)) AS m(meter, q, r)"
        " WHERE m.q > 0 AND m.r IS NULL"
        " ON CONFLICT DO NOTHING"
        " RETURNING account_id, plan_id, meter, to_char(hour AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI\"Z\"')";

/* After the usage: alerts once per (key, day, threshold), and the block at
 * 100%; a new `pause` block waives the paused storage of the key's sandboxes
 * it finds running (limit_waivers; apply_sql). Returns the keys newly blocked. */
static const char *const limits_sql =
        "WITH spent AS ("
        "  SELECT d.key_id, d.day, d.account_id, d.nanodollars, k.daily_limit_nanodollars AS lim, k.limit_policy"
        "    FROM spend_daily d JOIN api_keys k ON k.id = d.key_id"
        "   WHERE (d.key_id, d.day) IN (SELECT key_id, account_day(account_id, hour)"
        "                                 FROM (SELECT DISTINCT key_id, account_id, hour FROM stage_usage) s)"
        "     AND k.daily_limit_nanodollars IS NOT NULL AND k.revoked_at IS NULL AND d.nanodollars > 0),"
        " fired AS ("
        "  INSERT INTO alerts (key_id, day, threshold_pct, account_id, spend_nanodollars, limit_nanodollars)"
        "  SELECT s.key_id, s.day, t.pct, s.account_id, s.nanodollars, s.lim"
        "    FROM spent s, (VALUES (50), (80), (100)) AS t(pct)"
        "   WHERE s.nanodollars::numeric * 100 >= s.lim::numeric * t.pct"
        "  ON CONFLICT (key_id, day, threshold_pct) DO NOTHING RETURNING 1),"
        " blocked AS ("
        "  INSERT INTO key_blocks (key_id, day, account_id, policy)"
        "  SELECT key_id, day, account_id, limit_policy FROM spent WHERE nanodollars >= lim"
        "  ON CONFLICT (key_id, day) DO NOTHING RETURNING key_id, day, account_id, policy),"
        " waived AS ("
        "  INSERT INTO limit_waivers (key_id, day, sandbox_id, account_id)"
        "  SELECT b.key_id, b.day, s.id, b.account_id FROM blocked b"
        "    JOIN sandboxes s ON s.key_id = b.key_id AND s.account_id = b.account_id AND s.state = 'running'"
        "   WHERE b.policy = 'pause' ORDER BY s.id"
        "  ON CONFLICT DO NOTHING RETURNING 1)"
        " SELECT (SELECT count(*) FROM fired), (SELECT count(*) FROM blocked), (SELECT count(*) FROM waived)";

/* Keys blocked today that still had running sandboxes in this batch (the
 * newly blocked among them): their sandboxes get a command. */
static const char *const enforce_sql =
        "SELECT b.key_id, b.account_id, b.policy FROM key_blocks b"
        " WHERE b.day = account_day(b.account_id, now())"
        "   AND b.key_id IN (SELECT key_id FROM stage_fold WHERE state = 'running')";


/* One row per piece: the batch summed its usage per sandbox-hour as it was
 * folded (batch_add_piece), so this is as long as the sandbox-hours the
 * batch touched, whatever the samples. */
static int usage_copy_text(const struct batch *b, struct text *t, size_t *ret_rows)
{
        t->len = 0;
        for (size_t i = 0; i < b->npieces; i++) {
                const struct piece *p = &b->pieces[i];
                char hour[64], mem[48], sto[48];
                format_ts(hour, sizeof(hour), p->u.hour_ns);
                if (text_put(t, p->sb->id, '\t') < 0 || text_put(t, hour, '\t') < 0 ||
                    text_put(t, p->sb->account, '\t') < 0 || text_put(t, p->sb->key, '\t') < 0 ||
                    text_put_u64(t, p->u.cpu_ns, '\t') < 0 ||
                    text_put(t, u128_str(p->u.mem_byte_ns, mem, sizeof(mem)), '\t') < 0 ||
                    text_put(t, u128_str(p->u.storage_byte_ns, sto, sizeof(sto)), '\t') < 0 ||
                    text_put_u64(t, p->u.mem_peak_bytes, '\n') < 0)
                        return -ENOMEM;
        }
        *ret_rows = b->npieces;
        return 0;
}

static int id_sandbox_cmp(const void *id, const void *s)
{
        return strcmp(id, (*(struct sandbox *const *)s)->id);
}

/* Per dirty sandbox (b->dirty sorted by id): does this batch's `created`
 * event insert its sandboxes row as the sync would leave it? So when the
 * ledger has no row for it (no_row) and its first event in the batch is
 * that created event (lifecycle_first_created: the one lifecycle_stage_created
 * writes, or committed ahead, before the sync runs), from the host it is
 * running on, with no network bytes to save. The sync would then change nothing, at 2.8 us a row (14 ms for a
 * batch of 5,000 new sandboxes). NULL when none. */
static bool *created_as_synced(const struct batch *b)
{
        size_t *idx, n;
        if (lifecycle_first_created(b, 0, &idx, &n) < 0)
                return NULL;
        bool *same = NULL;
        for (size_t k = 0; k < n; k++) {
                const struct usage_event *ev = &b->events[idx[k]];
                struct sandbox **p = bsearch(ev->sandbox, b->dirty, b->ndirty, sizeof(*b->dirty), id_sandbox_cmp);
                if (!p)
                        continue;
                const struct sandbox *s = *p;
                if (s->no_row && strcmp(ev->host, s->host) == 0 && s->fold.state == STATE_RUNNING && s->net_rx == 0 &&
                    s->net_tx == 0) {
                        if (!same && !(same = calloc(b->ndirty, sizeof(*same))))
                                break;
                        same[p - b->dirty] = true;
                }
        }
        free(idx);
        return same;
}

/* One row per sandbox the batch touched: its fold state as folded, the
 * version it was read at, and what the sandboxes row is synced from. */
static int fold_copy_text(const struct batch *b, struct text *t)
{
        t->len = 0;
        bool *created = created_as_synced(b);
        int r = 0;
        for (size_t i = 0; r == 0 && i < b->ndirty; i++) {
                const struct sandbox *s = b->dirty[i];
                const struct fold_state *f = &s->fold;
                /* (A sandbox with only its created event has no reading to sync the row from.) */
                bool sync = f->known && !(created && created[i]) &&
                            (s->db_state != (int)f->state + 1 || strcmp(s->db_host, s->host) != 0 || s->net_unsaved);
                char fold[FOLD_STATE_TEXT_MAX], wall[64];
                if (fold_state_format(f, fold, sizeof(fold)) < 0) {
                        r = -ENOBUFS;
                        break;
                }
                for (char *c = fold; *c; c++) /* one COPY field: no tab, newline or backslash */
                        if (*c == '\t' || *c == '\n' || *c == '\\')
                                *c = ' ';
                format_ts(wall, sizeof(wall), f->wall_ns);
                if (text_put(t, s->id, '\t') < 0 || text_put(t, s->account, '\t') < 0 || text_put(t, s->key, '\t') < 0 ||
                    text_put(t, f->known ? s->host : "" /* no sample of its host yet */, '\t') < 0 ||
                    text_put_u64(t, s->vcpus, '\t') < 0 || text_put(t, fold, '\t') < 0 ||
                    text_put_i64(t, s->version, '\t') < 0 || text_put(t, f->state == STATE_STOPPED ? "t" : "f", '\t') < 0 ||
                    text_put(t, sandbox_state_name(f->state), '\t') < 0 || text_put_u64(t, f->mem_size_bytes, '\t') < 0 ||
                    text_put(t, wall, '\t') < 0 || text_put(t, sync ? "t" : "f", '\t') < 0 ||
                    text_put_u64(t, s->net_rx, '\t') < 0 || text_put_u64(t, s->net_tx, '\t') < 0 ||
                    text_put(t, s->sampled ? "t" : "f", '\n') < 0)
                        r = -ENOMEM;
        }
        free(created);
        return r;
}

static void dead_params(const struct dead_letter *d, char *p, char *o, const char **params, int *lens, int *fmts)
{
        snprintf(p, 16, "%d", d->partition);
        snprintf(o, 32, "%" PRId64, d->offset);
        params[0] = p, params[1] = o, params[2] = d->raw, params[3] = d->reason;
        lens[0] = lens[1] = lens[3] = 0, lens[2] = (int)d->len;
        fmts[0] = fmts[1] = fmts[3] = 0, fmts[2] = 1;
}

static void dead_logged(const struct dead_letter *d)
{
        char q[600];
        log_warn("message dead-lettered", "partition=%d offset=%" PRId64 " reason=%s", d->partition, d->offset,
                 log_quote(q, sizeof(q), d->reason));
}

int store_dead(struct ledger *l, const struct dead_letter *d)
{
        char p[16], o[32];
        const char *params[4];
        int lens[4], fmts[4];
        dead_params(d, p, o, params, lens, fmts);
        PGresult *res = ledger_exec(l, STMT_DEAD_LETTER, 4, params, lens, fmts);
        int r = query_ok(l, res, PGRES_COMMAND_OK, "dead letter");
        PQclear(res);
        if (r == 0)
                dead_logged(d);
        return r;
}

/* Moves each touched partition's next offset, only where our generation
 * still owns it. Returns 0, -ESTALE when fenced, -EIO. */
static int store_offsets(struct ledger *l, const struct partitions *ps, struct text *t)
{
        t->len = 0;
        int n = 0;
        for (int32_t p = 0; p < ps->nparts; p++) {
                if (!ps->parts[p].touched)
                        continue;
                if (text_add(t, "%s(%d, %" PRId64 "::bigint, %" PRId64 "::bigint)", n ? "," : "", p,
                             ps->parts[p].position, ps->parts[p].generation) < 0)
                        return -ENOMEM;
                n++;
        }
        if (!n)
                return 0;
        struct text sql = { 0 };
        if (text_add(&sql, "UPDATE consumer_offsets AS o SET next_offset = v.n, updated_at = now()"
                           " FROM (VALUES %.*s) AS v(p, n, g)"
                           " WHERE o.group_id = $1 AND o.topic = 'usage' AND o.partition = v.p AND o.generation = v.g",
                     (int)t->len, t->buf) < 0)
                return -ENOMEM;
        const char *params[] = { ps->group };
        PGresult *res = PQexecParams(l->db, sql.buf, 1, NULL, params, NULL, NULL, 0);
        free(sql.buf);
        int r = query_ok(l, res, PGRES_COMMAND_OK, "offsets");
        if (r == 0 && atoi(PQcmdTuples(res)) != n)
                r = -ESTALE;
        PQclear(res);
        return r;
}

/* ---- the commit: a table of steps ---- */

/* One commit's working state. */
struct commit {
        struct ledger *l;
        struct batch *b;
        const struct partitions *ps;
        struct agg_metrics *metrics;
        struct text t;          /* COPY and SQL text, reused step to step */
        struct commit_report *rep;
        bool *staged;           /* per event: written already (lifecycle_stage_created) */
        size_t nstaged;
};

/* (fold state) Every row written: else another aggregator moved a sandbox
 * on and ours is stale. */
static int read_fold(struct commit *c, PGresult *res)
{
        return strtoull(PQgetvalue(res, 0, 0), NULL, 10) == c->b->ndirty ? 0 : -EBUSY;
}

/* (rate) Usage no rate applies to: said loudly, once per (account, meter, hour). */
static int read_rating_gaps(struct commit *c, PGresult *res)
{
        for (int i = 0; i < PQntuples(res); i++) {
                log_error("usage without a rate: kept, not rated; add the plan's rate",
                          "account=%s plan=%s meter=%s hour=%s", PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
                          PQgetvalue(res, i, 2), PQgetvalue(res, i, 3));
                atomic_fetch_add_explicit(&c->metrics->rating_gaps, 1, memory_order_relaxed);
        }
        return 0;
}

static int read_limits(struct commit *c, PGresult *res)
{
        c->rep->fired = atol(PQgetvalue(res, 0, 0));
        c->rep->blocked = atol(PQgetvalue(res, 0, 1));
        c->rep->waived = atol(PQgetvalue(res, 0, 2));
        return 0;
}

/* (enforce) The commands for keys blocked today with running sandboxes. */
static int read_commands(struct commit *c, PGresult *res)
{
        if (PQntuples(res) == 0)
                return 0;
        struct command *cmds = calloc((size_t)PQntuples(res), sizeof(*cmds));
        c->rep->cmds = cmds;
        for (int i = 0; cmds && i < PQntuples(res); i++) {
                snprintf(cmds[i].key, sizeof(cmds[i].key), "%s", PQgetvalue(res, i, 0));
                snprintf(cmds[i].account, sizeof(cmds[i].account), "%s", PQgetvalue(res, i, 1));
                cmds[i].action = strcmp(PQgetvalue(res, i, 2), "stop") == 0 ? CONTROL_STOP : CONTROL_PAUSE;
                c->rep->ncmds++;
        }
        return 0;
}

static const char *const stage_usage_copy =
        "COPY stage_usage (sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns, storage_byte_ns, mem_peak_bytes)"
        " FROM STDIN";
static const char *const stage_fold_copy = "COPY stage_fold FROM STDIN";

/* The rows store_prepare wrote out, then the batch's first `created` event
 * per sandbox (its own arrays: built here, on the writer's thread). */
static int run_stage(struct commit *c)
{
        const struct commit_report *rep = c->rep;
        int r = copy_rows(c->l, stage_usage_copy, rep->usage_copy.buf, rep->usage_copy.len);
        if (r == 0)
                r = copy_rows(c->l, stage_fold_copy, rep->fold_copy.buf, rep->fold_copy.len);
        if (r == 0)
                r = lifecycle_stage_created(c->l, c->b, &c->t, &c->staged, &c->nstaged);
        return r;
}

/* The batch's rows that are not staged: one statement each (events, dead
 * letters, held readings), sent in libpq's pipeline mode PIPE_MAX at a time
 * and their results read back in order: a round trip per PIPE_MAX rows, not
 * per row (the preload of thousands of sandboxes brings as many `created`
 * events). Each result is checked as it would be alone; after the first
 * failure the rest of the chunk is aborted by the server and only drained,
 * so last_error keeps the failure's own words (poison.h compares them). */
#define PIPE_MAX 256

enum row_kind { ROW_EVENT, ROW_DEAD, ROW_WAITING };

struct row_ref {
        enum row_kind kind;
        size_t i;
};

static int row_send(struct commit *c, struct row_ref ref)
{
        struct batch *b = c->b;
        if (ref.kind == ROW_EVENT)
                return lifecycle_send(c->l, &b->events[ref.i]);
        if (ref.kind == ROW_WAITING)
                return waiting_send(c->l, &b->waiting[ref.i]);
        char p[16], o[32];
        const char *params[4];
        int lens[4], fmts[4];
        dead_params(&b->dead[ref.i], p, o, params, lens, fmts);
        return ledger_send(c->l, STMT_DEAD_LETTER, 4, params, lens, fmts);
}

static int row_read(struct commit *c, struct row_ref ref, PGresult *res)
{
        struct batch *b = c->b;
        if (ref.kind == ROW_EVENT)
                return query_ok(c->l, res, PGRES_COMMAND_OK, event_type_name(b->events[ref.i].type));
        if (ref.kind == ROW_WAITING)
                return waiting_read(c->l, &b->waiting[ref.i], res);
        int r = query_ok(c->l, res, PGRES_COMMAND_OK, "dead letter");
        if (r == 0)
                dead_logged(&b->dead[ref.i]);
        return r;
}

/* Ends a chunk: a sync, then every statement's result in order, then the
 * sync's. Returns the first failure (0 if none). */
static int pipe_read(struct commit *c, const struct row_ref *sent, size_t n)
{
        PGconn *db = c->l->db;
        int r = PQpipelineSync(db) == 1 ? 0 : -EIO;
        for (size_t k = 0; k < n && PQstatus(db) == CONNECTION_OK; k++) {
                PGresult *res = PQgetResult(db);
                if (!res) {
                        r = r ? r : -EIO;
                        break;
                }
                int e = r == 0 ? row_read(c, sent[k], res) : 0;
                if (r == 0)
                        r = e;
                PQclear(res);
                while ((res = PQgetResult(db))) /* the NULL that ends each statement's results */
                        PQclear(res);
        }
        for (PGresult *res; (res = PQgetResult(db));) { /* the sync's result */
                bool sync = PQresultStatus(res) == PGRES_PIPELINE_SYNC;
                PQclear(res);
                if (sync)
                        break;
        }
        return r;
}

static int run_rows(struct commit *c)
{
        struct batch *b = c->b;
        PGconn *db = c->l->db;
        if (b->nevents - c->nstaged + b->ndead + b->nwaiting == 0)
                return store_offsets(c->l, c->ps, &c->t);
        if (PQenterPipelineMode(db) != 1) {
                snprintf(c->l->last_error, sizeof(c->l->last_error), "could not enter pipeline mode");
                return -EIO;
        }
        struct row_ref sent[PIPE_MAX];
        size_t nsent = 0;
        int r = 0;
        size_t counts[] = { [ROW_EVENT] = b->nevents, [ROW_DEAD] = b->ndead, [ROW_WAITING] = b->nwaiting };
        for (enum row_kind kind = ROW_EVENT; r == 0 && kind <= ROW_WAITING; kind++)
                for (size_t i = 0; r == 0 && i < counts[kind]; i++) {
                        if (kind == ROW_EVENT && c->staged && c->staged[i])
                                continue;
                        struct row_ref ref = { kind, i };
                        int s = row_send(c, ref);
                        if (s < 0) {
                                snprintf(c->l->last_error, sizeof(c->l->last_error), "could not send: %s",
                                         PQerrorMessage(db));
                                r = s;
                        } else if (s > 0) {
                                sent[nsent++] = ref;
                        }
                        if (nsent == PIPE_MAX || (r < 0 && nsent)) {
                                int e = pipe_read(c, sent, nsent);
                                r = r ? r : e;
                                nsent = 0;
                        }
                }
        if (nsent) {
                int e = pipe_read(c, sent, nsent);
                r = r ? r : e;
        }
        if (PQexitPipelineMode(db) != 1 && r == 0) {
                snprintf(c->l->last_error, sizeof(c->l->last_error), "could not leave pipeline mode: %s",
                         PQerrorMessage(db));
                r = -EIO;
        }
        return r < 0 ? r : store_offsets(c->l, c->ps, &c->t);
}

enum { STEP_BEGIN, STEP_STAGE, STEP_FOLD, STEP_APPLY, STEP_RATE, STEP_ROWS, STEP_LIMITS, STEP_ENFORCE, STEP_HOSTS,
       STEP_COMMIT, STEPS };

/* A step is a statement (checked for want, then read) or a function. */
struct step {
        const char *what;       /* the statement's name in logs and last_error */
        const char *sql;
        ExecStatusType want;
        int (*read)(struct commit *c, PGresult *res);
        int (*run)(struct commit *c);
};

static const struct step steps[STEPS] = {
        [STEP_BEGIN] = { "begin", "BEGIN", PGRES_COMMAND_OK, NULL, NULL },
        [STEP_STAGE] = { "stage", NULL, 0, NULL, run_stage },
        [STEP_FOLD] = { "fold state", fold_sql, PGRES_TUPLES_OK, read_fold, NULL },
        [STEP_APPLY] = { "apply", apply_sql, PGRES_COMMAND_OK, NULL, NULL },
        [STEP_RATE] = { "rate", rate_sql, PGRES_TUPLES_OK, read_rating_gaps, NULL },
        [STEP_ROWS] = { "rows", NULL, 0, NULL, run_rows },
        [STEP_LIMITS] = { "limits", limits_sql, PGRES_TUPLES_OK, read_limits, NULL },
        [STEP_ENFORCE] = { "enforce", enforce_sql, PGRES_TUPLES_OK, read_commands, NULL },
        /* Last: the one row aggregators share (per host), held until COMMIT. */
        [STEP_HOSTS] = { "hosts", hosts_sql, PGRES_COMMAND_OK, NULL, NULL },
        [STEP_COMMIT] = { "commit", "COMMIT", PGRES_COMMAND_OK, NULL, NULL },
};

_Static_assert(sizeof(((struct commit_report *)0)->at) / sizeof(int64_t) == STEPS, "one time per step");

/* Runs steps [from, to]; a failure inside the transaction rolls it back
 * (BEGIN's and COMMIT's leave none open). */
static int run_steps(struct commit *c, int from, int to)
{
        struct ledger *l = c->l;
        l->last_error[0] = '\0';
        /* Connect (again) only to begin: a session lost inside the transaction
         * fails it, never carries on in a new one outside it. */
        int r = 0, i = from;
        if (from == STEP_BEGIN)
                r = db_ensure(l);
        else if (!l->db || PQstatus(l->db) != CONNECTION_OK)
                r = -EIO;
        for (; r == 0 && i <= to; i++) {
                const struct step *s = &steps[i];
                if (s->run) {
                        r = s->run(c);
                } else {
                        PGresult *res = PQexec(l->db, s->sql);
                        r = query_ok(l, res, s->want, s->what);
                        if (r == 0 && s->read)
                                r = s->read(c, res);
                        PQclear(res);
                }
                c->rep->at[i] = time_mono_ns();
        }
        if (r < 0 && i > STEP_BEGIN + 1 && i < STEPS)
                PQclear(PQexec(l->db, "ROLLBACK"));
        free(c->t.buf);
        return r;
}

/* One row in each staging table, written out as a commit writes its own
 * (usage_copy_text, fold_copy_text: a batch of one sandbox), and the
 * `created` upsert of it, for store_warm: a sandbox, account and key of this
 * process's own id that no one has, running, with nothing to rate (no
 * rating gap), its row to sync and no sample (no hosts row), in the current
 * hour's partition of usage_hourly. */
static int warm_rows(struct ledger *l)
{
        int64_t now = time_wall_ns();
        struct sandbox sb = { .vcpus = 1, .fold = { .known = true, .state = STATE_RUNNING, .wall_ns = now } };
        snprintf(sb.id, sizeof(sb.id), "tally-warm-%ld", (long)getpid());
        memcpy(sb.account, sb.id, sizeof(sb.id));
        memcpy(sb.key, sb.id, sizeof(sb.id));
        memcpy(sb.host, sb.id, sizeof(sb.id));
        struct sandbox *dirty = &sb;
        struct piece piece = { .sb = &sb, .u = { .hour_ns = time_hour_start(now) } };
        struct batch b = { .pieces = &piece, .npieces = 1, .dirty = &dirty, .ndirty = 1 };
        struct usage_event ev = { .type = EVENT_CREATED, .vcpus = 1, .wall_ns = now };
        memcpy(ev.sandbox, sb.id, sizeof(sb.id));
        memcpy(ev.account, sb.id, sizeof(sb.id));
        memcpy(ev.key, sb.id, sizeof(sb.id));
        memcpy(ev.host, sb.id, sizeof(sb.id));
        struct text t = { 0 };
        size_t rows;
        int r = usage_copy_text(&b, &t, &rows);
        if (r == 0)
                r = copy_rows(l, stage_usage_copy, t.buf, t.len);
        if (r == 0)
                r = fold_copy_text(&b, &t);
        if (r == 0)
                r = copy_rows(l, stage_fold_copy, t.buf, t.len);
        t.len = 0;
        if (r == 0)
                r = lifecycle_created_row(&t, &ev);
        if (r == 0)
                r = lifecycle_write_created(l, &t);
        free(t.buf);
        return r;
}

int store_warm(struct ledger *l)
{
        int64_t t0 = time_mono_ns();
        if (db_ensure(l) < 0)
                return -EIO;
        /* A table another session holds locked (a migration, an operator's
         * LOCK) gives up the warming, never the start. */
        PGresult *res = PQexec(l->db, "BEGIN; SET LOCAL lock_timeout = '200ms'");
        bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        char why[256] = "";
        if (!ok)
                snprintf(why, sizeof(why), "%s", PQresultErrorMessage(res));
        /* With a row to write: a table's partition, indexes and triggers are
         * opened by the first row that reaches them, not by an empty statement
         * (a session's first upsert of 2,500 usage rows took 36 ms, 20 ms
         * after one row had been written and rolled back). */
        if (ok && warm_rows(l) < 0) {
                snprintf(why, sizeof(why), "%s", l->last_error);
                ok = false;
        }
        for (int i = STEP_FOLD; ok && i <= STEP_HOSTS; i++) {
                if (!steps[i].sql)
                        continue; /* the COPYs and the rows: staged above, or nothing to stage */
                PQclear(res);
                res = PQexec(l->db, steps[i].sql);
                ok = PQresultStatus(res) == steps[i].want;
                if (!ok)
                        snprintf(why, sizeof(why), "%s", PQresultErrorMessage(res));
        }
        why[strcspn(why, "\n\"")] = '\0';
        PQclear(res);
        PQclear(PQexec(l->db, "ROLLBACK"));
        if (ok)
                log_info("ledger session warmed", "ms=%" PRId64, (time_mono_ns() - t0) / NS_PER_MS);
        else
                log_warn("could not warm the ledger session: its first commit pays for it", "error=\"%s\"", why);
        return ok ? 0 : -EIO;
}

static int sandbox_id_cmp(const void *x, const void *y)
{
        return strcmp((*(struct sandbox *const *)x)->id, (*(struct sandbox *const *)y)->id);
}

int store_prepare(struct batch *b, struct commit_report *ret)
{
        qsort(b->dirty, b->ndirty, sizeof(*b->dirty), sandbox_id_cmp); /* fold_sql's order */
        struct text usage = ret->usage_copy, fold = ret->fold_copy; /* (their memory kept, batch to batch) */
        *ret = (struct commit_report){ .t0 = time_mono_ns(), .usage_copy = usage, .fold_copy = fold };
        int r = usage_copy_text(b, &ret->usage_copy, &ret->rows);
        return r < 0 ? r : fold_copy_text(b, &ret->fold_copy);
}

int store_finish(struct ledger *l, struct batch *b, const struct partitions *ps, struct agg_metrics *metrics,
                 struct commit_report *ret)
{
        struct commit c = { .l = l, .b = b, .ps = ps, .metrics = metrics, .rep = ret };
        int r = run_steps(&c, STEP_BEGIN, STEPS - 1);
        free(c.staged);
        return r;
}

void store_report_free(struct commit_report *rep)
{
        free(rep->usage_copy.buf);
        free(rep->fold_copy.buf);
        free(rep->cmds);
        *rep = (struct commit_report){ 0 };
}

void store_log_committed(const struct commit_report *rep, const struct batch *b)
{
        const int64_t *at = rep->at;
        if (rep->fired)
                log_info("spend alerts recorded", "alerts=%ld blocked_keys=%ld waived_sandboxes=%ld", rep->fired,
                         rep->blocked, rep->waived);
        if (log_get_level() > LOG_LEVEL_DEBUG)
                return; /* (not a pass over the batch's stamps for a line nobody reads) */
        /* The batch's commit lag, oldest and newest sample (Kafka create time to now). */
        int64_t now_ms = time_wall_ns() / NS_PER_MS, oldest = INT64_MAX, newest = INT64_MIN;
        for (size_t i = 0; i < b->nstamps; i++) {
                oldest = b->stamps[i].kafka_ms < oldest ? b->stamps[i].kafka_ms : oldest;
                newest = b->stamps[i].kafka_ms > newest ? b->stamps[i].kafka_ms : newest;
        }
        if (!b->nstamps)
                oldest = newest = now_ms;
        log_debug("batch committed",
                  "messages=%zu partitions=%d usage_rows=%zu sandboxes=%zu events=%zu dead=%zu stage_ms=%" PRId64 " apply_ms=%" PRId64
                  " limits_ms=%" PRId64 " ms=%" PRId64 " fold_ms=%" PRId64 " usage_ms=%" PRId64 " rate_ms=%" PRId64
                  " commit_ms=%" PRId64 " open_ms=%" PRId64 " lag_ms_oldest=%" PRId64 " lag_ms_newest=%" PRId64
                  " noticed_ms=%" PRId64,
                  b->messages, rep->partitions, rep->rows, b->ndirty, b->nevents, b->ndead, (at[STEP_STAGE] - rep->t0) / NS_PER_MS,
                  (at[STEP_ROWS] - at[STEP_STAGE]) / NS_PER_MS, (at[STEP_HOSTS] - at[STEP_ROWS]) / NS_PER_MS,
                  (time_mono_ns() - rep->t0) / NS_PER_MS, (at[STEP_FOLD] - at[STEP_STAGE]) / NS_PER_MS,
                  (at[STEP_APPLY] - at[STEP_FOLD]) / NS_PER_MS, (at[STEP_RATE] - at[STEP_APPLY]) / NS_PER_MS,
                  (at[STEP_COMMIT] - at[STEP_HOSTS]) / NS_PER_MS, (rep->t0 - b->started_ns) / NS_PER_MS,
                  now_ms - oldest, now_ms - newest, (time_mono_ns() - at[STEP_COMMIT]) / NS_PER_MS);
}
