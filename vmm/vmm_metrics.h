/* vmm_metrics.h — tally-vmm's counters and their /metrics page (Prometheus
 * text format). Request threads, the tick and the control thread write them;
 * the HTTP thread only reads, so every figure is a relaxed atomic. Sandboxes
 * by state are counted from the table when the page is asked for. Integers
 * only: durations are counted in microseconds. */
#pragma once

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics_text.h"

/* What one operation did: counted in ok or failed, its time in the histogram. */
struct vmm_op_metrics {
        _Atomic uint64_t ok, failed;
        struct metrics_histogram latency; /* successes and failures alike */
};

struct vmm_metrics {
        struct vmm_op_metrics creates, forks, execs;
        _Atomic uint64_t fork_copies;           /* sandboxes made by successful forks */
        _Atomic uint64_t control_commands;      /* control commands read (decoded) from the topic */
        _Atomic uint64_t control_applied;       /* sandboxes paused or stopped by control commands */
};

/* Counts one operation that began at start_mono_ns (time_mono_ns) and
 * returned r (0 or -errno). */
void vmm_op_done(struct vmm_op_metrics *op, int64_t start_mono_ns, int r);

/* The sandboxes of the table by state, for the page. */
struct vmm_state_counts {
        uint64_t running, paused, stopped;
};

/* Writes the page into buf: m's figures, the states given and the registry's
 * write failures. Returns its length or -ENOBUFS. */
int vmm_metrics_text(const struct vmm_metrics *m, const struct vmm_state_counts *states, uint64_t write_failures,
                     char *buf, size_t size);
