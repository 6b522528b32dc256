/* vmm_metrics.c — see vmm_metrics.h. Reads the counters, never writes them
 * (but for vmm_op_done). */
#include "vmm_metrics.h"
#include "metrics_text.h"
#include "timeutil.h"

#include <inttypes.h>
#include <stdio.h>

void vmm_op_done(struct vmm_op_metrics *op, int64_t start_mono_ns, int r)
{
        atomic_fetch_add_explicit(r < 0 ? &op->failed : &op->ok, 1, memory_order_relaxed);
        metrics_histogram_add_us(&op->latency, (time_mono_ns() - start_mono_ns) / NS_PER_US);
}

static uint64_t get(const _Atomic uint64_t *v)
{
        return atomic_load_explicit(v, memory_order_relaxed);
}

static void header(struct metrics_text *p, const char *name, const char *type, const char *help)
{
        metrics_text_put(p, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(struct metrics_text *p, const char *name, const char *help, uint64_t v)
{
        header(p, name, "counter", help);
        metrics_text_put(p, "%s %" PRIu64 "\n", name, v);
}

/* One operation: its results as a counter by result, its time as a histogram
 * in seconds (microseconds written exactly, without floating point). */
static void operation(struct metrics_text *p, const char *what, const char *help, const struct vmm_op_metrics *op)
{
        metrics_text_put(p, "# HELP tally_vmm_%ss_total %s, by result\n# TYPE tally_vmm_%ss_total counter\n", what,
                         help, what);
        metrics_text_put(p, "tally_vmm_%ss_total{result=\"ok\"} %" PRIu64 "\n", what, get(&op->ok));
        metrics_text_put(p, "tally_vmm_%ss_total{result=\"failed\"} %" PRIu64 "\n", what, get(&op->failed));
        metrics_text_put(p, "# HELP tally_vmm_%s_duration_seconds %s: time from request to answer\n"
                            "# TYPE tally_vmm_%s_duration_seconds histogram\n", what, help, what);
        char name[96];
        snprintf(name, sizeof(name), "tally_vmm_%s_duration_seconds", what);
        metrics_text_histogram(p, name, &op->latency);
}

int vmm_metrics_text(const struct vmm_metrics *m, const struct vmm_state_counts *states, uint64_t write_failures,
                     char *buf, size_t size)
{
        struct metrics_text p;
        metrics_text_init(&p, buf, size);
        header(&p, "tally_vmm_sandboxes", "gauge", "Sandboxes of this host by state (stopped: not yet cleaned up)");
        metrics_text_put(&p, "tally_vmm_sandboxes{state=\"running\"} %" PRIu64 "\n", states->running);
        metrics_text_put(&p, "tally_vmm_sandboxes{state=\"paused\"} %" PRIu64 "\n", states->paused);
        metrics_text_put(&p, "tally_vmm_sandboxes{state=\"stopped\"} %" PRIu64 "\n", states->stopped);
        operation(&p, "create", "Sandbox creates", &m->creates);
        operation(&p, "fork", "Sandbox forks", &m->forks);
        operation(&p, "exec", "Commands run in sandboxes", &m->execs);
        counter(&p, "tally_vmm_fork_copies_total", "Sandboxes made by forks", get(&m->fork_copies));
        counter(&p, "tally_vmm_control_commands_total", "Control commands read from the control topic",
                get(&m->control_commands));
        counter(&p, "tally_vmm_control_applied_total", "Sandboxes paused or stopped by control commands",
                get(&m->control_applied));
        counter(&p, "tally_vmm_registry_write_failures_total",
                "Registry record writes that failed (each is retried until it holds)", write_failures);
        return metrics_text_end(&p);
}
