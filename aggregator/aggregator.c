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
#include "schema_version.h"
#include "event.h"
#include "fold.h"
#include "kafka.h"
#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "sample_decode.h"
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
#define SCHEMA_NEED  14 /* held_readings */
#define SCHEMA_KNOWN TALLY_SCHEMA_VERSION

#define LAG_BUCKETS 60000 /* 1 ms each: commit latency histogram up to 60 s */

struct sandbox {
        char id[EVENT_ID_MAX + 1];
        char account[EVENT_ID_MAX + 1];
        char key[EVENT_ID_MAX + 1];
        char host[EVENT_ID_MAX + 1];
        int32_t partition;
        /* Its size, from its `created` event (or the ledger's row of it): a
         * reading that does not carry one (the vmm's `stopped` event need
         * not) is billed at this size. 0: not known. */
        uint32_t vcpus;
        uint64_t mem_size_bytes;
        struct fold_state fold;
        bool dirty;             /* listed in the batch's dirty list */
        /* What the sandboxes table holds for it (state + 1; 0: unknown), and
         * its host there: the row is only written when they change. */
        int db_state;
        char db_host[EVENT_ID_MAX + 1];
        int64_t version;        /* fold_state.version it was read or last written at; 0: no row */
        /* Network bytes (recorded, not priced): the highest cumulative counters
         * its samples carried, and whether the sandboxes row is behind them. */
        uint64_t net_rx, net_tx;
        bool net_unsaved;
        int64_t used_ns;        /* monotonic time of its last commit, for eviction */
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
        struct waiting *waiting;
        size_t nwaiting, capwaiting;
        size_t messages;
        int64_t batch_started;
        int64_t *stamps;        /* Kafka create time (ms) of each message, for the latency figures */
        size_t nstamps, capstamps;

        struct key_throttle *throttle;
        size_t nthrottle;

        uint64_t *lag_hist;
        uint64_t committed_messages, committed_batches, fenced, dead_total;

        /* Rate limits of the fold's notes in the log (its counts are in metrics). */
        int64_t note_logged_ns[3];
        uint64_t note_suppressed[3];
        /* Sandboxes a prefetch looked up and the ledger has no row for
         * (sorted): new, so sandbox_add need not ask again. */
        char (*absent)[EVENT_ID_MAX + 1];
        size_t nabsent, capabsent;
        uint64_t seek_gen;      /* +1 whenever positions are reset (claim, resync): held messages are stale */

        /* The batch's first message, kept whole: a batch of one that the
         * database keeps refusing becomes a dead letter. */
        int32_t first_partition;
        int64_t first_offset;
        char *first_raw;
        size_t first_len, first_cap;

        /* Poison isolation (docs/billing.md, "Dead letters"). */
        char last_error[256];   /* SQLSTATE and message of the last refused statement */
        char fail_reason[256];  /* the reason the previous commit failed for, "" if it did not */
        int64_t split_limit;    /* 0, or the batch size while a failing batch is being split */
        int64_t split_left;     /* messages to commit before batches grow back */

        int64_t last_sweep_ns, last_gap_check_ns, last_gap_log_ns, last_held_check_ns;
        struct agg_metrics *metrics;
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

/* Length of the valid UTF-8 character at s (RFC 3629: no overlong forms,
 * no surrogates, nothing above U+10FFFF), or 0. */
static size_t utf8_char(const unsigned char *s)
{
        if (s[0] < 0x80)
                return 1;
        size_t n;
        unsigned lo = 0x80, hi = 0xBF;
        if (s[0] >= 0xC2 && s[0] <= 0xDF)
                n = 2;
        else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
                n = 3;
                lo = s[0] == 0xE0 ? 0xA0 : 0x80;
                hi = s[0] == 0xED ? 0x9F : 0xBF;
        } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
                n = 4;
                lo = s[0] == 0xF0 ? 0x90 : 0x80;
                hi = s[0] == 0xF4 ? 0x8F : 0xBF;
        } else
                return 0;
        if (s[1] < lo || s[1] > hi)
                return 0;
        for (size_t i = 2; i < n; i++)
                if (s[i] < 0x80 || s[i] > 0xBF)
                        return 0;
        return n;
}

/* Copies src into dst (size bytes with the NUL) as valid UTF-8: cut on a
 * character boundary, never inside one, and any byte that starts no valid
 * character (a reason cut mid-character by whoever wrote it) becomes '?'.
 * The ledger refuses text that is not UTF-8. */
static void utf8_copy(char *dst, size_t size, const char *src)
{
        const unsigned char *s = (const unsigned char *)src;
        size_t o = 0;
        while (*s && size) {
                size_t n = utf8_char(s);
                if (n == 0) {
                        if (o + 1 >= size)
                                break;
                        dst[o++] = '?';
                        s++;
                        continue;
                }
                if (o + n >= size)
                        break;
                memcpy(dst + o, s, n);
                o += n;
                s += n;
        }
        if (size)
                dst[o] = '\0';
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

static struct sandbox *sandbox_new(struct agg *a, const char *id)
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
        s->used_ns = time_mono_ns();
        atomic_store_explicit(&a->metrics->sandboxes_in_memory, a->nsandboxes, memory_order_relaxed);
        return s;
}

static bool absent_has(const struct agg *a, const char *id);
static int load_sandboxes(struct agg *a, char (*ids)[EVENT_ID_MAX + 1], size_t n);

/* A sandbox not in memory: its fold state is read from the ledger by id
 * (whatever partition it arrives on), unless a prefetch already found it has
 * none. NULL when the ledger cannot be read: the caller drops the batch and
 * reads it again, never billing from an empty state a row exists for. */
static struct sandbox *sandbox_add(struct agg *a, const char *id)
{
        if (!absent_has(a, id)) {
                char ids[1][EVENT_ID_MAX + 1];
                snprintf(ids[0], sizeof(ids[0]), "%s", id);
                if (load_sandboxes(a, ids, 1) < 0)
                        return NULL;
                struct sandbox *s = sandbox_find(a, id);
                if (s)
                        return s;
        }
        return sandbox_new(a, id);
}

/* Drops the state of every sandbox of partitions for which drop[p] is set
 * (drop NULL: all). Also forgets which sandboxes the ledger had no row for. */
static void sandboxes_drop(struct agg *a, const bool *drop)
{
        a->nabsent = 0;
        for (size_t i = 0; i < a->nbuckets; i++) {
                struct sandbox **pp = &a->buckets[i];
                while (*pp) {
                        struct sandbox *s = *pp;
                        if (!drop || (s->partition < a->nparts && drop[s->partition])) {
                                *pp = s->next;
                                free(s);
                                a->nsandboxes--;
                                if (a->metrics)
                                        atomic_store_explicit(&a->metrics->sandboxes_in_memory, a->nsandboxes,
                                                              memory_order_relaxed);
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
        for (size_t i = 0; i < a->nwaiting; i++)
                free(a->waiting[i].raw);
        a->npieces = a->ndirty = a->nevents = a->ndead = a->messages = a->nstamps = a->nwaiting = 0;
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
        utf8_copy(d->reason, sizeof(d->reason), why);
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
                atomic_fetch_add_explicit(&a->metrics->clock_ahead, 1, memory_order_relaxed);
                if (note_log_due(a, 0, &suppressed))
                        log_warn("reading dated ahead of the aggregator's clock; placed at the aggregator's clock",
                                 "sandbox=%s host=%s type=%s wall_ns=%" PRId64 " aggregator_ns=%" PRId64
                                 " suppressed=%" PRIu64,
                                 ev->sandbox, ev->host, event_type_name(ev->type), ev->wall_ns, now, suppressed);
        }
        if (notes & FOLD_NOTE_CLOCK_BEHIND) {
                atomic_fetch_add_explicit(&a->metrics->clock_behind, 1, memory_order_relaxed);
                if (note_log_due(a, 1, &suppressed))
                        log_warn("reading dated too far behind the aggregator's clock; placed at the aggregator's clock",
                                 "sandbox=%s host=%s type=%s wall_ns=%" PRId64 " aggregator_ns=%" PRId64
                                 " suppressed=%" PRIu64,
                                 ev->sandbox, ev->host, event_type_name(ev->type), ev->wall_ns, now, suppressed);
        }
        if (notes & FOLD_NOTE_HELD_BACK) {
                atomic_fetch_add_explicit(&a->metrics->held_back, 1, memory_order_relaxed);
                if (note_log_due(a, 2, &suppressed))
                        log_warn("held counters went back; billed only beyond the highest",
                                 "sandbox=%s host=%s running_ns=%" PRIu64 " paused_ns=%" PRIu64
                                 " billed_running_ns=%" PRIu64 " billed_paused_ns=%" PRIu64 " suppressed=%" PRIu64,
                                 ev->sandbox, ev->host, ev->running_ns, ev->paused_ns, before->running_ns,
                                 before->paused_ns, suppressed);
        }
}

static int mark_dirty(struct agg *a, struct sandbox *sb)
{
        if (sb->dirty)
                return 0;
        if (grow((void **)&a->dirty, &a->capdirty, a->ndirty + 1, sizeof(*a->dirty)) < 0)
                return -ENOMEM;
        a->dirty[a->ndirty++] = sb;
        sb->dirty = true;
        return 0;
}

/* The batch's sandbox of id, from memory or the ledger (new if neither has
 * it); NULL when the ledger cannot be read. */
static struct sandbox *sandbox_of(struct agg *a, const struct raw *m, const struct usage_event *ev)
{
        struct sandbox *sb = sandbox_find(a, ev->sandbox);
        if (sb)
                return sb;
        if (!(sb = sandbox_add(a, ev->sandbox)))
                return NULL;
        snprintf(sb->account, sizeof(sb->account), "%s", ev->account);
        snprintf(sb->key, sizeof(sb->key), "%s", ev->key);
        sb->partition = m->partition;
        return sb;
}

enum outcome { TAKEN, REFUSED, HELD };

/* Folds one reading (a sample or the vmm's `stopped` event) into its
 * sandbox's state. *ret says whether it was billed, dead-lettered, or is to
 * be held until its sandbox's provenance comes (then held_why says why). */
static int fold_reading(struct agg *a, const struct raw *m, const struct usage_event *in, enum outcome *ret,
                        char *held_why, size_t held_whylen)
{
        int32_t partition = m->partition;
        *ret = REFUSED;
        struct sandbox *sb = sandbox_find(a, in->sandbox);
        if (!sb && !(sb = sandbox_of(a, m, in)))
                return -ENOMEM;
        char buf[200];
        const char *why = NULL;
        /* Provenance: only the host that created the sandbox reads its counters
         * (a reading that names none is its creator's, like its key and size). */
        if (sb->fold.created && sb->fold.host[0] && in->host[0] && strcmp(in->host, sb->fold.host) != 0) {
                snprintf(buf, sizeof(buf), "%s from host %s, but the sandbox was created on host %s",
                         event_type_name(in->type), in->host, sb->fold.host);
                return add_dead(a, m->partition, m->offset, m->payload, m->len, buf);
        }
        /* A reading without the key or the size (the vmm's `stopped` event needs
         * none) is billed with the sandbox's: its last reading's, or its created
         * event's. Before that event it is held like any reading (the fold says so). */
        if (sb->key[0] == '\0' && in->key[0] != '\0') {
                snprintf(sb->account, sizeof(sb->account), "%s", in->account);
                snprintf(sb->key, sizeof(sb->key), "%s", in->key);
        }
        struct usage_event ev = *in; /* a shallow copy the fold reads; in keeps its labels */
        if (!ev.vcpus)
                ev.vcpus = sb->vcpus;
        if (!ev.mem_size_bytes && !sb->fold.known)
                ev.mem_size_bytes = sb->mem_size_bytes;
        if (sb->fold.created && sb->key[0] == '\0')
                return add_dead(a, m->partition, m->offset, m->payload, m->len,
                                "no key, and neither a reading nor the created event of the sandbox gave one");
        if (sb->fold.created && !ev.vcpus)
                return add_dead(a, m->partition, m->offset, m->payload, m->len,
                                "no vcpus, and neither a reading nor the created event of the sandbox gave them");
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
        switch (r) {
        case FOLD_DUPLICATE:
        case FOLD_OLD_EPOCH:
                *ret = TAKEN;
                return 0;
        case FOLD_UNANNOUNCED:
                if (!before.created)
                        snprintf(held_why, held_whylen, "no created event for the sandbox");
                else
                        snprintf(held_why, held_whylen,
                                 "epoch %" PRIu64 " was never announced by the sandbox's host (announced up to %" PRIu64 ")",
                                 ev.epoch, before.epoch_max > before.epoch ? before.epoch_max : before.epoch);
                *ret = HELD;
                return 0;
        case FOLD_IMPOSSIBLE:
                if (!before.known && before.created_ns > 0) {
                        snprintf(buf, sizeof(buf),
                                 "impossible first reading: more CPU or held time than %u vCPUs could use since the "
                                 "sandbox was created",
                                 before.created_vcpus ? before.created_vcpus : ev.vcpus);
                        why = buf;
                } else {
                        why = "impossible sample: more CPU or held time than could pass in the time";
                }
                break;
        case FOLD_STOP_BEHIND:
                snprintf(buf, sizeof(buf),
                         "stopped event behind what was billed: cpu_ns %" PRIu64 " (billed %" PRIu64 "), wall_ns %" PRId64
                         " (billed %" PRId64 ")",
                         ev.cpu_ns, before.cpu_ns, ev.wall_ns, before.wall_ns);
                why = buf;
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
                atomic_fetch_add_explicit(&a->metrics->counter_resets, 1, memory_order_relaxed);
                log_warn("counter went back within an epoch: taken as a restart, billed from zero",
                         "sandbox=%s host=%s epoch=%" PRIu64 " seq=%" PRIu64 " cpu_ns=%" PRIu64
                         " billed_cpu_ns=%" PRIu64,
                         ev.sandbox, ev.host, ev.epoch, ev.seq, ev.cpu_ns, before.cpu_ns);
                break;
        case FOLD_BILLED:
                break;
        }
        if (why)
                return add_dead(a, m->partition, m->offset, m->payload, m->len, why);
        *ret = TAKEN;
        if (ev.type == EVENT_STOPPED)
                atomic_fetch_add_explicit(&a->metrics->stops_folded, 1, memory_order_relaxed);
        if (ev.host[0])
                snprintf(sb->host, sizeof(sb->host), "%s", ev.host);
        if (ev.vcpus)
                sb->vcpus = ev.vcpus;
        if (ev.net_known && (ev.net_rx_bytes > sb->net_rx || ev.net_tx_bytes > sb->net_tx)) {
                if (ev.net_rx_bytes > sb->net_rx)
                        sb->net_rx = ev.net_rx_bytes;
                if (ev.net_tx_bytes > sb->net_tx)
                        sb->net_tx = ev.net_tx_bytes;
                sb->net_unsaved = true;
        }
        sb->partition = partition;
        return mark_dirty(a, sb);
}

/* Holds a reading of this batch until its sandbox's provenance comes. */
static int hold(struct agg *a, const struct raw *m, const char *sandbox, const char *why)
{
        if (grow((void **)&a->waiting, &a->capwaiting, a->nwaiting + 1, sizeof(*a->waiting)) < 0)
                return -ENOMEM;
        struct waiting *w = &a->waiting[a->nwaiting];
        *w = (struct waiting){ .partition = m->partition, .offset = m->offset, .len = m->len };
        if (!(w->raw = malloc(m->len ? m->len : 1)))
                return -ENOMEM;
        if (m->len)
                memcpy(w->raw, m->payload, m->len);
        snprintf(w->sandbox, sizeof(w->sandbox), "%s", sandbox);
        utf8_copy(w->reason, sizeof(w->reason), why);
        a->nwaiting++;
        atomic_fetch_add_explicit(&a->metrics->readings_held, 1, memory_order_relaxed);
        /* Its fold state is written too (unchanged), fenced by version like any: should
         * another aggregator have taken the sandbox's announcement meanwhile, this batch is
         * read again with the state that has it, and the reading is billed, not held. */
        struct sandbox *sb = sandbox_find(a, sandbox);
        /* (not one known by nothing but a keyless reading: no row without a key) */
        return sb && sb->key[0] ? mark_dirty(a, sb) : 0;
}

/* A held reading replayed and still held: it waits now for what `why` says
 * (a `created` event came, but not its epoch's announcement), and says so
 * when its grace runs out. */
static void rehold(struct agg *a, const struct raw *m, const char *why)
{
        for (size_t i = 0; i < a->nwaiting; i++) {
                struct waiting *w = &a->waiting[i];
                if (w->partition != m->partition || w->offset != m->offset || strcmp(w->reason, why) == 0)
                        continue;
                utf8_copy(w->reason, sizeof(w->reason), why);
                w->reason_moved = true;
        }
}

/* Takes a decoded reading: billed, dead-lettered or held (not again when
 * replaying a held one: *ret_held says it still waits). A billed `stopped`
 * event goes on to the batch's events (which then own it); otherwise ev is
 * cleared. */
static int take_reading(struct agg *a, const struct raw *m, struct usage_event *ev, bool replay, bool *ret_held)
{
        enum outcome o;
        char why[200];
        int r = fold_reading(a, m, ev, &o, why, sizeof(why));
        *ret_held = r == 0 && o == HELD;
        if (r == 0 && o == HELD && !replay)
                r = hold(a, m, ev->sandbox, why);
        else if (r == 0 && o == HELD)
                rehold(a, m, why);
        if (r < 0 || o != TAKEN || ev->type != EVENT_STOPPED) {
                event_clear(ev);
                return r;
        }
        if (grow((void **)&a->events, &a->capevents, a->nevents + 1, sizeof(*a->events)) < 0) {
                event_clear(ev);
                return -ENOMEM;
        }
        a->events[a->nevents++] = *ev; /* the batch owns it now */
        return 0;
}

static int take_announcement(struct agg *a, const struct raw *m, struct usage_event *ev, bool replay,
                             bool *ret_held);

static int db_ensure(struct agg *a);
static int query_ok(struct agg *a, PGresult *res, ExecStatusType want, const char *what);

/* Reads back what earlier batches held for the sandbox, then bills (or
 * refuses) everything held for it that its provenance now allows: the
 * earlier batches' readings first, then this batch's, each in order. */
static int replay_waiting(struct agg *a, const char *sandbox)
{
        if (db_ensure(a) < 0)
                return -EIO;
        const char *params[] = { sandbox };
        PGresult *res = PQexecParams(a->db,
                                     "SELECT partition, \"offset\", raw, reason FROM held_readings"
                                     " WHERE sandbox_id = $1 ORDER BY held_at, partition, \"offset\"",
                                     1, NULL, params, NULL, NULL, 0);
        int r = query_ok(a, res, PGRES_TUPLES_OK, "held readings");
        size_t first_new = a->nwaiting;
        for (int i = 0; r == 0 && i < PQntuples(res); i++) {
                int32_t p = (int32_t)strtol(PQgetvalue(res, i, 0), NULL, 10);
                int64_t o = strtoll(PQgetvalue(res, i, 1), NULL, 10);
                bool have = false;
                for (size_t k = 0; k < first_new && !have; k++)
                        have = a->waiting[k].stored && a->waiting[k].partition == p && a->waiting[k].offset == o;
                if (have)
                        continue;
                size_t len = 0;
                unsigned char *raw = PQunescapeBytea((const unsigned char *)PQgetvalue(res, i, 2), &len);
                if (!raw || grow((void **)&a->waiting, &a->capwaiting, a->nwaiting + 1, sizeof(*a->waiting)) < 0) {
                        PQfreemem(raw);
                        r = -ENOMEM;
                        break;
                }
                struct waiting *w = &a->waiting[a->nwaiting];
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
                a->nwaiting++;
        }
        PQclear(res);
        if (r < 0)
                return r;
        /* Stored rows first, then this batch's; a replay may hold nothing new
         * but may add dead letters and events (never entries to waiting). */
        for (int pass = 0; pass < 2; pass++)
                for (size_t i = 0; i < a->nwaiting; i++) {
                        struct waiting *w = &a->waiting[i];
                        if (w->done || w->stored != (pass == 0) || strcmp(w->sandbox, sandbox) != 0)
                                continue;
                        struct raw m = { .partition = w->partition, .offset = w->offset, .payload = w->raw,
                                         .len = w->len };
                        struct usage_event ev;
                        char why[256];
                        bool held = false;
                        w->done = true; /* so that a replay within this one does not take it again */
                        if (event_decode(w->raw, w->len, &ev, why, sizeof(why)) < 0)
                                r = add_dead(a, w->partition, w->offset, w->raw, w->len, why);
                        else if (ev.type == EVENT_RESTARTED)
                                r = take_announcement(a, &m, &ev, true, &held);
                        else
                                r = take_reading(a, &m, &ev, true, &held);
                        w = &a->waiting[i]; /* (nothing grows it during a replay, but read it again) */
                        if (r < 0)
                                return r;
                        w->done = !held;
                        if (!held)
                                atomic_fetch_add_explicit(&a->metrics->readings_released, 1, memory_order_relaxed);
                }
        return 0;
}

/* A `created` event (the sandbox's host, moment and size) or a `restarted`
 * one (a new epoch announced): what lets its sandbox's readings be billed.
 * A `created` goes on to the batch's events (which then own it). */
static int take_announcement(struct agg *a, const struct raw *m, struct usage_event *ev, bool replay, bool *ret_held)
{
        *ret_held = false;
        struct sandbox *sb = sandbox_of(a, m, ev);
        if (!sb) {
                event_clear(ev);
                return -ENOMEM;
        }
        char buf[200], id[EVENT_ID_MAX + 1];
        const char *why = NULL;
        snprintf(id, sizeof(id), "%s", ev->sandbox);
        if (ev->type == EVENT_CREATED && sb->fold.created && sb->fold.host[0] && strcmp(sb->fold.host, ev->host) != 0) {
                snprintf(buf, sizeof(buf), "created again from host %s, but the sandbox was created on host %s",
                         ev->host[0] ? ev->host : "(none)", sb->fold.host);
                why = buf;
        } else {
                int r = fold_announce(&sb->fold, ev);
                if (r == -ENOENT) {
                        *ret_held = true;
                        r = replay ? 0 : hold(a, m, id, "no created event for the sandbox");
                        event_clear(ev);
                        return r;
                }
                if (r == -EPERM) {
                        snprintf(buf, sizeof(buf), "restarted from host %s, but the sandbox was created on host %s",
                                 ev->host[0] ? ev->host : "(none)", sb->fold.host);
                        why = buf;
                } else if (r == -ERANGE) {
                        snprintf(buf, sizeof(buf), "restarted epoch %" PRIu64 " is more than %d above the highest known",
                                 ev->epoch, FOLD_JUMP_MAX);
                        why = buf;
                }
        }
        if (why) {
                event_clear(ev);
                return add_dead(a, m->partition, m->offset, m->payload, m->len, why);
        }
        if (ev->type == EVENT_CREATED) {
                /* the key and size of the readings that carry none (the vmm's `stopped` event) */
                if (sb->key[0] == '\0') {
                        snprintf(sb->account, sizeof(sb->account), "%s", ev->account);
                        snprintf(sb->key, sizeof(sb->key), "%s", ev->key);
                }
                if (!sb->vcpus)
                        sb->vcpus = ev->vcpus;
                if (!sb->mem_size_bytes)
                        sb->mem_size_bytes = ev->mem_size_bytes;
        }
        if (ev->type == EVENT_RESTARTED)
                log_info("sandbox's counters restarted: new epoch announced", "sandbox=%s host=%s epoch=%" PRIu64
                         " reason=%s", ev->sandbox, ev->host, ev->epoch, ev->reason);
        int r = mark_dirty(a, sb);
        if (r == 0 && ev->type == EVENT_CREATED) {
                if (grow((void **)&a->events, &a->capevents, a->nevents + 1, sizeof(*a->events)) < 0)
                        r = -ENOMEM;
                else
                        a->events[a->nevents++] = *ev; /* the batch owns it now */
        }
        if (r < 0 || ev->type != EVENT_CREATED)
                event_clear(ev);
        return r < 0 ? r : replay_waiting(a, id);
}

/* Takes one message into the batch. Never fails on the message's content. */
static int take_message(struct agg *a, const rd_kafka_message_t *m)
{
        struct partition *p = part(a, m->partition);
        if (!p || !p->owned || m->offset < p->position)
                return 0; /* not ours (any more), or already in the ledger */
        struct raw raw = { .partition = m->partition, .offset = m->offset, .payload = m->payload, .len = m->len };
        struct usage_event ev;
        char why[256];
        int r = 0;
        bool held;
        /* Samples take the fast path (sample_decode.h); anything it is not
         * sure of, event_decode. */
        if (!sample_decode_fast(m->payload, m->len, &ev) && event_decode(m->payload, m->len, &ev, why, sizeof(why)) < 0) {
                r = add_dead(a, m->partition, m->offset, m->payload, m->len, why);
        } else if (ev.type == EVENT_SAMPLE || ev.type == EVENT_STOPPED) {
                r = take_reading(a, &raw, &ev, false, &held);
        } else if (ev.type == EVENT_CREATED || ev.type == EVENT_RESTARTED) {
                r = take_announcement(a, &raw, &ev, false, &held);
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
        "CREATE TEMP TABLE IF NOT EXISTS stage_fold (sandbox_id text, account_id text, key_id text, host text,"
        " vcpus integer, fold text, version bigint, stopped boolean, state text, mem_size_bytes bigint,"
        " wall timestamptz, sync boolean, net_rx bigint, net_tx bigint) ON COMMIT DELETE ROWS;";

/* The fold state of the batch's sandboxes, fenced per sandbox: a row is
 * written only where its version is still the one this aggregator read, so
 * the count tells whether another owner moved any of them on meanwhile.
 * In id order: two aggregators sharing sandboxes lock their rows in one order. */
static const char *const fold_sql =
        "WITH w AS (INSERT INTO fold_state AS f (sandbox_id, account_id, key_id, fold, version, stopped)"
        "  SELECT sandbox_id, account_id, key_id, fold, version + 1, stopped FROM stage_fold ORDER BY sandbox_id"
        "  ON CONFLICT (sandbox_id) DO UPDATE SET account_id = EXCLUDED.account_id, key_id = EXCLUDED.key_id,"
        "   fold = EXCLUDED.fold, version = EXCLUDED.version, stopped = EXCLUDED.stopped, updated_at = now()"
        "   WHERE f.version = EXCLUDED.version - 1 RETURNING 1)"
        " SELECT count(*) FROM w";

/* Per host, when a sample of it was last committed (in host order, so that
 * aggregators sharing a host lock its row in one order). */
static const char *const hosts_sql =
        "INSERT INTO hosts AS h (host, last_sample_at, last_sample_wall)"
        " SELECT host, now(), max(wall) FROM stage_fold WHERE host <> '' GROUP BY host ORDER BY host"
        " ON CONFLICT (host) DO UPDATE SET last_sample_at = EXCLUDED.last_sample_at,"
        "  last_sample_wall = greatest(h.last_sample_wall, EXCLUDED.last_sample_wall)";

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
 * UTC day (the exact sums of quantity x rate), and the usage its plan has no
 * rate for, recorded once per (account, meter, hour) in rating_gaps and
 * returned so the aggregator can say so loudly. Such usage adds nothing to
 * spend (docs/billing.md, "Dead letters"); invoices price it when read. */
static const char *const rate_sql =
        "WITH g AS ("
        "  SELECT key_id, account_id, hour, plan, cpu, mem, sto, rate_at(plan, 'cpu', hour) AS rc,"
        "         rate_at(plan, 'memory', hour) AS rm, rate_at(plan, 'storage', hour) AS rs"
        "    FROM (SELECT key_id, account_id, hour, account_plan(account_id) AS plan, sum(cpu_ns)::numeric AS cpu,"
        "                 sum(mem_byte_ns) AS mem, sum(storage_byte_ns) AS sto"
        "            FROM stage_usage GROUP BY key_id, account_id, hour) x),"
        " spend AS ("
        "  INSERT INTO spend_daily AS s (key_id, day, account_id, cpu_rated, memory_rated, storage_rated)"
        "  SELECT key_id, (hour AT TIME ZONE 'UTC')::date, min(account_id), sum(cpu * coalesce(rc, 0)),"
        "         sum(mem * coalesce(rm, 0)), sum(sto * coalesce(rs, 0))"
        "    FROM g GROUP BY key_id, (hour AT TIME ZONE 'UTC')::date"
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
        int r = db_check_schema(a->db, err, errlen);
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
        /* What the poison rule compares and a dead letter keeps: the SQLSTATE
         * and the primary message (no statement text, no line numbers). */
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
        char e[sizeof(a->last_error)];
        snprintf(e, sizeof(e), "%s %s: %s", state ? state : "?????", what,
                 primary ? primary : PQerrorMessage(a->db));
        utf8_copy(a->last_error, sizeof(a->last_error), e);
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
        if (a->npieces)
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
                /* (A sandbox with only its created event has no reading to sync the row from.) */
                bool sync = f->known &&
                            (s->db_state != (int)f->state + 1 || strcmp(s->db_host, s->host) != 0 || s->net_unsaved);
                char fold[FOLD_STATE_TEXT_MAX], wall[64];
                if (fold_state_format(f, fold, sizeof(fold)) < 0)
                        return -ENOBUFS;
                for (char *c = fold; *c; c++) /* one COPY field: no tab, newline or backslash */
                        if (*c == '\t' || *c == '\n' || *c == '\\')
                                *c = ' ';
                format_ts(wall, sizeof(wall), f->wall_ns);
                if (text_add(t, "%s\t%s\t%s\t%s\t%u\t%s\t%" PRId64 "\t%s\t%s\t%" PRIu64 "\t%s\t%s\t%" PRIu64
                             "\t%" PRIu64 "\n", s->id, s->account, s->key,
                             f->known ? s->host : "" /* no sample of its host yet */, s->vcpus, fold, s->version,
                             f->state == STATE_STOPPED ? "t" : "f", sandbox_state_name(f->state), f->mem_size_bytes,
                             wall, sync ? "t" : "f", s->net_rx, s->net_tx) < 0)
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
        if (r == 0) {
                char q[600];
                log_warn("message dead-lettered", "partition=%d offset=%" PRId64 " reason=%s", d->partition,
                         d->offset, log_quote(q, sizeof(q), d->reason));
        }
        return r;
}

/* A held reading: this batch's still waiting goes into held_readings; an
 * earlier batch's now taken leaves it. -EBUSY when that row is gone (another
 * aggregator took it, or its grace ran out meanwhile): the batch is read again. */
static int store_waiting(struct agg *a, const struct waiting *w)
{
        if (w->stored != w->done && !(w->stored && w->reason_moved))
                return 0; /* an earlier batch's still waiting, or this batch's already taken */
        char p[16], o[32];
        snprintf(p, sizeof(p), "%d", w->partition);
        snprintf(o, sizeof(o), "%" PRId64, w->offset);
        PGresult *res;
        if (w->stored && !w->done) {
                const char *params[] = { p, o, w->reason };
                res = PQexecParams(a->db, "UPDATE held_readings SET reason = $3 WHERE partition = $1 AND \"offset\" = $2",
                                   3, NULL, params, NULL, NULL, 0);
        } else if (w->stored) {
                const char *params[] = { p, o };
                res = PQexecParams(a->db, "DELETE FROM held_readings WHERE partition = $1 AND \"offset\" = $2", 2,
                                   NULL, params, NULL, NULL, 0);
        } else {
                const char *params[] = { p, o, w->sandbox, w->raw, w->reason };
                int lens[] = { 0, 0, 0, (int)w->len, 0 };
                int fmts[] = { 0, 0, 0, 1, 0 };
                res = PQexecParams(a->db,
                                   "INSERT INTO held_readings (partition, \"offset\", sandbox_id, raw, reason)"
                                   " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                                   5, NULL, params, lens, fmts, 0);
        }
        int r = query_ok(a, res, PGRES_COMMAND_OK, "held reading");
        if (r == 0 && w->stored && atoi(PQcmdTuples(res)) != 1)
                r = -EBUSY;
        PQclear(res);
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
static void expire_held(struct agg *a)
{
        if (db_ensure(a) < 0)
                return;
        char grace[32];
        snprintf(grace, sizeof(grace), "%" PRId64, a->cfg->provenance_grace_ms);
        const char *params[] = { grace };
        PGresult *res = PQexecParams(
                a->db,
                "WITH gone AS (DELETE FROM held_readings WHERE held_at < now() - $1::bigint * interval '1 millisecond'"
                "  RETURNING partition, \"offset\", sandbox_id, raw, reason)"
                " INSERT INTO dead_letters (topic, partition, \"offset\", raw, reason)"
                " SELECT 'usage', partition, \"offset\", raw, reason || ' (held ' || $1 || ' ms)' FROM gone"
                " ON CONFLICT DO NOTHING RETURNING partition, \"offset\", reason",
                1, NULL, params, NULL, NULL, 0);
        if (query_ok(a, res, PGRES_TUPLES_OK, "expire held readings") == 0) {
                for (int i = 0; i < PQntuples(res); i++) {
                        char q[600];
                        log_warn("held reading dead-lettered: no provenance within the grace period",
                                 "partition=%s offset=%s reason=%s", PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
                                 log_quote(q, sizeof(q), PQgetvalue(res, i, 2)));
                }
                atomic_fetch_add_explicit(&a->metrics->readings_expired, (uint64_t)PQntuples(res), memory_order_relaxed);
                atomic_fetch_add_explicit(&a->metrics->dead_letters[AGG_DEAD_DECODE], (uint64_t)PQntuples(res),
                                          memory_order_relaxed);
                a->dead_total += (uint64_t)PQntuples(res);
        }
        PQclear(res);
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
                agg_histogram_add(&a->metrics->lag_ms, lag);
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

/* Is the last failure one the database would repeat for the same batch (its
 * content), rather than the connection, a deadlock, a serialization conflict,
 * the server's resources or a right the aggregator's role lacks (42501: the
 * set-up's fault, retried until an administrator grants it, never a message
 * set aside)? Only those are searched for a poison message. */
static bool content_error(const struct agg *a, int r)
{
        if (r != -EIO || !a->db || PQstatus(a->db) != CONNECTION_OK || !a->last_error[0])
                return false;
        if (strncmp(a->last_error, "42501", 5) == 0)
                return false;
        static const char *const transient[] = { "08", "40", "53", "55", "57", "58", "XX", "??" };
        for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
                if (strncmp(a->last_error, transient[i], 2) == 0)
                        return false;
        return true;
}

/* The batch was one message and the database refused it twice for the same
 * reason: it goes to dead_letters with that reason, and its partition's
 * offset moves past it, in one transaction (fenced like any commit). */
static int dead_letter_alone(struct agg *a, const char *reason)
{
        struct partition *p = part(a, a->first_partition);
        if (!p || !p->owned)
                return -ESTALE;
        struct dead_letter d = { .partition = a->first_partition, .offset = a->first_offset, .raw = a->first_raw,
                                 .len = a->first_len };
        char why[sizeof(d.reason)];
        snprintf(why, sizeof(why), "database refused: %s", reason);
        utf8_copy(d.reason, sizeof(d.reason), why);
        PGresult *res = PQexec(a->db, "BEGIN");
        int r = query_ok(a, res, PGRES_COMMAND_OK, "begin");
        PQclear(res);
        if (r < 0)
                return r;
        if ((r = store_dead(a, &d)) == 0) {
                char pn[16], o[32], next[32], g[32];
                snprintf(pn, sizeof(pn), "%d", d.partition);
                snprintf(o, sizeof(o), "%" PRId64, d.offset);
                snprintf(next, sizeof(next), "%" PRId64, d.offset + 1);
                snprintf(g, sizeof(g), "%" PRId64, p->generation);
                const char *params[] = { a->cfg->group, pn, o, next, g };
                res = PQexecParams(a->db,
                                   "UPDATE consumer_offsets SET next_offset = $4, updated_at = now()"
                                   " WHERE group_id = $1 AND topic = 'usage' AND partition = $2 AND next_offset = $3"
                                   "   AND generation = $5",
                                   5, NULL, params, NULL, NULL, 0);
                r = query_ok(a, res, PGRES_COMMAND_OK, "offsets");
                if (r == 0 && atoi(PQcmdTuples(res)) != 1)
                        r = -ESTALE;
                PQclear(res);
        }
        res = PQexec(a->db, r == 0 ? "COMMIT" : "ROLLBACK");
        if (r == 0)
                r = query_ok(a, res, PGRES_COMMAND_OK, "commit");
        PQclear(res);
        if (r == 0) {
                atomic_fetch_add_explicit(&a->metrics->dead_letters[AGG_DEAD_DATABASE], 1, memory_order_relaxed);
                a->dead_total++;
        }
        return r;
}

/* After a commit the database refused for the batch's content (the poison
 * rule, docs/billing.md "Dead letters"): the first failure is retried as it
 * was; a batch that fails again for the same reason is halved, and halved
 * again while it keeps failing so; a batch of one message that fails for
 * that reason is the message at fault and becomes a dead letter. Called
 * before the batch is cleared. */
static void poison_step(struct agg *a)
{
        char reason[sizeof(a->last_error)];
        memcpy(reason, a->last_error, sizeof(reason));
        bool same = strcmp(reason, a->fail_reason) == 0;
        char q[600];
        if (same && a->messages == 1 && a->first_raw) {
                int r = dead_letter_alone(a, reason);
                if (r == 0) {
                        log_error("message the ledger keeps refusing set aside as a dead letter",
                                  "partition=%d offset=%" PRId64 " reason=%s", a->first_partition, a->first_offset,
                                  log_quote(q, sizeof(q), reason));
                        a->fail_reason[0] = '\0';
                        a->split_limit = a->split_left = 0;
                } else {
                        log_error("could not set a refused message aside", "partition=%d offset=%" PRId64,
                                  a->first_partition, a->first_offset);
                }
                return;
        }
        if (same && a->messages > 1) {
                a->split_limit = (int64_t)a->messages / 2;
                if (a->split_left < (int64_t)a->messages)
                        a->split_left = (int64_t)a->messages;
                atomic_fetch_add_explicit(&a->metrics->batch_splits, 1, memory_order_relaxed);
                log_warn("batch refused twice for the same reason; splitting it", "messages=%zu next_batch=%" PRId64
                         " reason=%s", a->messages, a->split_limit, log_quote(q, sizeof(q), reason));
                return;
        }
        memcpy(a->fail_reason, reason, sizeof(a->fail_reason));
}

/* Commits the batch in one transaction. On failure the batch is dropped and
 * the state read back from the ledger (resync); a failure that repeats is
 * narrowed down to its message (poison_step). */
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
        a->last_error[0] = '\0';
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
        res = PQexec(a->db, fold_sql);
        r = query_ok(a, res, PGRES_TUPLES_OK, "fold state");
        if (r == 0 && strtoull(PQgetvalue(res, 0, 0), NULL, 10) != a->ndirty)
                r = -EBUSY; /* another aggregator moved a sandbox on: ours is stale */
        PQclear(res);
        if (r < 0)
                goto rollback;
        int64_t t_fold = time_mono_ns();
        res = PQexec(a->db, apply_sql);
        r = query_ok(a, res, PGRES_COMMAND_OK, "apply");
        PQclear(res);
        if (r < 0)
                goto rollback;
        int64_t t_usage = time_mono_ns();
        res = PQexec(a->db, rate_sql);
        r = query_ok(a, res, PGRES_TUPLES_OK, "rate");
        for (int i = 0; r == 0 && i < PQntuples(res); i++) {
                log_error("usage without a rate: kept, not rated; add the plan's rate",
                          "account=%s plan=%s meter=%s hour=%s", PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
                          PQgetvalue(res, i, 2), PQgetvalue(res, i, 3));
                atomic_fetch_add_explicit(&a->metrics->rating_gaps, 1, memory_order_relaxed);
        }
        PQclear(res);
        if (r < 0)
                goto rollback;
        int64_t t_rated = time_mono_ns();
        for (size_t i = 0; i < a->nevents; i++)
                if ((r = apply_event(a, &a->events[i])) < 0)
                        goto rollback;
        for (size_t i = 0; i < a->ndead; i++)
                if ((r = store_dead(a, &a->dead[i])) < 0)
                        goto rollback;
        for (size_t i = 0; i < a->nwaiting; i++)
                if ((r = store_waiting(a, &a->waiting[i])) < 0)
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
        /* Last: the one row aggregators share (per host), held until COMMIT. */
        res = PQexec(a->db, hosts_sql);
        r = query_ok(a, res, PGRES_COMMAND_OK, "hosts");
        PQclear(res);
        if (r < 0)
                goto rollback;
        int64_t t_limits = time_mono_ns();
        res = PQexec(a->db, "COMMIT");
        r = query_ok(a, res, PGRES_COMMAND_OK, "commit");
        PQclear(res);
        if (r < 0)
                goto fail;

        int64_t now_mono = time_mono_ns();
        for (size_t i = 0; i < a->ndirty; i++) {
                struct sandbox *s = a->dirty[i];
                s->db_state = (int)s->fold.state + 1;
                memcpy(s->db_host, s->host, sizeof(s->db_host));
                s->net_unsaved = false;
                s->version++;
                s->used_ns = now_mono;
        }
        for (size_t i = 0; i < a->nevents; i++) {
                struct sandbox *s = sandbox_find(a, a->events[i].sandbox);
                if (s)
                        s->db_state = 0; /* the event may have changed the row's state */
        }
        record_latency(a);
        agg_histogram_add(&a->metrics->commit_ms, (now_mono - t0) / NS_PER_MS);
        int64_t now = time_wall_ns();
        for (int i = 0; i < ncmds; i++)
                if (blocked || !throttled(a, cmds[i].key, now))
                        publish(a, &cmds[i]);
        a->committed_messages += a->messages;
        a->committed_batches++;
        a->dead_total += a->ndead;
        atomic_fetch_add_explicit(&a->metrics->messages_committed, a->messages, memory_order_relaxed);
        atomic_fetch_add_explicit(&a->metrics->batches_committed, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&a->metrics->dead_letters[AGG_DEAD_DECODE], a->ndead, memory_order_relaxed);
        if (a->split_limit) {
                a->split_left -= (int64_t)a->messages;
                if (a->split_left <= 0) {
                        a->split_limit = a->split_left = 0;
                        a->fail_reason[0] = '\0';
                }
        } else {
                a->fail_reason[0] = '\0';
        }
        if (fired)
                log_info("spend alerts recorded", "alerts=%ld blocked_keys=%ld", fired, blocked);
        log_debug("batch committed",
                  "messages=%zu usage_rows=%zu sandboxes=%zu events=%zu dead=%zu stage_ms=%" PRId64 " apply_ms=%" PRId64
                  " limits_ms=%" PRId64 " ms=%" PRId64 " fold_ms=%" PRId64 " usage_ms=%" PRId64 " rate_ms=%" PRId64
                  " commit_ms=%" PRId64,
                  a->messages, rows, a->ndirty, a->nevents, a->ndead, (t_staged - t0) / NS_PER_MS,
                  (t_applied - t_staged) / NS_PER_MS, (t_limits - t_applied) / NS_PER_MS,
                  (time_mono_ns() - t0) / NS_PER_MS, (t_fold - t_staged) / NS_PER_MS, (t_usage - t_fold) / NS_PER_MS,
                  (t_rated - t_usage) / NS_PER_MS, (now_mono - t_limits) / NS_PER_MS);
        batch_clear(a);
        free(t.buf);
        free(cmds);
        return 0;

rollback:
        res = PQexec(a->db, "ROLLBACK");
        PQclear(res);
fail:
        if (r == -ESTALE || r == -EBUSY) {
                a->fenced++;
                atomic_fetch_add_explicit(&a->metrics->batches_fenced, 1, memory_order_relaxed);
                if (r == -EBUSY)
                        atomic_fetch_add_explicit(&a->metrics->sandboxes_fenced, 1, memory_order_relaxed);
                log_warn(r == -ESTALE ? "partition fenced: another aggregator owns it now; batch dropped"
                                      : "sandbox fenced: another aggregator billed it meanwhile; batch read again",
                         "messages=%zu", a->messages);
        } else {
                atomic_fetch_add_explicit(&a->metrics->batches_failed, 1, memory_order_relaxed);
                log_error("could not commit a batch; it will be read again", "messages=%zu", a->messages);
                if (content_error(a, r))
                        poison_step(a); /* the database will say the same again: no need to wait */
                else
                        time_sleep_ns(NS_PER_SEC / 2); /* do not spin on a database that keeps refusing */
        }
        free(t.buf);
        free(cmds);
        batch_clear(a);
        resync(a);
        return r;
}

/* ---- the store: fold state by sandbox ---- */

static int id_cmp(const void *x, const void *y) { return strcmp(x, y); }

static bool absent_has(const struct agg *a, const char *id)
{
        return a->nabsent && bsearch(id, a->absent, a->nabsent, sizeof(*a->absent), id_cmp);
}

static bool valid_id(const char *s, size_t n)
{
        if (n == 0 || n > EVENT_ID_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
                      s[i] == '_' || s[i] == '.' || s[i] == ':' || s[i] == '-'))
                        return false;
        return true;
}

/* Reads the fold state of the sandboxes ids (n of them, not in memory) into
 * memory, in one query, with the size and key their `created` event gave (a
 * sandbox only created so far has no fold state: it comes back unknown, with
 * its size); those the ledger has no row for are remembered as
 * absent (new sandboxes) until the next prefetch. Returns 0, -EIO, -ENOMEM,
 * or -EPROTO for a row this aggregator cannot read (written by a newer one:
 * billing it from nothing would bill it twice, so nothing is billed). */
static int load_sandboxes(struct agg *a, char (*ids)[EVENT_ID_MAX + 1], size_t n)
{
        if (!n)
                return 0;
        if (db_ensure(a) < 0)
                return -EIO;
        struct text list = { 0 };
        for (size_t i = 0; i < n; i++)
                if (text_add(&list, "%s%s", i ? "," : "{", ids[i]) < 0) {
                        free(list.buf);
                        return -ENOMEM;
                }
        if (text_add(&list, "}") < 0) {
                free(list.buf);
                return -ENOMEM;
        }
        const char *params[] = { list.buf };
        PGresult *res = PQexecParams(a->db,
                                     "SELECT i.id, coalesce(f.account_id, s.account_id), coalesce(f.key_id, s.key_id),"
                                     " f.fold, coalesce(f.version, 0), coalesce(s.host, ''), coalesce(s.vcpus, 1),"
                                     " coalesce(s.state, ''), coalesce(s.mem_size_bytes, 0)"
                                     " FROM unnest($1::text[]) AS i(id) LEFT JOIN fold_state f ON f.sandbox_id = i.id"
                                     " LEFT JOIN sandboxes s ON s.id = i.id"
                                     " WHERE f.sandbox_id IS NOT NULL OR s.id IS NOT NULL",
                                     1, NULL, params, NULL, NULL, 0);
        free(list.buf);
        int r = query_ok(a, res, PGRES_TUPLES_OK, "load state");
        int rows = r == 0 ? PQntuples(res) : 0;
        for (int i = 0; r == 0 && i < rows; i++) {
                const char *id = PQgetvalue(res, i, 0);
                if (sandbox_find(a, id))
                        continue; /* memory is the ledger plus the batch: never older */
                struct fold_state f = { 0 }; /* no row: only its created event is in the ledger */
                if (!PQgetisnull(res, i, 3) && fold_state_parse(PQgetvalue(res, i, 3), &f) < 0) {
                        char q[600];
                        log_error("could not read a sandbox's fold state; not billing it", "sandbox=%s fold=%s", id,
                                  log_quote(q, sizeof(q), PQgetvalue(res, i, 3)));
                        r = -EPROTO;
                        break;
                }
                struct sandbox *s = sandbox_new(a, id);
                if (!s) {
                        r = -ENOMEM;
                        break;
                }
                s->fold = f;
                s->partition = INT32_MAX; /* set by the next message */
                snprintf(s->account, sizeof(s->account), "%s", PQgetvalue(res, i, 1));
                snprintf(s->key, sizeof(s->key), "%s", PQgetvalue(res, i, 2));
                s->version = strtoll(PQgetvalue(res, i, 4), NULL, 10);
                snprintf(s->host, sizeof(s->host), "%s", PQgetvalue(res, i, 5));
                s->vcpus = (uint32_t)strtoul(PQgetvalue(res, i, 6), NULL, 10);
                s->mem_size_bytes = strtoull(PQgetvalue(res, i, 8), NULL, 10);
                enum sandbox_state db;
                s->db_state = sandbox_state_parse(PQgetvalue(res, i, 7), &db) == 0 ? (int)db + 1 : 0;
                memcpy(s->db_host, s->host, sizeof(s->db_host));
                atomic_fetch_add_explicit(&a->metrics->sandboxes_loaded, 1, memory_order_relaxed);
        }
        PQclear(res);
        if (r < 0)
                return r;
        size_t sorted = a->nabsent; /* absent_has searches these while the new ones are added */
        for (size_t i = 0; i < n; i++) {
                if (sandbox_find(a, ids[i]) ||
                    (sorted && bsearch(ids[i], a->absent, sorted, sizeof(*a->absent), id_cmp)))
                        continue;
                if (grow((void **)&a->absent, &a->capabsent, a->nabsent + 1, sizeof(*a->absent)) < 0)
                        return -ENOMEM;
                memcpy(a->absent[a->nabsent++], ids[i], sizeof(*a->absent));
        }
        /* Sorted once (not after each id: with thousands of new sandboxes in
         * a prefetch that was most of its time). ids may repeat (sandbox_add
         * of one): the array stays a set for bsearch's purpose either way. */
        if (a->nabsent > sorted)
                qsort(a->absent, a->nabsent, sizeof(*a->absent), id_cmp);
        return 0;
}

/* The sandbox id of a message, read without decoding it, or false. Only a
 * hint for prefetching: a message it misreads is loaded by sandbox_add. */
static bool peek_sandbox(const rd_kafka_message_t *m, char *id)
{
        static const char needle[] = "\"sandbox\":\"";
        const char *p = m->payload, *end = p + m->len;
        const char *hit = m->len ? memmem(p, m->len, needle, sizeof(needle) - 1) : NULL;
        if (!hit)
                return false;
        const char *v = hit + sizeof(needle) - 1, *q = memchr(v, '"', (size_t)(end - v));
        if (!q || !valid_id(v, (size_t)(q - v)))
                return false;
        memcpy(id, v, (size_t)(q - v));
        id[q - v] = '\0';
        return true;
}

/* Before messages are folded: the fold state of every sandbox among them not
 * in memory, read in one query. A failure is not fatal here: sandbox_add
 * reads each one again. */
static void prefetch(struct agg *a, rd_kafka_message_t **msgs, size_t n)
{
        a->nabsent = 0;
        char (*ids)[EVENT_ID_MAX + 1] = NULL;
        size_t nids = 0, cap = 0;
        for (size_t i = 0; i < n; i++) {
                char id[EVENT_ID_MAX + 1];
                if (msgs[i]->err || !peek_sandbox(msgs[i], id) || sandbox_find(a, id))
                        continue;
                bool seen = false;
                for (size_t j = nids; j-- > 0 && !seen && j + 64 >= nids;) /* neighbours: a sandbox's messages cluster */
                        seen = strcmp(ids[j], id) == 0;
                if (seen)
                        continue;
                if (grow((void **)&ids, &cap, nids + 1, sizeof(*ids)) < 0)
                        break;
                memcpy(ids[nids++], id, sizeof(id));
        }
        if (nids) {
                qsort(ids, nids, sizeof(*ids), id_cmp);
                size_t u = 0;
                for (size_t i = 0; i < nids; i++)
                        if (!u || strcmp(ids[u - 1], ids[i]) != 0)
                                memmove(ids[u++], ids[i], sizeof(*ids));
                if (load_sandboxes(a, ids, u) < 0)
                        a->nabsent = 0;
        }
        free(ids);
}

/* Memory stays bounded: a sandbox leaves memory keep_stopped_ms (default a
 * minute) after a commit that left it stopped (its final reading), any other
 * after keep_idle_ms (15 minutes) without one. Its fold state stays in the
 * ledger; a later message reads it back by id. Only between batches (the
 * batch points at sandboxes). */

static void sandboxes_sweep(struct agg *a)
{
        int64_t now = time_mono_ns();
        size_t evicted = 0;
        for (size_t i = 0; i < a->nbuckets; i++) {
                struct sandbox **pp = &a->buckets[i];
                while (*pp) {
                        struct sandbox *s = *pp;
                        int64_t idle = now - s->used_ns;
                        if (!s->dirty && (idle > a->cfg->keep_idle_ms * NS_PER_MS ||
                                          (s->fold.state == STATE_STOPPED && idle > a->cfg->keep_stopped_ms * NS_PER_MS))) {
                                *pp = s->next;
                                free(s);
                                a->nsandboxes--;
                                evicted++;
                        } else {
                                pp = &s->next;
                        }
                }
        }
        atomic_store_explicit(&a->metrics->sandboxes_in_memory, a->nsandboxes, memory_order_relaxed);
        atomic_fetch_add_explicit(&a->metrics->sandboxes_evicted, evicted, memory_order_relaxed);
        if (evicted)
                log_debug("sandboxes evicted from memory", "evicted=%zu kept=%zu", evicted, a->nsandboxes);
}

/* ---- ownership ---- */

static int record_gap(struct agg *a, int32_t pn, int64_t generation, int64_t pos, int64_t lo, int64_t hi,
                      const char *found, int64_t *ret_next);

/* Claims partitions: bumps their generation and reads their next offsets.
 * Fold state is not read here: it follows each sandbox, read by id when one
 * of its messages arrives. What memory holds of sandboxes last seen on these
 * partitions is dropped (another owner may have billed them since). */
static int claim(struct agg *a, rd_kafka_topic_partition_list_t *parts)
{
        int r = db_ensure(a);
        if (r < 0)
                return r;
        a->seek_gen++;
        bool *load = calloc(65536, sizeof(bool));
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
                        /* Offsets lost while nobody consumed: found before
                         * fetching (else the fetch reports them, offset_reset). */
                        int64_t lo, hi, next;
                        if (rd_kafka_query_watermark_offsets(a->consumer, tp->topic, tp->partition, &lo, &hi, 5000) ==
                                    0 &&
                            record_gap(a, tp->partition, p->generation, p->position, lo, hi, "at_assignment",
                                       &next) == 0)
                                p->position = next;
                        tp->offset = p->position;
                        load[tp->partition] = true;
                        log_info("partition assigned", "partition=%d next_offset=%" PRId64 " generation=%" PRId64,
                                 tp->partition, p->position, p->generation);
                }
                PQclear(res);
                if (r < 0)
                        goto out;
        }
        bool *drop = calloc((size_t)a->nparts + 1, sizeof(bool));
        if (!drop) {
                r = -ENOMEM;
                goto out;
        }
        for (int32_t p = 0; p < a->nparts; p++)
                drop[p] = load[p];
        sandboxes_drop(a, drop);
        free(drop);
out:
        free(load);
        return r;
}

/* After a failed commit: read back the positions of what we still own and
 * forget every sandbox (each is read again by id when it next appears). */
static int resync(struct agg *a)
{
        sandboxes_drop(a, NULL);
        a->seek_gen++;
        while (!*a->stop) {
                if (db_ensure(a) < 0) {
                        time_sleep_ns(NS_PER_SEC);
                        continue;
                }
                rd_kafka_topic_partition_list_t *seek = rd_kafka_topic_partition_list_new(8);
                int r = 0;
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
                        } else if (r == 0) {
                                a->parts[p].owned = false; /* fenced: the group will revoke it */
                        }
                        PQclear(res);
                }
                if (r == 0 && seek->cnt) {
                        rd_kafka_error_t *e = rd_kafka_seek_partitions(a->consumer, seek, 10000);
                        if (e) {
                                log_error("could not seek", "error=\"%s\"", rd_kafka_error_string(e));
                                rd_kafka_error_destroy(e);
                                r = -EIO;
                        }
                }
                rd_kafka_topic_partition_list_destroy(seek);
                if (r == 0)
                        return 0;
                time_sleep_ns(NS_PER_SEC);
        }
        return -ECANCELED;
}

static void release(struct agg *a, const rd_kafka_topic_partition_list_t *parts)
{
        bool *drop = calloc((size_t)a->nparts + 1, sizeof(bool));
        for (int i = 0; i < parts->cnt; i++) {
                int32_t p = parts->elems[i].partition;
                if (p >= 0 && p < a->nparts) {
                        a->parts[p].owned = false;
                        if (drop)
                                drop[p] = true;
                        log_info("partition released", "partition=%d", p);
                }
        }
        a->seek_gen++;
        sandboxes_drop(a, drop); /* without memory for the list: all of them */
        free(drop);
}

/* ---- gaps ---- */

/* The next offset the ledger holds for partition pn (pos) against what the
 * broker still has [lo, hi): when it is outside, messages were lost never
 * billed (retention, or a broker's memory limit). That is recorded in
 * offset_gaps with the range, in the same transaction that moves the offset
 * to lo, logged at error and counted; never a silent reset. Fills *ret_next
 * with where to consume from. Returns 0, or -errno when nothing moved
 * (fenced, or the ledger refused). */
static int record_gap(struct agg *a, int32_t pn, int64_t generation, int64_t pos, int64_t lo, int64_t hi,
                      const char *found, int64_t *ret_next)
{
        const char *kind = pos < lo ? "behind" : pos > hi ? "ahead" : NULL;
        if (!kind) {
                *ret_next = pos;
                return 0;
        }
        int64_t from = pos < lo ? pos : hi, to = pos < lo ? lo - 1 : pos - 1;
        char g[32], ps[16], f[32], t[32], next[32], cur[32];
        snprintf(ps, sizeof(ps), "%d", pn);
        snprintf(g, sizeof(g), "%" PRId64, generation);
        snprintf(f, sizeof(f), "%" PRId64, from);
        snprintf(t, sizeof(t), "%" PRId64, to);
        snprintf(next, sizeof(next), "%" PRId64, lo);
        snprintf(cur, sizeof(cur), "%" PRId64, pos);
        const char *params[] = { a->cfg->group, ps, f, t, kind, next, cur, g };
        /* One statement, one transaction: the gap row only if the offset moved. */
        PGresult *res = PQexecParams(a->db,
                                     "WITH moved AS (UPDATE consumer_offsets SET next_offset = $6, updated_at = now()"
                                     "  WHERE group_id = $1 AND topic = 'usage' AND partition = $2"
                                     "    AND next_offset = $7 AND generation = $8 RETURNING 1)"
                                     " INSERT INTO offset_gaps (group_id, topic, partition, from_offset, to_offset, kind)"
                                     " SELECT $1, 'usage', $2, $3, $4, $5 FROM moved",
                                     8, NULL, params, NULL, NULL, 0);
        int r = query_ok(a, res, PGRES_COMMAND_OK, "offset gap");
        if (r == 0 && atoi(PQcmdTuples(res)) != 1)
                r = -ESTALE;
        PQclear(res);
        if (r < 0)
                return r;
        uint64_t lost = pos < lo ? (uint64_t)(lo - pos) : 0;
        atomic_fetch_add_explicit(&a->metrics->offset_gaps, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&a->metrics->offsets_lost, lost, memory_order_relaxed);
        log_error("offsets lost: the stored offset is no longer in the broker; messages never billed",
                  "partition=%d kind=%s from_offset=%" PRId64 " to_offset=%" PRId64 " lost=%" PRIu64
                  " next_offset=%" PRId64 " found=%s",
                  pn, kind, from, to, lost, lo, found);
        *ret_next = lo;
        return 0;
}

/* While consuming, the stored position was no longer in the broker
 * (auto.offset.reset=error reports it): record the gap and go on from the
 * partition's first offset. (At assignment, claim checks first.) */
static void offset_reset(struct agg *a, const rd_kafka_message_t *m)
{
        int32_t pn = m->partition;
        struct partition *p = part(a, pn);
        if (!p || !p->owned)
                return;
        if (commit_batch(a) < 0)
                return; /* resynced: the error comes again from the ledger's position */
        int64_t lo = -1, hi = -1, next;
        rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(a->consumer, TOPIC_USAGE, pn, &lo, &hi, 10000);
        if (e) {
                log_error("could not read a partition's offsets", "partition=%d error=\"%s\"", pn, rd_kafka_err2str(e));
                resync(a);
                return;
        }
        if (record_gap(a, pn, p->generation, p->position, lo, hi, "while_consuming", &next) < 0) {
                resync(a);
                return;
        }
        p->position = next;
        /* After the error the partition fetches nothing until assigned again
         * (a seek does not restart it): assign what we own at our positions,
         * which equal the ledger's (the batch was committed above). */
        rd_kafka_topic_partition_list_t *assign = rd_kafka_topic_partition_list_new(a->nparts > 0 ? a->nparts : 1);
        for (int32_t i = 0; i < a->nparts; i++)
                if (a->parts[i].owned)
                        rd_kafka_topic_partition_list_add(assign, TOPIC_USAGE, i)->offset = a->parts[i].position;
        rd_kafka_resp_err_t ae = rd_kafka_assign(a->consumer, assign);
        rd_kafka_topic_partition_list_destroy(assign);
        a->seek_gen++;
        if (ae)
                log_error("could not resume the partitions", "partition=%d error=\"%s\"", pn, rd_kafka_err2str(ae));
}

/* Hosts with running sandboxes and no recent sample (the metering_gaps
 * view): logged at warning and counted at each check. */
static void check_metering_gaps(struct agg *a)
{
        if (db_ensure(a) < 0)
                return;
        PGresult *res = PQexec(a->db, "SELECT host, running_sandboxes, extract(epoch FROM silent_for)::bigint,"
                                      " coalesce(to_char(last_sample_at AT TIME ZONE 'UTC',"
                                      " 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), 'never')"
                                      " FROM metering_gaps ORDER BY host");
        if (query_ok(a, res, PGRES_TUPLES_OK, "metering gaps") == 0) {
                int n = PQntuples(res);
                /* A line per host when the set of gaps grows, then once a minute. */
                uint64_t before = atomic_load_explicit(&a->metrics->metering_gap_hosts, memory_order_relaxed);
                bool say = (uint64_t)n > before || time_mono_ns() - a->last_gap_log_ns >= 60 * NS_PER_SEC;
                if (say && n)
                        a->last_gap_log_ns = time_mono_ns();
                for (int i = 0; say && i < n; i++)
                        log_warn("metering gap: a host with running sandboxes sends no samples",
                                 "host=%s running_sandboxes=%s silent_s=%s last_sample=%s", PQgetvalue(res, i, 0),
                                 PQgetvalue(res, i, 1), PQgetvalue(res, i, 2), PQgetvalue(res, i, 3));
                atomic_store_explicit(&a->metrics->metering_gap_hosts, (uint64_t)n, memory_order_relaxed);
                atomic_fetch_add_explicit(&a->metrics->metering_gaps_seen, (uint64_t)n, memory_order_relaxed);
        }
        PQclear(res);
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *parts,
                         void *opaque)
{
        struct agg *a = opaque;
        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
                commit_batch(a); /* claiming replaces sandboxes the batch may point to */
                a->seek_gen++;
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

#define HOLD_MAX 4096                        /* messages taken from the consumer at once */
#define METERING_CHECK_NS (5 * NS_PER_SEC)   /* how often the metering_gaps view is read */

/* A batch of a consumer that is behind may grow past batch_ms, up to this
 * many times batch_ms (see the commit rule in aggregator_run). */
#ifndef CATCHUP_BATCH_FACTOR
#define CATCHUP_BATCH_FACTOR 10
#endif

/* Messages the broker holds beyond those taken, in the partitions owned: the
 * consumer's high watermarks as its last fetches saw them (no request to the
 * broker), less each partition's next offset. */
static int64_t backlog(struct agg *a)
{
        int64_t lag = 0;
        for (int32_t p = 0; p < a->nparts; p++) {
                int64_t lo = -1, hi = -1;
                if (a->parts[p].owned &&
                    rd_kafka_get_watermark_offsets(a->consumer, TOPIC_USAGE, p, &lo, &hi) == RD_KAFKA_RESP_ERR_NO_ERROR &&
                    hi > a->parts[p].position)
                        lag += hi - a->parts[p].position;
        }
        return lag;
}

/* While a failing batch is being split, batches are that small. */
static int64_t batch_limit(const struct agg *a)
{
        return a->split_limit ? a->split_limit : a->cfg->batch_messages;
}

/* Keeps a whole copy of the batch's first message (see dead_letter_alone). */
static void keep_first(struct agg *a, const rd_kafka_message_t *m)
{
        if (a->first_cap < m->len + 1) {
                char *b = realloc(a->first_raw, m->len + 1);
                if (!b) {
                        free(a->first_raw);
                        a->first_raw = NULL;
                        a->first_cap = a->first_len = 0;
                        return; /* then a refused batch of one is retried, not set aside */
                }
                a->first_raw = b;
                a->first_cap = m->len + 1;
        }
        if (m->len)
                memcpy(a->first_raw, m->payload, m->len);
        a->first_len = m->len;
        a->first_partition = m->partition;
        a->first_offset = m->offset;
}

/* Folds the held messages in order (and destroys them), committing whenever
 * the batch reaches its limit. A commit that fails resyncs: the rest are
 * stale then and dropped (the consumer delivers them again). */
static void take_held(struct agg *a, rd_kafka_message_t **held, size_t n)
{
        prefetch(a, held, n);
        uint64_t gen = a->seek_gen;
        for (size_t i = 0; i < n; i++) {
                rd_kafka_message_t *m = held[i];
                if (a->seek_gen == gen) {
                        if (!m->err) {
                                size_t before = a->messages;
                                if (take_message(a, m) < 0) {
                                        log_error("could not take a message (memory, or the ledger unreadable);"
                                                  " dropping the batch to read it again", NULL);
                                        batch_clear(a);
                                        resync(a);
                                        time_sleep_ns(NS_PER_SEC / 2);
                                } else if (before == 0 && a->messages == 1) {
                                        keep_first(a, m);
                                }
                        } else if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET) {
                                offset_reset(a, m);
                        } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                                log_warn("consumer error", "error=\"%s\"", rd_kafka_message_errstr(m));
                        }
                        if (a->messages && (int64_t)a->messages >= batch_limit(a))
                                commit_batch(a);
                }
                rd_kafka_message_destroy(m);
        }
        a->nabsent = 0;
}

int aggregator_run(const struct aggregator_config *cfg, volatile sig_atomic_t *stop)
{
        struct agg a = { .cfg = cfg, .stop = stop };
        char err[1024];
        int r = -EIO;
        struct metrics_http *ms = NULL;
        a.lag_hist = calloc(LAG_BUCKETS, sizeof(*a.lag_hist));
        a.metrics = calloc(1, sizeof(*a.metrics));
        if (!a.lag_hist || !a.metrics) {
                free(a.lag_hist);
                free(a.metrics);
                return -ENOMEM;
        }
        if ((r = metrics_http_start(cfg->metrics_address ? cfg->metrics_address : "127.0.0.1",
                                    (int)cfg->metrics_port, agg_metrics_page, a.metrics, METRICS_HTTP_PAGE_MAX, &ms)) < 0) {
                log_error("could not serve /metrics", "port=%" PRId64 " error=\"%s\"", cfg->metrics_port,
                          strerror(-r));
                r = -EIO;
                goto out;
        }
        r = -EIO;
        if (ms)
                log_info("metrics served", "url=http://%s:%" PRId64 "/metrics",
                         cfg->metrics_address ? cfg->metrics_address : "127.0.0.1", cfg->metrics_port);
        a.db = db_connect(cfg->database_url, err, sizeof(err));
        if (!a.db || db_session(&a, err, sizeof(err)) < 0) {
                log_error("could not open the ledger", "error=\"%s\"", err);
                goto out;
        }
        rd_kafka_conf_t *pconf = rd_kafka_conf_new();
        static const char *const refresh[] = { KAFKA_METADATA_REFRESH, NULL };
        if (kafka_conf_set_all(pconf, refresh, err, sizeof(err)) < 0 ||
            kafka_conf_set_client(pconf, &cfg->kafka, err, sizeof(err)) < 0) {
                rd_kafka_conf_destroy(pconf);
                log_error("bad kafka_settings", "error=\"%s\"", err);
                goto out;
        }
        a.producer = kafka_producer_new(cfg->kafka_brokers, pconf, NULL, err, sizeof(err));
        if (!a.producer) {
                log_error("could not create the control producer", "error=\"%s\"", err);
                goto out;
        }
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
        rd_kafka_conf_set_opaque(conf, &a);
        /* topic.metadata.refresh.interval.ms: partitions added to usage are
         * found (and the group rebalanced onto them) within 30 s, not
         * librdkafka's 5 min (docs/kafka.md, "Adding partitions");
         * consumer_settings, applied after, may change it. */
        static const char *const consumer_settings[] = {
                "fetch.max.bytes=16777216", "max.partition.fetch.bytes=4194304", "fetch.wait.max.ms=20",
                "queued.min.messages=200000", KAFKA_METADATA_REFRESH, NULL };
        if (kafka_conf_set_client(conf, &cfg->kafka, err, sizeof(err)) < 0 ||
            kafka_conf_set_all(conf, consumer_settings, err, sizeof(err)) < 0 ||
            kafka_conf_set_list(conf, cfg->consumer_settings, err, sizeof(err)) < 0) {
                rd_kafka_conf_destroy(conf);
                log_error("bad consumer setting", "error=\"%s\"", err);
                goto out;
        }
        /* A stored offset the broker no longer has is reported, never silently
         * reset (offset_reset): the error setting wins over any other. */
        static const char *const consumer_fixed[] = { "auto.offset.reset=error", NULL };
        a.consumer = kafka_consumer_new(cfg->kafka_brokers, cfg->group, conf, consumer_fixed, err, sizeof(err));
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
        rd_kafka_message_t **held = calloc(HOLD_MAX, sizeof(*held));
        if (!held) {
                r = -ENOMEM;
                goto out;
        }
        while (!*stop) {
                /* Take what is waiting (up to HOLD_MAX messages), so that the
                 * fold state of the sandboxes among them not in memory is read
                 * in one query before any is folded. Messages taken before a
                 * rebalance or a seek are stale: dropped, delivered again. */
                uint64_t gen = a.seek_gen;
                size_t n = 0;
                rd_kafka_message_t *m = rd_kafka_consumer_poll(a.consumer, a.messages ? 5 : 100);
                while (m) {
                        if (a.seek_gen != gen) {
                                for (size_t i = 0; i < n; i++)
                                        rd_kafka_message_destroy(held[i]);
                                n = 0;
                                gen = a.seek_gen;
                        }
                        held[n++] = m;
                        if (n == HOLD_MAX)
                                break;
                        m = rd_kafka_consumer_poll(a.consumer, 0);
                }
                if (a.seek_gen != gen) {
                        for (size_t i = 0; i < n; i++)
                                rd_kafka_message_destroy(held[i]);
                        n = 0;
                }
                /* Nothing came within the first poll's wait (as before
                 * holding), not merely an empty queue between fetches. */
                bool quiet = n == 0;
                take_held(&a, held, n);
                /* Commit when the batch is full, old enough, or nothing more is
                 * waiting: when idle a sample is committed without delay.
                 * Unless the consumer is behind: a quiet poll while the broker
                 * holds more for us is the fetcher between two fetches, not the
                 * end of the stream; and while at least as many messages wait
                 * as the batch holds, the batch grows to batch_messages (up to
                 * CATCHUP_BATCH_FACTOR x batch_ms): the ledger's work per batch
                 * is per sandbox and hour, so larger batches catch up faster,
                 * and the samples waiting are late already. */
                if (a.messages) {
                        int64_t age = time_mono_ns() - a.batch_started, batch_ns = cfg->batch_ms * NS_PER_MS;
                        bool commit = (int64_t)a.messages >= batch_limit(&a);
                        if (!commit && (quiet || age >= batch_ns)) {
                                int64_t behind = backlog(&a);
                                if (age >= CATCHUP_BATCH_FACTOR * batch_ns)
                                        commit = true;
                                else if (age >= batch_ns)
                                        commit = behind < (int64_t)a.messages;
                                else
                                        commit = behind == 0;
                        }
                        if (commit)
                                commit_batch(&a);
                }
                rd_kafka_poll(a.producer, 0);
                int64_t now_mono = time_mono_ns();
                int64_t sweep_every = cfg->keep_stopped_ms * NS_PER_MS < 5 * NS_PER_SEC
                                              ? cfg->keep_stopped_ms * NS_PER_MS : 5 * NS_PER_SEC;
                if (!a.messages && now_mono - a.last_sweep_ns >= sweep_every) {
                        a.last_sweep_ns = now_mono;
                        sandboxes_sweep(&a);
                }
                if (now_mono - a.last_gap_check_ns >= METERING_CHECK_NS) {
                        a.last_gap_check_ns = now_mono;
                        check_metering_gaps(&a);
                }
                int64_t held_every = cfg->provenance_grace_ms * NS_PER_MS / 4;
                if (held_every > METERING_CHECK_NS)
                        held_every = METERING_CHECK_NS;
                if (!a.messages && now_mono - a.last_held_check_ns >= held_every) {
                        a.last_held_check_ns = now_mono;
                        expire_held(&a);
                }
                if (time_mono_ns() - last_report >= 10 * NS_PER_SEC) {
                        last_report = time_mono_ns();
                        log_info("progress", "messages=%" PRIu64 " batches=%" PRIu64 " sandboxes=%zu dead=%" PRIu64
                                             " fenced=%" PRIu64 " commit_lag_ms_p50=%" PRId64 " commit_lag_ms_p99=%" PRId64,
                                 a.committed_messages, a.committed_batches, a.nsandboxes, a.dead_total, a.fenced,
                                 lag_quantile(&a, 50, 100), lag_quantile(&a, 99, 100));
                }
        }
        commit_batch(&a);
        free(held);
        r = 0;
out:
        metrics_http_stop(ms);
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
        free(a.waiting);
        free(a.stamps);
        free(a.throttle);
        free(a.lag_hist);
        free(a.absent);
        free(a.first_raw);
        free(a.metrics);
        PQfinish(a.db);
        return r;
}
