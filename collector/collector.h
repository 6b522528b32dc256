/* collector.h — tally-collector's engine: one per host. It learns the host's
 * sandboxes from the vmm registry (inotify on <state_dir>/sandboxes, plus a
 * periodic rescan), samples every sandbox's cgroup once per tick, and publishes
 * cumulative usage samples to Kafka's usage topic, keyed by account.
 *
 * It must never lose a sandbox's final counter: a stopped sandbox's final
 * sample goes to the on-disk spool (spool.h) before <id>.final tells the vmm it
 * may remove the cgroup, and leaves the spool only on the broker's
 * acknowledgement. Ordinary samples queue within queue_max while the broker is
 * unreachable; beyond that each sandbox keeps only its newest sample. */
#pragma once

#include "kafka.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct collector_options {
        const char *brokers;
        const struct kafka_client_settings *kafka; /* TLS/SASL for the producer; may be NULL */
        const char *state_dir;
        const char *host_id;          /* used when a record names no host */
        int64_t tick_ms;
        int64_t queue_max;            /* ordinary samples waiting for the broker, at most */
        int64_t delivery_timeout_ms;  /* a message not acknowledged by then is reported failed (finals are re-sent) */
        int64_t rescan_s;             /* full registry rescan period, a safety net under inotify */
        bool read_peak;               /* read memory.peak / memory.max_usage_in_bytes too ... */
        int64_t peak_every;           /* ... every this many ticks (it is a high watermark) */
        const char *cgroup_reader;    /* "auto": the BPF cgroup walk where it loads, else files; "scan"; "files" */
        uint32_t seq_start;           /* tests: the n every sandbox's seq counts from (0 in production) */
        const char *usage_format;     /* "v1": a message per sample; "v2": batches per partition (docs/events.md) */
};

/* Counters and gauges for /metrics. Written by the engine, read by the HTTP
 * thread with relaxed atomic loads. */
struct collector_metrics {
        uint64_t sandboxes;
        uint64_t sandboxes_transient; /* read by opening their files: no descriptors left to keep */
        uint64_t samples_total;
        uint64_t samples_per_second;
        uint64_t finals_total;
        uint64_t deliveries_total;
        uint64_t publish_errors_total;
        uint64_t queue_depth;
        uint64_t pending_newest;      /* sandboxes whose newest sample waits outside the queue */
        uint64_t spool_entries;
        uint64_t spool_bytes;
        uint64_t tick_duration_us;
        uint64_t tick_overruns_total;
        uint64_t ticks_total;
        uint64_t read_errors_total;
        uint64_t epoch_changes_total;
        uint64_t counter_backwards_total; /* a counter went down in the same open cgroup: tampering */
        uint64_t state_save_errors_total; /* a raised epoch or generation could not be stored */
        uint64_t samples_held_total;      /* readings not published until that state is stored */
        uint64_t clock_steps_total;
        uint64_t scan_active;         /* 1: each tick walks the cgroup tree once (cgroup_scan.h) */
        uint64_t scan_cgroups;        /* cgroups the last walk saw */
        uint64_t scan_errors_total;   /* walks that failed (that tick read files) */
        uint64_t file_reads_total;    /* sandbox readings taken from files, not the walk */
        uint64_t moment_lock_timeouts_total; /* ticks sampled without the moment lock (registry.h) */
};

struct collector;

/* Prepares the state folder, loads the spool, raises the start generation and
 * connects the producer. Returns 0 or -errno with a reason in err. */
int collector_new(const struct collector_options *opt, struct collector **ret, char *err, size_t errlen);

/* Runs until *stop is set, then flushes for up to 10 s. Returns 0, or -EIO
 * after a fatal producer error (the spool keeps what was not acknowledged). */
int collector_run(struct collector *c, volatile sig_atomic_t *stop);

void collector_free(struct collector *c);

/* The metrics in Prometheus text format. Returns the length, or -ENOBUFS. */
int collector_metrics_text(const struct collector *c, char *buf, size_t size);
