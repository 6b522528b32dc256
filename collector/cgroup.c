/* cgroup.c — see cgroup.h. Nothing here allocates or opens on the read path. */
#include "cgroup.h"
#include "cgroup_counter.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *path_of(const char *dir, const char *name)
{
        char *p;
        return asprintf(&p, "%s/%s", dir, name) < 0 ? NULL : p;
}

void cgroup_files_close(struct cgroup_files *f)
{
        if (!f)
                return;
        if (f->cpu_fd >= 0)
                close(f->cpu_fd);
        if (f->mem_fd >= 0)
                close(f->mem_fd);
        free(f->cpu_path);
        free(f->mem_path);
        free(f->peak_path);
        *f = CGROUP_FILES_NONE;
}

int cgroup_files_open(int version, const char *cpu_dir, const char *mem_dir, bool want_peak, bool keep,
                      struct cgroup_files *ret)
{
        if (version != 1 && version != 2)
                return -EINVAL;
        struct cgroup_files f = CGROUP_FILES_NONE;
        int r = 0;
        f.version = version;
        f.cpu_path = path_of(cpu_dir, version == 2 ? "cpu.stat" : "cpuacct.usage");
        f.mem_path = path_of(mem_dir, version == 2 ? "memory.current" : "memory.usage_in_bytes");
        f.peak_path = want_peak ? path_of(mem_dir, version == 2 ? "memory.peak" : "memory.max_usage_in_bytes") : NULL;
        if (!f.cpu_path || !f.mem_path || (want_peak && !f.peak_path)) {
                r = -ENOMEM;
                goto fail;
        }
        f.cpu_fd = keep ? open(f.cpu_path, O_RDONLY | O_CLOEXEC) : -1;
        if (keep && f.cpu_fd < 0 && errno != EMFILE && errno != ENFILE) {
                r = -errno;
                goto fail;
        }
        if (f.cpu_fd >= 0) {
                f.mem_fd = open(f.mem_path, O_RDONLY | O_CLOEXEC);
                if (f.mem_fd < 0 && (errno == EMFILE || errno == ENFILE)) {
                        close(f.cpu_fd);
                        f.cpu_fd = -1;
                }
        }
        /* Out of descriptors: read this sandbox by opening its files each time. */
        f.transient = f.cpu_fd < 0;
        if (f.transient && access(f.cpu_path, R_OK) < 0) {
                r = -errno;
                goto fail;
        }
        /* Memory files are optional: a v2 tree without the memory controller lacks them. */
        if (f.mem_fd < 0 && access(f.mem_path, R_OK) < 0) {
                free(f.mem_path);
                f.mem_path = NULL;
        }
        if (f.peak_path && access(f.peak_path, R_OK) < 0) {
                free(f.peak_path);
                f.peak_path = NULL;
        }
        *ret = f;
        return 0;
fail:
        cgroup_files_close(&f);
        return r;
}

int cgroup_files_kept(const struct cgroup_files *f)
{
        return (f->cpu_fd >= 0) + (f->mem_fd >= 0);
}

/* One pread at offset 0; a removed cgroup's open file answers ENODEV. */
static int read_at0(int fd, char *buf, size_t size, size_t *ret_len)
{
        ssize_t n = pread(fd, buf, size, 0);
        if (n < 0)
                return -errno;
        if (n == 0 || (size_t)n == size)
                return n == 0 ? -ENODEV : -EINVAL; /* empty: gone; full: not the format we know */
        *ret_len = (size_t)n;
        return 0;
}

/* Reads through the kept descriptor, or opens path for this one read. */
static int read_file(int fd, const char *path, char *buf, size_t size, size_t *ret_len)
{
        if (fd >= 0)
                return read_at0(fd, buf, size, ret_len);
        int tfd = open(path, O_RDONLY | O_CLOEXEC);
        if (tfd < 0)
                return -errno;
        int r = read_at0(tfd, buf, size, ret_len);
        close(tfd);
        return r;
}

int cgroup_files_read(const struct cgroup_files *f, struct cgroup_reading *ret)
{
        char buf[1024];
        size_t len = 0;
        struct cgroup_reading rd = { 0 };
        int r = read_file(f->cpu_fd, f->cpu_path, buf, sizeof(buf), &len);
        if (r < 0)
                return r;
        r = cgroup_counter_parse_cpu(f->version, buf, len, &rd.cpu_ns);
        if (r < 0)
                return r;
        if (f->mem_fd >= 0 || (f->transient && f->mem_path)) {
                if ((r = read_file(f->mem_fd, f->mem_path, buf, sizeof(buf), &len)) < 0 ||
                    (r = cgroup_counter_parse_u64(buf, len, &rd.mem_bytes)) < 0)
                        return r;
        }
        *ret = rd;
        return 0;
}

int cgroup_files_read_peak(const struct cgroup_files *f, uint64_t *ret)
{
        char buf[64];
        size_t len = 0;
        uint64_t v = 0;
        int r;
        if (f->peak_path &&
            ((r = read_file(-1, f->peak_path, buf, sizeof(buf), &len)) < 0 || (r = cgroup_counter_parse_u64(buf, len, &v)) < 0))
                return r;
        *ret = v;
        return 0;
}
