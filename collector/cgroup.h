/* cgroup.h — reading a sandbox's cgroup counters cheaply, once per tick.
 *
 * Each counter file is opened once when the sandbox is discovered and re-read
 * with pread at offset 0 on every tick: no open/close, no allocation, no
 * memory.stat on the hot path. cgroup v2 reads cpu.stat (usage_usec, in µs),
 * memory.current and memory.peak (kernel >= 5.19); cgroup v1 reads
 * cpuacct.usage (ns), memory.usage_in_bytes and memory.max_usage_in_bytes.
 * A file the kernel does not offer (memory.peak on older kernels, memory.current
 * in a v2 tree without the memory controller) reads as 0. */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct cgroup_files {
        int version;  /* 1 or 2 */
        int cpu_fd;   /* cpu.stat (v2) or cpuacct.usage (v1); always open */
        int mem_fd;   /* memory.current / memory.usage_in_bytes; -1 if absent */
        int peak_fd;  /* memory.peak / memory.max_usage_in_bytes; -1 if absent or not wanted */
};

struct cgroup_reading {
        uint64_t cpu_ns;         /* cumulative CPU time of the cgroup */
        uint64_t mem_bytes;      /* memory charged now; 0 if the kernel does not say */
        uint64_t mem_peak_bytes; /* peak memory; 0 if the kernel does not say */
};

/* A cgroup_files with nothing open (safe to close). */
#define CGROUP_FILES_NONE ((struct cgroup_files){ .version = 0, .cpu_fd = -1, .mem_fd = -1, .peak_fd = -1 })

/* Opens the counter files of a cgroup: cpu_dir holds the CPU counter, mem_dir
 * the memory counters (the same folder on v2). want_peak opens the peak file too.
 * Returns 0, -ENOENT when the CPU counter is missing (the cgroup is gone), -EINVAL
 * for a bad version, or another -errno. *ret is written only on success. */
int cgroup_files_open(int version, const char *cpu_dir, const char *mem_dir, int want_peak,
                      struct cgroup_files *ret);

/* Closes what is open and marks it closed. Accepts NULL. */
void cgroup_files_close(struct cgroup_files *f);

/* Reads every counter: one pread per open file. Returns 0, -ENODEV or -ENOENT
 * when the cgroup was removed under us, -EINVAL for content that does not parse,
 * or another -errno. *ret is written only on success. */
int cgroup_files_read(const struct cgroup_files *f, struct cgroup_reading *ret);

/* Number of preads cgroup_files_read makes for f. */
int cgroup_files_reads(const struct cgroup_files *f);

/* Parsers for the kernel's formats, exposed for tests.
 * cpu.stat: lines "name value"; returns usage_usec × 1000 in *ret_ns. */
int cgroup_parse_cpu_stat(const char *buf, size_t len, uint64_t *ret_ns);
/* A file holding one decimal integer and a newline (memory.current, cpuacct.usage, ...).
 * "max" is refused: counters never read "max". */
int cgroup_parse_u64(const char *buf, size_t len, uint64_t *ret);
