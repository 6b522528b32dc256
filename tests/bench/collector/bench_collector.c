/* bench-collector — the cost of one sandbox-sample, tally's way and the
 * common way, on the same real cgroups in the same run.
 *
 * Creates N v1 cgroups (cpuacct + memory) under a parent unique to this
 * process, then samples all of them for a number of ticks with
 *   scan:      collector/cgroup_scan.c — one BPF walk of each hierarchy per
 *              tick, then each sandbox's reading looked up (the collector's
 *              reader where the walk loads)
 *   pread:     collector/cgroup.c — each counter file opened once, pread at 0
 *              (the collector's reader where it does not)
 *   openclose: open, read, close of each file on every tick (how common
 *              collectors read cgroups)
 * all reading the same counters on the collector's schedule (CPU counter and
 * memory every tick, memory peak every 10th tick: staggered for files, all at
 * once for the walk). Prints CPU time (user + system, of this process) per
 * sandbox-sample for each, and removes the cgroups.
 *
 *   bench-collector N [ROUNDS] [TICKS]     measure all, print "N scan_ns pread_ns openclose_ns transient"
 *   bench-collector --only MODE N TICKS    sample only (for strace), MODE scan|pread|openclose|none
 *   bench-collector --registry DIR N       create N cgroups with registry records in DIR (as the vmm
 *                                          would), print "ready", and remove them when stdin closes */
#include "cgroup.h"
#include "cgroup_counter.h"
#include "cgroup_scan.h"
#include "registry.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define V1_CPU "/sys/fs/cgroup/cpuacct"
#define V1_MEM "/sys/fs/cgroup/memory"

static int n;
static char parent_cpu[256], parent_mem[256];
static volatile uint64_t sink;

static void fail(const char *what, const char *path, const char *why);

static int64_t cpu_now(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void dir_of(char *buf, size_t size, const char *parent, int i)
{
        snprintf(buf, size, "%s/sb%d", parent, i);
}

static void create_all(void)
{
        snprintf(parent_cpu, sizeof(parent_cpu), V1_CPU "/tally-bench-collector-%d", (int)getpid());
        snprintf(parent_mem, sizeof(parent_mem), V1_MEM "/tally-bench-collector-%d", (int)getpid());
        if (mkdir(parent_cpu, 0755) < 0 || mkdir(parent_mem, 0755) < 0) {
                fprintf(stderr, "bench-collector: could not create %s: %s (needs root and cgroup v1)\n", parent_cpu,
                        strerror(errno));
                exit(1);
        }
        for (int i = 0; i < n; i++) {
                char d[PATH_MAX];
                dir_of(d, sizeof(d), parent_cpu, i);
                if (mkdir(d, 0755) < 0)
                        fail("could not create", d, strerror(errno));
                dir_of(d, sizeof(d), parent_mem, i);
                if (mkdir(d, 0755) < 0)
                        fail("could not create", d, strerror(errno));
        }
}

static void remove_all(void);

/* Gives up, removing the cgroups made so far. */
static void fail(const char *what, const char *path, const char *why)
{
        fprintf(stderr, "bench-collector: %s %s: %s\n", what, path, why);
        remove_all();
        exit(1);
}

static void remove_all(void)
{
        for (int i = 0; i < n; i++) {
                char d[PATH_MAX];
                dir_of(d, sizeof(d), parent_cpu, i);
                rmdir(d);
                dir_of(d, sizeof(d), parent_mem, i);
                rmdir(d);
        }
        rmdir(parent_cpu);
        rmdir(parent_mem);
}

static struct cgroup_files *files;
static int transient; /* sandboxes read without kept descriptors (the process ran out) */
static struct cgroup_scan *scan;
static struct cgroup_scan_ref *cpu_refs, *mem_refs;

/* Descriptors open_all leaves free: each walk creates one (bpf_iter_create), and
 * stdio, strace and the loader hold a few. */
#define FD_SPARE 64

static void open_all(void)
{
        struct rlimit rl = { 0, 0 };
        getrlimit(RLIMIT_NOFILE, &rl);
        files = calloc((size_t)n, sizeof(*files));
        for (int i = 0; i < n; i++) {
                char c[PATH_MAX], m[PATH_MAX];
                dir_of(c, sizeof(c), parent_cpu, i);
                dir_of(m, sizeof(m), parent_mem, i);
                /* Two kept a sandbox while the limit leaves FD_SPARE; beyond, read as the collector
                 * does when its budget is spent (open on every read). */
                bool keep = (rlim_t)(2 * (i + 1) + FD_SPARE) <= rl.rlim_cur;
                int r = cgroup_files_open(1, c, m, true, keep, &files[i]);
                if (r < 0 || !files[i].peak_path)
                        fail("could not open the counters of", c, r < 0 ? strerror(-r) : "no peak file");
                transient += files[i].transient;
        }
}

static void open_scan(void)
{
        char err[256];
        int r = cgroup_scan_new(&scan, err, sizeof(err));
        if (r < 0)
                fail("could not load", "the cgroup walk", err);
        cpu_refs = calloc((size_t)n, sizeof(*cpu_refs));
        mem_refs = calloc((size_t)n, sizeof(*mem_refs));
        for (int i = 0; i < n; i++) {
                char c[PATH_MAX], m[PATH_MAX];
                dir_of(c, sizeof(c), parent_cpu, i);
                dir_of(m, sizeof(m), parent_mem, i);
                if ((r = cgroup_scan_watch(scan, 1, c, CGROUP_SCAN_CPU, &cpu_refs[i])) < 0 ||
                    (r = cgroup_scan_watch(scan, 1, m, CGROUP_SCAN_MEM, &mem_refs[i])) < 0)
                        fail("could not watch", c, strerror(-r));
        }
}

/* Both readers follow the collector's schedule: CPU counter and memory every
 * tick, the peak (a high watermark) every PEAK_EVERY ticks, staggered. */
#define PEAK_EVERY 10
static unsigned tick_no;

static void tick_scan(void)
{
        if (cgroup_scan_run(scan, tick_no % PEAK_EVERY == 0) < 0)
                fail("could not run", "the cgroup walk", "walk failed");
        for (int i = 0; i < n; i++) {
                struct cgroup_scan_reading rd;
                if (!cgroup_scan_get(scan, &cpu_refs[i], &mem_refs[i], &rd))
                        fail("the walk missed", "a sandbox", "not seen");
                sink += rd.cpu_ns + rd.mem_bytes + rd.mem_peak_bytes;
        }
        tick_no++;
}

static void tick_pread(void)
{
        for (int i = 0; i < n; i++) {
                struct cgroup_reading rd;
                if (cgroup_files_read(&files[i], &rd) < 0)
                        fail("could not read", "a counter", "read failed");
                sink += rd.cpu_ns + rd.mem_bytes;
                if ((tick_no + (unsigned)i) % PEAK_EVERY == 0) {
                        uint64_t peak;
                        if (cgroup_files_read_peak(&files[i], &peak) < 0)
                                fail("could not read", "a peak", "read failed");
                        sink += peak;
                }
        }
        tick_no++;
}

static uint64_t read_openclose(const char *dir, const char *name)
{
        char path[PATH_MAX], buf[256];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                fail("could not open", path, strerror(errno));
        ssize_t len = read(fd, buf, sizeof(buf));
        close(fd);
        uint64_t v = 0;
        if (len <= 0 || cgroup_counter_parse_u64(buf, (size_t)len, &v) < 0)
                fail("could not parse", path, "bad content");
        return v;
}

static void tick_openclose(void)
{
        for (int i = 0; i < n; i++) {
                char c[PATH_MAX], m[PATH_MAX];
                dir_of(c, sizeof(c), parent_cpu, i);
                dir_of(m, sizeof(m), parent_mem, i);
                sink += read_openclose(c, "cpuacct.usage") + read_openclose(m, "memory.usage_in_bytes");
                if ((tick_no + (unsigned)i) % PEAK_EVERY == 0)
                        sink += read_openclose(m, "memory.max_usage_in_bytes");
        }
        tick_no++;
}

/* CPU ns per sandbox-sample over ticks ticks. */
static int64_t measure(void (*tick)(void), int ticks)
{
        tick(); /* warm */
        int64_t t0 = cpu_now();
        for (int t = 0; t < ticks; t++)
                tick();
        return (cpu_now() - t0) / ((int64_t)ticks * n);
}

static int cmp64(const void *a, const void *b)
{
        int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
        return x < y ? -1 : x > y;
}

static void raise_nofile(void)
{
        struct rlimit rl = { 1 << 20, 1 << 20 };
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
                getrlimit(RLIMIT_NOFILE, &rl);
                rl.rlim_cur = rl.rlim_max;
                setrlimit(RLIMIT_NOFILE, &rl);
        }
}

int main(int argc, char **argv)
{
        raise_nofile();
        if (argc == 5 && strcmp(argv[1], "--only") == 0) {
                n = atoi(argv[3]);
                int ticks = atoi(argv[4]);
                create_all();
                void (*tick)(void) = NULL;
                if (strcmp(argv[2], "scan") == 0)
                        open_scan(), tick = tick_scan;
                else if (strcmp(argv[2], "pread") == 0)
                        open_all(), tick = tick_pread;
                else if (strcmp(argv[2], "openclose") == 0)
                        tick = tick_openclose;
                /* A marker the script finds in strace's output: sampling starts after it. */
                getppid();
                for (int t = 0; tick && t < ticks; t++)
                        tick();
                getppid();
                for (int i = 0; files && i < n; i++)
                        cgroup_files_close(&files[i]);
                cgroup_scan_free(scan);
                remove_all();
                return 0;
        }
        if (argc == 4 && strcmp(argv[1], "--registry") == 0) {
                n = atoi(argv[3]);
                create_all();
                for (int i = 0; i < n; i++) {
                        struct sandbox_record r = { .state = STATE_RUNNING, .vcpus = 2, .epoch = 1,
                                                    .mem_size_bytes = UINT64_C(4) << 30, .cgroup_version = 1 };
                        snprintf(r.id, sizeof(r.id), "bench_%d", i);
                        snprintf(r.account, sizeof(r.account), "acct_%d", i % 100);
                        snprintf(r.key, sizeof(r.key), "key_%d", i % 100);
                        dir_of(r.cgroup_cpu, sizeof(r.cgroup_cpu), parent_cpu, i);
                        dir_of(r.cgroup_memory, sizeof(r.cgroup_memory), parent_mem, i);
                        int e = registry_write(argv[2], &r);
                        if (e < 0)
                                fail("could not write a record in", argv[2], strerror(-e));
                }
                printf("ready\n");
                fflush(stdout);
                char buf[64];
                while (read(0, buf, sizeof(buf)) > 0)
                        ;
                for (int i = 0; i < n; i++) {
                        char id[32];
                        snprintf(id, sizeof(id), "bench_%d", i);
                        registry_remove(argv[2], id);
                }
                remove_all();
                return 0;
        }
        if (argc < 2) {
                fprintf(stderr, "usage: bench-collector N [ROUNDS] [TICKS] | --only scan|pread|openclose|none N TICKS\n");
                return 2;
        }
        n = atoi(argv[1]);
        int rounds = argc > 2 ? atoi(argv[2]) : 5;
        /* About 50,000 samples per measurement, at least 10 ticks (a whole peak cycle). */
        int ticks = argc > 3 ? atoi(argv[3]) : (50000 / n > 10 ? 50000 / n : 10);
        create_all();
        open_scan(); /* first: the walk needs descriptors, and the kept files take what is left */
        open_all();
        int64_t a[32], b[32], o[32];
        if (rounds > 32)
                rounds = 32;
        for (int r = 0; r < rounds; r++) { /* interleaved, so all see the same machine */
                a[r] = measure(tick_scan, ticks);
                b[r] = measure(tick_pread, ticks);
                o[r] = measure(tick_openclose, ticks);
        }
        qsort(a, (size_t)rounds, sizeof(a[0]), cmp64);
        qsort(b, (size_t)rounds, sizeof(b[0]), cmp64);
        qsort(o, (size_t)rounds, sizeof(o[0]), cmp64);
        printf("%d %lld %lld %lld %d\n", n, (long long)a[rounds / 2], (long long)b[rounds / 2],
               (long long)o[rounds / 2], transient);
        cgroup_scan_free(scan);
        for (int i = 0; i < n; i++)
                cgroup_files_close(&files[i]);
        free(files);
        remove_all();
        return 0;
}
