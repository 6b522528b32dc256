/* cgroup_scan.c — see cgroup_scan.h. */
#include "cgroup_scan.h"

#include <errno.h>
#include <stdio.h>

#ifndef HAVE_CGROUP_SCAN

int cgroup_scan_new(struct cgroup_scan **ret, char *err, size_t errlen)
{
        (void)ret;
        snprintf(err, errlen, "built without BPF (clang, bpftool, libbpf or the build host's BTF were missing)");
        return -EOPNOTSUPP;
}

void cgroup_scan_free(struct cgroup_scan *s)
{
        (void)s;
}

int cgroup_scan_watch(struct cgroup_scan *s, int version, const char *cgroup_dir, enum cgroup_scan_counter what,
                      struct cgroup_scan_ref *ret)
{
        (void)s, (void)version, (void)cgroup_dir, (void)what, (void)ret;
        return -EOPNOTSUPP;
}

int cgroup_scan_run(struct cgroup_scan *s, bool peaks)
{
        (void)s, (void)peaks;
        return -EOPNOTSUPP;
}

size_t cgroup_scan_seen(const struct cgroup_scan *s)
{
        (void)s;
        return 0;
}

size_t cgroup_scan_dropped(const struct cgroup_scan *s)
{
        (void)s;
        return 0;
}

void cgroup_scan_prefetch(const struct cgroup_scan *s, const struct cgroup_scan_ref *ref)
{
        (void)s, (void)ref;
}

bool cgroup_scan_get(struct cgroup_scan *s, struct cgroup_scan_ref *cpu, struct cgroup_scan_ref *mem,
                     struct cgroup_scan_reading *ret)
{
        (void)s, (void)cpu, (void)mem, (void)ret;
        return false;
}

#else

#include <linux/types.h>

#include "cgroup_scan_abi.h"
#include "cgroup_scan.skel.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(CGROUP_SCAN_CPU == SCAN_HAS_CPU && CGROUP_SCAN_MEM == SCAN_HAS_MEM, "want bits");

struct scan_root {
        char *dir;
        int version;
        unsigned want;                  /* SCAN_HAS_*: the counters its sandboxes are watched for */
        int dir_fd;
        struct bpf_link *link;
        uint32_t prev_start, prev_end;  /* its records in the last successful scan (their idents: prev_half) */
        uint32_t cur_start, cur_end;    /* ... and in the scan under way */
};

struct cgroup_scan {
        struct cgroup_scan_bpf *skel;
        struct scan_root *roots;
        size_t nroots;
        uint32_t prev_half;             /* the half of idents the last successful scan wrote */
        uint32_t *slots;   /* open addressing: index + 1 into records, 0 empty */
        size_t slot_mask;  /* slots in use this run - 1 (a power of two) */
        size_t seen;
        bool valid;        /* the last run succeeded */
        bool hashed;       /* slots index this run's records (built at the first hint that misses) */
};

static int print_nothing(enum libbpf_print_level level, const char *fmt, va_list ap)
{
        (void)level, (void)fmt, (void)ap;
        return 0;
}

int cgroup_scan_new(struct cgroup_scan **ret, char *err, size_t errlen)
{
        struct cgroup_scan *s = calloc(1, sizeof(*s));
        s->slots = calloc(2 * SCAN_RECORDS_MAX, sizeof(*s->slots));
        if (!s || !s->slots) {
                free(s);
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        libbpf_set_print(print_nothing); /* the verifier's log is long; the error below says what failed */
        int r;
        s->skel = cgroup_scan_bpf__open();
        if (!s->skel) {
                r = -errno;
                snprintf(err, errlen, "could not open the BPF object: %s", strerror(-r));
                goto fail;
        }
        int cpus = libbpf_num_possible_cpus();
        if (cpus <= 0 || cpus > SCAN_CPUS_MAX) {
                r = cpus <= 0 ? cpus : -E2BIG;
                snprintf(err, errlen, "possible CPUs: %d (at most %d)", cpus, SCAN_CPUS_MAX);
                goto fail;
        }
        s->skel->rodata->nr_cpus = (__u32)cpus;
        s->skel->rodata->page_size = (__u64)sysconf(_SC_PAGESIZE);
        if ((r = cgroup_scan_bpf__load(s->skel)) < 0) {
                snprintf(err, errlen, "the kernel refused the cgroup walk: %s", strerror(-r));
                goto fail;
        }
        *ret = s;
        return 0;
fail:
        cgroup_scan_free(s);
        return r;
}

void cgroup_scan_free(struct cgroup_scan *s)
{
        if (!s)
                return;
        for (size_t i = 0; i < s->nroots; i++) {
                bpf_link__destroy(s->roots[i].link);
                close(s->roots[i].dir_fd);
                free(s->roots[i].dir);
        }
        free(s->roots);
        cgroup_scan_bpf__destroy(s->skel);
        free(s->slots);
        free(s);
}

/* The index of the root for dir, added (and attached) the first time; it reads what too. */
static int add_root(struct cgroup_scan *s, int version, const char *dir, unsigned what)
{
        for (size_t i = 0; i < s->nroots; i++)
                if (s->roots[i].version == version && strcmp(s->roots[i].dir, dir) == 0) {
                        s->roots[i].want |= what;
                        return (int)i;
                }
        if (version != 1 && version != 2)
                return -EINVAL;
        struct scan_root *roots = realloc(s->roots, (s->nroots + 1) * sizeof(*roots));
        if (!roots)
                return -ENOMEM;
        s->roots = roots;
        struct scan_root *root = &roots[s->nroots];
        *root = (struct scan_root){ .version = version, .want = what,
                                    .dir_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) };
        if (root->dir_fd < 0)
                return -errno;
        union bpf_iter_link_info info = { .cgroup = { .cgroup_fd = (__u32)root->dir_fd,
                                                      .order = BPF_CGROUP_ITER_DESCENDANTS_PRE } };
        LIBBPF_OPTS(bpf_iter_attach_opts, opts, .link_info = &info, .link_info_len = sizeof(info));
        struct bpf_program *prog = version == 1 ? s->skel->progs.scan_v1 : s->skel->progs.scan_v2;
        root->link = bpf_program__attach_iter(prog, &opts);
        root->dir = strdup(dir);
        if (!root->link || !root->dir) {
                int r = root->link ? -ENOMEM : -errno;
                bpf_link__destroy(root->link);
                free(root->dir);
                close(root->dir_fd);
                return r;
        }
        return (int)s->nroots++;
}

/* A cgroup folder's id: its inode number, which is the kernel's kernfs id on 64-bit hosts. */
static int cgroup_id_of(const char *dir, uint64_t *ret)
{
        struct stat st;
        if (stat(dir, &st) < 0)
                return -errno;
        if (!S_ISDIR(st.st_mode))
                return -ENOTDIR;
        *ret = (uint64_t)st.st_ino;
        return 0;
}

int cgroup_scan_watch(struct cgroup_scan *s, int version, const char *cgroup_dir, enum cgroup_scan_counter what,
                      struct cgroup_scan_ref *ret)
{
        char parent[PATH_MAX];
        uint64_t id = 0;
        if ((size_t)snprintf(parent, sizeof(parent), "%s", cgroup_dir) >= sizeof(parent))
                return -ENAMETOOLONG;
        int r = cgroup_id_of(cgroup_dir, &id);
        if (r < 0)
                return r;
        int root = add_root(s, version, dirname(parent), (unsigned)what);
        if (root < 0)
                return root;
        *ret = (struct cgroup_scan_ref){ .root = root, .id = id };
        return 0;
}

/* One walk: a fresh iterator over the root, read to its end. */
static int walk(struct cgroup_scan *s, size_t i)
{
        struct scan_root *root = &s->roots[i];
        struct cgroup_scan_bpf__bss *bss = s->skel->bss;
        bss->root_index = (__u32)i;
        bss->want = root->want;
        bss->prev_at = root->prev_start; /* where its cgroups' ids are from the last scan */
        bss->prev_end = root->prev_end;
        root->cur_start = bss->count;
        int fd = bpf_iter_create(bpf_link__fd(root->link));
        if (fd < 0)
                return -errno;
        char buf[64];
        ssize_t n;
        while ((n = read(fd, buf, sizeof(buf))) > 0)
                ; /* the walk prints nothing: its records are in the program's global data */
        int r = n < 0 ? -errno : 0;
        close(fd);
        root->cur_end = bss->count;
        return r;
}

static size_t slot_of(const struct cgroup_scan *s, uint64_t id, uint32_t root)
{
        uint64_t h = (id ^ ((uint64_t)root << 56)) * UINT64_C(0x9E3779B97F4A7C15);
        return (size_t)(h >> 32) & s->slot_mask;
}

int cgroup_scan_run(struct cgroup_scan *s, bool peaks)
{
        struct cgroup_scan_bpf__bss *bss = s->skel->bss;
        s->valid = false;
        bss->count = 0;
        bss->dropped = 0;
        bss->want_peak = peaks;
        bss->ident_half = s->prev_half ^ 1; /* a failed scan leaves the last successful one's idents */
        for (size_t i = 0; i < s->nroots; i++) {
                int r = walk(s, i);
                if (r < 0)
                        return r;
        }
        s->prev_half ^= 1;
        for (size_t i = 0; i < s->nroots; i++) {
                s->roots[i].prev_start = s->roots[i].cur_start;
                s->roots[i].prev_end = s->roots[i].cur_end;
        }
        s->seen = bss->count;
        s->hashed = false;
        s->valid = true;
        return 0;
}

size_t cgroup_scan_seen(const struct cgroup_scan *s)
{
        return s->seen;
}

size_t cgroup_scan_dropped(const struct cgroup_scan *s)
{
        return s->skel->bss->dropped;
}

/* Indexes this run's records by (root, id). */
static void build_hash(struct cgroup_scan *s)
{
        const struct scan_record *records = s->skel->bss->records;
        size_t size = 16;
        while (size < 2 * s->seen)
                size *= 2;
        s->slot_mask = size - 1;
        memset(s->slots, 0, size * sizeof(*s->slots));
        for (size_t i = 0; i < s->seen; i++) {
                size_t at = slot_of(s, records[i].id, records[i].root);
                while (s->slots[at])
                        at = (at + 1) & s->slot_mask;
                s->slots[at] = (uint32_t)i + 1;
        }
        s->hashed = true;
}

/* The record of ref in this run: at its hint, else through the hash. */
static const struct scan_record *find(struct cgroup_scan *s, struct cgroup_scan_ref *ref)
{
        if (!s->valid || ref->root < 0)
                return NULL;
        const struct scan_record *records = s->skel->bss->records;
        const uint32_t root = (uint32_t)ref->root;
        if (ref->hint < s->seen && records[ref->hint].id == ref->id && records[ref->hint].root == root)
                return &records[ref->hint];
        if (!s->hashed)
                build_hash(s);
        for (size_t at = slot_of(s, ref->id, root); s->slots[at]; at = (at + 1) & s->slot_mask) {
                const struct scan_record *r = &records[s->slots[at] - 1];
                if (r->id == ref->id && r->root == root) {
                        ref->hint = s->slots[at] - 1;
                        return r;
                }
        }
        return NULL;
}

void cgroup_scan_prefetch(const struct cgroup_scan *s, const struct cgroup_scan_ref *ref)
{
        if (s->valid && ref->root >= 0 && ref->hint < s->seen) {
                const struct scan_record *r = &s->skel->bss->records[ref->hint];
                __builtin_prefetch(r);
                __builtin_prefetch((const char *)(r + 1) - 1); /* a record may span two lines */
        }
}

bool cgroup_scan_get(struct cgroup_scan *s, struct cgroup_scan_ref *cpu, struct cgroup_scan_ref *mem,
                     struct cgroup_scan_reading *ret)
{
        const struct scan_record *c = find(s, cpu);
        if (!c || !(c->flags & SCAN_HAS_CPU))
                return false;
        const struct scan_record *m = NULL;
        if (mem && (!(m = find(s, mem)) || !(m->flags & SCAN_HAS_MEM)))
                return false;
        bool v2 = s->roots[cpu->root].version == 2;
        *ret = (struct cgroup_scan_reading){
                .cpu_ns = v2 ? c->cpu_ns / 1000 * 1000 : c->cpu_ns,
                .mem_bytes = m ? m->mem_bytes : 0,
                .mem_peak_bytes = m ? m->peak_bytes : 0,
                .has_peak = m && s->skel->bss->want_peak,
        };
        return true;
}

#endif
