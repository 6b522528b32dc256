/* process_exec.c — runs one command in a process sandbox (the backend's
 * exec operation, see backend.h and process_sandbox.h).
 *
 * The init forks the command on request (its exec socket), so the command
 * starts inside the jail and the cgroup. Without that socket a forked helper
 * execs tally-sandbox-init --join, which enters the cgroup and the
 * namespaces and runs the command in the jail. Either way the command's
 * pid and wait status come back on a status descriptor, and its stdout and
 * stderr on pipes read here, kept up to the request's cap. */
#include "jail.h"
#include "process_sandbox.h"
#include "spec.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define INIT_REQUEST_MAX (SPEC_COMMAND_BYTES_MAX + 64)

/* Asks the init to run argv with the given ends of the pipes. Returns the
 * connection (which then delivers the command's pid and wait status, and
 * takes a byte to kill it), or -1 if the sandbox has no exec socket. */
static int request_exec(struct backend_sandbox *sb, char *const *argv, int fds[3])
{
        struct sockaddr_un a;
        if (!process_init_socket_path(sb->dir, &a))
                return -1;
        size_t len = 0;
        for (char *const *p = argv; *p; p++)
                len += strlen(*p) + 1;
        if (len > INIT_REQUEST_MAX - 1)
                return -1;
        char *buf = malloc(len ? len : 1);
        if (!buf)
                return -1;
        size_t at = 0;
        for (char *const *p = argv; *p; p++) {
                memcpy(buf + at, *p, strlen(*p) + 1);
                at += strlen(*p) + 1;
        }
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
                if (fd >= 0)
                        close(fd);
                free(buf);
                return -1;
        }
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(3 * sizeof(int))];
        } control;
        memset(&control, 0, sizeof(control));
        struct iovec iov = { buf, len };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                              .msg_controllen = sizeof(control.buf) };
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(3 * sizeof(int));
        memcpy(CMSG_DATA(c), fds, 3 * sizeof(int));
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        free(buf);
        if (n != (ssize_t)len) {
                close(fd);
                return -1;
        }
        return fd;
}

/* Reads what fd has, keeping up to cap bytes in all and dropping the rest.
 * Returns 1 after data, 2 if nothing is there yet, 0 at end of file, or -errno. */
static int take_output(int fd, char **buf, size_t *len, size_t cap, bool *truncated)
{
        char chunk[16384];
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n < 0)
                return errno == EAGAIN || errno == EINTR ? 2 : -errno;
        if (n == 0)
                return 0;
        size_t keep = *len < cap ? cap - *len : 0;
        if ((size_t)n > keep)
                *truncated = true;
        else
                keep = (size_t)n;
        if (keep > 0) {
                char *b = realloc(*buf, *len + keep + 1);
                if (!b)
                        return -ENOMEM;
                memcpy(b + *len, chunk, keep);
                *len += keep;
                b[*len] = '\0';
                *buf = b;
        }
        return 1;
}

/* Takes what is already in the pipe, then closes it. */
static void drain(int *fd, char **buf, size_t *len, size_t cap, bool *truncated)
{
        if (*fd < 0)
                return;
        while (take_output(*fd, buf, len, cap, truncated) == 1)
                ;
        close(*fd);
        *fd = -1;
}

/* Forks a helper that execs tally-sandbox-init --join for argv: it enters
 * the sandbox's cgroup and namespaces and runs argv there, with fds[0..2] as
 * its stdin, stdout and stderr. Makes st, whose write end reports the
 * command's pid and wait status. *ret_helper is the helper, to be reaped. */
static int start_helper(struct backend_sandbox *sb, char *const *argv, const int fds[3], int st[2],
                        pid_t *ret_helper, char *why, size_t whylen)
{
        const char *init = process_init_program();
        if (!init || kill(sb->init, 0) < 0) {
                snprintf(why, whylen, init ? "the sandbox's init is gone" : "%s is missing", JAIL_INIT_NAME);
                return init ? -ESRCH : -ENOENT;
        }
        char k_pid[32], k_cg[CGROUP_MAX_DIRS][PATH_MAX + 8];
        const char *keys[2 + CGROUP_MAX_DIRS];
        snprintf(k_pid, sizeof(k_pid), "pid=%d", (int)sb->init);
        keys[0] = k_pid;
        keys[1] = sb->internet ? "network=1" : "network=0";
        for (size_t i = 0; i < sb->cg.ndirs; i++) {
                snprintf(k_cg[i], sizeof(k_cg[i]), "cgroup=%s", sb->cg.dirs[i]);
                keys[2 + i] = k_cg[i];
        }
        int config = process_jail_config(keys, 2 + sb->cg.ndirs, argv);
        if (config < 0)
                return config;
        if (pipe2(st, O_CLOEXEC) < 0) {
                int r = -errno;
                close(config);
                return r;
        }
        pid_t helper = fork();
        if (helper < 0) {
                int r = -errno;
                close(config);
                return r;
        }
        if (helper == 0) {
                /* In the copy of the threaded daemon: system calls only, then exec. */
                const int from[5] = { fds[0], fds[1], fds[2], st[1], config };
                static const int to[5] = { 0, 1, 2, JAIL_FD_STATUS, JAIL_FD_CONFIG };
                if (process_place_fds(from, to, 5) < 0)
                        _exit(126);
                sigset_t none; /* the daemon's blocked signals survive exec */
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                char *const join[] = { (char *)JAIL_INIT_NAME, (char *)"--join", NULL };
                char *const envp[] = { NULL };
                execve(init, join, envp);
                process_say(2, "tally: could not run " JAIL_INIT_NAME "\n");
                _exit(126);
        }
        close(config);
        *ret_helper = helper;
        return 0;
}

int process_exec(struct backend_sandbox *sb, const struct exec_request *req, struct exec_result *ret, char *why,
                 size_t whylen)
{
        int in[2] = { -1, -1 }, out[2] = { -1, -1 }, err[2] = { -1, -1 }, st[2] = { -1, -1 };
        struct exec_result res = { 0 };
        pid_t helper = -1;
        int r = 0;
        bool via_init = false;
        if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
                r = -errno;
                goto out;
        }
        int ends[3] = { in[0], out[1], err[1] };
        if ((st[0] = request_exec(sb, req->argv, ends)) >= 0) {
                via_init = true;
                goto started;
        }
        /* No exec socket: a helper enters the cgroup and the jail itself. */
        if ((r = start_helper(sb, req->argv, ends, st, &helper, why, whylen)) < 0)
                goto out;
started:
        close(in[0]);
        close(out[1]);
        close(err[1]);
        if (st[1] >= 0)
                close(st[1]);
        in[0] = out[1] = err[1] = st[1] = -1;
        if (!req->stdin_data || req->stdin_len == 0) {
                close(in[1]);
                in[1] = -1;
        } else {
                fcntl(in[1], F_SETFL, O_NONBLOCK);
        }
        fcntl(out[0], F_SETFL, O_NONBLOCK);
        fcntl(err[0], F_SETFL, O_NONBLOCK);

        int64_t deadline = 0;
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        int64_t start_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
        deadline = start_ns + req->timeout_ns;
        int words[2];
        size_t got = 0, stdin_at = 0;
        pid_t cmd = -1;
        bool killed = false, cancelled = false;
        while (out[0] >= 0 || err[0] >= 0 || st[0] >= 0) {
                struct pollfd p[4] = { { out[0], POLLIN, 0 }, { err[0], POLLIN, 0 }, { st[0], POLLIN, 0 },
                                       { in[1], POLLOUT, 0 } };
                clock_gettime(CLOCK_MONOTONIC, &now);
                int64_t left = deadline - ((int64_t)now.tv_sec * 1000000000 + now.tv_nsec);
                if (!killed && req->cancel && *req->cancel) {
                        cancelled = true;
                        left = 0;
                }
                if (left <= 0 && !killed) {
                        res.timed_out = true;
                        killed = true;
                        if (via_init) {
                                ssize_t w = write(st[0], "k", 1); /* the init kills the command's group */
                                (void)w;
                        } else if (cmd > 0) {
                                kill(-cmd, SIGKILL);
                                kill(cmd, SIGKILL);
                        }
                        /* A grace second to collect what is left; escaped children may hold the pipes. */
                        deadline += 1000000000;
                        continue;
                }
                if (left <= 0)
                        break;
                int wait_ms = (int)(left / 1000000) + 1;
                if (req->cancel && wait_ms > 100)
                        wait_ms = 100; /* look at the cancel flag ten times a second */
                int n = poll(p, 4, wait_ms);
                if (n < 0 && errno != EINTR) {
                        r = -errno;
                        goto out;
                }
                if (n <= 0)
                        continue;
                if (p[0].revents) {
                        int t = take_output(out[0], &res.out, &res.out_len, req->output_cap, &res.out_truncated);
                        if (t <= 0) {
                                close(out[0]);
                                out[0] = -1;
                        }
                }
                if (p[1].revents) {
                        int t = take_output(err[0], &res.err, &res.err_len, req->output_cap, &res.err_truncated);
                        if (t <= 0) {
                                close(err[0]);
                                err[0] = -1;
                        }
                }
                if (p[3].revents) {
                        ssize_t w = write(in[1], req->stdin_data + stdin_at, req->stdin_len - stdin_at);
                        if (w > 0)
                                stdin_at += (size_t)w;
                        if ((w < 0 && errno != EAGAIN) || stdin_at == req->stdin_len) {
                                close(in[1]);
                                in[1] = -1;
                        }
                }
                if (p[2].revents) {
                        ssize_t m = read(st[0], (char *)words + got, sizeof(words) - got);
                        if (m > 0)
                                got += (size_t)m;
                        if (got >= sizeof(int) && cmd < 0)
                                cmd = words[0];
                        if (m <= 0 || got == sizeof(words)) {
                                close(st[0]);
                                st[0] = -1;
                                /* The command ended: take what it wrote and do not wait
                                 * for children it left running with our pipes. */
                                drain(&out[0], &res.out, &res.out_len, req->output_cap, &res.out_truncated);
                                drain(&err[0], &res.err, &res.err_len, req->output_cap, &res.err_truncated);
                                break;
                        }
                }
        }
        if (got < sizeof(words)) {
                if (via_init && st[0] >= 0) {
                        ssize_t w = write(st[0], "k", 1);
                        (void)w;
                } else if (!killed && cmd > 0) {
                        kill(-cmd, SIGKILL);
                        kill(cmd, SIGKILL);
                }
                /* The helper reports the status once the command is reaped. */
                if (st[0] >= 0) {
                        fcntl(st[0], F_SETFL, 0);
                        ssize_t m;
                        while (got < sizeof(words) && (m = read(st[0], (char *)words + got, sizeof(words) - got)) > 0)
                                got += (size_t)m;
                }
        }
        if (got < sizeof(words)) {
                r = -EIO;
                snprintf(why, whylen, "the command's status was lost");
                goto out;
        }
        if (cancelled) {
                r = -ECANCELED;
                snprintf(why, whylen, "tally-vmm is stopping: the command was ended");
                goto out;
        }
        int status = words[1];
        res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 255;
        if (!res.out && !(res.out = strdup("")))
                r = -ENOMEM;
        if (!res.err && !(res.err = strdup("")))
                r = -ENOMEM;
out:
        if (helper > 0)
                while (waitpid(helper, NULL, 0) < 0 && errno == EINTR)
                        ;
        for (int i = 0; i < 2; i++) {
                if (in[i] >= 0)
                        close(in[i]);
                if (out[i] >= 0)
                        close(out[i]);
                if (err[i] >= 0)
                        close(err[i]);
                if (st[i] >= 0)
                        close(st[i]);
        }
        if (r < 0) {
                exec_result_clear(&res);
                return r;
        }
        *ret = res;
        return 0;
}

