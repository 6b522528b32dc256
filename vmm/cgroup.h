/* cgroup.h — one cgroup per sandbox, on cgroup v2 or v1, independent of backends.
 *
 * A sandbox's cgroup holds everything it runs (for QEMU: the process and all its
 * threads). It is created, with a CPU limit of its vCPUs and a memory limit of
 * its size, before the sandbox's first instruction, so boot CPU is counted. It
 * is removed only after its final CPU counter has been read and published.
 *
 * v2 (production hosts): one folder <mount>/<parent>/<id>, the controllers cpu,
 * memory and pids enabled in the parent, freezing through cgroup.freeze.
 * v1 (the build machines here): one folder per hierarchy (cpu, cpuacct, memory,
 * freezer, pids) named <hierarchy>/<parent>/<id>; when a controller-less v2 tree
 * is mounted at <mount>/unified the sandbox gets a folder there too.
 * Which one is decided once at start by cgroup_host_detect(). */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define CGROUP_MAX_DIRS 8

struct cgroup_host {
        int version;                 /* 1 or 2 */
        char mount[PATH_MAX];        /* e.g. /sys/fs/cgroup */
        char parent[256];            /* relative to each hierarchy's root, e.g. "tally" */
};

/* The folders of one sandbox's cgroup. */
struct sandbox_cgroup {
        int version;                 /* 1 or 2 */
        char cpu[PATH_MAX];          /* v1: the cpu hierarchy's folder (cpu.cfs_quota_us); v2: the folder */
        char cpuacct[PATH_MAX];      /* v1: holds cpuacct.usage; v2: the folder (cpu.stat) */
        char memory[PATH_MAX];       /* v1: memory.usage_in_bytes; v2: the folder */
        char freezer[PATH_MAX];      /* v1: freezer.state; v2: the folder (cgroup.freeze) */
        size_t ndirs;                /* every folder created, in creation order */
        char dirs[CGROUP_MAX_DIRS][PATH_MAX];
};

/* Detects cgroup v2 (mount/cgroup.controllers exists) or v1 under mount
 * (NULL: /sys/fs/cgroup) and checks that parent's folders can be created.
 * Returns 0, -ENOENT (no cgroup file system), -EACCES, or -errno. */
int cgroup_host_detect(const char *mount, const char *parent, struct cgroup_host *ret);

/* The folders id's cgroup has (or would have) on host, without touching them. */
int cgroup_paths(const struct cgroup_host *host, const char *id, struct sandbox_cgroup *ret);

/* Creates id's cgroup with a CPU limit of vcpus CPUs and a memory limit of
 * mem_bytes (no swap where the kernel lets us say so). An existing folder of
 * the same name is refused with -EEXIST. On failure nothing is left behind. */
int cgroup_create(const struct cgroup_host *host, const char *id, uint32_t vcpus, uint64_t mem_bytes,
                  struct sandbox_cgroup *ret);

/* Writes pids.max = max in every folder of cg that has the file (v1: the pids
 * hierarchy; v2: the folder). Returns -ENOENT if none has it. */
int cgroup_set_pids_max(const struct sandbox_cgroup *cg, uint64_t max);

/* Moves pid (0: the caller) with all its threads into every folder of cg.
 * Async-signal-safe (open/write/close only), so a freshly forked child of a
 * threaded daemon may call it before it execs. */
int cgroup_enter(const struct sandbox_cgroup *cg, pid_t pid);

/* Freezes / thaws every process in cg and waits until the kernel says so
 * (at most timeout_ms). Freezing a frozen group is harmless. */
int cgroup_freeze(const struct sandbox_cgroup *cg, int timeout_ms);
int cgroup_thaw(const struct sandbox_cgroup *cg, int timeout_ms);

/* Cumulative CPU time of the group in ns (v1 cpuacct.usage, v2 cpu.stat usage_usec × 1000). */
int cgroup_cpu_ns(const struct sandbox_cgroup *cg, uint64_t *ret);
/* Memory charged to the group now, in bytes (v1 memory.usage_in_bytes, v2
 * memory.current), and its high watermark since the group was made (v1
 * memory.max_usage_in_bytes, v2 memory.peak: kernel 5.19 and later). Read
 * with the collector's parser (common/cgroup_counter.h). -ENOENT where the
 * kernel offers no such file. */
int cgroup_memory_bytes(const struct sandbox_cgroup *cg, uint64_t *ret);
int cgroup_memory_peak_bytes(const struct sandbox_cgroup *cg, uint64_t *ret);

/* The pids in the group (malloc'd array in *ret). Returns the count or -errno. */
int cgroup_pids(const struct sandbox_cgroup *cg, pid_t **ret);

/* The CPU counter of a group whose processes were killed, once the kernel has
 * charged them all: after every task is released (pids.current 0, or 1 when
 * that one is init, the group's first process, ended and not yet reaped), or,
 * where that cannot be known, once the counter holds still. Waits at most about
 * timeout_ms on the monotonic clock (twice that when the release is not
 * seen). Returns 0; -EAGAIN when
 * the release could not be seen (*ret is then the still counter, or the last
 * read at the bound); or -errno from reading the counter (*ret untouched). */
int cgroup_cpu_final(const struct sandbox_cgroup *cg, pid_t init, int timeout_ms, uint64_t *ret);

/* SIGKILLs every process in the group (thawing it so they can die) and waits
 * until it is empty, at most timeout_ms. Returns 0 or -ETIMEDOUT. */
int cgroup_kill_all(const struct sandbox_cgroup *cg, int timeout_ms);

/* Removes every folder of the group; the group must be empty. Missing folders
 * are fine. Returns 0 or the first -errno. */
int cgroup_remove(const struct cgroup_host *host, const struct sandbox_cgroup *cg);

/* The ids of every sandbox cgroup under host's parent (malloc'd array of
 * malloc'd strings in *ret; free with cgroup_ids_free). Returns the count. */
int cgroup_list_ids(const struct cgroup_host *host, char ***ret);
void cgroup_ids_free(char **ids, int n);
