/* cgroup_scan.bpf.c — one walk over every cgroup under a root folder, reading
 * the same kernel counters the collector's files print, in one system call
 * for all of them instead of two reads per sandbox.
 *
 * A cgroup iterator (iter/cgroup, Linux >= 6.1) visits the root and its
 * descendants in pre-order with cgroup_mutex held, so the walk sees a
 * consistent tree. For each cgroup it records:
 *   - v1 cpuacct.usage: the sum over possible CPUs of cpuacct's per-CPU usage,
 *     as the kernel's cpuusage_read does;
 *   - v2 cpu.stat usage_usec: the base stats' sum_exec_runtime after one rstat
 *     flush of the root (user space rounds it down to µs as cpu.stat does);
 *   - memory.usage_in_bytes / memory.current: the memory page counter × page
 *     size, and the counter's watermark (max_usage_in_bytes / memory.peak).
 * Records go to a global array user space reads through the skeleton's mmap;
 * the iterator itself prints nothing, so one read() runs the whole walk.
 *
 * The walk is bound by cache misses (tens of thousands of cgroups, each
 * struct far from the last), so it loads as few cache lines as it can: only
 * the controllers a root was asked for (want), the peak only when asked, and
 * the cgroup's id (its kernfs node, two lines away) only for a cgroup the last
 * walk did not list (cgroup_id_of); and it loads the lines of the cgroups
 * ahead where the last scan found them, in batches whose misses overlap
 * (look_ahead).
 *
 * Kernel structures are read with CO-RE relocations, so the object built
 * against one kernel's BTF loads on another. Counters and subsystem state are reached
 * with bpf_rdonly_cast (Linux >= 6.2): direct loads the kernel guards against
 * faults, cheaper than a bpf_probe_read_kernel call each. */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>

#include "cgroup_scan_abi.h"

char LICENSE[] SEC("license") = "GPL"; /* bpf_probe_read_kernel and the rstat kfunc are GPL-only */

const volatile __u32 nr_cpus = 1;       /* possible CPUs, set before loading */
const volatile __u64 page_size = 4096;

__u32 root_index; /* set by user space before each walk: stamped on its records */
__u32 want;       /* SCAN_HAS_* this walk reads (what the root's sandboxes need), set before each walk */
__u32 want_peak;  /* read watermarks in this walk */
__u32 count;      /* records written; user space zeroes it before the first walk of a scan */
__u32 dropped;    /* cgroups not recorded because the array was full */
struct scan_record records[SCAN_RECORDS_MAX];

/* Each cgroup as this scan saw it (struct scan_ident), by record index, for the next scan's walks:
 * half ident_half is written, the other half holds the last successful scan's,
 * of which [prev_at, prev_end) is this root's (both set by user space before
 * each walk; prev_at moves along it). A map of its own: with the records, the
 * global data's one value would pass the kernel's size limit. The verifier
 * inlines an array's lookup. */
struct {
        __uint(type, BPF_MAP_TYPE_ARRAY);
        __uint(max_entries, 2 * SCAN_RECORDS_MAX);
        __type(key, __u32);
        __type(value, struct scan_ident);
} idents SEC(".maps");
__u32 ident_half;
__u32 prev_at, prev_end;
__u64 cpu_offset[SCAN_CPUS_MAX];

/* Per-CPU offsets. cpuacct's counters are per-CPU memory, but this kernel's
 * BTF carries no per-CPU type tag for bpf_per_cpu_ptr, and __per_cpu_offset is
 * not in kallsyms without CONFIG_KALLSYMS_ALL. A per-CPU array map tells them:
 * its value's per-CPU pointer (bpf_array.pptrs[0]) plus CPU c's offset is the
 * address bpf_map_lookup_percpu_elem returns for c. */
struct {
        __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
        __uint(max_entries, 1);
        __type(key, __u32);
        __type(value, __u64);
} percpu_probe SEC(".maps");

extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;              /* Linux >= 6.2 */
extern void css_rstat_flush(struct cgroup_subsys_state *css) __ksym __weak; /* Linux >= 6.16 */
extern void cgroup_rstat_flush(struct cgroup *cgrp) __ksym __weak;          /* before */

/* A pointer's value as a number (the verifier forbids arithmetic on some pointer kinds). */
static __always_inline __u64 address_of(const void *p)
{
        __u64 a = 0;
        bpf_probe_read_kernel(&a, sizeof(a), &p);
        return a;
}

static __always_inline int learn_cpu_offsets(void)
{
        __u64 base = 0;
        __u32 key = 0;
        bpf_probe_read_kernel(&base, sizeof(base),
                              (void *)(address_of(&percpu_probe) + bpf_core_field_offset(struct bpf_array, pptrs)));
        for (__u32 c = 0; c < SCAN_CPUS_MAX && c < nr_cpus; c++) {
                void *at = bpf_map_lookup_percpu_elem(&percpu_probe, &key, c);
                if (!at)
                        return -1;
                cpu_offset[c] = address_of(at) - base;
        }
        return 0;
}

/* How many of the last scan's cgroups one cgroup may pass over (removed since) before its id is
 * read from its kernfs node instead. */
#define SKIP_MAX 8

/* The last scan's entry of the cgroup visited `ahead` visits after this one (0: this one), or NULL. */
static __always_inline struct scan_ident *last_scan(__u32 ahead)
{
        __u32 j = prev_at + ahead, key = ((ident_half & 1) ^ 1) * SCAN_RECORDS_MAX + j;
        return j < prev_end && j < SCAN_RECORDS_MAX ? bpf_map_lookup_elem(&idents, &key) : NULL;
}

/* The cgroup's id: its kernfs node's (the inode number user space stats).
 * Reading it costs two cache misses (the cgroup's kn pointer, then the node),
 * so the last scan's id is reused when this is the same cgroup: the same
 * serial_nr, which the kernel takes from one 64-bit counter for every cgroup
 * it creates (under cgroup_mutex) and never reuses, so a cgroup removed and
 * made again at the same path has another, and gets its new id read here.
 * serial_nr is on a line the iterator has just read (self.flags: is it dead).
 * Siblings are listed in creation order, so a walk lists serials in the same
 * order as the last one did, with removed cgroups missing and new ones
 * inserted: one cursor over the last walk's list (prev_at) finds each (a
 * merge), and leaves it at the cgroup expected next. A hierarchy's root has
 * serial 0 (never matched). */
static __always_inline __u64 cgroup_id_of(struct cgroup *cgrp)
{
        const __u64 serial = cgrp->self.serial_nr;
        __u64 id = 0;
        for (int k = 0; k < SKIP_MAX; k++) {
                const struct scan_ident *p = last_scan(0);
                if (!p || p->serial > serial)
                        break; /* a cgroup made since */
                prev_at++;
                if (p->serial == serial && serial) {
                        id = p->id;
                        break;
                }
                /* else removed since the last scan */
        }
        if (!id)
                id = cgrp->kn->id;
        return id;
}

/* Loading ahead. A cgroup's counters are a chain of dependent loads, each a
 * cache miss at scale (the cgroup's line the iterator reads, its subsys
 * pointers, cpuacct's per-CPU pointer and the per-CPU counters, the memory
 * page counter), and the iterator reaches the next cgroup through this one's
 * sibling list (one more miss): a walk that only followed them would wait for
 * each miss in turn. The last scan saw the same cgroups in the same order and
 * noted where each of those lines is (remember), so visits load the lines of
 * the cgroups a few visits on, many at once: the misses overlap, and by its
 * own visit a cgroup's lines are in the cache. The addresses are guesses
 * (that cgroup may be gone since, its memory reused): they are read with
 * fault-guarded loads (bpf_rdonly_cast) into a sink, never into a record;
 * every value recorded is read through the cgroup the iterator gives. */
#define LOOK_AHEAD 8
__u64 sink; /* what loads made only to warm the cache read, kept so they are not elided */

static __always_inline __u64 load_u64(__u64 address)
{
        /* bpf_rdonly_cast needs a struct type: struct kernel_cpustat's first member is a u64 */
        struct kernel_cpustat *v = bpf_rdonly_cast((void *)address, bpf_core_type_id_kernel(struct kernel_cpustat));
        return v->cpustat[0];
}

/* Loads the lines of the last scan's entry p into the cache; returns what they hold. */
static __always_inline __u64 warm(const struct scan_ident *p, bool v1)
{
        const __u64 cg = p->cgroup;
        __u64 sum = load_u64(cg + bpf_core_field_offset(struct cgroup_subsys_state, sibling)) +
                    load_u64(cg + bpf_core_field_offset(struct cgroup_subsys_state, serial_nr));
        if (want & SCAN_HAS_CPU) {
                if (v1) {
                        sum += load_u64(cg + bpf_core_field_offset(struct cgroup, subsys) +
                                        8 * bpf_core_enum_value(enum cgroup_subsys_id, cpuacct_cgrp_id));
                        if (p->cpuacct)
                                sum += load_u64(p->cpuacct + bpf_core_field_offset(struct cpuacct, cpuusage));
                        if (p->percpu)
                                for (__u32 c = 0; c < SCAN_CPUS_MAX && c < nr_cpus; c++)
                                        sum += load_u64(p->percpu + cpu_offset[c]);
                } else {
                        sum += load_u64(cg + bpf_core_field_offset(struct cgroup, bstat));
                }
        }
        if (want & SCAN_HAS_MEM) {
                sum += load_u64(cg + bpf_core_field_offset(struct cgroup, subsys) +
                                8 * bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id));
                if (p->memcg) {
                        sum += load_u64(p->memcg + bpf_core_field_offset(struct mem_cgroup, memory.usage));
                        if (want_peak)
                                sum += load_u64(p->memcg + bpf_core_field_offset(struct mem_cgroup, memory.watermark));
                }
        }
        return sum;
}

/* Every LOOK_AHEAD-th visit (seq: the visit's number) warms the LOOK_AHEAD
 * cgroups from LOOK_AHEAD visits on. In batches, because a load here is a
 * load, not a prefetch: the visit waits for the first of them, and the others
 * overlap with it — one wait for a batch rather than one for each cgroup. */
static __always_inline void look_ahead(__u64 seq, bool v1)
{
        if (seq % LOOK_AHEAD)
                return;
        __u64 sum = 0;
        for (__u32 k = 0; k < LOOK_AHEAD; k++) {
                const struct scan_ident *p = last_scan(LOOK_AHEAD - 1 + k);
                if (!p)
                        break;
                sum += warm(p, v1);
        }
        sink += sum;
}

/* Notes for the next scan where this cgroup and its counters were (entry i of this scan). */
static __always_inline void remember(__u32 i, const struct scan_ident *ident)
{
        __u32 key = (ident_half & 1) * SCAN_RECORDS_MAX + i;
        struct scan_ident *at = i < SCAN_RECORDS_MAX ? bpf_map_lookup_elem(&idents, &key) : NULL;
        if (at)
                *at = *ident;
}

static __always_inline void read_memory(struct cgroup *cgrp, struct scan_record *r, struct scan_ident *ident)
{
        if (!(want & SCAN_HAS_MEM))
                return;
        struct cgroup_subsys_state *css = cgrp->subsys[bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id)];
        if (!css)
                return;
        struct mem_cgroup *memcg = bpf_rdonly_cast(css, bpf_core_type_id_kernel(struct mem_cgroup));
        r->mem_bytes = memcg->memory.usage.counter * page_size;
        if (want_peak)
                r->peak_bytes = memcg->memory.watermark * page_size;
        r->flags |= SCAN_HAS_MEM;
        ident->memcg = (__u64)css;
}

static __always_inline void emit(const struct scan_record *r, const struct scan_ident *ident)
{
        __u32 i = count;
        if (i < SCAN_RECORDS_MAX) {
                records[i] = *r;
                remember(i, ident);
                count = i + 1;
        } else {
                dropped++;
        }
}

SEC("iter/cgroup")
int scan_v1(struct bpf_iter__cgroup *ctx)
{
        struct cgroup *cgrp = ctx->cgroup;
        if (!cgrp)
                return 0;
        if (ctx->meta->seq_num == 0 && learn_cpu_offsets() < 0)
                return 1; /* ends the walk; user space sees no records and reads files instead */
        struct scan_ident ident = { .serial = cgrp->self.serial_nr, .id = cgroup_id_of(cgrp), .cgroup = (__u64)cgrp };
        look_ahead(ctx->meta->seq_num, true);
        struct scan_record r = { .id = ident.id, .root = root_index };
        struct cgroup_subsys_state *css = NULL;
        if (want & SCAN_HAS_CPU)
                css = cgrp->subsys[bpf_core_enum_value(enum cgroup_subsys_id, cpuacct_cgrp_id)];
        if (css) {
                struct cpuacct *ca = bpf_rdonly_cast(css, bpf_core_type_id_kernel(struct cpuacct));
                __u64 percpu = (__u64)ca->cpuusage;
                /* CPU c's u64 counter, loaded directly (load_u64). */
                for (__u32 c = 0; c < SCAN_CPUS_MAX && c < nr_cpus; c++)
                        r.cpu_ns += load_u64(percpu + cpu_offset[c]);
                r.flags |= SCAN_HAS_CPU;
                ident.cpuacct = (__u64)css;
                ident.percpu = percpu;
        }
        read_memory(cgrp, &r, &ident);
        emit(&r, &ident);
        return 0;
}

SEC("iter.s/cgroup")
int scan_v2(struct bpf_iter__cgroup *ctx)
{
        struct cgroup *cgrp = ctx->cgroup;
        if (!cgrp)
                return 0;
        if (ctx->meta->seq_num == 0) { /* the root: bring the whole subtree's base stats up to date */
                if (css_rstat_flush)
                        css_rstat_flush(&cgrp->self);
                else if (cgroup_rstat_flush)
                        cgroup_rstat_flush(cgrp);
                else
                        return 1;
        }
        struct scan_ident ident = { .serial = cgrp->self.serial_nr, .id = cgroup_id_of(cgrp), .cgroup = (__u64)cgrp };
        look_ahead(ctx->meta->seq_num, false);
        struct scan_record r = { .id = ident.id, .root = root_index };
        if (want & SCAN_HAS_CPU) {
                r.cpu_ns = cgrp->bstat.cputime.sum_exec_runtime;
                r.flags = SCAN_HAS_CPU;
        }
        read_memory(cgrp, &r, &ident);
        emit(&r, &ident);
        return 0;
}
