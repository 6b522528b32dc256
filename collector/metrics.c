/* metrics.c — tally-collector's /metrics text (collector_metrics_text,
 * collector.h): one row per field of struct collector_metrics. */
#include "collector.h"
#include "engine.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>

int collector_metrics_text(const struct collector *c, char *buf, size_t size)
{
        static const struct {
                const char *name, *type, *help;
                size_t offset;
        } rows[] = {
#define ROW(n, t, h) { "tally_collector_" #n, t, h, offsetof(struct collector_metrics, n) }
                ROW(sandboxes, "gauge", "Sandboxes tracked"),
                ROW(sandboxes_transient, "gauge", "Sandboxes read by opening their files (no descriptors to keep)"),
                ROW(samples_total, "counter", "Samples taken"),
                ROW(samples_per_second, "gauge", "Samples taken in the last second"),
                ROW(finals_total, "counter", "Final samples spooled"),
                ROW(deliveries_total, "counter", "Messages the broker acknowledged"),
                ROW(publish_errors_total, "counter", "Messages that could not be queued or delivered"),
                ROW(queue_depth, "gauge", "Messages waiting for the broker"),
                ROW(pending_newest, "gauge", "Sandboxes whose newest sample waits for room in the queue"),
                ROW(spool_entries, "gauge", "Final samples on disk awaiting acknowledgement"),
                ROW(spool_bytes, "gauge", "Bytes of final samples on disk"),
                ROW(tick_duration_us, "gauge", "Duration of the last tick in microseconds"),
                ROW(tick_overruns_total, "counter", "Ticks that took longer than the tick interval"),
                ROW(ticks_total, "counter", "Ticks run"),
                ROW(read_errors_total, "counter", "Counter reads that failed (cgroup gone, unparseable)"),
                ROW(epoch_changes_total, "counter", "Counter restarts seen (new epochs)"),
                ROW(counter_backwards_total, "counter",
                    "Counters that went backwards in the same cgroup (possible tampering; each a new epoch)"),
                ROW(state_save_errors_total, "counter",
                    "Failed writes of a raised epoch or generation (the sandbox's samples wait)"),
                ROW(samples_held_total, "counter", "Readings not published because their epoch or generation was not on disk"),
                ROW(clock_steps_total, "counter", "Wall clock steps seen"),
                ROW(scan_active, "gauge", "1 when each tick reads every cgroup in one BPF walk; 0 when it reads files"),
                ROW(scan_cgroups, "gauge", "Cgroups the last walk saw"),
                ROW(scan_errors_total, "counter", "Walks that failed (those ticks read files)"),
                ROW(file_reads_total, "counter", "Sandbox readings taken from cgroup files rather than the walk"),
                ROW(moment_lock_timeouts_total, "counter",
                    "Ticks that could not take the registry's moment lock within 2 s (sampled without it)"),
#undef ROW
        };
        size_t len = 0;
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
                const uint64_t *v = (const uint64_t *)((const char *)&c->m + rows[i].offset);
                int n = snprintf(buf + len, size - len, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", rows[i].name,
                                 rows[i].help, rows[i].name, rows[i].type, rows[i].name,
                                 (unsigned long long)__atomic_load_n(v, __ATOMIC_RELAXED));
                if (n < 0 || (size_t)n >= size - len)
                        return -ENOBUFS;
                len += (size_t)n;
        }
        return (int)len;
}
