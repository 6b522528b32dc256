/* sandboxes.h — the collector's integration tests play the vmm's part with real
 * cgroups and real processes: a sandbox is a cgroup (v1 cpuacct + memory, or a
 * child of the cgroup2 tree, wherever the host mounts them) holding a child that burns a known amount of
 * CPU, plus a registry record written with common/registry.c, with held time
 * kept as the vmm keeps it (state_since_boot_ns on the boot clock). Stopping
 * one is what tally-vmm does: kill the processes, rewrite the record as
 * stopped at that moment; once the collector made <id>.final, the test reads
 * the cgroup's counter itself from the kernel (the truth every final is
 * checked against: the record carries no final_cpu_ns, so the collector must
 * measure it, not pass on the test's number), then removes the cgroup and the
 * record. The tests then read what the collector published from the broker. */
#pragma once

#include "event.h"
#include "registry.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct test_sandbox {
        struct sandbox_record rec;
        pid_t child;
        int version;
        char cpu_dir[512], mem_dir[512];
        uint64_t truth_cpu_ns;   /* the counter read by the test from the kernel at the end (tsb_remove) */
        int64_t created_boot, created_mono, created_wall; /* read together when the record was written */
        int64_t stopped_boot, stopped_wall;                /* read together at the stop */
        bool stopped, removed;
};

/* The layout a sandbox asked for as version (1: v1 cpuacct + memory, 2: the
 * cgroup2 tree) gets on this host: the other one when the host has not got it
 * (a pure v2 host has no v1; tsb_create uses this, and sets sb->version).
 * TALLY_TEST_CGROUP_LAYOUT=v2 in the environment gives every sandbox the
 * cgroup2 tree, as a pure v2 host would: how the tests' v2 paths run on a v1
 * host (docs/testing.md). */
int tsb_version(int want);

/* The per-test parent cgroups (unique per process); created on first use. */
void tsb_cgroup_parent_remove(void);

/* Creates the cgroup(s) for a sandbox and starts a child in them that burns
 * burn_ms of its own CPU time, then blocks; returns once the burn is done. */
void tsb_create(struct test_sandbox *sb, const char *state_dir, const char *id, const char *account, int version,
                int burn_ms);

/* Reads the sandbox's CPU counter from the kernel (cpuacct.usage, or cpu.stat usage_usec × 1000). */
uint64_t tsb_read_cpu(const struct test_sandbox *sb);

/* Stops as the vmm does: kill -9, reap, record state stopped at that moment
 * (held time frozen: the time since the current state began added to its
 * total, so a sandbox never paused has running_ns = stopped_boot - created_boot),
 * final_cpu_ns 0. */
void tsb_stop(struct test_sandbox *sb, const char *state_dir);

/* True if <state_dir>/sandboxes/<id>.final exists. */
bool tsb_final_marked(const struct test_sandbox *sb, const char *state_dir);

/* Reads truth_cpu_ns from the kernel, then removes the cgroup(s) and the record (the vmm's last step). */
void tsb_remove(struct test_sandbox *sb, const char *state_dir);

/* What the collector published, read from the broker. */
struct published {
        char sandbox[EVENT_ID_MAX + 1];
        uint64_t epoch, seq, cpu_ns;
        int64_t wall_ns, mono_ns;
        bool held_known;
        uint64_t running_ns, paused_ns;
        enum sandbox_state state;
        bool final;
        uint64_t mem_bytes, mem_peak_bytes;
        uint64_t order;     /* its place among the samples and `restarted` events kept */
};

struct consumer;
/* A consumer of the usage topic in a fresh group, from the earliest offset. */
struct consumer *consumer_new(const char *brokers);
/* Reads for up to ms milliseconds, appending samples whose sandbox id starts with prefix. */
void consumer_poll(struct consumer *c, const char *prefix, int ms);
/* Messages kept so far (borrowed). */
const struct published *consumer_items(struct consumer *c, size_t *ret_n);
void consumer_free(struct consumer *c);

/* The first `restarted` event published for sandbox announcing epoch: its
 * reason and its place (published.order); false if none was seen. */
bool published_restart(struct consumer *c, const char *sandbox, uint64_t epoch, char *reason, size_t size,
                       uint64_t *ret_order);

/* Counts what was published for sandbox: finals, and the last final's counter. */
int published_finals(struct consumer *c, const char *sandbox, uint64_t *ret_cpu_ns);

/* Starts tally-collector with the given state folder and brokers and extra args (NULL-terminated). */
pid_t collector_start(const char *state_dir, const char *brokers, const char *log_path, const char *const *extra);
/* SIGTERM and wait; returns the exit status. */
int collector_stop(pid_t pid);

/* A private tally-broker, for faults that must not disturb other tests. */
struct private_broker {
        pid_t pid;
        char bootstrap[128];
        char sock[512];
};
void private_broker_start(struct private_broker *b, const char *dir);
void private_broker_ctl(struct private_broker *b, const char *cmd);
void private_broker_stop(struct private_broker *b);

/* tally_collector_<name>'s value in a /metrics answer; 0 if missing. */
uint64_t metric_value(const char *metrics, const char *name);

/* Writes text to a file (a cgroup's control file); false on failure. */
bool write_file(const char *path, const char *text);

/* Sleeps ms milliseconds. */
void msleep(int ms);
/* Fetches http://127.0.0.1:port/metrics (malloc'd body), or NULL. */
char *http_get_metrics(int port);
