/* cgroup.c — see cgroup.h. Nothing here allocates or opens on the read path. */
#include "cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int cgroup_parse_u64(const char *buf, size_t len, uint64_t *ret)
{
        uint64_t v = 0;
        size_t i = 0;
        if (len == 0 || buf[0] < '0' || buf[0] > '9')
                return -EINVAL;
        for (; i < len && buf[i] >= '0' && buf[i] <= '9'; i++) {
                uint64_t d = (uint64_t)(buf[i] - '0');
                if (v > (UINT64_MAX - d) / 10)
                        return -EINVAL;
                v = v * 10 + d;
        }
        if (i < len && buf[i] != '\n')
                return -EINVAL;
        *ret = v;
        return 0;
}

int cgroup_parse_cpu_stat(const char *buf, size_t len, uint64_t *ret_ns)
{
        static const char name[] = "usage_usec ";
        const size_t nlen = sizeof(name) - 1;
        size_t pos = 0;
        while (pos < len) {
                const char *nl = memchr(buf + pos, '\n', len - pos);
                size_t end = nl ? (size_t)(nl - buf) : len;
                if (end - pos > nlen && memcmp(buf + pos, name, nlen) == 0) {
                        uint64_t us;
                        int r = cgroup_parse_u64(buf + pos + nlen, end - pos - nlen, &us);
                        if (r < 0)
                                return r;
                        if (us > UINT64_MAX / 1000)
                                return -EINVAL;
                        *ret_ns = us * 1000;
                        return 0;
                }
                pos = end + 1;
        }
        return -EINVAL;
}

static int open_counter(const char *dir, const char *name)
{
        char path[PATH_MAX];
        int n = snprintf(path, sizeof(path), "%s/%s", dir, name);
        if (n < 0 || (size_t)n >= sizeof(path))
                return -ENAMETOOLONG;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        return fd < 0 ? -errno : fd;
}

void cgroup_files_close(struct cgroup_files *f)
{
        if (!f)
                return;
        if (f->cpu_fd >= 0)
                close(f->cpu_fd);
        if (f->mem_fd >= 0)
                close(f->mem_fd);
        if (f->peak_fd >= 0)
                close(f->peak_fd);
        *f = CGROUP_FILES_NONE;
}

int cgroup_files_open(int version, const char *cpu_dir, const char *mem_dir, int want_peak,
                      struct cgroup_files *ret)
{
        if (version != 1 && version != 2)
                return -EINVAL;
        struct cgroup_files f = CGROUP_FILES_NONE;
        f.version = version;
        f.cpu_fd = open_counter(cpu_dir, version == 2 ? "cpu.stat" : "cpuacct.usage");
        if (f.cpu_fd < 0) {
                int r = f.cpu_fd;
                f.cpu_fd = -1;
                return r;
        }
        /* Memory files are optional: a v2 tree without the memory controller lacks them. */
        int fd = open_counter(mem_dir, version == 2 ? "memory.current" : "memory.usage_in_bytes");
        f.mem_fd = fd >= 0 ? fd : -1;
        if (want_peak) {
                fd = open_counter(mem_dir, version == 2 ? "memory.peak" : "memory.max_usage_in_bytes");
                f.peak_fd = fd >= 0 ? fd : -1;
        }
        *ret = f;
        return 0;
}

int cgroup_files_reads(const struct cgroup_files *f)
{
        return (f->cpu_fd >= 0) + (f->mem_fd >= 0) + (f->peak_fd >= 0);
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

int cgroup_files_read(const struct cgroup_files *f, struct cgroup_reading *ret)
{
        char buf[1024];
        size_t len = 0;
        struct cgroup_reading rd = { 0 };
        int r = read_at0(f->cpu_fd, buf, sizeof(buf), &len);
        if (r < 0)
                return r;
        r = f->version == 2 ? cgroup_parse_cpu_stat(buf, len, &rd.cpu_ns) : cgroup_parse_u64(buf, len, &rd.cpu_ns);
        if (r < 0)
                return r;
        if (f->mem_fd >= 0) {
                if ((r = read_at0(f->mem_fd, buf, sizeof(buf), &len)) < 0 ||
                    (r = cgroup_parse_u64(buf, len, &rd.mem_bytes)) < 0)
                        return r;
        }
        if (f->peak_fd >= 0) {
                if ((r = read_at0(f->peak_fd, buf, sizeof(buf), &len)) < 0 ||
                    (r = cgroup_parse_u64(buf, len, &rd.mem_peak_bytes)) < 0)
                        return r;
        }
        *ret = rd;
        return 0;
}
