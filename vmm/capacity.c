/* capacity.c — see capacity.h. */
#include "capacity.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define MiB (UINT64_C(1) << 20)

static uint64_t host_memory_bytes(void)
{
        FILE *f = fopen("/proc/meminfo", "re");
        char line[256];
        uint64_t kib = 0;
        while (f && fgets(line, sizeof(line), f))
                if (sscanf(line, "MemTotal: %" SCNu64 " kB", &kib) == 1)
                        break;
        if (f)
                fclose(f);
        return kib * 1024;
}

static uint64_t scaled(uint64_t v, int64_t pct)
{
        /* no overflow for any real host: v < 2^50 bytes, pct <= 10000 */
        return v / 100 * (uint64_t)pct + v % 100 * (uint64_t)pct / 100;
}

int capacity_init(struct capacity *c, const struct capacity_settings *s, const char *state_dir, char *err,
                  size_t errlen)
{
        memset(c, 0, sizeof(*c));
        c->host.mem_bytes = s->memory_mib > 0 ? (uint64_t)s->memory_mib * MiB : host_memory_bytes();
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        c->host.vcpus = s->vcpus > 0 ? (uint64_t)s->vcpus : cpus > 0 ? (uint64_t)cpus : 1;
        if (s->disk_mib > 0) {
                c->host.disk_bytes = (uint64_t)s->disk_mib * MiB;
        } else {
                struct statvfs fs;
                if (statvfs(state_dir, &fs) < 0) {
                        int r = -errno;
                        snprintf(err, errlen, "could not read the free space under %s: %s", state_dir, strerror(-r));
                        return r;
                }
                c->host.disk_bytes = (uint64_t)fs.f_bavail * fs.f_frsize;
        }
        if (c->host.mem_bytes == 0) {
                snprintf(err, errlen, "could not read the host's memory (/proc/meminfo); set capacity_memory_mib");
                return -EINVAL;
        }
        c->memory_pct = s->memory_overcommit_pct;
        c->vcpu_pct = s->vcpu_overcommit_pct;
        c->disk_pct = s->disk_overcommit_pct;
        c->limit.mem_bytes = scaled(c->host.mem_bytes, c->memory_pct);
        c->limit.vcpus = scaled(c->host.vcpus, c->vcpu_pct);
        c->limit.disk_bytes = scaled(c->host.disk_bytes, c->disk_pct);
        return 0;
}

static uint64_t left_of(uint64_t limit, uint64_t used)
{
        return used < limit ? limit - used : 0;
}

int capacity_check(const struct capacity *c, const struct capacity_use *promised, const struct capacity_use *want,
                   char *why, size_t whylen)
{
        if (promised->mem_bytes + want->mem_bytes > c->limit.mem_bytes) {
                snprintf(why, whylen,
                         "this host cannot take the sandbox: not enough memory (%" PRIu64 " MiB asked, %" PRIu64
                         " MiB left of the %" PRIu64 " MiB it may promise: %" PRId64 " %% of %" PRIu64 " MiB)",
                         want->mem_bytes / MiB, left_of(c->limit.mem_bytes, promised->mem_bytes) / MiB,
                         c->limit.mem_bytes / MiB, c->memory_pct, c->host.mem_bytes / MiB);
                return -ENOSPC;
        }
        if (promised->vcpus + want->vcpus > c->limit.vcpus) {
                snprintf(why, whylen,
                         "this host cannot take the sandbox: not enough vCPUs (%" PRIu64 " asked, %" PRIu64
                         " left of the %" PRIu64 " it may promise: %" PRId64 " %% of %" PRIu64 ")",
                         want->vcpus, left_of(c->limit.vcpus, promised->vcpus), c->limit.vcpus, c->vcpu_pct,
                         c->host.vcpus);
                return -ENOSPC;
        }
        if (promised->disk_bytes + want->disk_bytes > c->limit.disk_bytes) {
                snprintf(why, whylen,
                         "this host cannot take the sandbox: not enough disk (%" PRIu64 " MiB asked, %" PRIu64
                         " MiB left of the %" PRIu64 " MiB it may promise: %" PRId64 " %% of %" PRIu64 " MiB)",
                         want->disk_bytes / MiB, left_of(c->limit.disk_bytes, promised->disk_bytes) / MiB,
                         c->limit.disk_bytes / MiB, c->disk_pct, c->host.disk_bytes / MiB);
                return -ENOSPC;
        }
        return 0;
}

int capacity_check_free(const char *state_dir, uint64_t disk_bytes, char *why, size_t whylen)
{
        struct statvfs fs;
        if (statvfs(state_dir, &fs) < 0)
                return -errno;
        uint64_t free_bytes = (uint64_t)fs.f_bavail * fs.f_frsize;
        if (disk_bytes > free_bytes) {
                snprintf(why, whylen,
                         "this host cannot take the sandbox: a %" PRIu64 " MiB disk is more than the %" PRIu64
                         " MiB free on the host's disk for sandboxes",
                         disk_bytes / MiB, free_bytes / MiB);
                return -ENOSPC;
        }
        return 0;
}
