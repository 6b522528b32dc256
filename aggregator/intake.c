/* intake.c — see intake.h. */
#include "intake.h"

#include "held.h"
#include "log.h"
#include "sample_batch.h"
#include "sample_decode.h"
#include "text.h"
#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Clock and counter notes are logged at most once a second each (with how
 * many were not), so a host with a bad clock cannot flood the log. */
static bool note_log_due(struct intake *it, int kind, uint64_t *suppressed)
{
        int64_t now = time_mono_ns();
        if (it->note_logged_ns[kind] && now - it->note_logged_ns[kind] < NS_PER_SEC) {
                it->note_suppressed[kind]++;
                return false;
        }
        it->note_logged_ns[kind] = now;
        *suppressed = it->note_suppressed[kind];
        it->note_suppressed[kind] = 0;
        return true;
}

static void count_notes(struct intake *it, const struct usage_event *ev, unsigned notes, int64_t now,
                        const struct fold_state *before)
{
        uint64_t suppressed;
        if (notes & FOLD_NOTE_CLOCK_AHEAD) {
                atomic_fetch_add_explicit(&it->metrics->clock_ahead, 1, memory_order_relaxed);
                if (note_log_due(it, 0, &suppressed))
                        log_warn("reading dated ahead of the aggregator's clock; placed at the aggregator's clock",
                                 "sandbox=%s host=%s type=%s wall_ns=%" PRId64 " aggregator_ns=%" PRId64
                                 " suppressed=%" PRIu64,
                                 ev->sandbox, ev->host, event_type_name(ev->type), ev->wall_ns, now, suppressed);
        }
        if (notes & FOLD_NOTE_CLOCK_BEHIND) {
                atomic_fetch_add_explicit(&it->metrics->clock_behind, 1, memory_order_relaxed);
                if (note_log_due(it, 1, &suppressed))
                        log_warn("reading dated too far behind the aggregator's clock; placed at the aggregator's clock",
                                 "sandbox=%s host=%s type=%s wall_ns=%" PRId64 " aggregator_ns=%" PRId64
                                 " suppressed=%" PRIu64,
                                 ev->sandbox, ev->host, event_type_name(ev->type), ev->wall_ns, now, suppressed);
        }
        if (notes & FOLD_NOTE_HELD_BACK) {
                atomic_fetch_add_explicit(&it->metrics->held_back, 1, memory_order_relaxed);
                if (note_log_due(it, 2, &suppressed))
                        log_warn("held counters went back; billed only beyond the highest",
                                 "sandbox=%s host=%s running_ns=%" PRIu64 " paused_ns=%" PRIu64
                                 " billed_running_ns=%" PRIu64 " billed_paused_ns=%" PRIu64 " suppressed=%" PRIu64,
                                 ev->sandbox, ev->host, ev->running_ns, ev->paused_ns, before->running_ns,
                                 before->paused_ns, suppressed);
        }
}

/* The batch's sandbox of id, from memory or the ledger (new if neither has
 * it); NULL when the ledger cannot be read. */
static struct sandbox *sandbox_of(struct intake *it, const struct raw *m, const struct usage_event *ev)
{
        struct sandbox *sb = sandbox_find(it->cache, ev->sandbox);
        if (sb)
                return sb;
        if (!(sb = sandbox_add(it->cache, ev->sandbox)))
                return NULL;
        snprintf(sb->account, sizeof(sb->account), "%s", ev->account);
        snprintf(sb->key, sizeof(sb->key), "%s", ev->key);
        sb->partition = m->partition;
        return sb;
}


enum outcome { TAKEN, REFUSED, HELD };

/* A usage batch's refused samples (docs/events.md, "Usage batches"):
 * dead_letters is keyed by partition and offset, so the message gets one row
 * whose raw holds each refused sample on a line (its v1 JSON, or a record
 * that did not decode in hex) and whose reason is the first's, then how many. */
struct aside {
        struct text raw;
        char first[200];        /* the first refusal's reason */
        size_t refused;         /* samples refused */
        size_t index;           /* the record being taken (from 1) */
        bool held;              /* a sample of this message waits in held_readings */
};

static int aside_add(struct aside *a, const char *line, size_t len, const char *why)
{
        if (text_add(&a->raw, "%.*s\n", (int)len, line) < 0)
                return -ENOMEM;
        if (!a->refused++)
                utf8_copy(a->first, sizeof(a->first), why);
        return 0;
}

/* A record that did not decode: its bytes in hex. */
static int aside_add_record(struct aside *a, const uint8_t *rec, size_t len, const char *why)
{
        static const char hex[] = "0123456789abcdef";
        char line[2 * SAMPLE_BATCH_RECORD_MAX + 1];
        size_t n = 0;
        for (size_t i = 0; i < len && n + 2 < sizeof(line); i++) {
                line[n++] = hex[rec[i] >> 4];
                line[n++] = hex[rec[i] & 15];
        }
        return aside_add(a, line, n, why);
}

/* Refuses a reading: a dead letter of its message, or, inside a usage
 * batch, of that sample only. */
static int refuse_reading(struct intake *it, const struct raw *m, const struct usage_event *ev, const char *why)
{
        if (!it->aside)
                return add_dead(it->batch, m->partition, m->offset, m->payload, m->len, why);
        char json[2048], reason[512];
        int n = event_encode(ev, json, sizeof(json));
        snprintf(reason, sizeof(reason), "%s (record %zu, sandbox %s)", why, it->aside->index, ev->sandbox);
        return aside_add(it->aside, json, n > 0 ? (size_t)n : 0, reason);
}

struct emit_ctx {
        struct intake *it;
        struct sandbox *sb;
        int err;
};

static void on_usage(void *opaque, const struct fold_usage *u)
{
        struct emit_ctx *c = opaque;
        if (batch_add_piece(c->it->batch, c->sb, u) < 0)
                c->err = -ENOMEM;
}

/* Folds one reading (a sample or the vmm's `stopped` event) into its
 * sandbox's state. *ret says whether it was billed, dead-lettered, or is to
 * be held until its sandbox's provenance comes (then held_why says why). */
static int fold_reading(struct intake *it, const struct raw *m, const struct usage_event *in, enum outcome *ret,
                        char *held_why, size_t held_whylen)
{
        int32_t partition = m->partition;
        *ret = REFUSED;
        struct sandbox *sb = sandbox_find(it->cache, in->sandbox);
        if (!sb && !(sb = sandbox_of(it, m, in)))
                return -ENOMEM;
        char buf[200];
        const char *why = NULL;
        /* Provenance: only the host that created the sandbox reads its counters
         * (a reading that names none is its creator's, like its key and size). */
        if (sb->fold.created && sb->fold.host[0] && in->host[0] && strcmp(in->host, sb->fold.host) != 0) {
                snprintf(buf, sizeof(buf), "%s from host %s, but the sandbox was created on host %s",
                         event_type_name(in->type), in->host, sb->fold.host);
                return refuse_reading(it, m, in, buf);
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
                return refuse_reading(it, m, in,
                                "no key, and neither a reading nor the created event of the sandbox gave one");
        if (sb->fold.created && !ev.vcpus)
                return refuse_reading(it, m, in,
                                "no vcpus, and neither a reading nor the created event of the sandbox gave them");
        struct fold_clock clock = { .now_ns = it->now_wall_ns,
                                    .max_ahead_ns = it->max_ahead_ns,
                                    .max_behind_ns = it->max_behind_ns };
        struct fold_state before = sb->fold;
        struct emit_ctx c = { .it = it, .sb = sb };
        unsigned notes = 0;
        enum fold_result r = fold_apply_at(&sb->fold, &ev, &clock, &notes, on_usage, &c);
        if (c.err < 0)
                return c.err;
        count_notes(it, &ev, notes, clock.now_ns, &before);
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
                atomic_fetch_add_explicit(&it->metrics->counter_resets, 1, memory_order_relaxed);
                log_warn("counter went back within an epoch: taken as a restart, billed from zero",
                         "sandbox=%s host=%s epoch=%" PRIu64 " seq=%" PRIu64 " cpu_ns=%" PRIu64
                         " billed_cpu_ns=%" PRIu64,
                         ev.sandbox, ev.host, ev.epoch, ev.seq, ev.cpu_ns, before.cpu_ns);
                break;
        case FOLD_BILLED:
                break;
        }
        if (why)
                return refuse_reading(it, m, in, why);
        *ret = TAKEN;
        if (ev.type == EVENT_STOPPED)
                atomic_fetch_add_explicit(&it->metrics->stops_folded, 1, memory_order_relaxed);
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
        /* (only a collector's sample says its host is metered: the vmm's
         * lifecycle events and `stopped` event do not, docs/billing.md) */
        if (ev.type == EVENT_SAMPLE)
                sb->sampled = true;
        return mark_dirty(it->batch, sb);
}

/* Holds a reading of this batch until its sandbox's provenance comes. */
static int hold(struct intake *it, const struct raw *m, const char *sandbox, const char *why)
{
        int r = held_add(it->batch, m, sandbox, why);
        if (r < 0)
                return r;
        atomic_fetch_add_explicit(&it->metrics->readings_held, 1, memory_order_relaxed);
        /* Its fold state is written too (unchanged), fenced by version like any: should
         * another aggregator have taken the sandbox's announcement meanwhile, this batch is
         * read again with the state that has it, and the reading is billed, not held. */
        struct sandbox *sb = sandbox_find(it->cache, sandbox);
        /* (not one known by nothing but a keyless reading: no row without a key) */
        return sb && sb->key[0] ? mark_dirty(it->batch, sb) : 0;
}

/* Holds a sample of a usage batch as its v1 JSON (replayed like any held
 * reading). held_readings is keyed by partition and offset: one sample of a
 * message can wait there; another of the same message is refused (its
 * sandbox's next sample, final sample or stopped event carries the truth). */
static int hold_batched(struct intake *it, const struct raw *m, const struct usage_event *ev, const char *why,
                        bool *ret_held)
{
        char json[2048], buf[512];
        if (it->aside->held) {
                *ret_held = false;
                snprintf(buf, sizeof(buf), "held, but another sample of this batch waits already: %s", why);
                return refuse_reading(it, m, ev, buf);
        }
        int n = event_encode(ev, json, sizeof(json));
        if (n < 0) {
                *ret_held = false;
                return refuse_reading(it, m, ev, "held, but it does not encode as JSON");
        }
        struct raw one = { .partition = m->partition, .offset = m->offset, .payload = json, .len = (size_t)n };
        it->aside->held = true;
        return hold(it, &one, ev->sandbox, why);
}

/* Takes a decoded reading: billed, dead-lettered or held (not again when
 * replaying a held one: *ret_held says it still waits). A billed `stopped`
 * event goes on to the batch's events (which then own it); otherwise ev is
 * cleared. */
static int take_reading(struct intake *it, const struct raw *m, struct usage_event *ev, bool replay, bool *ret_held)
{
        enum outcome o;
        char why[200];
        int r = fold_reading(it, m, ev, &o, why, sizeof(why));
        *ret_held = r == 0 && o == HELD;
        if (r == 0 && o == HELD && !replay && it->aside)
                r = hold_batched(it, m, ev, why, ret_held);
        else if (r == 0 && o == HELD && !replay)
                r = hold(it, m, ev->sandbox, why);
        else if (r == 0 && o == HELD)
                rehold(it->batch, m, why);
        if (r < 0 || o != TAKEN || ev->type != EVENT_STOPPED) {
                event_clear(ev);
                return r;
        }
        if (batch_add_event(it->batch, ev) < 0) {
                event_clear(ev);
                return -ENOMEM;
        }
        return 0;
}

/* A `created` event (the sandbox's host, moment and size) or a `restarted`
 * one (a new epoch announced): what lets its sandbox's readings be billed.
 * A `created` goes on to the batch's events (which then own it). Returns 1
 * when the sandbox was announced: the caller then replays what is held for
 * it (replay_waiting); 0 when the event was held or dead-lettered. */
static int take_announcement(struct intake *it, const struct raw *m, struct usage_event *ev, bool replay, bool *ret_held)
{
        *ret_held = false;
        struct sandbox *sb = sandbox_of(it, m, ev);
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
                        r = replay ? 0 : hold(it, m, id, "no created event for the sandbox");
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
                return add_dead(it->batch, m->partition, m->offset, m->payload, m->len, why);
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
        int r = mark_dirty(it->batch, sb);
        if (r == 0 && ev->type == EVENT_CREATED && batch_add_event(it->batch, ev) < 0)
                r = -ENOMEM;
        if (r < 0 || ev->type != EVENT_CREATED)
                event_clear(ev);
        return r < 0 ? r : 1;
}

/* Reads back what earlier batches held for the sandbox, then bills (or
 * refuses) everything held for it that its provenance now allows: the
 * earlier batches' readings first, then this batch's, each in order. */
static int replay_waiting(struct intake *it, const char *sandbox)
{
        /* (A prefetch that found none spares a round trip per `created` event.) */
        int r = sandbox_unheld(it->cache, sandbox) ? 0 : held_load(it->ledger, it->batch, sandbox);
        if (r < 0)
                return r;
        /* Stored rows first, then this batch's; a replay may hold nothing new
         * but may add dead letters and events (never entries to waiting). */
        for (int pass = 0; pass < 2; pass++)
                for (size_t i = 0; i < it->batch->nwaiting; i++) {
                        struct waiting *w = &it->batch->waiting[i];
                        if (w->done || w->stored != (pass == 0) || strcmp(w->sandbox, sandbox) != 0)
                                continue;
                        struct raw m = { .partition = w->partition, .offset = w->offset, .payload = w->raw,
                                         .len = w->len };
                        struct usage_event ev;
                        char why[256];
                        bool held = false;
                        w->done = true; /* so that a replay within this one does not take it again */
                        if (event_decode(w->raw, w->len, &ev, why, sizeof(why)) < 0) {
                                r = add_dead(it->batch, w->partition, w->offset, w->raw, w->len, why);
                        } else if (ev.type == EVENT_RESTARTED) {
                                char id[EVENT_ID_MAX + 1];
                                snprintf(id, sizeof(id), "%s", ev.sandbox);
                                if ((r = take_announcement(it, &m, &ev, true, &held)) > 0)
                                        r = replay_waiting(it, id); /* the epoch it announced */
                        } else {
                                r = take_reading(it, &m, &ev, true, &held);
                        }
                        w = &it->batch->waiting[i]; /* (nothing grows it during a replay, but read it again) */
                        if (r < 0)
                                return r;
                        w->done = !held;
                        if (!held)
                                atomic_fetch_add_explicit(&it->metrics->readings_released, 1, memory_order_relaxed);
                }
        return 0;
}

/* Takes a usage batch (format v2): each sample as a reading of its own;
 * those refused make one dead letter of the message. */
static int take_batch(struct intake *it, const struct raw *m, uint32_t *samples)
{
        struct sample_batch_reader rd;
        char why[256];
        if (sample_batch_open(&rd, m->payload, m->len, why, sizeof(why)) < 0)
                return add_dead(it->batch, m->partition, m->offset, m->payload, m->len, why);
        struct aside a = { 0 };
        struct usage_event ev;
        const uint8_t *rec;
        size_t reclen;
        int r = 0, k;
        it->aside = &a;
        while (r >= 0 && (k = sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why))) != 0) {
                a.index = rd.index;
                bool held;
                r = k > 0 ? take_reading(it, m, &ev, false, &held) : aside_add_record(&a, rec, reclen, why);
        }
        it->aside = NULL;
        *samples = rd.index > UINT32_MAX ? UINT32_MAX : (uint32_t)rd.index;
        if (r >= 0 && a.refused) {
                char reason[512];
                snprintf(reason, sizeof(reason), "%s; %zu of the usage batch's %zu samples refused", a.first,
                         a.refused, rd.index);
                r = add_dead(it->batch, m->partition, m->offset, a.raw.buf, a.raw.len, reason);
        }
        free(a.raw.buf);
        return r;
}

/* Takes one message into the batch. Never fails on the message's content. */
int take_message(struct intake *it, const rd_kafka_message_t *m)
{
        struct partition *p = part(it->parts, m->partition);
        if (!p || !p->owned || m->offset < p->position)
                return 0; /* not ours (any more), or already in the ledger */
        struct raw raw = { .partition = m->partition, .offset = m->offset, .payload = m->payload, .len = m->len };
        struct usage_event ev;
        char why[256];
        int r = 0;
        bool held;
        uint32_t samples = 1;
        /* Once per message, not per sample: a usage batch is folded within a few ms of it
         * (max_clock_ahead_ms is minutes by default). */
        it->now_wall_ns = time_wall_ns();
        /* Samples take the fast path (sample_decode.h); anything it is not
         * sure of, event_decode. */
        if (sample_batch_is(m->payload, m->len)) {
                r = take_batch(it, &raw, &samples);
        } else if (!sample_decode_fast(m->payload, m->len, &ev) &&
                   event_decode(m->payload, m->len, &ev, why, sizeof(why)) < 0) {
                r = add_dead(it->batch, m->partition, m->offset, m->payload, m->len, why);
        } else if (ev.type == EVENT_SAMPLE || ev.type == EVENT_STOPPED) {
                r = take_reading(it, &raw, &ev, false, &held);
        } else if (ev.type == EVENT_CREATED || ev.type == EVENT_RESTARTED) {
                char id[EVENT_ID_MAX + 1];
                snprintf(id, sizeof(id), "%s", ev.sandbox);
                if ((r = take_announcement(it, &raw, &ev, false, &held)) > 0)
                        r = replay_waiting(it, id);
        } else if (batch_add_event(it->batch, &ev) < 0) { /* the batch owns it now */
                event_clear(&ev);
                r = -ENOMEM;
        }
        if (r < 0)
                return r;
        p->position = m->offset + 1;
        p->touched = true;
        rd_kafka_timestamp_type_t tt;
        batch_count_message(it->batch, rd_kafka_message_timestamp(m, &tt), samples);
        return 0;
}
