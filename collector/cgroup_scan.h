/* cgroup_scan.h — every sandbox's counters in one walk of the cgroup tree.
 *
 * cgroup.c reads two files per sandbox per tick: two system calls, each
 * through kernfs and seq_file, whose cost grows with the number of cgroups
 * (cold kernel caches). A scan instead runs a BPF cgroup iterator (bpf/cgroup_scan.bpf.c)
 * over each root folder that holds sandboxes: one system call per root reads
 * the same kernel counters for every cgroup under it (docs/collector.md has the
 * figures). The values are the ones the files print, to the unit: cgroup_scan_get
 * gives what cgroup_files_read would have read.
 *
 * A scan needs a kernel with cgroup iterators, bpf_rdonly_cast and BTF (Linux >= 6.2) and the
 * privilege to load BPF programs; cgroup_scan_new says when it cannot, and the
 * collector then reads files. A cgroup the scan did not see (removed, recreated
 * under a new id, outside every root, beyond SCAN_RECORDS_MAX) is read from its
 * files too, which is also how a removed cgroup is noticed. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cgroup_scan;

/* What a scan read of one sandbox: the CPU counter from its CPU cgroup, memory
 * from its memory cgroup (the same cgroup on v2). */
struct cgroup_scan_reading {
        uint64_t cpu_ns;         /* v2: rounded down to whole µs, as cpu.stat's usage_usec */
        uint64_t mem_bytes;      /* 0 when the cgroup has no memory controller, as cgroup.c reads it */
        uint64_t mem_peak_bytes; /* only when the scan ran with peaks; else 0 */
        bool has_peak;
};

/* Loads the BPF program. Returns 0, -EOPNOTSUPP when tally was built without
 * BPF, or the loader's -errno (EPERM without privilege; EINVAL, ENOENT, ESRCH
 * on kernels without cgroup iterators). On failure a reason goes to err. */
int cgroup_scan_new(struct cgroup_scan **ret, char *err, size_t errlen);

void cgroup_scan_free(struct cgroup_scan *s);

/* Where a walk finds one cgroup: the walked folder above it, its id (the
 * inode number of its folder, which is the kernel's kernfs id on 64-bit
 * hosts), and where the last walk listed it (walks list cgroups in the same
 * order from tick to tick, so this spares a lookup). */
struct cgroup_scan_ref {
        int root; /* -1: not watched */
        uint64_t id;
        uint32_t hint;
};

#define CGROUP_SCAN_REF_NONE ((struct cgroup_scan_ref){ .root = -1 })

/* The counters a cgroup is watched for: a walk reads, of each cgroup under a
 * root, only what some cgroup under it was watched for (each costs cache
 * misses). */
enum cgroup_scan_counter {
        CGROUP_SCAN_CPU = 1,
        CGROUP_SCAN_MEM = 2,
};

/* Watches a sandbox's cgroup folder (v1 hierarchy or v2 tree) for a counter:
 * its parent becomes a folder every run walks (once per parent), reading
 * that counter too from then on. Returns 0 or -errno. */
int cgroup_scan_watch(struct cgroup_scan *s, int version, const char *cgroup_dir, enum cgroup_scan_counter what,
                      struct cgroup_scan_ref *ret);

/* Walks every root. peaks: read memory watermarks too. Returns 0, or -errno
 * (then no reading is available until the next successful run). */
int cgroup_scan_run(struct cgroup_scan *s, bool peaks);

/* Cgroups the last run saw, and those it could not record (array full). */
size_t cgroup_scan_seen(const struct cgroup_scan *s);
size_t cgroup_scan_dropped(const struct cgroup_scan *s);

/* Asks the cache for the record cgroup_scan_get will look at first for ref
 * (a hint: nothing is read). */
void cgroup_scan_prefetch(const struct cgroup_scan *s, const struct cgroup_scan_ref *ref);

/* One sandbox's reading from the last run: its CPU cgroup and its memory
 * cgroup (NULL: it has no memory counter file, and memory reads 0 as in
 * cgroup.c). Returns false if the run did not see one of them: the caller
 * reads the files. Updates the references' hints. */
bool cgroup_scan_get(struct cgroup_scan *s, struct cgroup_scan_ref *cpu, struct cgroup_scan_ref *mem,
                     struct cgroup_scan_reading *ret);
