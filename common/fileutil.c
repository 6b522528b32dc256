/* fileutil.c — see fileutil.h. */
#include "fileutil.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

int file_read_small(const char *path, char *buf, size_t size)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        ssize_t n = read(fd, buf, size - 1);
        int r = n < 0 ? -errno : 0;
        close(fd);
        if (r == 0)
                buf[n] = '\0';
        return r;
}

int file_write_atomic(const char *path, const void *text, size_t len, mode_t mode)
{
        char tmp[PATH_MAX + 8];
        int n = snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        if (n < 0 || (size_t)n >= sizeof(tmp))
                return -ENAMETOOLONG;
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
        if (fd < 0)
                return -errno;
        int r = 0;
        if (fchmod(fd, mode) < 0)
                r = -errno;
        else if (write(fd, text, len) != (ssize_t)len || fsync(fd) < 0)
                r = errno ? -errno : -EIO;
        if (close(fd) < 0 && r == 0)
                r = -errno;
        if (r == 0 && rename(tmp, path) < 0)
                r = -errno;
        if (r < 0)
                unlink(tmp);
        return r;
}
