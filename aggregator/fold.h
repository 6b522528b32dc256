/* fold.h — turning a sandbox's stream of cumulative samples into usage per
 * UTC hour (docs/events.md, "the counter rules").
 *
 * Pure: no I/O, no allocation. The caller keeps one fold_state per sandbox and
 * passes each sample through fold_apply, which reports the usage the sample
 * adds, hour by hour, through a callback. Integers only: CPU in ns, held
 * memory and kept storage in byte-ns (128 bits: an hour of a large sandbox
 * exceeds 64). Applying a duplicate, an older sample or a leftover of an old
 * epoch changes nothing, so a replayed stream bills nothing twice. */
#pragma once

#include "event.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef unsigned __int128 u128;

/* The last sample billed for a sandbox. */
struct fold_state {
        bool known;              /* false until the first sample */
        uint64_t epoch, seq;
        uint64_t cpu_ns;         /* highest counter billed in this epoch */
        int64_t wall_ns;         /* wall clock of the last sample billed */
        enum sandbox_state state;
        uint64_t mem_size_bytes; /* held memory, billed while running */
        uint64_t disk_bytes;     /* with the memory, billed while paused */
};

/* The fold state as one line of text (for fold_state.fold in the ledger), so
 * the store never needs to know its fields: "v1 <field>=<value> ...". The
 * format carries a version; fold_state_parse refuses what it cannot read.
 * fold_state_format returns the length or -ENOBUFS. */
#define FOLD_STATE_TEXT_MAX 512
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
        FOLD_BILLED,        /* the sample moved the state on (it may still bill zero) */
        FOLD_DUPLICATE,     /* same epoch, seq not higher: nothing changes */
        FOLD_OLD_EPOCH,     /* a leftover of an earlier epoch: nothing changes */
        FOLD_COUNTER_BACK,  /* same epoch, higher seq, smaller counter: time billed, no CPU */
        FOLD_IMPOSSIBLE,    /* more CPU than its vCPUs could run in the time: refused, nothing changes */
};

/* The slack allowed on "CPU used <= vCPUs x wall time" (clocks and counters
 * are read at slightly different moments); beyond it a sample is impossible. */
#define FOLD_CPU_SLACK_NS (INT64_C(3600) * INT64_C(1000000000))
/* A sandbox's first sample may carry at most vCPUs x this much CPU. */
#define FOLD_FIRST_CPU_MAX_NS (INT64_C(366) * 24 * 3600 * INT64_C(1000000000))

/* Applies one decoded sample (ev->type must be EVENT_SAMPLE) to st, calling
 * emit for each hour it adds usage to (in time order). */
enum fold_result fold_apply(struct fold_state *st, const struct usage_event *ev, fold_emit_fn emit, void *ctx);

/* Splits CPU `cpu` used over wall time [from, to) into UTC hours by each
 * hour's share of the time (exact: the pieces sum to cpu), together with the
 * held time of `state` at the given sizes. Exposed for tests. */
void fold_split(int64_t from, int64_t to, uint64_t cpu, enum sandbox_state state, uint64_t mem_size_bytes,
                uint64_t disk_bytes, fold_emit_fn emit, void *ctx);
