/* qmp.c — the QMP client (see qmp.h). */
#include "qmp.h"
#include "sockio.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define QMP_TIMEOUT_MS 5000

void qmp_init(struct qmp *q)
{
        q->fd = -1;
        q->quitting = false;
        q->len = 0;
        pthread_mutex_init(&q->lock, NULL);
}

void qmp_free(struct qmp *q)
{
        if (q->fd >= 0)
                close(q->fd);
        q->fd = -1;
        pthread_mutex_destroy(&q->lock);
}

/* Reads the next line (NUL-terminated in q->buf's front; consumed by the next call). */
static int read_line(struct qmp *q, char **ret, int64_t deadline)
{
        for (;;) {
                char *nl = memchr(q->buf, '\n', q->len);
                if (nl) {
                        *nl = 0;
                        *ret = q->buf;
                        return (int)(nl - q->buf) + 1;
                }
                if (q->len == sizeof(q->buf) - 1)
                        return -EMSGSIZE;
                ssize_t r = qio_read_some(q->fd, q->buf + q->len, sizeof(q->buf) - 1 - q->len, deadline);
                if (r < 0)
                        return (int)r;
                q->len += (size_t)r;
        }
}

static void consume(struct qmp *q, int n)
{
        memmove(q->buf, q->buf + n, q->len - (size_t)n);
        q->len -= (size_t)n;
}

/* Waits for a line holding key (e.g. "return"); 0 if it came, -EIO if QEMU
 * answered with "error". */
static int wait_value(struct qmp *q, const char *key, int64_t deadline, json_t **ret_value)
{
        for (;;) {
                char *line = NULL;
                int n = read_line(q, &line, deadline);
                if (n < 0)
                        return n;
                json_t *j = json_loads(line, 0, NULL);
                consume(q, n);
                if (!j)
                        continue;
                int r = 1;
                json_t *v = json_object_get(j, key);
                if (v) {
                        r = 0;
                        if (ret_value)
                                *ret_value = json_incref(v);
                } else if (json_object_get(j, "error"))
                        r = -EIO;
                json_decref(j);
                if (r <= 0)
                        return r;
        }
}

static bool closed(struct qmp *q)
{
        return q->fd < 0 || __atomic_load_n(&q->quitting, __ATOMIC_ACQUIRE);
}

int qmp_handshake(struct qmp *q, int64_t deadline)
{
        int r = wait_value(q, "QMP", deadline, NULL);
        return r < 0 ? r : qmp_command(q, "qmp_capabilities");
}

int qmp_call(struct qmp *q, const char *json, json_t **ret_value)
{
        if (closed(q))
                return -ESRCH;
        pthread_mutex_lock(&q->lock);
        int64_t deadline = time_mono_ms() + QMP_TIMEOUT_MS;
        int r = qio_write_all(q->fd, json, strlen(json), deadline);
        if (r >= 0)
                r = qio_write_all(q->fd, "\n", 1, deadline);
        if (r >= 0)
                r = wait_value(q, "return", deadline, ret_value);
        pthread_mutex_unlock(&q->lock);
        return r;
}

int qmp_command(struct qmp *q, const char *command)
{
        char buf[128];
        snprintf(buf, sizeof(buf), "{\"execute\":\"%s\"}", command);
        return qmp_call(q, buf, NULL);
}

int qmp_send_fd(struct qmp *q, const char *name, int fd)
{
        if (closed(q))
                return -ESRCH;
        char cmd[256];
        int len = snprintf(cmd, sizeof(cmd), "{\"execute\":\"getfd\",\"arguments\":{\"fdname\":\"%s\"}}\n", name);
        if (len < 0 || (size_t)len >= sizeof(cmd))
                return -EINVAL;
        union {
                char buf[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
        } u;
        memset(&u, 0, sizeof(u));
        struct iovec iov = { cmd, (size_t)len };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
        pthread_mutex_lock(&q->lock);
        int64_t deadline = time_mono_ms() + QMP_TIMEOUT_MS;
        ssize_t w;
        do
                w = sendmsg(q->fd, &msg, MSG_NOSIGNAL);
        while (w < 0 && errno == EINTR);
        int r = w < 0 ? -errno : 0;
        if (r >= 0 && w < len)
                r = qio_write_all(q->fd, cmd + w, (size_t)(len - w), deadline);
        if (r >= 0)
                r = wait_value(q, "return", deadline, NULL);
        pthread_mutex_unlock(&q->lock);
        return r;
}

void qmp_quit(struct qmp *q)
{
        __atomic_store_n(&q->quitting, true, __ATOMIC_RELEASE);
        if (q->fd < 0)
                return;
        static const char quit[] = "{\"execute\":\"quit\"}\n";
        pthread_mutex_lock(&q->lock);
        qio_write_all(q->fd, quit, sizeof(quit) - 1, time_mono_ms() + 1000);
        pthread_mutex_unlock(&q->lock);
}

void qmp_shutdown(struct qmp *q)
{
        if (q->fd >= 0)
                shutdown(q->fd, SHUT_RDWR);
}
