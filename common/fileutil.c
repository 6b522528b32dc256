/* fileutil.c — see fileutil.h. */
#include "fileutil.h"

#include <errno.h>
#include <fcntl.h>
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
