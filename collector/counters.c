/* counters.c — see counters.h. */
#include "counters.h"
#include "log.h"
#include "metrics.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

/* Descriptors the daemon keeps for itself: Kafka sockets, /metrics connections, inotify, files. */
#define FD_RESERVE 512

/* Room for two descriptors a sandbox at 10,000s of sandboxes: raises the limit
 * as far as allowed and returns how many counter descriptors may stay open. */
static size_t raise_nofile(void)
{
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return 0;
        struct rlimit want = { 1 << 20, 1 << 20 };
        if (rl.rlim_max < want.rlim_max && setrlimit(RLIMIT_NOFILE, &want) == 0) {
                rl = want;
        } else {
                rl.rlim_cur = rl.rlim_max;
                setrlimit(RLIMIT_NOFILE, &rl);
                getrlimit(RLIMIT_NOFILE, &rl);
        }
        return rl.rlim_cur > FD_RESERVE ? (size_t)(rl.rlim_cur - FD_RESERVE) : 0;
}

int counters_init(struct counters *cn, const char *reader, bool read_peak, struct collector_metrics *m, char *err,
                  size_t errlen)
{
        cn->m = m;
        cn->read_peak = read_peak;
        cn->fd_budget = raise_nofile();
        if (strcmp(reader, "files") != 0) {
                char serr[256];
                int r = cgroup_scan_new(&cn->scan, serr, sizeof(serr));
                if (r < 0 && strcmp(reader, "scan") == 0) {
                        snprintf(err, errlen, "cgroup_reader is scan, but %s", serr);
                        return r;
                }
                if (r < 0)
                        log_info("reading cgroup files: the cgroup walk is not available", "reason=\"%s\"", serr);
        }
        M_SET(m, scan_active, cn->scan != NULL);
        return 0;
}

void counters_free(struct counters *cn)
{
        cgroup_scan_free(cn->scan);
        cn->scan = NULL;
}

/* Closes a sandbox's counter files and gives their descriptors back to the budget. */
void counters_close(struct counters *cn, struct sandbox *s)
{
        if (s->files.version == 0)
                return;
        cn->kept_fds -= (size_t)cgroup_files_kept(&s->files);
        if (s->files.transient)
                M_SET(cn->m, sandboxes_transient, M_GET(cn->m, sandboxes_transient) - 1);
        cgroup_files_close(&s->files);
}

/* Has the walk watch this sandbox's cgroups: the memory one only if it has a
 * memory counter file. Any failure leaves the sandbox to its files. */
static void watch_cgroups(struct counters *cn, struct sandbox *s)
{
        struct cgroup_scan_ref cpu, mem = CGROUP_SCAN_REF_NONE;
        s->scan_cpu = s->scan_mem = CGROUP_SCAN_REF_NONE;
        if (!cn->scan || cgroup_scan_watch(cn->scan, s->cgroup_version, s->cpu_dir, CGROUP_SCAN_CPU, &cpu) < 0 ||
            (s->files.mem_path &&
             cgroup_scan_watch(cn->scan, s->cgroup_version, s->mem_dir, CGROUP_SCAN_MEM, &mem) < 0))
                return;
        s->scan_cpu = cpu;
        s->scan_mem = mem;
}

void counters_prefetch(const struct counters *cn, const struct sandbox *s)
{
        if (!cn->scanned)
                return;
        cgroup_scan_prefetch(cn->scan, &s->scan_cpu);
        cgroup_scan_prefetch(cn->scan, &s->scan_mem);
}

/* This tick's reading of a sandbox from the scan, if it saw the sandbox's
 * cgroups; peak read too when the walk read watermarks. */
bool counters_read_scanned(struct counters *cn, struct sandbox *s, struct cgroup_reading *rd)
{
        struct cgroup_scan_reading sr;
        if (!cn->scanned || s->scan_cpu.root < 0 ||
            !cgroup_scan_get(cn->scan, &s->scan_cpu, s->scan_mem.root >= 0 ? &s->scan_mem : NULL, &sr))
                return false;
        *rd = (struct cgroup_reading){ .cpu_ns = sr.cpu_ns, .mem_bytes = sr.mem_bytes };
        if (sr.has_peak && s->files.peak_path) {
                s->peak_bytes = sr.mem_peak_bytes;
                s->peak_read = true;
        }
        return true;
}

/* Walks every root once for this tick; on failure this tick reads files. */
void counters_scan_tick(struct counters *cn, bool peaks)
{
        cn->scanned = false;
        if (!cn->scan)
                return;
        int r = cgroup_scan_run(cn->scan, peaks);
        if (r < 0) {
                M_ADD(cn->m, scan_errors_total, 1);
                if (!cn->scan_error_logged)
                        log_warn("the cgroup walk failed: reading files this tick", "error=\"%s\"", strerror(-r));
                cn->scan_error_logged = true;
                return;
        }
        cn->scanned = true;
        M_SET(cn->m, scan_cgroups, cgroup_scan_seen(cn->scan));
}

/* Opens a sandbox's counter files, outside the hot path. */
int counters_open(struct counters *cn, struct sandbox *s)
{
        /* Two descriptors a sandbox while the budget lasts; the daemon keeps the rest for itself. */
        bool keep = cn->kept_fds + 2 <= cn->fd_budget;
        int r = cgroup_files_open(s->cgroup_version, s->cpu_dir, s->mem_dir, cn->read_peak, keep, &s->files);
        if (r < 0) {
                if (!s->gone_logged)
                        log_warn("could not open a sandbox's cgroup", "sandbox=%s path=%s error=\"%s\"", s->id,
                                 s->cpu_dir, strerror(-r));
                s->gone_logged = true;
                return r;
        }
        cn->kept_fds += cgroup_files_kept(&s->files);
        s->reopened = s->opened_before; /* a counter restart after this is a recreated cgroup, not tampering */
        s->opened_before = true;
        watch_cgroups(cn, s);
        if (s->files.transient) {
                M_ADD(cn->m, sandboxes_transient, 1);
                if (!cn->transient_logged)
                        log_warn("out of file descriptors: counters of further sandboxes are opened on every read",
                                 "sandbox=%s kept=%zu budget=%zu", s->id, cn->kept_fds, cn->fd_budget);
                cn->transient_logged = true;
        }
        return 0;
}
