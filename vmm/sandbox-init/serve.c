/* serve.c — see serve.h. */
#include "serve.h"
#include "builder.h"
#include "confine.h"
#include "jail.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define JOBS_MAX 256
#define REQUEST_MAX (64 * 1024 + 64)

static int lease_fd = -1, timer_fd = -1;

void lease_open(const char *dir)
{
        char p[PATH_MAX];
        path(p, sizeof(p), dir, JAIL_LEASE_FILE);
        if ((lease_fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0)
                fail("could not open the lease file");
        if ((timer_fd = timerfd_create(CLOCK_REALTIME, TFD_CLOEXEC | TFD_NONBLOCK)) < 0)
                fail("could not create the lease timer");
}

static _Noreturn void end_sandbox(void)
{
        kill(-1, SIGKILL); /* every process of our pid namespace but us */
        _exit(0);
}

void lease_check(void)
{
        char buf[32];
        ssize_t n = pread(lease_fd, buf, sizeof(buf) - 1, 0);
        int64_t deadline = 0;
        if (n > 0) {
                buf[n] = '\0';
                deadline = strtoll(buf, NULL, 10);
        }
        struct itimerspec its = { 0 };
        if (deadline > 0) {
                int64_t at = deadline + JAIL_LEASE_GRACE_NS;
                struct timespec now;
                clock_gettime(CLOCK_REALTIME, &now);
                if ((int64_t)now.tv_sec * 1000000000 + now.tv_nsec >= at)
                        end_sandbox();
                its.it_value.tv_sec = at / 1000000000;
                its.it_value.tv_nsec = at % 1000000000;
        }
        timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &its, NULL);
}

static struct job {
        int conn;
        pid_t pid;
} jobs[JOBS_MAX];
static char request[REQUEST_MAX];
static char *request_argv[ARGS_MAX + 1];

/* One request: argv as NUL-terminated strings with the command's stdin,
 * stdout and stderr as SCM_RIGHTS; answered with its pid, then its status.
 * A request whose argv is JAIL_LEASE_REQUEST (no descriptors) re-reads the lease. */
static void start_job(int conn)
{
        int fds[3] = { -1, -1, -1 };
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(fds))];
        } control;
        struct iovec iov = { request, sizeof(request) - 1 };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                              .msg_controllen = sizeof(control.buf) };
        ssize_t n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
        if (n > 0 && (size_t)n == sizeof(JAIL_LEASE_REQUEST) && memcmp(request, JAIL_LEASE_REQUEST, (size_t)n) == 0) {
                lease_check();
                ssize_t w = write(conn, "ok", 2);
                (void)w;
                close(conn);
                return;
        }
        struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
        int slot = -1;
        for (int i = 0; i < JOBS_MAX && slot < 0; i++)
                if (jobs[i].pid == 0)
                        slot = i;
        if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(fds)) || (msg.msg_flags & MSG_TRUNC) ||
            slot < 0 || request[n - 1] != '\0') {
                if (c && c->cmsg_type == SCM_RIGHTS) {
                        memcpy(fds, CMSG_DATA(c), sizeof(fds));
                        for (int i = 0; i < 3; i++)
                                if (fds[i] >= 0)
                                        close(fds[i]);
                }
                close(conn);
                return;
        }
        memcpy(fds, CMSG_DATA(c), sizeof(fds));
        size_t argc = 0;
        for (ssize_t at = 0; at < n && argc < ARGS_MAX; at += (ssize_t)strlen(request + at) + 1)
                request_argv[argc++] = request + at;
        request_argv[argc] = NULL;
        pid_t pid = argc ? fork() : -1;
        if (pid == 0) {
                dup2(fds[0], 0);
                dup2(fds[1], 1);
                dup2(fds[2], 2);
                exec_in_jail(request_argv);
        }
        for (int i = 0; i < 3; i++)
                close(fds[i]);
        int v = (int)pid;
        if (pid < 0 || write(conn, &v, sizeof(v)) != sizeof(v)) {
                if (pid > 0)
                        kill(pid, SIGKILL); /* reaped below; nobody waits for its status */
                close(conn);
                return;
        }
        jobs[slot].conn = conn;
        jobs[slot].pid = pid;
}

void on_sigchld(int sig) { (void)sig; }

_Noreturn void serve(int listen_fd, const sigset_t *none)
{
        struct pollfd fds[JOBS_MAX + 2];
        int slots[JOBS_MAX + 2];
        for (int i = 0; i < JOBS_MAX; i++)
                jobs[i].conn = -1;
        for (;;) {
                int status;
                pid_t p;
                while ((p = waitpid(-1, &status, WNOHANG)) > 0) {
                        for (int i = 0; i < JOBS_MAX; i++) {
                                if (jobs[i].pid != p)
                                        continue;
                                if (jobs[i].conn >= 0) {
                                        ssize_t w = write(jobs[i].conn, &status, sizeof(status));
                                        (void)w;
                                        close(jobs[i].conn);
                                }
                                jobs[i].pid = 0;
                                jobs[i].conn = -1;
                        }
                }
                int n = 0;
                fds[n] = (struct pollfd){ timer_fd, POLLIN, 0 };
                slots[n++] = -2;
                if (listen_fd >= 0) {
                        fds[n] = (struct pollfd){ listen_fd, POLLIN, 0 };
                        slots[n++] = -1;
                }
                for (int i = 0; i < JOBS_MAX; i++)
                        if (jobs[i].pid > 0 && jobs[i].conn >= 0) {
                                fds[n] = (struct pollfd){ jobs[i].conn, POLLIN, 0 };
                                slots[n++] = i;
                        }
                if (ppoll(fds, (nfds_t)n, NULL, none) <= 0)
                        continue; /* SIGCHLD: reap */
                for (int k = 0; k < n; k++) {
                        if (!fds[k].revents)
                                continue;
                        if (slots[k] == -2) {
                                uint64_t ticks;
                                ssize_t r = read(timer_fd, &ticks, sizeof(ticks));
                                (void)r;
                                lease_check();
                                continue;
                        }
                        if (slots[k] == -1) {
                                int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
                                if (c >= 0)
                                        start_job(c);
                                continue;
                        }
                        /* The daemon asks for a kill, or went away: the command must not outlive it. */
                        struct job *j = &jobs[slots[k]];
                        char b;
                        ssize_t r = read(j->conn, &b, 1);
                        if (r == 1 || r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
                                kill(-j->pid, SIGKILL);
                                kill(j->pid, SIGKILL);
                        }
                        if (r <= 0 && !(r < 0 && (errno == EINTR || errno == EAGAIN))) {
                                close(j->conn);
                                j->conn = -1;
                        }
                }
        }
}
