/* pipe.h — what the pipeline tests share: every part a real process.
 *
 * A private tally-broker, a fresh migrated PostgreSQL database, tally-vmm with
 * process sandboxes in real cgroups under a cgroup parent of the test's own,
 * tally-collector and tally-aggregator. The vmm is driven through its local
 * API (HTTP over its unix socket), each call timed on the boot clock, so the
 * test knows, within one call's round trip, when each lifecycle moment
 * happened. The ground truth is read by the test itself: a sandbox's CPU
 * counter from the kernel (cgroup v1 cpuacct.usage, v2 cpu.stat usage_usec)
 * once its processes have ended, and its life from the test's own clock. */
#pragma once

#include "support.h"
#include "vmmtest.h" /* test_sleep_ms, the tests' waits */

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct pipeline {
        char *dir;
        char state_dir[512], sock[600], cgroup_parent[128], brokers[128];
        char *db_url;
        int tick_ms;
        pid_t broker, vmm, collector, aggregator;
        int collectors; /* started, for log names */
        const char *collector_format; /* the collector's usage_format; NULL: its default */
        char host_id[65];        /* the vmm's and collector's --host-id; "": the host name */
        struct test_kafka kafka; /* the development broker (pid in broker), or Apache Kafka */
        bool shares;             /* a host added by pipe_add_host: broker and database are another's */
};

/* Starts broker, database (migrated, with account `acct_pipe` and key
 * `key_free`), vmm, collector (tick_ms) and aggregator. vmm_extra: more
 * arguments for the vmm daemon (NULL-terminated, or NULL). */
void pipe_start(struct pipeline *p, const char *name, int tick_ms, const char *const *vmm_extra);
/* pipe_start with more to say: arguments for the vmm and the aggregator
 * (NULL-terminated, or NULL each) and the host's id (NULL: the host name). */
struct pipe_options {
        const char *const *vmm_extra;
        const char *const *aggregator_extra;
        const char *host_id;
};
void pipe_start_with(struct pipeline *p, const char *name, int tick_ms, const struct pipe_options *o);
/* Another host on this machine, on base's broker and database: its own state
 * folder, vmm socket and cgroup parent, a tally-vmm (vmm_extra, as pipe_start)
 * and a tally-collector (base's tick_ms), both with --host-id host_id. h is a
 * pipeline of its own for pipe_api, pipe_create and the rest, without an
 * aggregator. Stop it with pipe_finish(h) before pipe_finish(base). */
void pipe_add_host(struct pipeline *base, struct pipeline *h, const char *host_id, const char *const *vmm_extra);
/* Starts (again) the collector; its log is collector.N.log. */
void pipe_collector_start(struct pipeline *p);
/* SIGTERM, then SIGKILL after 10 s; waits. */
void pipe_daemon_stop(pid_t pid);
/* Stops every daemon, prints the logs' tails if a check failed, removes what
 * is left of the test's cgroups, drops the database (not a host's of
 * pipe_add_host: base's). Returns test_result(). Twice is once. */
int pipe_finish(struct pipeline *p);

/* One call's moments on the boot clock (time_boot_ns). */
struct call {
        int64_t start, end;
        long status;
};
/* A local API request; returns the JSON answer (NULL if none) and fills c. */
json_t *pipe_api(struct pipeline *p, const char *method, const char *path, const char *body, struct call *c);

/* GET url over TCP (10 s at most): the body (malloc'd) and its HTTP status
 * in *ret_status, or NULL when nothing answered (a failure the caller says). */
char *pipe_http_get(const char *url, long *ret_status);

/* A sandbox the test made, with what the test measured of it. */
struct sb {
        char id[80];
        char cpu_dir[600];  /* its CPU cgroup folder (v1 cpuacct, v2 the one folder) */
        char hold[640];     /* a child folder the test makes so the folder outlives the stop */
        struct call create, stop;
        uint64_t truth_cpu_ns; /* the kernel's counter once its processes ended */
        bool have_truth;
};

/* POST /v1/sandboxes with body; fills s (id, cgroup). Returns 0 or -1 (checked). */
int pipe_create(struct pipeline *p, struct sb *s, const char *body);
/* exec of argv (NULL-terminated) in the sandbox; returns its exit code or -1. */
int pipe_exec(struct pipeline *p, const struct sb *s, const char *const *argv);
/* POST /v1/sandboxes/ID/ACTION (pause, resume, stop); returns 0 or -1 (checked). */
int pipe_action(struct pipeline *p, const struct sb *s, const char *action, struct call *c);

/* Makes s->hold, so the vmm cannot remove the cgroup before the test read it
 * (its rmdir waits while the folder has a child; a child with no process adds
 * no CPU). Returns 0 or -1 (checked). */
int pipe_hold(struct sb *s);
/* Stops the sandbox (timed into s->stop), then reads the truth: waits until
 * the cgroup has no process left, reads its CPU counter, checks it stays put,
 * and removes the hold. Returns 0 or -1 (checked). */
int pipe_stop_with_truth(struct pipeline *p, struct sb *s);
/* The second half of pipe_stop_with_truth, for a sandbox stopped some other
 * way (through tally-api, say) after pipe_hold: waits until its cgroup has no
 * process left, reads the counter into s->truth_cpu_ns, checks it stays put,
 * removes the hold. Returns 0 or -1 (checked). */
int pipe_read_truth(struct sb *s);

/* The kernel's CPU counter of a CPU cgroup folder, in ns (v2: usage_usec x
 * 1000); -1 when unreadable. */
int64_t pipe_cgroup_cpu_ns(const char *cpu_dir);

/* Waits until the vmm removed the sandbox's record (its stop is acknowledged
 * and its final counter safe) and the collector's spool no longer holds its
 * final sample (the broker has it), up to timeout_ms. Returns 0 or -1 (checked). */
int pipe_wait_removed(struct pipeline *p, const char *id, int timeout_ms);
/* Waits until the aggregator committed every message in the usage topic, up
 * to timeout_ms. Returns 0 or -1 (checked). */
int pipe_wait_caught_up(struct pipeline *p, int timeout_ms);

/* What the ledger billed a sandbox: CPU ns, held byte-ns while running over
 * mem_size_bytes, and byte-ns while paused over storage_bytes (the memory
 * size plus the disk bytes used: docs/events.md), as whole ns and remainders. */
struct billed {
        int64_t cpu_ns;
        int64_t mem_ns, mem_rem;         /* sum(mem_byte_ns) / mem_size, remainder */
        int64_t storage_ns, storage_rem; /* sum(storage_byte_ns) / mem_size, remainder */
        bool found;
};
struct billed pipe_billed(struct pipeline *p, const char *id, uint64_t mem_size_bytes, uint64_t storage_bytes);
/* The bytes the sandbox's disk (its record's disk_path) uses, measured by the
 * test: blocks of a file, or of every file under a folder; -1 (checked) when
 * it cannot tell. */
int64_t pipe_disk_bytes(struct pipeline *p, const char *id);

char *pipe_query(struct pipeline *p, const char *sql);
void pipe_exec_sql(struct pipeline *p, const char *sql);

