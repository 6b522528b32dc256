/* cgroup.h — reading a sandbox's cgroup counters cheaply, once per tick.
 *
 * The two counters read every tick are opened once when the sandbox is
 * discovered and re-read with pread at offset 0: no open/close, no allocation,
 * no memory.stat on the hot path. cgroup v2 reads cpu.stat (usage_usec, in µs)
 * and memory.current; cgroup v1 reads cpuacct.usage (ns) and
 * memory.usage_in_bytes. The peak (memory.peak on v2, kernel >= 5.19;
 * memory.max_usage_in_bytes on v1) is a high watermark read every few ticks,
 * so it keeps no descriptor: two per sandbox is the budget. When the process
 * runs out of descriptors (EMFILE), a sandbox is read by opening its files each
 * time instead — slower, never lost. A file the kernel does not offer
 * (memory.peak on older kernels, memory.current in a v2 tree without the
 * memory controller) reads as 0. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cgroup_files {
        int version;      /* 1 or 2 */
        int cpu_fd;       /* cpu.stat (v2) or cpuacct.usage (v1); -1 when transient */
        int mem_fd;       /* memory.current / memory.usage_in_bytes; -1 if absent or transient */
        bool transient;   /* no descriptors kept: each read opens the files */
        char *cpu_path;   /* kept for transient reads */
        char *mem_path;   /* NULL if the kernel offers no such file */
        char *peak_path;  /* NULL if absent or not wanted */
};

struct cgroup_reading {
        uint64_t cpu_ns;         /* cumulative CPU time of the cgroup */
        uint64_t mem_bytes;      /* memory charged now; 0 if the kernel does not say */
        uint64_t mem_peak_bytes; /* left 0 by cgroup_files_read: see cgroup_files_read_peak */
};

/* A cgroup_files with nothing open (safe to close). */
#define CGROUP_FILES_NONE ((struct cgroup_files){ .version = 0, .cpu_fd = -1, .mem_fd = -1 })

/* Opens the counter files of a cgroup: cpu_dir holds the CPU counter, mem_dir
 * the memory counters (the same folder on v2); want_peak notes the peak file.
 * keep false (the caller's descriptor budget is spent) reads transiently.
 * Returns 0, -ENOENT when the CPU counter is missing (the cgroup is gone),
 * -EINVAL for a bad version, or another -errno. *ret is written only on success. */
int cgroup_files_open(int version, const char *cpu_dir, const char *mem_dir, bool want_peak, bool keep,
                      struct cgroup_files *ret);

/* Closes and frees what is held and marks it closed. Accepts NULL. */
void cgroup_files_close(struct cgroup_files *f);

/* Reads the CPU counter and current memory: one pread each (the memory one
 * only if the file exists). Returns 0, -ENODEV or -ENOENT when the cgroup was
 * removed under us, -EINVAL for content that does not parse, or another -errno.
 * *ret is written only on success. */
int cgroup_files_read(const struct cgroup_files *f, struct cgroup_reading *ret);

/* Reads the peak (open, read, close). Returns 0 (with 0 when the kernel offers no peak), or as above. */
int cgroup_files_read_peak(const struct cgroup_files *f, uint64_t *ret);

/* Descriptors f keeps open (2 normally, 1 without a memory file, 0 when transient). */
int cgroup_files_kept(const struct cgroup_files *f);

/* The files' text is parsed by common/cgroup_counter.h, the vmm's parser too. */
