/* engine.h — tally-collector's engine (struct collector, collector.h) as its
 * modules compose it. Each module owns its part behind its own header:
 *   table.h     the sandboxes tracked (by id, and in tick order)
 *   counters.h  where readings come from (cgroup files, the BPF walk, descriptors)
 *   encode.h    clocks, epochs, sequence numbers and the sample itself
 *   publish.h   the producer, the spool of finals, samples kept while the queue is full
 *   watch.h     inotify on the registry: which records changed
 *   metrics.h   the counters behind /metrics (metrics.c writes the text)
 * The functions declared here are the ones that act across modules, so they
 * take the whole engine: taking in registry records (records.c), the stop
 * handshake's final sample (final.c), and the tick loop (collector.c). They
 * run on the engine's one thread; only the metrics are read by another. */
#pragma once

#include "collector.h"
#include "counters.h"
#include "encode.h"
#include "event.h"
#include "publish.h"
#include "registry.h"
#include "table.h"
#include "watch.h"

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

struct collector {
        struct collector_options opt;
        char state_dir[PATH_MAX];
        char registry_dir[PATH_MAX];
        char host_id[EVENT_ID_MAX + 1];
        struct sandbox_table table;
        struct counters counters;
        struct encoder enc;
        struct publisher pub;
        struct watch watch;
        uint64_t ticks;
        bool lock_timed_out;          /* the last tick could not take the moment lock */
        struct collector_metrics m;
};

/* Acts on what watch_collect read, in the order read: new, changed, stopped
 * (the final sample is taken) and removed sandboxes. The tick's clocks are
 * kept: a final sample taken here reads its own. */
void records_apply(struct collector *c);

/* Reads every record and takes it in; a sandbox no record names any more is
 * gone. Returns 0 or -errno (logged). */
int records_rescan(struct collector *c);

/* The stop handshake (docs/registry.md) for a stopped sandbox s: spool the
 * final sample durably, then make <id>.final so the vmm may remove the
 * cgroup, then produce. Returns without marking s finished when something
 * could not be done; the tick retries. */
void final_take(struct collector *c, struct sandbox *s);
