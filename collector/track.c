/* track.c — see track.h. */
#include "track.h"

#include <errno.h>

void epoch_track_init(struct epoch_track *t, uint64_t record_epoch, uint64_t saved_epoch, uint64_t saved_record)
{
        t->record_epoch = record_epoch;
        t->epoch = record_epoch;
        /* A raised epoch from an earlier run still holds while the record's epoch is the one it was raised over. */
        if (saved_record == record_epoch && saved_epoch > record_epoch)
                t->epoch = saved_epoch;
        /* The record moved on while we were away: a counter restart we did not watch. Keep above what we published. */
        else if (saved_record != record_epoch && saved_epoch >= record_epoch && saved_epoch > 0)
                t->epoch = saved_epoch + 1;
        t->last_cpu_ns = 0;
        t->have_last = false;
}

bool epoch_track_observe(struct epoch_track *t, uint64_t record_epoch, uint64_t cpu_ns)
{
        bool changed = false;
        if (record_epoch != t->record_epoch) {
                /* The vmm restarted the counter: its epoch, unless we already published at or above it. */
                uint64_t e = record_epoch > t->epoch ? record_epoch : t->epoch + 1;
                t->record_epoch = record_epoch;
                t->epoch = e;
                t->have_last = false;
                changed = true;
        } else if (t->have_last && cpu_ns < t->last_cpu_ns) {
                /* Backwards without a new record epoch: cgroup recreated or restored behind our back. */
                t->epoch++;
                changed = true;
        }
        t->last_cpu_ns = cpu_ns;
        t->have_last = true;
        return changed;
}

int seq_next(struct seq_track *t, uint32_t *host_gen, seq_raise_fn raise, void *ctx, uint64_t *ret_seq)
{
        uint32_t gen = *host_gen, n = t->n + 1;
        if (t->n == UINT32_MAX) {
                n = 1;
                if (gen <= t->generation) {
                        /* Under the generation it last used, this sandbox has no n left: a new one, persisted first. */
                        if (t->generation >= SEQ_GENERATION_MAX)
                                return -EOVERFLOW;
                        gen = t->generation + 1;
                        int r = raise(ctx, gen);
                        if (r < 0)
                                return r;
                        *host_gen = gen;
                }
        }
        t->generation = gen;
        t->n = n;
        *ret_seq = seq_make(gen, n);
        return 0;
}

int64_t wall_guard_next(struct wall_guard *g, int64_t real, int64_t mono)
{
        if (!g->started) {
                g->started = true;
                g->last_wall = real;
                g->last_mono = mono;
                g->last_real = real;
                return real;
        }
        int64_t expected = g->last_wall + (mono - g->last_mono);
        int64_t drift = (real - g->last_real) - (mono - g->last_mono);
        if (drift > WALL_STEP_NS || drift < -WALL_STEP_NS)
                g->steps++;
        int64_t wall = real;
        if (wall <= g->last_wall)
                /* Backwards (or stuck): move on with the monotonic clock, at least 1 ns. */
                wall = expected > g->last_wall ? expected : g->last_wall + 1;
        g->last_wall = wall;
        g->last_mono = mono;
        g->last_real = real;
        return wall;
}

int64_t tick_next(int64_t planned, int64_t tick_ns, int64_t done, bool *ret_overran)
{
        int64_t next = planned + tick_ns;
        *ret_overran = done > next;
        return *ret_overran ? done : next;
}
