/* registry.h — the host's sandbox registry: one JSON file per sandbox in
 * <state_dir>/sandboxes/<id>.json, written by tally-vmm, read by
 * tally-collector (which watches the folder) and by a restarted tally-vmm.
 *
 * Writes are atomic (temporary file, fsync, rename), so a reader sees the old
 * record or the new one, never half. The record outlives the sandbox's cgroup
 * until its final counter is safe: see docs/registry.md for the stop handshake
 * between vmm and collector. */
#pragma once

#include "event.h"

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define REGISTRY_DIR "sandboxes"
/* The moment lock: <state_dir>/sandboxes/.moments.lock (docs/registry.md, "Moments and ticks"). */
#define REGISTRY_MOMENTS_LOCK ".moments.lock"
/* How long either side waits for the other's hold of it before carrying on without. */
#define REGISTRY_MOMENT_WAIT_MS 2000

struct sandbox_record {
        char id[EVENT_ID_MAX + 1];
        char account[EVENT_ID_MAX + 1];
        char key[EVENT_ID_MAX + 1];
        char host[EVENT_ID_MAX + 1];
        char parent[EVENT_ID_MAX + 1];   /* set for a fork's copy */
        char backend[16];                /* "process" or "qemu" */
        enum sandbox_state state;
        uint32_t vcpus;
        uint64_t mem_size_bytes;
        uint64_t disk_size_bytes;
        uint64_t epoch;                  /* changes whenever the cgroup (and its counters) is recreated */
        int64_t created_ns;              /* wall clock */
        int64_t timeout_ns;              /* wall clock deadline, 0: none */
        uint64_t final_cpu_ns;           /* set with state stopped: the last counter read */
        /* Held time, kept by the vmm at each lifecycle moment (created, paused,
         * resumed, stopped): the ns spent running and paused BEFORE the current
         * state began, and when it began on the host's boot clock
         * (time_boot_ns). registry_held_at() gives the cumulative totals at
         * any later instant; they stop growing once the state is stopped. */
        uint64_t running_ns;
        uint64_t paused_ns;
        int64_t state_since_boot_ns;
        /* Written before the backend starts (the vmm's first write of a new
         * sandbox): the sandbox may not run yet and its held time has no
         * moment to count from. The collector takes no sample of it until a
         * record says it started; registry_set_state clears it. */
        bool starting;
        int cgroup_version;              /* 1 or 2 */
        char cgroup_cpu[PATH_MAX];       /* folder holding cpuacct.usage (v1) or cpu.stat (v2) */
        char cgroup_memory[PATH_MAX];    /* folder holding memory.usage_in_bytes (v1) or memory.current (v2) */
        char disk_path[PATH_MAX];        /* the sandbox's disk (file or folder); "" if none */
        pid_t pid;                       /* the sandbox's main process on this host */
        size_t nlabels;
        struct event_label *labels;      /* owned; freed by sandbox_record_clear */
};

/* Writes rec to <state_dir>/sandboxes/<id>.json atomically, creating the
 * folder. Returns 0 or -errno. */
int registry_write(const char *state_dir, const struct sandbox_record *rec);

/* Reads one record file. Returns 0 and fills *ret (clear it later), -ENOENT,
 * or -EINVAL for a file that is not a valid record. */
int registry_read_file(const char *path, struct sandbox_record *ret);
int registry_read(const char *state_dir, const char *id, struct sandbox_record *ret);

/* Removes a record. Missing is fine. Returns 0 or -errno. */
int registry_remove(const char *state_dir, const char *id);

/* Reads every valid record (invalid files are skipped and logged). *ret is a
 * malloc'd array the caller frees with registry_list_free. Returns the count or -errno. */
int registry_list(const char *state_dir, struct sandbox_record **ret);
void registry_list_free(struct sandbox_record *list, int n);

/* The sandbox's cumulative held time at boot-clock instant boot_now: the
 * totals before the current state plus (boot_now - state_since_boot_ns) for
 * the current state if it is running or paused (never negative). */
void registry_held_at(const struct sandbox_record *rec, int64_t boot_now, uint64_t *ret_running_ns,
                      uint64_t *ret_paused_ns);

/* Moves rec to state `to` at boot-clock instant boot_now, adding the time
 * spent in the state it leaves to its total; a starting record has started. */
void registry_set_state(struct sandbox_record *rec, enum sandbox_state to, int64_t boot_now);

/* The moment lock orders the vmm's lifecycle moments against the collector's
 * ticks, so that a tick never extrapolates a state past a moment whose record
 * it has not read (docs/registry.md, "Moments and ticks"):
 *  - the vmm holds it SHARED from just before it reads a moment's clock until
 *    the record carrying that moment is renamed into place
 *    (registry_moment_begin ... registry_moment_end); moments never wait on
 *    each other;
 *  - the collector holds it EXCLUSIVE once per tick while it reads its tick's
 *    clocks and the records inotify says changed (registry_moments_quiesce ...
 *    registry_moment_end): with it, no moment is in flight, so every moment
 *    before the tick's clock is in a record it reads.
 * Each hold opens the lock file afresh (an open file description of its own:
 * flock locks belong to it, and threads of one process must not share one).
 * Either side waits at most wait_ms (polling), then returns -ETIMEDOUT so a
 * wedged peer never stops the other. Returns the descriptor holding the lock,
 * or -errno. */
int registry_moment_begin(const char *state_dir, int64_t wait_ms);
int registry_moments_quiesce(const char *state_dir, int64_t wait_ms);
/* Releases a hold (closes fd). Accepts a negative fd (nothing held). */
void registry_moment_end(int fd);

/* Frees what the record owns and zeroes it. Accepts NULL. */
void sandbox_record_clear(struct sandbox_record *rec);

/* The record's path (for watchers): <state_dir>/sandboxes/<id>.json. */
int registry_path(char *buf, size_t size, const char *state_dir, const char *id);

/* A sandbox's network counters: the file SANDBOX_NET_FILE in its folder (the
 * folder of the record's disk_path), written by tally-vmm's egress proxy and
 * read by the collector at each tick. One line, "RX TX\n", two fixed-width
 * decimals (bytes relayed to and from the sandbox, cumulative), rewritten in
 * place so a reader's pread never sees a shorter number. No file: no
 * internet, both counters 0. */
#define SANDBOX_NET_FILE "net"
#define SANDBOX_NET_LINE_LEN 42

/* Reads the counters from an open file. Returns 0, or -errno (-EINVAL for a
 * malformed line). Out-parameters are written only on success. */
int sandbox_net_read(int fd, uint64_t *ret_rx, uint64_t *ret_tx);
/* Rewrites them in place. */
int sandbox_net_write(int fd, uint64_t rx, uint64_t tx);
