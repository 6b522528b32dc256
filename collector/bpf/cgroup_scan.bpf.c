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
 * walk did not list: see cgroup_id_of.
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

/* Each cgroup's (serial, id), by record index, for the next scan's walks:
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

/* The cgroup's id: its kernfs node's (the inode number user space stats).
 * Reading it costs two cache misses (the cgroup's kn pointer, then the node),
 * so the last scan's id is reused when this is the same cgroup: the same
 * serial_nr, which the kernel takes from one 64-bit counter for every cgroup
 * it creates (under cgroup_mutex) and never reuses, so a cgroup removed and
 * made again at the same path has another, and gets its new id read here.
 * serial_nr is on a line the iterator has just read (self.flags: is it dead).
 * Siblings are listed in creation order, so a walk lists serials in the same
 * order as the last one did, with removed cgroups missing and new ones
 * inserted: one cursor over the last walk's list finds each (a merge). A
 * hierarchy's root has serial 0 (never matched). Records the id for the next
 * scan at index i. */
static __always_inline __u64 cgroup_id_of(struct cgroup *cgrp, __u32 i)
{
        const __u64 serial = cgrp->self.serial_nr;
        const __u32 cur = (ident_half & 1) * SCAN_RECORDS_MAX, prev = ((ident_half & 1) ^ 1) * SCAN_RECORDS_MAX;
        __u32 j = prev_at;
        __u64 id = 0;
        for (int k = 0; k < SKIP_MAX && j < prev_end && j < SCAN_RECORDS_MAX; k++) {
                __u32 key = prev + j;
                const struct scan_ident *p = bpf_map_lookup_elem(&idents, &key);
                if (!p)
                        break;
                if (p->serial >= serial) {
                        if (p->serial == serial && serial) {
                                id = p->id;
                                j++;
                        }
                        break;
                }
                j++; /* removed since the last scan */
        }
        prev_at = j;
        if (!id)
                id = cgrp->kn->id;
        __u32 key = cur + i;
        struct scan_ident *at = i < SCAN_RECORDS_MAX ? bpf_map_lookup_elem(&idents, &key) : NULL;
        if (at)
                *at = (struct scan_ident){ .serial = serial, .id = id };
        return id;
}

/* Loading ahead. A cgroup's counters are a chain of dependent loads, each
 * a cache miss at scale (v1 CPU: the cgroup's subsys pointer, cpuacct's
 * per-CPU pointer, the per-CPU counters; memory: the subsys pointer, the
 * page counter), so a walk that only followed them would wait for each miss
 * in turn. Instead each visit also starts one link of the chains of the
 * cgroups the walk visits next — guessed as the siblings that follow (a
 * sandbox folder's cgroups are siblings) — at distances such that every
 * link's address is already in hand: the cgroup three ahead (its list line
 * and subsys pointers), the css two ahead, the per-CPU counters one ahead.
 * Those misses then overlap, and by its own visit a cgroup's chain is in the
 * cache. A wrong guess (the first cgroup, a descent into children, the end of
 * a list) only wastes loads: the guess is checked against the cgroup the
 * iterator gives, and every value recorded is read from that cgroup.
 * Guessed addresses are read with fault-guarded loads (bpf_rdonly_cast),
 * into globals or the sink, never into a record. */
struct look_ahead ahead; /* cgroup_scan_abi.h */

/* The sibling after cgroup cg (an address), as a guess; 0 for 0. */
static __always_inline __u64 sibling_after(__u64 cg)
{
        struct cgroup *c = bpf_rdonly_cast((void *)cg, bpf_core_type_id_kernel(struct cgroup));
        __u64 next = (__u64)c->self.sibling.next;
        return next ? next - bpf_core_field_offset(struct cgroup_subsys_state, sibling) : 0;
}

static __always_inline void look_ahead(struct cgroup *cgrp, bool v1)
{
        struct look_ahead a = ahead;
        const __u64 me = (__u64)cgrp;
        if (a.at[0] != me) { /* not the guess: start again from here */
                a.at[0] = me;
                a.at[1] = sibling_after(me);
                a.at[2] = sibling_after(a.at[1]);
                a.at[3] = sibling_after(a.at[2]);
                a.cpu_css = a.mem_css = a.percpu = 0;
        }
        /* The cgroup three ahead: the one after it, and its subsys pointers. */
        __u64 after = sibling_after(a.at[3]), cpu_css = 0, mem_css = 0, sink = 0;
        struct cgroup *far = bpf_rdonly_cast((void *)a.at[3], bpf_core_type_id_kernel(struct cgroup));
        if (want & SCAN_HAS_CPU) {
                if (v1)
                        cpu_css = (__u64)far->subsys[bpf_core_enum_value(enum cgroup_subsys_id, cpuacct_cgrp_id)];
                else
                        sink += far->bstat.cputime.sum_exec_runtime;
        }
        if (want & SCAN_HAS_MEM)
                mem_css = (__u64)far->subsys[bpf_core_enum_value(enum cgroup_subsys_id, memory_cgrp_id)];
        /* Two ahead: its css's line. */
        __u64 percpu = 0;
        if (a.cpu_css) {
                struct cpuacct *ca = bpf_rdonly_cast((void *)a.cpu_css, bpf_core_type_id_kernel(struct cpuacct));
                percpu = (__u64)ca->cpuusage;
        }
        if (a.mem_css) {
                struct mem_cgroup *memcg = bpf_rdonly_cast((void *)a.mem_css, bpf_core_type_id_kernel(struct mem_cgroup));
                sink += memcg->memory.usage.counter;
                if (want_peak)
                        sink += memcg->memory.watermark;
        }
        /* One ahead: its per-CPU counters. */
        if (a.percpu)
                for (__u32 c = 0; c < SCAN_CPUS_MAX && c < nr_cpus; c++) {
                        struct kernel_cpustat *v = bpf_rdonly_cast((void *)(a.percpu + cpu_offset[c]),
                                                                   bpf_core_type_id_kernel(struct kernel_cpustat));
                        sink += v->cpustat[0];
                }
        ahead = (struct look_ahead){ .at = { a.at[1], a.at[2], a.at[3], after }, .cpu_css = cpu_css,
                                     .mem_css = mem_css, .percpu = percpu, .sink = a.sink + sink };
}

static __always_inline void read_memory(struct cgroup *cgrp, struct scan_record *r)
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
}

static __always_inline void emit(const struct scan_record *r)
{
        __u32 i = count;
        if (i < SCAN_RECORDS_MAX) {
                records[i] = *r;
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
        look_ahead(cgrp, true);
        struct scan_record r = { .id = cgroup_id_of(cgrp, count), .root = root_index };
        struct cgroup_subsys_state *css = NULL;
        if (want & SCAN_HAS_CPU)
                css = cgrp->subsys[bpf_core_enum_value(enum cgroup_subsys_id, cpuacct_cgrp_id)];
        if (css) {
                struct cpuacct *ca = bpf_rdonly_cast(css, bpf_core_type_id_kernel(struct cpuacct));
                __u64 percpu = (__u64)ca->cpuusage;
                /* CPU c's u64 counter, loaded directly. bpf_rdonly_cast needs a struct type, so the
                 * address is typed as struct kernel_cpustat, whose first member is a u64 (it is the
                 * type of cpuacct's other per-CPU field); only that first u64 is read. */
                for (__u32 c = 0; c < SCAN_CPUS_MAX && c < nr_cpus; c++) {
                        struct kernel_cpustat *v = bpf_rdonly_cast((void *)(percpu + cpu_offset[c]),
                                                                   bpf_core_type_id_kernel(struct kernel_cpustat));
                        r.cpu_ns += v->cpustat[0];
                }
                r.flags |= SCAN_HAS_CPU;
        }
        read_memory(cgrp, &r);
        emit(&r);
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
        look_ahead(cgrp, false);
        struct scan_record r = { .id = cgroup_id_of(cgrp, count), .root = root_index };
        if (want & SCAN_HAS_CPU) {
                r.cpu_ns = cgrp->bstat.cputime.sum_exec_runtime;
                r.flags = SCAN_HAS_CPU;
        }
        read_memory(cgrp, &r);
        emit(&r);
        return 0;
}
