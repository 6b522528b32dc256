/* announce.c — see announce.h. */
#include "announce.h"

#include "lifecycle.h"
#include "log.h"
#include "timeutil.h"

#include <inttypes.h>
#include <stdlib.h>

void announce_start(struct announcer *an, struct writer *w, struct ledger *l, struct batch *b)
{
        size_t fresh = b->nevents - b->events_scanned;
        if (an->running || fresh < ANNOUNCE_MIN || fresh < b->events_scanned)
                return;
        if (b->nstamps && time_wall_ns() / NS_PER_MS - b->stamps[b->nstamps - 1].kafka_ms > ANNOUNCE_BEHIND_MS)
                return; /* catching up */
        size_t *idx = NULL, n = 0;
        if (lifecycle_announce_rows(b, &w->rows, &idx, &n) < 0)
                return;
        b->events_scanned = b->nevents;
        if (!n) {
                free(idx);
                return;
        }
        *an = (struct announcer){ .running = true, .batch = b, .gen = b->gen, .idx = idx, .n = n, .t0 = time_mono_ns() };
        w->ledger = l;
        w->announce = true;
        writer_submit(w);
}

void announce_settle(struct announcer *an, struct writer *w)
{
        if (!an->running)
                return;
        int r = writer_wait(w);
        an->running = w->announce = false;
        if (r == 0 && an->batch->gen == an->gen) {
                for (size_t k = 0; k < an->n; k++)
                        an->batch->announced[an->idx[k]] = true;
                log_debug("created events committed ahead of their batch", "events=%zu ms=%" PRId64, an->n,
                          (time_mono_ns() - an->t0) / NS_PER_MS);
        } else if (r < 0) {
                log_warn("could not commit created events ahead of their batch; the batch writes them", "events=%zu",
                         an->n);
        }
        free(an->idx);
        an->idx = NULL;
}
