/* fold.h — turning a sandbox's stream of cumulative readings (samples and the
 * vmm's `stopped` event) into usage per UTC hour (docs/events.md, "How the
 * aggregator reads samples").
 *
 * Pure: no I/O, no allocation. The caller keeps one fold_state per sandbox and
 * passes each reading through fold_apply_at, which reports the usage the
 * reading adds, hour by hour, through a callback. Integers only: CPU in ns,
 * held memory and kept storage in byte-ns (128 bits: an hour of a large
 * sandbox exceeds 64). Applying a duplicate, an older sample or a leftover of
 * an old epoch changes nothing, so a replayed stream bills nothing twice; the
 * counters are cumulative, so whatever bills a reading bills only what the
 * state has not billed yet. */
#pragma once

#include "event.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef unsigned __int128 u128;

/* The last reading billed for a sandbox. */
struct fold_state {
        bool known;              /* false until the first reading */
        uint64_t epoch, seq;
        uint64_t cpu_ns;         /* the counter billed up to in this epoch */
        int64_t wall_ns;         /* wall clock of the last reading billed (checked; never moves back) */
        enum sandbox_state state;
        uint64_t mem_size_bytes; /* held memory, billed while running */
        uint64_t disk_bytes;     /* with the memory, billed while paused */
        /* v2: held time by cumulative counters (docs/events.md, "Held time") */
        bool held;               /* running_ns/paused_ns are the held counters billed up to */
        uint64_t running_ns, paused_ns;
        bool closed;             /* known stopped (the vmm's `stopped` event or a stopped sample): counters only move up */
        /* Provenance (docs/events.md, "Provenance"): what the sandbox's
         * `created` event said, and the epochs announced since. A reading is
         * billed only once `created` is known, and only up to epoch_max. */
        bool created;            /* its `created` event was seen (or the state predates provenance) */
        int64_t created_ns;      /* the created moment; 0: unknown (a state from before provenance) */
        uint32_t created_vcpus;  /* vCPUs it was created with; 0: unknown */
        uint64_t epoch_max;      /* the highest epoch announced (`created`'s, then `restarted` events) */
        char host[EVENT_ID_MAX + 1]; /* the host that created it; "": any (a state from before provenance) */
};

/* The fold state as one line of text (for fold_state.fold in the ledger), so
 * the store never needs to know its fields: "v2 <field>=<value> ...". The
 * format carries a version; fold_state_parse reads v3, v2 (no provenance: taken
 * as created on any host, its epoch announced) and v1 (which had no held
 * counters either: a v1 state bills time by intervals until its next reading
 * with held counters) and refuses what it cannot read.
 * fold_state_format returns the length or -ENOBUFS. */
#define FOLD_STATE_TEXT_MAX 640
int fold_state_format(const struct fold_state *st, char *buf, size_t size);
/* Fills *ret on success (0); -EINVAL for text it cannot read. */
int fold_state_parse(const char *text, struct fold_state *ret);

/* Usage of one UTC hour (hour_ns: the hour's start). mem_peak_bytes is the
 * peak measured memory seen in that hour, 0 if none. */
struct fold_usage {
        int64_t hour_ns;
        uint64_t cpu_ns;
        u128 mem_byte_ns;
        u128 storage_byte_ns;
        uint64_t mem_peak_bytes;
};

typedef void (*fold_emit_fn)(void *ctx, const struct fold_usage *u);

enum fold_result {
        FOLD_BILLED,        /* the reading moved the state on (it may still bill zero) */
        FOLD_DUPLICATE,     /* same epoch, seq not higher: nothing changes */
        FOLD_OLD_EPOCH,     /* a leftover of an earlier epoch: nothing changes */
        FOLD_COUNTER_RESET, /* same epoch, higher seq, smaller counter: the counter restarted, billed from zero */
        FOLD_IMPOSSIBLE,    /* more CPU or held time than could pass in the time: refused, nothing changes */
        FOLD_SEQ_JUMP,      /* seq's generation more than FOLD_JUMP_MAX above the last billed: refused */
        FOLD_EPOCH_JUMP,    /* epoch more than FOLD_JUMP_MAX above the last billed: refused */
        FOLD_UNANNOUNCED,   /* epoch above any the sandbox's host announced (or no `created` yet): held */
        FOLD_STOP_BEHIND,   /* a `stopped` of a running sandbox below the billed counter or long before
                             * the last reading billed: refused */
};

/* The slack allowed on "CPU used <= vCPUs x wall time" and "held time <=
 * wall time" (clocks and counters are read at slightly different moments);
 * beyond it a reading is impossible. */
#define FOLD_CPU_SLACK_NS (INT64_C(3600) * INT64_C(1000000000))
/* A sandbox's first reading may carry at most vCPUs x this much CPU, and at
 * most this much held time (running + paused). */
#define FOLD_FIRST_CPU_MAX_NS (INT64_C(366) * 24 * 3600 * INT64_C(1000000000))
/* With its `created` moment known, a first reading may carry at most vCPUs x
 * (its wall time - the created moment + this) of CPU and (the same time) of
 * held time: the vmm and the collector read the same host's clock, so the
 * slack covers only a clock step between the two readings. */
#define FOLD_FIRST_SLACK_NS (INT64_C(60) * INT64_C(1000000000))
/* The most seq's generation (seq >> 32) or the epoch may rise between two
 * readings billed: more is a forged or corrupt message (docs/events.md). */
#define FOLD_JUMP_MAX 65536

/* The aggregator's clock, against which readings' wall times are checked
 * (docs/events.md, "How the aggregator reads samples"). A reading dated more
 * than max_ahead_ns after now_ns, or more than max_behind_ns before it (0: no
 * limit), is not trusted for time: its usage is placed at now_ns and the
 * state's wall_ns does not move, so its interval is billed by the next
 * reading with a good clock. */
struct fold_clock {
        int64_t now_ns;
        int64_t max_ahead_ns, max_behind_ns;
};

/* What fold_apply_at noticed beside its result (bits of *notes). */
#define FOLD_NOTE_CLOCK_AHEAD  1u /* wall time too far ahead of the aggregator's clock */
#define FOLD_NOTE_CLOCK_BEHIND 2u /* wall time too far behind it */
#define FOLD_NOTE_HELD_BACK    4u /* a held counter went back: billed only beyond the highest */

/* Takes in a `created` event (the sandbox's host, moment, vCPUs, epoch) or a
 * `restarted` one (a new epoch announced). Returns 0, or -EPERM when a
 * `restarted` comes from another host than the created one, or -ERANGE when
 * it announces an epoch more than FOLD_JUMP_MAX above the highest known (the
 * state does not move then). A second `created` changes nothing. */
int fold_announce(struct fold_state *st, const struct usage_event *ev);

/* Applies one decoded reading — a sample, or the vmm's `stopped` event, which
 * closes the bill with its final counters — to st, calling emit for each hour
 * it adds usage to (in time order). clock may be NULL (wall times trusted);
 * notes, if not NULL, receives FOLD_NOTE_* bits. Any other event type
 * changes nothing (FOLD_DUPLICATE). */
enum fold_result fold_apply_at(struct fold_state *st, const struct usage_event *ev, const struct fold_clock *clock,
                               unsigned *notes, fold_emit_fn emit, void *ctx);
/* fold_apply_at without a clock check. */
enum fold_result fold_apply(struct fold_state *st, const struct usage_event *ev, fold_emit_fn emit, void *ctx);

/* Splits CPU `cpu` used over wall time [from, to) into UTC hours by each
 * hour's share of the time (exact: the pieces sum to cpu), together with the
 * held time of `state` at the given sizes. Exposed for tests. */
void fold_split(int64_t from, int64_t to, uint64_t cpu, enum sandbox_state state, uint64_t mem_size_bytes,
                uint64_t disk_bytes, fold_emit_fn emit, void *ctx);

/* Places usage measured by held counters: `running` ns held running and
 * `paused` ns kept paused, with `cpu`, over the span of their sum ending at
 * `end`, split at UTC hours; each quantity goes to each hour by its share of
 * the span (exact: the pieces sum to the quantities). Memory is running x
 * mem_size_bytes, storage paused x (mem_size_bytes + disk_bytes). With no
 * held time the CPU lands in the hour of `end`. Exposed for tests. */
void fold_place(int64_t end, uint64_t cpu, uint64_t running, uint64_t paused, uint64_t mem_size_bytes,
                uint64_t disk_bytes, fold_emit_fn emit, void *ctx);
