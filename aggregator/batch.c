/* batch.c — see batch.h. */
#include "batch.h"

#include "text.h"
#include "timeutil.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* A sandbox's pieces in the batch are a chain from its newest (sb->piece),
 * usually one or two long (the hours its readings reached), so a reading
 * finds its hour's piece without a search of the batch, and the commit
 * writes sandbox-hours without sorting samples. */
int batch_add_piece(struct batch *b, struct sandbox *sb, const struct fold_usage *u)
{
        for (size_t i = sb->piece; i; i = b->pieces[i - 1].prev) {
                struct fold_usage *sum = &b->pieces[i - 1].u;
                if (sum->hour_ns != u->hour_ns)
                        continue;
                sum->cpu_ns += u->cpu_ns;
                sum->mem_byte_ns += u->mem_byte_ns;
                sum->storage_byte_ns += u->storage_byte_ns;
                if (u->mem_peak_bytes > sum->mem_peak_bytes)
                        sum->mem_peak_bytes = u->mem_peak_bytes;
                return 0;
        }
        if (grow((void **)&b->pieces, &b->cappieces, b->npieces + 1, sizeof(*b->pieces)) < 0)
                return -ENOMEM;
        b->pieces[b->npieces++] = (struct piece){ .sb = sb, .u = *u, .prev = sb->piece };
        sb->piece = b->npieces;
        return 0;
}

int add_dead(struct batch *b, int32_t partition, int64_t offset, const void *raw, size_t len, const char *why)
{
        if (grow((void **)&b->dead, &b->capdead, b->ndead + 1, sizeof(*b->dead)) < 0)
                return -ENOMEM;
        struct dead_letter *d = &b->dead[b->ndead];
        d->raw = malloc(len ? len : 1);
        if (!d->raw)
                return -ENOMEM;
        if (len)
                memcpy(d->raw, raw, len);
        d->len = len;
        d->partition = partition;
        d->offset = offset;
        utf8_copy(d->reason, sizeof(d->reason), why);
        b->ndead++;
        return 0;
}

int mark_dirty(struct batch *b, struct sandbox *sb)
{
        if (sb->dirty)
                return 0;
        if (grow((void **)&b->dirty, &b->capdirty, b->ndirty + 1, sizeof(*b->dirty)) < 0)
                return -ENOMEM;
        b->dirty[b->ndirty++] = sb;
        sb->dirty = true;
        return 0;
}

int batch_add_event(struct batch *b, const struct usage_event *ev)
{
        if (grow((void **)&b->events, &b->capevents, b->nevents + 1, sizeof(*b->events)) < 0 ||
            grow((void **)&b->announced, &b->capannounced, b->nevents + 1, sizeof(*b->announced)) < 0)
                return -ENOMEM;
        b->announced[b->nevents] = false;
        b->events[b->nevents++] = *ev; /* the batch owns it now */
        return 0;
}

void batch_count_message(struct batch *b, int64_t kafka_ms, uint32_t samples)
{
        if (b->messages == 0)
                b->started_ns = time_mono_ns();
        b->messages++;
        if (kafka_ms > 0 && grow((void **)&b->stamps, &b->capstamps, b->nstamps + 1, sizeof(*b->stamps)) == 0)
                b->stamps[b->nstamps++] = (struct stamp){ kafka_ms, samples ? samples : 1 };
}

void keep_first(struct batch *b, const struct raw *m)
{
        if (b->first_cap < m->len + 1) {
                char *q = realloc(b->first_raw, m->len + 1);
                if (!q) {
                        free(b->first_raw);
                        b->first_raw = NULL;
                        b->first_cap = b->first_len = 0;
                        return; /* then a refused batch of one is retried, not set aside */
                }
                b->first_raw = q;
                b->first_cap = m->len + 1;
        }
        if (m->len)
                memcpy(b->first_raw, m->payload, m->len);
        b->first_len = m->len;
        b->first_partition = m->partition;
        b->first_offset = m->offset;
}

/* The batch's sandboxes are free for the next batch: none points back at it. */
static void release_sandboxes(struct batch *b)
{
        if (b->released)
                return;
        for (size_t i = 0; i < b->npieces; i++)
                b->pieces[i].sb->piece = 0;
        for (size_t i = 0; i < b->ndirty; i++)
                b->dirty[i]->dirty = b->dirty[i]->sampled = false;
        b->released = true;
}

void batch_written(struct batch *b, struct sandbox_cache *c, int64_t now_mono_ns)
{
        for (size_t i = 0; i < b->ndirty; i++) {
                struct sandbox *s = b->dirty[i];
                s->db_state = (int)s->fold.state + 1;
                memcpy(s->db_host, s->host, sizeof(s->db_host));
                s->net_unsaved = false;
                s->no_row = false;
                s->version++;
                s->used_ns = now_mono_ns;
        }
        for (size_t i = 0; i < b->nevents; i++) {
                struct sandbox *s = sandbox_find(c, b->events[i].sandbox);
                if (s) {
                        s->db_state = 0; /* the event may have changed the row's state */
                        s->no_row = false;
                }
        }
        release_sandboxes(b);
}

void batch_clear(struct batch *b)
{
        release_sandboxes(b);
        b->released = false;
        for (size_t i = 0; i < b->nevents; i++)
                event_clear(&b->events[i]);
        for (size_t i = 0; i < b->ndead; i++)
                free(b->dead[i].raw);
        for (size_t i = 0; i < b->nwaiting; i++)
                free(b->waiting[i].raw);
        b->npieces = b->ndirty = b->nevents = b->ndead = b->messages = b->nstamps = b->nwaiting = 0;
        b->events_scanned = 0;
        b->gen++;
}

void batch_free(struct batch *b)
{
        batch_clear(b);
        free(b->pieces);
        free(b->dirty);
        free(b->events);
        free(b->announced);
        free(b->dead);
        free(b->waiting);
        free(b->stamps);
        free(b->first_raw);
        *b = (struct batch){ 0 };
}
