/* sockio.c — the shared socket I/O of the qemu backend (see sockio.h). */
#include "sockio.h"
#include "timeutil.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int qio_left_ms(int64_t deadline)
{
        if (deadline < 0)
                return -1;
        int64_t l = deadline - time_mono_ms();
        return l < 0 ? 0 : l > 60000 ? 60000 : (int)l;
}

int qio_listen_unix(const char *path)
{
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        if (strlen(path) >= sizeof(a.sun_path))
                return -ENAMETOOLONG;
        strcpy(a.sun_path, path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        unlink(path);
        if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 1) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        return fd;
}

int qio_write_all(int fd, const void *buf, size_t len, int64_t deadline)
{
        const char *p = buf;
        while (len > 0) {
                struct pollfd pf = { fd, POLLOUT, 0 };
                int n = poll(&pf, 1, qio_left_ms(deadline));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        return -ETIMEDOUT;
                ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
                if (w < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                p += w;
                len -= (size_t)w;
        }
        return 0;
}

ssize_t qio_read_some(int fd, void *buf, size_t len, int64_t deadline)
{
        for (;;) {
                struct pollfd pf = { fd, POLLIN, 0 };
                int n = poll(&pf, 1, qio_left_ms(deadline));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0) {
                        if (deadline >= 0 && time_mono_ms() >= deadline)
                                return -ETIMEDOUT;
                        continue;
                }
                ssize_t r = read(fd, buf, len);
                if (r == 0)
                        return -EPIPE;
                if (r < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                return r;
        }
}

int qio_read_all(int fd, void *buf, size_t len, int64_t deadline)
{
        char *p = buf;
        while (len > 0) {
                ssize_t r = qio_read_some(fd, p, len, deadline);
                if (r < 0)
                        return (int)r;
                p += r;
                len -= (size_t)r;
        }
        return 0;
}

void qio_set_why(char *why, size_t whylen, const char *fmt, ...)
{
        if (!why || whylen == 0)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
}
