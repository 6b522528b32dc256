/* track.h — the counter rules a collector must keep (docs/events.md): which
 * epoch and sequence number a sample carries, and a wall clock that never runs
 * backwards. Pure functions of their inputs, so each rule has a unit test.
 *
 * Epochs: a sample's epoch is the registry record's epoch (the vmm changes it
 * when it recreates a cgroup or restores a snapshot), raised by the collector
 * when it sees a counter go backwards without that change. It is never lowered:
 * the aggregator ignores samples of a lower epoch and bills a higher epoch's
 * whole counter, so both a missed and a spurious change would bill wrong. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct epoch_track {
        uint64_t record_epoch; /* the registry record's epoch last seen */
        uint64_t epoch;        /* the epoch samples carry; >= record_epoch */
        uint64_t last_cpu_ns;  /* the last counter published in this epoch */
        bool have_last;        /* last_cpu_ns is meaningful */
};

/* Starts tracking: record_epoch from the registry, saved_epoch/saved_record
 * what an earlier run persisted (0, 0 if nothing). */
void epoch_track_init(struct epoch_track *t, uint64_t record_epoch, uint64_t saved_epoch, uint64_t saved_record);

/* Applies one reading: the record's current epoch and the counter read. Returns
 * true if the epoch changed (the caller persists it). Afterwards t->epoch is the
 * epoch to publish cpu_ns under. */
bool epoch_track_observe(struct epoch_track *t, uint64_t record_epoch, uint64_t cpu_ns);

/* True when the epoch differs from the record's, so it must survive a restart. */
static inline bool epoch_track_is_local(const struct epoch_track *t)
{
        return t->epoch != t->record_epoch;
}

/* Sequence numbers (docs/events.md, "Sequence numbers"): per sandbox
 * (generation << 32) | n, where n counts the sandbox's samples since the
 * collector started (from 1) and the generation is the host's, persisted and
 * raised by one at every start, and whenever a sandbox's n would pass 2^32 - 1.
 * So a sandbox's seq never wraps and never goes backwards. Generations stay
 * below 2^31, so seq stays below 2^63 (the message's integers). */
#define SEQ_GENERATION_MAX INT32_MAX

static inline uint64_t seq_make(uint32_t generation, uint32_t n)
{
        return ((uint64_t)generation << 32) | n;
}

/* One sandbox's place in its sequence: the generation and n of its last seq
 * (n 0: none yet). */
struct seq_track {
        uint32_t generation;
        uint32_t n;
};

/* Raises the host's generation to `next` and persists it, before any seq uses
 * it. Returns 0 or -errno. */
typedef int (*seq_raise_fn)(void *ctx, uint32_t next);

/* The next seq of the sandbox t, under the host's generation *host_gen. When
 * the sandbox's n would pass 2^32 - 1 under the generation it last used, n
 * restarts at 1 under a higher generation: the host's if it was raised since,
 * else host + 1, through raise() first. Returns 0 and *ret_seq, or the
 * -errno of a failed raise (-EOVERFLOW past SEQ_GENERATION_MAX), changing
 * nothing: that sample must not be published. */
int seq_next(struct seq_track *t, uint32_t *host_gen, seq_raise_fn raise, void *ctx, uint64_t *ret_seq);

/* Wall clock for samples: follows CLOCK_REALTIME, but never goes backwards.
 * After a backward step it advances with the monotonic clock from the last
 * value until the real clock catches up. A step is a disagreement of more than
 * WALL_STEP_NS between the wall and monotonic clocks' progress. */
#define WALL_STEP_NS INT64_C(1000000000)

struct wall_guard {
        int64_t last_wall, last_mono, last_real;
        bool started;
        uint64_t steps; /* clock steps seen (either direction) */
};

/* Returns the wall time to stamp on a reading taken at (real, mono). */
int64_t wall_guard_next(struct wall_guard *g, int64_t real, int64_t mono);

/* Tick scheduling on the monotonic clock: the tick planned at `planned` ended
 * at `done`. Returns when the next tick starts: planned + tick_ns, or, if the
 * tick overran that, `done` itself (the next tick runs at once and is never
 * skipped silently); *ret_overran says which. */
int64_t tick_next(int64_t planned, int64_t tick_ns, int64_t done, bool *ret_overran);
