/* aggregator.c — see aggregator.h.
 *
 * The loop: poll messages, fold each sample into the in-memory state of its
 * sandbox (which produces usage per (sandbox, hour)), and every few thousand
 * messages or batch_ms commit the batch in ONE transaction: usage upserts,
 * spend per key and day, fold state, sandboxes, lifecycle events, dead
 * letters, the partitions' next offsets (fenced by generation) and alerts.
 * Only after the commit are control commands published.
 *
 * In-memory fold state is always "the database plus this batch": when a
 * commit fails (database error or fenced partition) the batch is thrown away
 * and the state and positions are read back from the database. */
#include "aggregator.h"

#include "control.h"
#include "db.h"
#include "event.h"
#include "fold.h"
#include "kafka.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Schema this aggregator writes: 002_ledger and up to what it knows. */
#define SCHEMA_NEED  2
#define SCHEMA_KNOWN 2

#define LAG_BUCKETS 60000 /* 1 ms each: commit latency histogram up to 60 s */

struct sandbox {
        char id[EVENT_ID_MAX + 1];
        char account[EVENT_ID_MAX + 1];
        char key[EVENT_ID_MAX + 1];
        char host[EVENT_ID_MAX + 1];
        int32_t partition;
        uint32_t vcpus;
        struct fold_state fold;
        bool dirty;             /* listed in the batch's dirty list */
        /* What the sandboxes table holds for it (state + 1; 0: unknown), and
         * its host there: the row is only written when they change. */
        int db_state;
        char db_host[EVENT_ID_MAX + 1];
        struct sandbox *next;   /* hash chain */
};

struct piece {
        struct sandbox *sb;
        struct fold_usage u;
};

struct dead_letter {
        int32_t partition;
        int64_t offset;
        char *raw;
        size_t len;
        char reason[256];
};

struct partition {
        bool owned;
        int64_t generation;
        int64_t position;       /* next offset to process */
        bool touched;           /* moved in this batch */
};

struct key_throttle {
        char key[EVENT_ID_MAX + 1];
        int64_t last_ns;
};

struct agg {
        const struct aggregator_config *cfg;
        volatile sig_atomic_t *stop;
        PGconn *db;
        rd_kafka_t *consumer;
        rd_kafka_t *producer;

        struct sandbox **buckets;
        size_t nbuckets, nsandboxes;

        struct partition *parts;
        int32_t nparts;

        /* the batch */
        struct piece *pieces;
        size_t npieces, cappieces;
        struct sandbox **dirty;
        size_t ndirty, capdirty;
        struct usage_event *events;
        size_t nevents, capevents;
        struct dead_letter *dead;
        size_t ndead, capdead;
        size_t messages;
        int64_t batch_started;
        int64_t *stamps;        /* Kafka create time (ms) of each message, for the latency figures */
        size_t nstamps, capstamps;

        struct key_throttle *throttle;
        size_t nthrottle;

        uint64_t *lag_hist;
        uint64_t committed_messages, committed_batches, fenced, dead_total;

        /* The fold's counts (for /metrics): readings whose wall time was out
         * of bounds of the aggregator's clock, counters that went back within
         * an epoch (taken as restarts), held counters that went back, and
         * `stopped` events folded. */
        uint64_t clock_ahead, clock_behind, counter_resets, held_back, stops_folded;
        int64_t note_logged_ns[3];
        uint64_t note_suppressed[3];
};

/* ---- small helpers ---- */

static int grow(void **p, size_t *cap, size_t need, size_t size)
{
        if (need <= *cap)
                return 0;
        size_t n = *cap ? *cap * 2 : 1024;
        while (n < need)
                n *= 2;
        void *q = realloc(*p, n * size);
        if (!q)
                return -ENOMEM;
        *p = q;
        *cap = n;
        return 0;
}

static uint64_t hash_id(const char *s)
{
        uint64_t h = 1469598103934665603ULL;
        for (; *s; s++)
                h = (h ^ (unsigned char)*s) * 1099511628211ULL;
        return h;
}

static char *u128_str(u128 v, char *buf, size_t size)
{
        char tmp[48];
        size_t n = 0;
        do {
                tmp[n++] = (char)('0' + (int)(v % 10));
                v /= 10;
        } while (v);
        size_t i = 0;
        for (; i < n && i + 1 < size; i++)
                buf[i] = tmp[n - 1 - i];
        buf[i] = '\0';
        return buf;
}

static void format_ts(char *buf, size_t size, int64_t ns)
{
        time_t s = (time_t)time_floor(ns, NS_PER_SEC) / NS_PER_SEC;
        struct tm tm;
        gmtime_r(&s, &tm);
        int64_t frac = ns - (int64_t)s * NS_PER_SEC;
        char date[32];
        strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", &tm);
        snprintf(buf, size, "%s.%06" PRId64 "+00", date, frac / NS_PER_US);
}

/* ---- sandboxes ---- */

static struct sandbox *sandbox_find(struct agg *a, const char *id)
{
        if (!a->nbuckets)
                return NULL;
        for (struct sandbox *s = a->buckets[hash_id(id) & (a->nbuckets - 1)]; s; s = s->next)
                if (strcmp(s->id, id) == 0)
                        return s;
        return NULL;
}

static int sandbox_rehash(struct agg *a, size_t n)
{
        struct sandbox **b = calloc(n, sizeof(*b));
        if (!b)
                return -ENOMEM;
        for (size_t i = 0; i < a->nbuckets; i++)
                for (struct sandbox *s = a->buckets[i], *next; s; s = next) {
                        next = s->next;
                        size_t h = hash_id(s->id) & (n - 1);
                        s->next = b[h];
                        b[h] = s;
                }
        free(a->buckets);
        a->buckets = b;
        a->nbuckets = n;
        return 0;
}

static struct sandbox *sandbox_add(struct agg *a, const char *id)
{
        if (a->nsandboxes + 1 > a->nbuckets && sandbox_rehash(a, a->nbuckets ? a->nbuckets * 2 : 4096) < 0)
                return NULL;
        struct sandbox *s = calloc(1, sizeof(*s));
        if (!s)
                return NULL;
        snprintf(s->id, sizeof(s->id), "%s", id);
        size_t h = hash_id(id) & (a->nbuckets - 1);
        s->next = a->buckets[h];
        a->buckets[h] = s;
        a->nsandboxes++;
        return s;
}

/* Drops the state of every sandbox of partitions for which drop[p] is set
 * (drop NULL: all). */
static void sandboxes_drop(struct agg *a, const bool *drop)
{
        for (size_t i = 0; i < a->nbuckets; i++) {
                struct sandbox **pp = &a->buckets[i];
                while (*pp) {
                        struct sandbox *s = *pp;
                        if (!drop || (s->partition < a->nparts && drop[s->partition])) {
                                *pp = s->next;
                                free(s);
                                a->nsandboxes--;
                        } else {
                                pp = &s->next;
                        }
                }
        }
}

/* ---- partitions ---- */

static struct partition *part(struct agg *a, int32_t p)
{
        if (p < 0 || p > 65535)
                return NULL;
        if (p >= a->nparts) {
                int32_t n = p + 1;
                struct partition *q = realloc(a->parts, (size_t)n * sizeof(*q));
                if (!q)
                        return NULL;
                memset(q + a->nparts, 0, (size_t)(n - a->nparts) * sizeof(*q));
                a->parts = q;
                a->nparts = n;
        }
        return &a->parts[p];
}

/* ---- the batch ---- */

static void batch_clear(struct agg *a)
{
        for (size_t i = 0; i < a->ndirty; i++)
                a->dirty[i]->dirty = false;
        for (size_t i = 0; i < a->nevents; i++)
                event_clear(&a->events[i]);
        for (size_t i = 0; i < a->ndead; i++)
                free(a->dead[i].raw);
        a->npieces = a->ndirty = a->nevents = a->ndead = a->messages = a->nstamps = 0;
        for (int32_t p = 0; p < a->nparts; p++)
                a->parts[p].touched = false;
}

struct emit_ctx {
        struct agg *a;
        struct sandbox *sb;
        int err;
};

static void on_usage(void *opaque, const struct fold_usage *u)
{
        struct emit_ctx *c = opaque;
        struct agg *a = c->a;
        if (grow((void **)&a->pieces, &a->cappieces, a->npieces + 1, sizeof(*a->pieces)) < 0) {
                c->err = -ENOMEM;
                return;
        }
        a->pieces[a->npieces++] = (struct piece){ .sb = c->sb, .u = *u };
}

static int add_dead(struct agg *a, int32_t partition, int64_t offset, const void *raw, size_t len, const char *why)
{
        if (grow((void **)&a->dead, &a->capdead, a->ndead + 1, sizeof(*a->dead)) < 0)
                return -ENOMEM;
        struct dead_letter *d = &a->dead[a->ndead];
        d->raw = malloc(len ? len : 1);
        if (!d->raw)
                return -ENOMEM;
        if (len)
                memcpy(d->raw, raw, len);
        d->len = len;
        d->partition = partition;
        d->offset = offset;
        snprintf(d->reason, sizeof(d->reason), "%s", why);
        a->ndead++;
        return 0;
}

/* Clock and counter notes are logged at most once a second each (with how
 * many were not), so a host with a bad clock cannot flood the log. */
static bool note_log_due(struct agg *a, int kind, uint64_t *suppressed)
{
        int64_t now = time_mono_ns();
        if (a->note_logged_ns[kind] && now - a->note_logged_ns[kind] < NS_PER_SEC) {
                a->note_suppressed[kind]++;
                return false;
        }
        a->note_logged_ns[kind] = now;
        *suppressed = a->note_suppressed[kind];
        a->note_suppressed[kind] = 0;
        return true;
}

static void count_notes(struct agg *a, const struct usage_event *ev, unsigned notes, int64_t now,
                        const struct fold_state *before)
{
        uint64_t suppressed;
        if (notes & FOLD_NOTE_CLOCK_AHEAD) {
                a->clock_ahead++;
                if (note_log_due(a, 0, &suppressed))
                        log_warn("reading dated ahead of the aggregator's clock; placed at the aggregator's clock",
                                 "sandbox=%s host=%s type=%s wall_ns=%" PRId64 " aggregator_ns=%" PRId64
                                 " suppressed=%" PRIu64,
                                 ev->sandbox, ev->host, event_type_name(ev->type), ev->wall_ns, now, suppressed);
        }
        if (notes & FOLD_NOTE_CLOCK_BEHIND) {
                a->clock_behind++;
                if (note_log_due(a, 1, &suppressed))
                        log_warn("reading dated too far behind the aggregator's clock; placed at the aggregator's clock",
                                 "sandbox=%s host=%s type=%s wall_ns=%" PRId64 " aggregator_ns=%" PRId64
                                 " suppressed=%" PRIu64,
                                 ev->sandbox, ev->host, event_type_name(ev->type), ev->wall_ns, now, suppressed);
        }
        if (notes & FOLD_NOTE_HELD_BACK) {
                a->held_back++;
                if (note_log_due(a, 2, &suppressed))
                        log_warn("held counters went back; billed only beyond the highest",
                                 "sandbox=%s host=%s running_ns=%" PRIu64 " paused_ns=%" PRIu64
                                 " billed_running_ns=%" PRIu64 " billed_paused_ns=%" PRIu64 " suppressed=%" PRIu64,
                                 ev->sandbox, ev->host, ev->running_ns, ev->paused_ns, before->running_ns,
                                 before->paused_ns, suppressed);
        }
}

/* Folds one reading (a sample or the vmm's `stopped` event) into its
 * sandbox's state. *refused is set when the message went to the dead letters. */
static int fold_reading(struct agg *a, const rd_kafka_message_t *m, const struct usage_event *in, bool *refused)
{
        int32_t partition = m->partition;
        *refused = false;
        struct sandbox *sb = sandbox_find(a, in->sandbox);
        if ((!sb || !sb->fold.known) && in->key[0] == '\0') {
                *refused = true;
                return add_dead(a, m->partition, m->offset, m->payload, m->len,
                                "no key, and no reading of the sandbox billed before");
        }
        if (!sb) {
                sb = sandbox_add(a, in->sandbox);
                if (!sb)
                        return -ENOMEM;
                snprintf(sb->account, sizeof(sb->account), "%s", in->account);
                snprintf(sb->key, sizeof(sb->key), "%s", in->key);
                sb->partition = partition;
        }
        struct usage_event ev = *in; /* a shallow copy the fold reads; in keeps its labels */
        if (!ev.vcpus)
                ev.vcpus = sb->vcpus;
        struct fold_clock clock = { .now_ns = time_wall_ns(),
                                    .max_ahead_ns = a->cfg->max_clock_ahead_ms * NS_PER_MS,
                                    .max_behind_ns = a->cfg->max_clock_behind_ms * NS_PER_MS };
        struct fold_state before = sb->fold;
        struct emit_ctx c = { .a = a, .sb = sb };
        unsigned notes = 0;
        enum fold_result r = fold_apply_at(&sb->fold, &ev, &clock, &notes, on_usage, &c);
        if (c.err < 0)
                return c.err;
        count_notes(a, &ev, notes, clock.now_ns, &before);
        const char *why = NULL;
        char buf[160];
        switch (r) {
        case FOLD_DUPLICATE:
        case FOLD_OLD_EPOCH:
                return 0;
        case FOLD_IMPOSSIBLE:
                why = "impossible sample: more CPU or held time than could pass in the time";
                break;
        case FOLD_SEQ_JUMP:
                snprintf(buf, sizeof(buf), "seq generation %" PRIu64 " is more than %d above the last billed, %" PRIu64,
                         ev.seq >> 32, FOLD_JUMP_MAX, before.seq >> 32);
                why = buf;
                break;
        case FOLD_EPOCH_JUMP:
                snprintf(buf, sizeof(buf), "epoch %" PRIu64 " is more than %d above the last billed, %" PRIu64,
                         ev.epoch, FOLD_JUMP_MAX, before.epoch);
                why = buf;
                break;
        case FOLD_COUNTER_RESET:
                a->counter_resets++;
                log_warn("counter went back within an epoch: taken as a restart, billed from zero",
                         "sandbox=%s host=%s epoch=%" PRIu64 " seq=%" PRIu64 " cpu_ns=%" PRIu64
                         " billed_cpu_ns=%" PRIu64,
                         ev.sandbox, ev.host, ev.epoch, ev.seq, ev.cpu_ns, before.cpu_ns);
                break;
        case FOLD_BILLED:
                break;
        }
        if (why) {
                *refused = true;
                return add_dead(a, m->partition, m->offset, m->payload, m->len, why);
        }
        if (ev.type == EVENT_STOPPED)
                a->stops_folded++;
        if (ev.host[0])
                snprintf(sb->host, sizeof(sb->host), "%s", ev.host);
        if (ev.vcpus)
                sb->vcpus = ev.vcpus;
        sb->partition = partition;
        if (!sb->dirty) {
                if (grow((void **)&a->dirty, &a->capdirty, a->ndirty + 1, sizeof(*a->dirty)) < 0)
                        return -ENOMEM;
                a->dirty[a->ndirty++] = sb;
                sb->dirty = true;
        }
        return 0;
}

/* Takes one message into the batch. Never fails on the message's content. */
static int take_message(struct agg *a, const rd_kafka_message_t *m)
{
        struct partition *p = part(a, m->partition);
        if (!p || !p->owned || m->offset < p->position)
                return 0; /* not ours (any more), or already in the ledger */
        struct usage_event ev;
        char why[256];
        int r = 0;
        bool refused_stop = false;
        if (event_decode(m->payload, m->len, &ev, why, sizeof(why)) < 0) {
                r = add_dead(a, m->partition, m->offset, m->payload, m->len, why);
        } else if (ev.type == EVENT_SAMPLE) {
                bool refused;
                r = fold_reading(a, m, &ev, &refused);
                event_clear(&ev);
        } else if (ev.type == EVENT_STOPPED && ((r = fold_reading(a, m, &ev, &refused_stop)) < 0 || refused_stop)) {
                event_clear(&ev); /* dead-lettered (or out of memory): the event is not applied */
        } else if (grow((void **)&a->events, &a->capevents, a->nevents + 1, sizeof(*a->events)) < 0) {
                event_clear(&ev);
                r = -ENOMEM;
        } else {
                a->events[a->nevents++] = ev; /* the batch owns it now */
        }
        if (r < 0)
                return r;
        if (a->messages == 0)
                a->batch_started = time_mono_ns();
        a->messages++;
        p->position = m->offset + 1;
        p->touched = true;
        rd_kafka_timestamp_type_t tt;
        int64_t ts = rd_kafka_message_timestamp(m, &tt);
        if (ts > 0 && grow((void **)&a->stamps, &a->capstamps, a->nstamps + 1, sizeof(*a->stamps)) == 0)
                a->stamps[a->nstamps++] = ts;
        return 0;
}

/* ---- database ---- */

static const char *const session_sql =
        "SET TIME ZONE 'UTC';"
        "CREATE TEMP TABLE IF NOT EXISTS stage_usage (sandbox_id text, hour timestamptz, account_id text,"
        " key_id text, cpu_ns bigint, mem_byte_ns numeric, storage_byte_ns numeric, mem_peak_bytes bigint)"
        " ON COMMIT DELETE ROWS;"
        "CREATE TEMP TABLE IF NOT EXISTS stage_fold (sandbox_id text, partition integer, account_id text,"
        " key_id text, host text, vcpus integer, epoch bigint, seq bigint, cpu_ns bigint, wall_ns bigint,"
        " state text, mem_size_bytes bigint, disk_bytes bigint, sync boolean) ON COMMIT DELETE ROWS;";

/* Everything a batch writes from its staging tables, in one round trip. */
static const char *const apply_sql =
        "INSERT INTO usage_hourly AS u (sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns,"
        "  storage_byte_ns, mem_peak_bytes)"
        " SELECT sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns, storage_byte_ns, mem_peak_bytes"
        "   FROM stage_usage"
        " ON CONFLICT (sandbox_id, hour) DO UPDATE SET cpu_ns = u.cpu_ns + EXCLUDED.cpu_ns,"
        "  mem_byte_ns = u.mem_byte_ns + EXCLUDED.mem_byte_ns,"
        "  storage_byte_ns = u.storage_byte_ns + EXCLUDED.storage_byte_ns,"
        "  mem_peak_bytes = greatest(u.mem_peak_bytes, EXCLUDED.mem_peak_bytes);"
        "INSERT INTO spend_daily AS s (key_id, day, account_id, cpu_rated, memory_rated, storage_rated)"
        " SELECT key_id, (hour AT TIME ZONE 'UTC')::date, min(account_id),"
        "        sum(cpu * rate_at(plan, 'cpu', hour)), sum(mem * rate_at(plan, 'memory', hour)),"
        "        sum(sto * rate_at(plan, 'storage', hour))"
        "   FROM (SELECT key_id, account_id, hour, account_plan(account_id) AS plan, sum(cpu_ns)::numeric AS cpu,"
        "                sum(mem_byte_ns) AS mem, sum(storage_byte_ns) AS sto"
        "           FROM stage_usage GROUP BY key_id, account_id, hour) g"
        "  GROUP BY key_id, (hour AT TIME ZONE 'UTC')::date"
        " ON CONFLICT (key_id, day) DO UPDATE SET cpu_rated = s.cpu_rated + EXCLUDED.cpu_rated,"
        "  memory_rated = s.memory_rated + EXCLUDED.memory_rated,"
        "  storage_rated = s.storage_rated + EXCLUDED.storage_rated;"
        "INSERT INTO fold_state AS f (sandbox_id, partition, account_id, key_id, epoch, seq, cpu_ns, wall_ns,"
        "  state, mem_size_bytes, disk_bytes)"
        " SELECT sandbox_id, partition, account_id, key_id, epoch, seq, cpu_ns, wall_ns, state, mem_size_bytes,"
        "        disk_bytes FROM stage_fold"
        " ON CONFLICT (sandbox_id) DO UPDATE SET partition = EXCLUDED.partition, epoch = EXCLUDED.epoch,"
        "  seq = EXCLUDED.seq, cpu_ns = EXCLUDED.cpu_ns, wall_ns = EXCLUDED.wall_ns, state = EXCLUDED.state,"
        "  mem_size_bytes = EXCLUDED.mem_size_bytes, disk_bytes = EXCLUDED.disk_bytes;"
        "INSERT INTO sandboxes AS s (id, account_id, key_id, host, vcpus, mem_size_bytes, state)"
        " SELECT sandbox_id, account_id, key_id, host, vcpus, mem_size_bytes, state FROM stage_fold WHERE sync"
        " ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, host = EXCLUDED.host, updated_at = now()"
        "  WHERE s.state IS DISTINCT FROM EXCLUDED.state OR s.host IS DISTINCT FROM EXCLUDED.host;";

/* After the usage: alerts once per (key, day, threshold), and the block at
 * 100%. Returns the keys newly blocked. */
static const char *const limits_sql =
        "WITH spent AS ("
        "  SELECT d.key_id, d.day, d.account_id, d.nanodollars, k.daily_limit_nanodollars AS lim, k.limit_policy"
        "    FROM spend_daily d JOIN api_keys k ON k.id = d.key_id"
        "   WHERE (d.key_id, d.day) IN (SELECT DISTINCT key_id, (hour AT TIME ZONE 'UTC')::date FROM stage_usage)"
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
        "  ON CONFLICT (key_id, day) DO NOTHING RETURNING key_id, day)"
        " SELECT (SELECT count(*) FROM fired), (SELECT count(*) FROM blocked)";

/* Keys blocked today that still had running sandboxes in this batch (the
 * newly blocked among them): their sandboxes get a command. */
static const char *const enforce_sql =
        "SELECT b.key_id, b.account_id, b.policy FROM key_blocks b"
        " WHERE b.day = (now() AT TIME ZONE 'UTC')::date"
        "   AND b.key_id IN (SELECT key_id FROM stage_fold WHERE state = 'running')";

static int db_session(struct agg *a, char *err, size_t errlen)
{
        int r = db_check_schema(a->db, SCHEMA_NEED, SCHEMA_KNOWN, err, errlen);
        if (r < 0)
                return r;
        if (db_exec(a->db, session_sql, err, errlen) < 0)
                return -EIO;
        PGresult *res = PQprepare(a->db, "dead_letter",
                                  "INSERT INTO dead_letters (topic, partition, \"offset\", raw, reason)"
                                  " VALUES ('usage', $1, $2, $3, $4) ON CONFLICT DO NOTHING", 4, NULL);
        r = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : -EIO;
        PQclear(res);
        if (r < 0) {
                snprintf(err, errlen, "could not prepare: %s", PQerrorMessage(a->db));
                return r;
        }
        return 0;
}

/* Makes sure the connection works, reconnecting if it broke. */
static int db_ensure(struct agg *a)
{
        char err[1024];
        if (a->db && PQstatus(a->db) == CONNECTION_OK)
                return 0;
        PQfinish(a->db);
        a->db = db_connect(a->cfg->database_url, err, sizeof(err));
        if (!a->db || db_session(a, err, sizeof(err)) < 0) {
                log_error("could not open the ledger", "error=\"%s\"", err);
                PQfinish(a->db);
                a->db = NULL;
                return -EIO;
        }
        return 0;
}

static int query_ok(struct agg *a, PGresult *res, ExecStatusType want, const char *what)
{
        if (PQresultStatus(res) == want)
                return 0;
        /* The server's message, on one line and without quotes, for the log. */
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(res));
        for (char *c = msg; *c; c++)
                if (*c == '\n' || *c == '"')
                        *c = *c == '\n' ? ' ' : '\'';
        log_error("ledger statement failed", "what=%s error=\"%s\"", what, msg);
        return -EIO;
}

static int copy_rows(struct agg *a, const char *sql, const char *buf, size_t len)
{
        PGresult *res = PQexec(a->db, sql);
        int r = query_ok(a, res, PGRES_COPY_IN, "copy");
        PQclear(res);
        if (r < 0)
                return r;
        if (len && PQputCopyData(a->db, buf, (int)len) != 1)
                r = -EIO;
        if (PQputCopyEnd(a->db, r < 0 ? "failed" : NULL) != 1)
                r = -EIO;
        res = PQgetResult(a->db);
        if (query_ok(a, res, PGRES_COMMAND_OK, "copy end") < 0)
                r = -EIO;
        PQclear(res);
        while ((res = PQgetResult(a->db)))
                PQclear(res);
        return r;
}

static int piece_cmp(const void *x, const void *y)
{
        const struct piece *p = x, *q = y;
        if (p->sb != q->sb)
                return p->sb < q->sb ? -1 : 1;
        return p->u.hour_ns < q->u.hour_ns ? -1 : p->u.hour_ns > q->u.hour_ns;
}

/* A growing text buffer for COPY. */
struct text {
        char *buf;
        size_t len, cap;
};

static int text_add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int text_add(struct text *t, const char *fmt, ...)
{
        for (;;) {
                va_list ap;
                va_start(ap, fmt);
                int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->cap - t->len, fmt, ap);
                va_end(ap);
                if (n < 0)
                        return -EINVAL;
                if ((size_t)n < t->cap - t->len) {
                        t->len += (size_t)n;
                        return 0;
                }
                size_t cap = t->cap ? t->cap * 2 : 1 << 20;
                while (cap < t->len + (size_t)n + 1)
                        cap *= 2;
                char *b = realloc(t->buf, cap);
                if (!b)
                        return -ENOMEM;
                t->buf = b;
                t->cap = cap;
        }
}

static int stage_usage(struct agg *a, struct text *t, size_t *ret_rows)
{
        qsort(a->pieces, a->npieces, sizeof(*a->pieces), piece_cmp);
        size_t rows = 0;
        t->len = 0;
        for (size_t i = 0; i < a->npieces;) {
                struct piece sum = a->pieces[i++];
                while (i < a->npieces && a->pieces[i].sb == sum.sb && a->pieces[i].u.hour_ns == sum.u.hour_ns) {
                        const struct fold_usage *u = &a->pieces[i++].u;
                        sum.u.cpu_ns += u->cpu_ns;
                        sum.u.mem_byte_ns += u->mem_byte_ns;
                        sum.u.storage_byte_ns += u->storage_byte_ns;
                        if (u->mem_peak_bytes > sum.u.mem_peak_bytes)
                                sum.u.mem_peak_bytes = u->mem_peak_bytes;
                }
                char hour[64], mem[48], sto[48];
                format_ts(hour, sizeof(hour), sum.u.hour_ns);
                if (text_add(t, "%s\t%s\t%s\t%s\t%" PRIu64 "\t%s\t%s\t%" PRIu64 "\n", sum.sb->id, hour,
                             sum.sb->account, sum.sb->key, sum.u.cpu_ns, u128_str(sum.u.mem_byte_ns, mem, sizeof(mem)),
                             u128_str(sum.u.storage_byte_ns, sto, sizeof(sto)), sum.u.mem_peak_bytes) < 0)
                        return -ENOMEM;
                rows++;
        }
        *ret_rows = rows;
        return copy_rows(a, "COPY stage_usage FROM STDIN", t->buf, t->len);
}

static int stage_fold(struct agg *a, struct text *t)
{
        t->len = 0;
        for (size_t i = 0; i < a->ndirty; i++) {
                const struct sandbox *s = a->dirty[i];
                const struct fold_state *f = &s->fold;
                bool sync = s->db_state != (int)f->state + 1 || strcmp(s->db_host, s->host) != 0;
                if (text_add(t, "%s\t%d\t%s\t%s\t%s\t%u\t%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%" PRId64 "\t%s\t%" PRIu64
                                "\t%" PRIu64 "\t%s\n",
                             s->id, s->partition, s->account, s->key, s->host, s->vcpus, f->epoch, f->seq, f->cpu_ns,
                             f->wall_ns, sandbox_state_name(f->state), f->mem_size_bytes, f->disk_bytes,
                             sync ? "t" : "f") < 0)
                        return -ENOMEM;
        }
        return copy_rows(a, "COPY stage_fold FROM STDIN", t->buf, t->len);
}

static int apply_event(struct agg *a, const struct usage_event *ev)
{
        char ts[64], vcpus[16], mem[32], disk[32];
        format_ts(ts, sizeof(ts), ev->wall_ns);
        PGresult *res;
        if (ev->type == EVENT_CREATED) {
                json_t *labels = json_object();
                for (size_t i = 0; i < ev->nlabels; i++)
                        json_object_set_new(labels, ev->labels[i].key, json_string(ev->labels[i].value));
                char *ljson = json_dumps(labels, JSON_COMPACT);
                json_decref(labels);
                snprintf(vcpus, sizeof(vcpus), "%u", ev->vcpus);
                snprintf(mem, sizeof(mem), "%" PRIu64, ev->mem_size_bytes);
                snprintf(disk, sizeof(disk), "%" PRIu64, ev->disk_size_bytes);
                const char *params[] = { ev->sandbox, ev->account, ev->key, ev->host, ev->parent[0] ? ev->parent : NULL,
                                         ev->backend[0] ? ev->backend : NULL, vcpus, mem, disk,
                                         ljson ? ljson : "{}", ts };
                res = PQexecParams(a->db,
                                   "INSERT INTO sandboxes AS s (id, account_id, key_id, host, parent_id, backend, vcpus,"
                                   "  mem_size_bytes, disk_size_bytes, labels, state, created_at)"
                                   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, 'running', $11)"
                                   " ON CONFLICT (id) DO UPDATE SET parent_id = EXCLUDED.parent_id,"
                                   "  backend = EXCLUDED.backend, vcpus = EXCLUDED.vcpus,"
                                   "  mem_size_bytes = EXCLUDED.mem_size_bytes, disk_size_bytes = EXCLUDED.disk_size_bytes,"
                                   "  labels = EXCLUDED.labels, created_at = EXCLUDED.created_at, updated_at = now()",
                                   11, NULL, params, NULL, NULL, 0);
                free(ljson);
        } else if (ev->type == EVENT_PAUSED || ev->type == EVENT_RESUMED || ev->type == EVENT_STOPPED) {
                const char *state = ev->type == EVENT_PAUSED ? "paused" : ev->type == EVENT_RESUMED ? "running" : "stopped";
                const char *params[] = { ev->sandbox, state };
                res = PQexecParams(a->db, "UPDATE sandboxes SET state = $2, updated_at = now() WHERE id = $1", 2,
                                   NULL, params, NULL, NULL, 0);
        } else {
                return 0; /* forked: each copy has its own created event */
        }
        int r = query_ok(a, res, PGRES_COMMAND_OK, event_type_name(ev->type));
        PQclear(res);
        return r;
}

static int store_dead(struct agg *a, const struct dead_letter *d)
{
        char p[16], o[32];
        snprintf(p, sizeof(p), "%d", d->partition);
        snprintf(o, sizeof(o), "%" PRId64, d->offset);
        const char *params[] = { p, o, d->raw, d->reason };
        int lens[] = { 0, 0, (int)d->len, 0 };
        int fmts[] = { 0, 0, 1, 0 };
        PGresult *res = PQexecPrepared(a->db, "dead_letter", 4, params, lens, fmts, 0);
        int r = query_ok(a, res, PGRES_COMMAND_OK, "dead letter");
        PQclear(res);
        if (r == 0)
                log_warn("message dead-lettered", "partition=%d offset=%" PRId64 " reason=\"%s\"", d->partition,
                         d->offset, d->reason);
        return r;
}

/* Moves each touched partition's next offset, only where our generation
 * still owns it. Returns 0, -ESTALE when fenced, -EIO. */
static int store_offsets(struct agg *a, struct text *t)
{
        t->len = 0;
        int n = 0;
        for (int32_t p = 0; p < a->nparts; p++) {
                if (!a->parts[p].touched)
                        continue;
                if (text_add(t, "%s(%d, %" PRId64 "::bigint, %" PRId64 "::bigint)", n ? "," : "", p,
                             a->parts[p].position, a->parts[p].generation) < 0)
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
        const char *params[] = { a->cfg->group };
        PGresult *res = PQexecParams(a->db, sql.buf, 1, NULL, params, NULL, NULL, 0);
        free(sql.buf);
        int r = query_ok(a, res, PGRES_COMMAND_OK, "offsets");
        if (r == 0 && atoi(PQcmdTuples(res)) != n)
                r = -ESTALE;
        PQclear(res);
        return r;
}

/* ---- spend-limit enforcement ---- */

struct command {
        char key[EVENT_ID_MAX + 1];
        char account[EVENT_ID_MAX + 1];
        enum control_action action;
};

static bool throttled(struct agg *a, const char *key, int64_t now)
{
        for (size_t i = 0; i < a->nthrottle; i++)
                if (strcmp(a->throttle[i].key, key) == 0) {
                        if (now - a->throttle[i].last_ns < NS_PER_SEC)
                                return true;
                        a->throttle[i].last_ns = now;
                        return false;
                }
        struct key_throttle *t = realloc(a->throttle, (a->nthrottle + 1) * sizeof(*t));
        if (!t)
                return false;
        a->throttle = t;
        snprintf(t[a->nthrottle].key, sizeof(t->key), "%s", key);
        t[a->nthrottle++].last_ns = now;
        return false;
}

static void publish(struct agg *a, const struct command *c)
{
        struct control_command cmd = { .action = c->action, .issued_ns = time_wall_ns() };
        snprintf(cmd.account, sizeof(cmd.account), "%s", c->account);
        snprintf(cmd.key, sizeof(cmd.key), "%s", c->key);
        snprintf(cmd.reason, sizeof(cmd.reason), "daily_limit");
        char buf[1024];
        int n = control_encode(&cmd, buf, sizeof(buf));
        if (n < 0) {
                log_error("could not encode a control command", "key=%s", c->key);
                return;
        }
        rd_kafka_resp_err_t e;
        while ((e = rd_kafka_producev(a->producer, RD_KAFKA_V_TOPIC(TOPIC_CONTROL),
                                      RD_KAFKA_V_KEY(cmd.account, strlen(cmd.account)),
                                      RD_KAFKA_V_VALUE(buf, (size_t)n), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                      RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(a->producer, 10);
        if (e)
                log_error("could not publish a control command", "key=%s error=\"%s\"", c->key, rd_kafka_err2str(e));
        else
                log_info("daily limit reached: command published", "key=%s account=%s action=%s", c->key, c->account,
                         control_action_name(c->action));
}

/* ---- commit ---- */

static void record_latency(struct agg *a)
{
        int64_t now_ms = time_wall_ns() / NS_PER_MS;
        for (size_t i = 0; i < a->nstamps; i++) {
                int64_t lag = now_ms - a->stamps[i];
                if (lag < 0)
                        lag = 0;
                a->lag_hist[lag < LAG_BUCKETS ? lag : LAG_BUCKETS - 1]++;
        }
}

static int64_t lag_quantile(const struct agg *a, uint64_t num, uint64_t den)
{
        uint64_t total = 0, seen = 0;
        for (int i = 0; i < LAG_BUCKETS; i++)
                total += a->lag_hist[i];
        if (!total)
                return -1;
        uint64_t want = (total * num + den - 1) / den;
        for (int i = 0; i < LAG_BUCKETS; i++) {
                seen += a->lag_hist[i];
                if (seen >= want)
                        return i;
        }
        return LAG_BUCKETS - 1;
}

static int resync(struct agg *a);

/* Commits the batch in one transaction. On failure the batch is dropped and
 * the state read back from the ledger (resync). */
static int commit_batch(struct agg *a)
{
        if (a->messages == 0)
                return 0;
        int64_t t0 = time_mono_ns();
        struct text t = { 0 };
        struct command *cmds = NULL;
        int ncmds = 0, r = db_ensure(a);
        size_t rows = 0;
        long fired = 0, blocked = 0;
        if (r < 0)
                goto fail;
        PGresult *res = PQexec(a->db, "BEGIN");
        r = query_ok(a, res, PGRES_COMMAND_OK, "begin");
        PQclear(res);
        if (r < 0)
                goto fail;
        if ((r = stage_usage(a, &t, &rows)) < 0 || (r = stage_fold(a, &t)) < 0)
                goto rollback;
        int64_t t_staged = time_mono_ns();
        res = PQexec(a->db, apply_sql);
        r = query_ok(a, res, PGRES_COMMAND_OK, "apply");
        PQclear(res);
        if (r < 0)
                goto rollback;
        for (size_t i = 0; i < a->nevents; i++)
                if ((r = apply_event(a, &a->events[i])) < 0)
                        goto rollback;
        for (size_t i = 0; i < a->ndead; i++)
                if ((r = store_dead(a, &a->dead[i])) < 0)
                        goto rollback;
        if ((r = store_offsets(a, &t)) < 0)
                goto rollback;
        int64_t t_applied = time_mono_ns();
        res = PQexec(a->db, limits_sql);
        r = query_ok(a, res, PGRES_TUPLES_OK, "limits");
        if (r == 0) {
                fired = atol(PQgetvalue(res, 0, 0));
                blocked = atol(PQgetvalue(res, 0, 1));
        }
        PQclear(res);
        if (r < 0)
                goto rollback;
        res = PQexec(a->db, enforce_sql);
        r = query_ok(a, res, PGRES_TUPLES_OK, "enforce");
        if (r == 0 && PQntuples(res) > 0) {
                cmds = calloc((size_t)PQntuples(res), sizeof(*cmds));
                for (int i = 0; cmds && i < PQntuples(res); i++) {
                        snprintf(cmds[i].key, sizeof(cmds[i].key), "%s", PQgetvalue(res, i, 0));
                        snprintf(cmds[i].account, sizeof(cmds[i].account), "%s", PQgetvalue(res, i, 1));
                        cmds[i].action = strcmp(PQgetvalue(res, i, 2), "stop") == 0 ? CONTROL_STOP : CONTROL_PAUSE;
                        ncmds++;
                }
        }
        PQclear(res);
        if (r < 0)
                goto rollback;
        int64_t t_limits = time_mono_ns();
        res = PQexec(a->db, "COMMIT");
        r = query_ok(a, res, PGRES_COMMAND_OK, "commit");
        PQclear(res);
        if (r < 0)
                goto fail;

        for (size_t i = 0; i < a->ndirty; i++) {
                struct sandbox *s = a->dirty[i];
                s->db_state = (int)s->fold.state + 1;
                memcpy(s->db_host, s->host, sizeof(s->db_host));
        }
        for (size_t i = 0; i < a->nevents; i++) {
                struct sandbox *s = sandbox_find(a, a->events[i].sandbox);
                if (s)
                        s->db_state = 0; /* the event may have changed the row's state */
        }
        record_latency(a);
        int64_t now = time_wall_ns();
        for (int i = 0; i < ncmds; i++)
                if (blocked || !throttled(a, cmds[i].key, now))
                        publish(a, &cmds[i]);
        a->committed_messages += a->messages;
        a->committed_batches++;
        a->dead_total += a->ndead;
        if (fired)
                log_info("spend alerts recorded", "alerts=%ld blocked_keys=%ld", fired, blocked);
        log_debug("batch committed",
                  "messages=%zu usage_rows=%zu sandboxes=%zu events=%zu dead=%zu stage_ms=%" PRId64 " apply_ms=%" PRId64
                  " limits_ms=%" PRId64 " ms=%" PRId64,
                  a->messages, rows, a->ndirty, a->nevents, a->ndead, (t_staged - t0) / NS_PER_MS,
                  (t_applied - t_staged) / NS_PER_MS, (t_limits - t_applied) / NS_PER_MS,
                  (time_mono_ns() - t0) / NS_PER_MS);
        batch_clear(a);
        free(t.buf);
        free(cmds);
        return 0;

rollback:
        res = PQexec(a->db, "ROLLBACK");
        PQclear(res);
fail:
        if (r == -ESTALE) {
                a->fenced++;
                log_warn("partition fenced: another aggregator owns it now; batch dropped", "messages=%zu", a->messages);
        } else {
                log_error("could not commit a batch; it will be read again", "messages=%zu", a->messages);
                time_sleep_ns(NS_PER_SEC / 2); /* do not spin on a database that keeps refusing */
        }
        free(t.buf);
        free(cmds);
        batch_clear(a);
        resync(a);
        return r;
}

/* ---- ownership ---- */

static int load_state(struct agg *a, const bool *load)
{
        struct text list = { 0 };
        int n = 0;
        for (int32_t p = 0; p < a->nparts; p++)
                if (load[p] && text_add(&list, "%s%d", n++ ? "," : "{", p) < 0)
                        return -ENOMEM;
        if (!n)
                return 0;
        if (text_add(&list, "}") < 0)
                return -ENOMEM;
        const char *params[] = { list.buf };
        PGresult *res = PQexecParams(a->db,
                                     "SELECT f.sandbox_id, f.partition, f.account_id, f.key_id, f.epoch, f.seq,"
                                     " f.cpu_ns, f.wall_ns, f.state, f.mem_size_bytes, f.disk_bytes,"
                                     " coalesce(s.host, ''), coalesce(s.vcpus, 1), coalesce(s.state, '')"
                                     " FROM fold_state f LEFT JOIN sandboxes s ON s.id = f.sandbox_id"
                                     " WHERE f.partition = ANY($1::int[])",
                                     1, NULL, params, NULL, NULL, 0);
        free(list.buf);
        int r = query_ok(a, res, PGRES_TUPLES_OK, "load state");
        for (int i = 0; r == 0 && i < PQntuples(res); i++) {
                const char *id = PQgetvalue(res, i, 0);
                struct sandbox *s = sandbox_find(a, id);
                if (!s && !(s = sandbox_add(a, id))) {
                        r = -ENOMEM;
                        break;
                }
                s->partition = atoi(PQgetvalue(res, i, 1));
                snprintf(s->account, sizeof(s->account), "%s", PQgetvalue(res, i, 2));
                snprintf(s->key, sizeof(s->key), "%s", PQgetvalue(res, i, 3));
                s->fold.known = true;
                s->fold.epoch = strtoull(PQgetvalue(res, i, 4), NULL, 10);
                s->fold.seq = strtoull(PQgetvalue(res, i, 5), NULL, 10);
                s->fold.cpu_ns = strtoull(PQgetvalue(res, i, 6), NULL, 10);
                s->fold.wall_ns = strtoll(PQgetvalue(res, i, 7), NULL, 10);
                if (sandbox_state_parse(PQgetvalue(res, i, 8), &s->fold.state) < 0)
                        s->fold.state = STATE_STOPPED;
                s->fold.mem_size_bytes = strtoull(PQgetvalue(res, i, 9), NULL, 10);
                s->fold.disk_bytes = strtoull(PQgetvalue(res, i, 10), NULL, 10);
                snprintf(s->host, sizeof(s->host), "%s", PQgetvalue(res, i, 11));
                s->vcpus = (uint32_t)strtoul(PQgetvalue(res, i, 12), NULL, 10);
                enum sandbox_state db;
                s->db_state = sandbox_state_parse(PQgetvalue(res, i, 13), &db) == 0 ? (int)db + 1 : 0;
                memcpy(s->db_host, s->host, sizeof(s->db_host));
        }
        PQclear(res);
        return r;
}

/* Claims partitions: bumps their generation, reads their next offsets and
 * the fold state of their sandboxes. Fills the offsets into parts. */
static int claim(struct agg *a, rd_kafka_topic_partition_list_t *parts)
{
        int r = db_ensure(a);
        if (r < 0)
                return r;
        bool *load = calloc((size_t)a->nparts + 65536, sizeof(bool));
        if (!load)
                return -ENOMEM;
        for (int i = 0; i < parts->cnt; i++) {
                rd_kafka_topic_partition_t *tp = &parts->elems[i];
                struct partition *p = part(a, tp->partition);
                if (!p) {
                        r = -ENOMEM;
                        goto out;
                }
                char pn[16];
                snprintf(pn, sizeof(pn), "%d", tp->partition);
                const char *params[] = { a->cfg->group, tp->topic, pn };
                PGresult *res = PQexecParams(a->db,
                                             "INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, generation)"
                                             " VALUES ($1, $2, $3, 0, 1) ON CONFLICT (group_id, topic, partition)"
                                             " DO UPDATE SET generation = consumer_offsets.generation + 1, updated_at = now()"
                                             " RETURNING next_offset, generation",
                                             3, NULL, params, NULL, NULL, 0);
                r = query_ok(a, res, PGRES_TUPLES_OK, "claim");
                if (r == 0) {
                        p->owned = true;
                        p->position = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
                        p->generation = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
                        tp->offset = p->position;
                        load[tp->partition] = true;
                        log_info("partition assigned", "partition=%d next_offset=%" PRId64 " generation=%" PRId64,
                                 tp->partition, p->position, p->generation);
                }
                PQclear(res);
                if (r < 0)
                        goto out;
        }
        bool drop[65536];
        memset(drop, 0, sizeof(drop));
        for (int32_t p = 0; p < a->nparts; p++)
                drop[p] = load[p];
        sandboxes_drop(a, drop);
        r = load_state(a, load);
out:
        free(load);
        return r;
}

/* After a failed commit: read back positions and state of what we still own. */
static int resync(struct agg *a)
{
        sandboxes_drop(a, NULL);
        while (!*a->stop) {
                if (db_ensure(a) < 0) {
                        time_sleep_ns(NS_PER_SEC);
                        continue;
                }
                rd_kafka_topic_partition_list_t *seek = rd_kafka_topic_partition_list_new(8);
                bool *load = calloc((size_t)a->nparts + 1, sizeof(bool));
                int r = load ? 0 : -ENOMEM;
                for (int32_t p = 0; r == 0 && p < a->nparts; p++) {
                        if (!a->parts[p].owned)
                                continue;
                        char pn[16];
                        snprintf(pn, sizeof(pn), "%d", p);
                        const char *params[] = { a->cfg->group, pn };
                        PGresult *res = PQexecParams(a->db,
                                                     "SELECT next_offset, generation FROM consumer_offsets"
                                                     " WHERE group_id = $1 AND topic = 'usage' AND partition = $2",
                                                     2, NULL, params, NULL, NULL, 0);
                        r = query_ok(a, res, PGRES_TUPLES_OK, "resync");
                        if (r == 0 && PQntuples(res) == 1 &&
                            strtoll(PQgetvalue(res, 0, 1), NULL, 10) == a->parts[p].generation) {
                                a->parts[p].position = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
                                rd_kafka_topic_partition_list_add(seek, TOPIC_USAGE, p)->offset = a->parts[p].position;
                                load[p] = true;
                        } else if (r == 0) {
                                a->parts[p].owned = false; /* fenced: the group will revoke it */
                        }
                        PQclear(res);
                }
                if (r == 0)
                        r = load_state(a, load);
                if (r == 0 && seek->cnt) {
                        rd_kafka_error_t *e = rd_kafka_seek_partitions(a->consumer, seek, 10000);
                        if (e) {
                                log_error("could not seek", "error=\"%s\"", rd_kafka_error_string(e));
                                rd_kafka_error_destroy(e);
                                r = -EIO;
                        }
                }
                free(load);
                rd_kafka_topic_partition_list_destroy(seek);
                if (r == 0)
                        return 0;
                sandboxes_drop(a, NULL);
                time_sleep_ns(NS_PER_SEC);
        }
        return -ECANCELED;
}

static void release(struct agg *a, const rd_kafka_topic_partition_list_t *parts)
{
        bool drop[65536];
        memset(drop, 0, sizeof(drop));
        for (int i = 0; i < parts->cnt; i++) {
                int32_t p = parts->elems[i].partition;
                if (p >= 0 && p < a->nparts) {
                        a->parts[p].owned = false;
                        drop[p] = true;
                        log_info("partition released", "partition=%d", p);
                }
        }
        sandboxes_drop(a, drop);
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *parts,
                         void *opaque)
{
        struct agg *a = opaque;
        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
                commit_batch(a); /* claiming replaces sandboxes the batch may point to */
                while (claim(a, parts) < 0 && !*a->stop) {
                        log_error("could not claim partitions; retrying", NULL);
                        time_sleep_ns(NS_PER_SEC);
                }
                rd_kafka_assign(rk, parts);
        } else {
                /* Revoked or lost: what we hold commits only if our generation
                 * still owns the partitions; then the state is dropped. */
                commit_batch(a);
                release(a, parts);
                rd_kafka_assign(rk, NULL);
        }
}

/* ---- the loop ---- */

/* Applies "name=value,name=value" to conf. */
static int set_consumer_settings(rd_kafka_conf_t *conf, const char *list, char *err, size_t errlen)
{
        char *copy = strdup(list ? list : "");
        if (!copy)
                return -ENOMEM;
        int r = 0;
        char *save = NULL;
        for (char *item = strtok_r(copy, ",", &save); item && r == 0; item = strtok_r(NULL, ",", &save)) {
                const char *pairs[] = { item, NULL };
                r = kafka_conf_set_all(conf, pairs, err, errlen);
        }
        free(copy);
        return r;
}

int aggregator_run(const struct aggregator_config *cfg, volatile sig_atomic_t *stop)
{
        struct agg a = { .cfg = cfg, .stop = stop };
        char err[1024];
        int r = -EIO;
        a.lag_hist = calloc(LAG_BUCKETS, sizeof(*a.lag_hist));
        if (!a.lag_hist)
                return -ENOMEM;
        a.db = db_connect(cfg->database_url, err, sizeof(err));
        if (!a.db || db_session(&a, err, sizeof(err)) < 0) {
                log_error("could not open the ledger", "error=\"%s\"", err);
                goto out;
        }
        a.producer = kafka_producer_new(cfg->kafka_brokers, NULL, NULL, err, sizeof(err));
        if (!a.producer) {
                log_error("could not create the control producer", "error=\"%s\"", err);
                goto out;
        }
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
        rd_kafka_conf_set_opaque(conf, &a);
        static const char *const consumer_settings[] = {
                "fetch.max.bytes=16777216", "max.partition.fetch.bytes=4194304", "fetch.wait.max.ms=20",
                "queued.min.messages=200000", NULL };
        if (kafka_conf_set_all(conf, consumer_settings, err, sizeof(err)) < 0 ||
            set_consumer_settings(conf, cfg->consumer_settings, err, sizeof(err)) < 0) {
                rd_kafka_conf_destroy(conf);
                log_error("bad consumer setting", "error=\"%s\"", err);
                goto out;
        }
        a.consumer = kafka_consumer_new(cfg->kafka_brokers, cfg->group, conf, NULL, err, sizeof(err));
        if (!a.consumer) {
                log_error("could not create the consumer", "error=\"%s\"", err);
                goto out;
        }
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, TOPIC_USAGE, RD_KAFKA_PARTITION_UA);
        rd_kafka_resp_err_t e = rd_kafka_subscribe(a.consumer, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        if (e) {
                log_error("could not subscribe", "error=\"%s\"", rd_kafka_err2str(e));
                goto out;
        }
        log_info("aggregator started", "group=%s batch_messages=%" PRId64 " batch_ms=%" PRId64, cfg->group,
                 cfg->batch_messages, cfg->batch_ms);
        int64_t last_report = time_mono_ns();
        while (!*stop) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(a.consumer, a.messages ? 5 : 100);
                bool drained = !m;
                if (m) {
                        if (!m->err) {
                                if (take_message(&a, m) < 0) {
                                        log_error("out of memory; dropping the batch to read it again", NULL);
                                        batch_clear(&a);
                                        resync(&a);
                                }
                        } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                                log_warn("consumer error", "error=\"%s\"", rd_kafka_message_errstr(m));
                        }
                        rd_kafka_message_destroy(m);
                }
                /* Commit when the batch is full, old enough, or nothing more is
                 * waiting: under load batches grow while the previous one
                 * commits; when idle a sample is committed without delay. */
                if (a.messages && (drained || (int64_t)a.messages >= cfg->batch_messages ||
                                   time_mono_ns() - a.batch_started >= cfg->batch_ms * NS_PER_MS))
                        commit_batch(&a);
                rd_kafka_poll(a.producer, 0);
                if (time_mono_ns() - last_report >= 10 * NS_PER_SEC) {
                        last_report = time_mono_ns();
                        log_info("progress", "messages=%" PRIu64 " batches=%" PRIu64 " sandboxes=%zu dead=%" PRIu64
                                             " fenced=%" PRIu64 " commit_lag_ms_p50=%" PRId64 " commit_lag_ms_p99=%" PRId64,
                                 a.committed_messages, a.committed_batches, a.nsandboxes, a.dead_total, a.fenced,
                                 lag_quantile(&a, 50, 100), lag_quantile(&a, 99, 100));
                }
        }
        commit_batch(&a);
        r = 0;
out:
        if (a.consumer) {
                rd_kafka_consumer_close(a.consumer);
                rd_kafka_destroy(a.consumer);
        }
        if (a.producer) {
                rd_kafka_flush(a.producer, 10000);
                rd_kafka_destroy(a.producer);
        }
        if (r == 0)
                log_info("aggregator stopped", "messages=%" PRIu64 " batches=%" PRIu64 " dead=%" PRIu64 " fenced=%" PRIu64
                                               " commit_lag_ms_p50=%" PRId64 " commit_lag_ms_p99=%" PRId64,
                         a.committed_messages, a.committed_batches, a.dead_total, a.fenced, lag_quantile(&a, 50, 100),
                         lag_quantile(&a, 99, 100));
        batch_clear(&a);
        sandboxes_drop(&a, NULL);
        free(a.buckets);
        free(a.parts);
        free(a.pieces);
        free(a.dirty);
        free(a.events);
        free(a.dead);
        free(a.stamps);
        free(a.throttle);
        free(a.lag_hist);
        PQfinish(a.db);
        return r;
}
