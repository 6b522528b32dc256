/* cgroup_scan_abi.h — what the cgroup walk (cgroup_scan.bpf.c) leaves for
 * user space (cgroup_scan.c) in its global data, shared by both sides. */
#pragma once

#define SCAN_RECORDS_MAX 65536 /* cgroups one scan reports, at most; beyond it sandboxes are read with pread */
#define SCAN_CPUS_MAX 1024     /* possible CPUs the per-CPU counters are summed over, at most */

#define SCAN_HAS_CPU 1u  /* cpu_ns is the cgroup's counter (v1 cpuacct, or v2 base stats) */
#define SCAN_HAS_MEM 2u  /* mem_bytes (and peak_bytes if asked) come from the memory controller */
/* The same bits say what a walk is to read (want): a root's sandboxes' CPU, memory or both. */

struct scan_record {
        __u64 id;         /* the cgroup's kernfs id: the inode number of its folder */
        __u64 cpu_ns;     /* v1: sum of cpuacct's per-CPU usage; v2: base stats' sum_exec_runtime (ns) */
        __u64 mem_bytes;  /* pages charged to the cgroup's memory counter × page size */
        __u64 peak_bytes; /* the counter's high watermark × page size; 0 unless peaks were asked */
        __u32 root;       /* which of the walks (one per root folder) found it */
        __u32 flags;      /* SCAN_HAS_* */
};

/* A cgroup as one scan saw it, for the next scan (cgroup_scan.bpf.c:
 * cgroup_id_of, look_ahead): its identity, and where its lines were. */
struct scan_ident {
        __u64 serial;     /* the kernel's css serial_nr: never reused while the host runs */
        __u64 id;         /* its kernfs id, as in scan_record */
        __u64 cgroup;     /* addresses, only ever read through fault-guarded loads: the struct cgroup, */
        __u64 cpuacct;    /* its cpuacct css (v1), */
        __u64 percpu;     /* cpuacct's per-CPU counter (v1), */
        __u64 memcg;      /* its memory css; 0 when not read */
};

