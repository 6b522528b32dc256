/* process.c — the process backend (see process.h).
 *
 * Start: the daemon clone()s the sandbox's init straight into new namespaces;
 * the init waits on a pipe until the daemon has written its pid into every
 * folder of the cgroup, so not one instruction of the sandbox runs outside it.
 * Exec: the init forks the command on request (its exec socket), so the
 * command starts inside the namespaces and the cgroup. Without that socket, a
 * forked helper joins the init's namespaces (setns needs a single-threaded
 * process, which the daemon is not) and forks the command, which enters the
 * cgroup itself before it execs.
 *
 * Code between fork/clone and exec runs in a copy of a threaded process, so it
 * makes system calls only: no malloc, no stdio, no locks. Everything it needs
 * is prepared before the fork. */
#include "process.h"
#include "log.h"
#include "spec.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define INIT_STACK_SIZE (256 * 1024)
#define COMMAND_FILE "command"   /* the main program's argv, NUL-separated, for fork after a restart */

struct backend_sandbox {
        pid_t init;                  /* the sandbox's pid 1, as this host sees it */
        bool is_child;               /* init is this daemon's child (reaped on stop) */
        bool network;
        struct sandbox_cgroup cg;
        char id[EVENT_ID_MAX + 1];
        char dir[PATH_MAX];
        char disk[PATH_MAX + 8];
};

static char *const sandbox_env[] = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG=C.UTF-8",
        "TERM=dumb",
        NULL,
};

void exec_result_clear(struct exec_result *r)
{
        if (!r)
                return;
        free(r->out);
        free(r->err);
        memset(r, 0, sizeof(*r));
}

/* Closes every descriptor from 3 up except keep[0..n). Syscalls only. */
static void close_other_fds(const int *keep, int n)
{
        unsigned int from = 3;
        for (;;) {
                unsigned int next = ~0U;
                for (int i = 0; i < n; i++)
                        if ((unsigned int)keep[i] >= from && (unsigned int)keep[i] < next)
                                next = (unsigned int)keep[i];
                if (next == ~0U) {
                        close_range(from, ~0U, 0);
                        return;
                }
                if (next > from)
                        close_range(from, next - 1, 0);
                from = next + 1;
        }
}

static void write_str(int fd, const char *s)
{
        ssize_t r = write(fd, s, strlen(s));
        (void)r;
}

/* Where this process's command line and environment strings live
 * (/proc/self/stat fields 48 to 51), so the init can blank its copy of them:
 * the daemon's flags and environment (a database URL with a password, say)
 * must not show in the sandbox's /proc/1/cmdline or /proc/1/environ. */
struct arg_area {
        unsigned long arg_start, arg_end, env_start, env_end;
};

static int read_arg_area(struct arg_area *ret)
{
        char buf[2048];
        FILE *f = fopen("/proc/self/stat", "re");
        if (!f)
                return -errno;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        char *p = strrchr(buf, ')');
        if (!p)
                return -EINVAL;
        unsigned long v[52] = { 0 };
        int field = 2;
        for (char *save = NULL, *t = strtok_r(p + 1, " ", &save); t && field < 51; t = strtok_r(NULL, " ", &save))
                v[++field] = strtoul(t, NULL, 10);
        if (field < 51 || v[48] == 0 || v[49] < v[48] || v[51] < v[50])
                return -EINVAL;
        *ret = (struct arg_area){ v[48], v[49], v[50], v[51] };
        return 0;
}

struct init_args {
        int sync_r;                  /* the daemon closes its end once the init is in the cgroup */
        int ready_w;                 /* the init writes "ok" or the reason it failed */
        bool network;
        const char *id;
        const char *disk;
        const char *console;         /* the main program's stdout and stderr */
        char **command;
        struct arg_area area;        /* zero: unknown, left as is */
        int listen_fd;               /* <dir>/init.sock: exec requests from the daemon, -1 if none */
};

static void on_sigchld(int sig) { (void)sig; }

static void fail_init(int fd, const char *what)
{
        const char *e = strerrordesc_np(errno);
        write_str(fd, what);
        write_str(fd, ": ");
        write_str(fd, e ? e : "error");
        _exit(1);
}

#define INIT_JOBS_MAX 256
#define INIT_REQUEST_MAX (SPEC_COMMAND_BYTES_MAX + 64)

/* The init's exec server. A request is one SOCK_SEQPACKET message on a fresh
 * connection to <dir>/init.sock: the argv as NUL-terminated strings, with the
 * command's stdin, stdout and stderr passed as SCM_RIGHTS. The init forks the
 * command (already inside the sandbox's namespaces and cgroup: no migration,
 * which on cgroup v1 costs an RCU grace period per exec), answers its pid, then
 * its wait status when it ends. A byte from the daemon, or the connection
 * closing early, kills the command's process group. It also reaps every orphan
 * of the sandbox. Static buffers only: this runs in a copy of a threaded daemon. */
static struct init_job {
        int conn;
        pid_t pid;
} init_jobs[INIT_JOBS_MAX];
static char init_request[INIT_REQUEST_MAX];
static char *init_argv[SPEC_COMMAND_ARGS_MAX + 1];

static void start_job(int conn)
{
        int fds[3] = { -1, -1, -1 };
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(fds))];
        } control;
        struct iovec iov = { init_request, sizeof(init_request) - 1 };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                              .msg_controllen = sizeof(control.buf) };
        ssize_t n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
        struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
        int slot = -1;
        for (int i = 0; i < INIT_JOBS_MAX && slot < 0; i++)
                if (init_jobs[i].pid == 0)
                        slot = i;
        if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(fds)) || (msg.msg_flags & MSG_TRUNC) ||
            slot < 0 || init_request[n - 1] != '\0') {
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
        for (ssize_t at = 0; at < n && argc < SPEC_COMMAND_ARGS_MAX; at += (ssize_t)strlen(init_request + at) + 1)
                init_argv[argc++] = init_request + at;
        init_argv[argc] = NULL;
        pid_t pid = argc ? fork() : -1;
        if (pid == 0) {
                setsid();
                dup2(fds[0], 0);
                dup2(fds[1], 1);
                dup2(fds[2], 2);
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                signal(SIGCHLD, SIG_DFL);
                execvpe(init_argv[0], init_argv, sandbox_env);
                int e = errno;
                write_str(2, "tally: could not run ");
                write_str(2, init_argv[0]);
                write_str(2, ": ");
                write_str(2, strerrordesc_np(e) ? strerrordesc_np(e) : "error");
                write_str(2, "\n");
                _exit(e == ENOENT ? 127 : 126);
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
        init_jobs[slot].conn = conn;
        init_jobs[slot].pid = pid;
}

static _Noreturn void serve_exec(int listen_fd, const sigset_t *none)
{
        struct pollfd fds[INIT_JOBS_MAX + 1];
        int slots[INIT_JOBS_MAX + 1];
        for (;;) {
                int status;
                pid_t p;
                while ((p = waitpid(-1, &status, WNOHANG)) > 0) {
                        for (int i = 0; i < INIT_JOBS_MAX; i++) {
                                if (init_jobs[i].pid != p)
                                        continue;
                                if (init_jobs[i].conn >= 0) {
                                        ssize_t w = write(init_jobs[i].conn, &status, sizeof(status));
                                        (void)w;
                                        close(init_jobs[i].conn);
                                }
                                init_jobs[i].pid = 0;
                                init_jobs[i].conn = -1;
                        }
                }
                int n = 0;
                if (listen_fd >= 0) {
                        fds[n] = (struct pollfd){ listen_fd, POLLIN, 0 };
                        slots[n++] = -1;
                }
                for (int i = 0; i < INIT_JOBS_MAX; i++)
                        if (init_jobs[i].pid > 0 && init_jobs[i].conn >= 0) {
                                fds[n] = (struct pollfd){ init_jobs[i].conn, POLLIN, 0 };
                                slots[n++] = i;
                        }
                if (ppoll(fds, (nfds_t)n, NULL, none) <= 0)
                        continue; /* SIGCHLD: reap */
                for (int k = 0; k < n; k++) {
                        if (!fds[k].revents)
                                continue;
                        if (slots[k] < 0) {
                                int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
                                if (c >= 0)
                                        start_job(c);
                                continue;
                        }
                        /* The daemon asks for a kill, or went away: the command must not outlive it. */
                        struct init_job *j = &init_jobs[slots[k]];
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

/* The sandbox's pid 1. Sets up its namespaces, starts the main program if
 * there is one, then reaps orphans until it is killed. */
static int init_main(void *arg)
{
        struct init_args *a = arg;
        int keep[] = { a->sync_r, a->ready_w, a->listen_fd };
        close_other_fds(keep, 3);
        char byte;
        if (read(a->sync_r, &byte, 1) != 1)
                _exit(1); /* the daemon gave up before the cgroup held us */
        close(a->sync_r);
        prctl(PR_SET_NAME, "tally-init", 0, 0, 0);
        if (a->area.arg_start) {
                static const char name[] = "tally-sandbox-init";
                size_t len = a->area.arg_end - a->area.arg_start;
                memset((void *)a->area.arg_start, 0, len);
                memcpy((void *)a->area.arg_start, name, len < sizeof(name) ? len : sizeof(name));
                if (len < sizeof(name) && len > 0)
                        ((char *)a->area.arg_start)[len - 1] = '\0';
                memset((void *)a->area.env_start, 0, a->area.env_end - a->area.env_start);
        }
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null >= 0)
                dup2(null, 0);
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
                fail_init(a->ready_w, "could not make the mounts private");
        if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
                fail_init(a->ready_w, "could not mount /proc");
        if (sethostname(a->id, strlen(a->id)) < 0)
                fail_init(a->ready_w, "could not set the host name");
        if (!a->network) {
                /* Only loopback, and up, so local servers work without a network. */
                int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
                struct ifreq ifr = { 0 };
                memcpy(ifr.ifr_name, "lo", 3);
                if (s >= 0 && ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
                        ifr.ifr_flags |= IFF_UP;
                        ioctl(s, SIOCSIFFLAGS, &ifr);
                }
                if (s >= 0)
                        close(s);
        }
        if (chdir(a->disk) < 0)
                fail_init(a->ready_w, "could not enter the disk folder");
        setsid();
        struct sigaction sa = { .sa_handler = on_sigchld, .sa_flags = SA_NOCLDSTOP };
        sigaction(SIGCHLD, &sa, NULL);
        sigset_t chld, none;
        sigemptyset(&chld);
        sigaddset(&chld, SIGCHLD);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &chld, NULL);
        if (a->command) {
                int out = open(a->console, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
                if (out < 0)
                        fail_init(a->ready_w, "could not open the console log");
                pid_t p = fork();
                if (p < 0)
                        fail_init(a->ready_w, "could not start the main program");
                if (p == 0) {
                        dup2(out, 1);
                        dup2(out, 2);
                        close(a->ready_w);
                        sigprocmask(SIG_SETMASK, &none, NULL);
                        signal(SIGCHLD, SIG_DFL);
                        execvpe(a->command[0], a->command, sandbox_env);
                        write_str(2, "tally: could not run the main program\n");
                        _exit(127);
                }
                close(out);
        }
        write_str(a->ready_w, "ok");
        close(a->ready_w);
        serve_exec(a->listen_fd, &none);
}

static int write_command_file(const char *dir, char **command)
{
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/" COMMAND_FILE, dir);
        FILE *f = fopen(path, "we");
        if (!f)
                return -errno;
        for (char **c = command; c && *c; c++)
                fwrite(*c, 1, strlen(*c) + 1, f);
        return fclose(f) == 0 ? 0 : -errno;
}

/* The main program recorded at start: a malloc'd NULL-terminated argv whose
 * strings live in one block (free(argv[0]) then free(argv)), or NULL for none. */
static int read_command_file(const char *dir, char ***ret)
{
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/" COMMAND_FILE, dir);
        FILE *f = fopen(path, "re");
        if (!f)
                return -errno;
        char *buf = NULL;
        size_t len = 0, cap = 0;
        char chunk[4096];
        size_t n;
        while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
                if (len + n + 1 > cap) {
                        cap = (len + n + 1) * 2;
                        char *b = realloc(buf, cap);
                        if (!b) {
                                free(buf);
                                fclose(f);
                                return -ENOMEM;
                        }
                        buf = b;
                }
                memcpy(buf + len, chunk, n);
                len += n;
        }
        fclose(f);
        if (len == 0) {
                free(buf);
                *ret = NULL;
                return 0;
        }
        size_t count = 0;
        for (size_t i = 0; i < len; i++)
                count += buf[i] == '\0';
        char **argv = calloc(count + 1, sizeof(*argv));
        if (!argv) {
                free(buf);
                return -ENOMEM;
        }
        size_t at = 0;
        for (size_t i = 0; i < count; i++) {
                argv[i] = buf + at;
                at += strlen(buf + at) + 1;
        }
        *ret = argv;
        return 0;
}

/* The init's exec socket, <dir>/init.sock; -1 (exec then joins the namespaces
 * itself) if the path is too long for a unix socket or it cannot be made. */
static int open_init_socket(const char *dir)
{
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        if (snprintf(a.sun_path, sizeof(a.sun_path), "%s/init.sock", dir) >= (int)sizeof(a.sun_path))
                return -1;
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -1;
        unlink(a.sun_path);
        if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || chmod(a.sun_path, 0600) < 0 || listen(fd, 64) < 0) {
                close(fd);
                return -1;
        }
        return fd;
}

/* Asks the init to run argv with the given ends of the pipes. Returns the
 * connection (which then delivers the command's pid and wait status, and
 * takes a byte to kill it), or -1 if the sandbox has no exec socket. */
static int request_exec(struct backend_sandbox *sb, char *const *argv, int fds[3])
{
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        if (snprintf(a.sun_path, sizeof(a.sun_path), "%s/init.sock", sb->dir) >= (int)sizeof(a.sun_path))
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

static int process_start(const struct sandbox_spec *spec, const struct sandbox_cgroup *cg, const char *dir,
                         struct backend_sandbox **ret, pid_t *ret_pid, char *why, size_t whylen)
{
        struct backend_sandbox *sb = calloc(1, sizeof(*sb));
        char *stack = NULL;
        int sync[2] = { -1, -1 }, ready[2] = { -1, -1 };
        pid_t pid = -1;
        int r;
        if (spec->image && *spec->image) {
                snprintf(why, whylen, "the process backend runs on the host's file system and has no images "
                         "(image \"%.64s\"); use the qemu backend", spec->image);
                free(sb);
                return -EINVAL;
        }
        if (!sb)
                return -ENOMEM;
        sb->cg = *cg;
        sb->network = spec->network;
        sb->is_child = true;
        snprintf(sb->id, sizeof(sb->id), "%s", spec->id);
        snprintf(sb->dir, sizeof(sb->dir), "%s", dir);
        snprintf(sb->disk, sizeof(sb->disk), "%s/disk", dir);
        char console[PATH_MAX + 16];
        snprintf(console, sizeof(console), "%s/console.log", dir);
        if (mkdir(sb->disk, 0755) < 0 && errno != EEXIST) {
                r = -errno;
                snprintf(why, whylen, "could not create the sandbox's disk folder: %s", strerror(-r));
                goto fail;
        }
        if ((r = write_command_file(dir, spec->command)) < 0) {
                snprintf(why, whylen, "could not record the main program: %s", strerror(-r));
                goto fail;
        }
        if (pipe2(sync, O_CLOEXEC) < 0 || pipe2(ready, O_CLOEXEC) < 0 || !(stack = malloc(INIT_STACK_SIZE))) {
                r = errno ? -errno : -ENOMEM;
                goto fail;
        }
        int listen_fd = open_init_socket(dir);
        struct init_args args = { sync[0], ready[1], spec->network, sb->id, sb->disk, console, spec->command, { 0 },
                                  listen_fd };
        if (read_arg_area(&args.area) < 0)
                memset(&args.area, 0, sizeof(args.area));
        int flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | (spec->network ? 0 : CLONE_NEWNET);
        pid = clone(init_main, stack + INIT_STACK_SIZE, flags | SIGCHLD, &args);
        if (pid < 0) {
                if (listen_fd >= 0)
                        close(listen_fd);
                r = -errno;
                snprintf(why, whylen, "could not create the sandbox's namespaces: %s", strerror(-r));
                goto fail;
        }
        close(sync[0]);
        sync[0] = -1;
        close(ready[1]);
        ready[1] = -1;
        if (listen_fd >= 0)
                close(listen_fd); /* the init keeps its copy */
        listen_fd = -1;
        if ((r = cgroup_enter(cg, pid)) < 0) {
                snprintf(why, whylen, "could not move the sandbox into its cgroup: %s", strerror(-r));
                goto fail;
        }
        /* The init is in the cgroup: let it run. */
        if (write(sync[1], "g", 1) != 1) {
                r = -errno;
                goto fail;
        }
        close(sync[1]);
        sync[1] = -1;
        /* The init closes its end after "ok" or its reason: read to the end of file. */
        char reply[200];
        ssize_t n = 0;
        for (;;) {
                struct pollfd p = { ready[0], POLLIN, 0 };
                ssize_t m = poll(&p, 1, 10000) == 1 ? read(ready[0], reply + n, sizeof(reply) - 1 - (size_t)n) : -1;
                if (m <= 0)
                        break;
                n += m;
                if ((size_t)n == sizeof(reply) - 1)
                        break;
        }
        if (n != 2 || memcmp(reply, "ok", 2) != 0) {
                if (n > 0) {
                        reply[n] = '\0';
                        snprintf(why, whylen, "the sandbox's init failed: %s", reply);
                } else {
                        snprintf(why, whylen, "the sandbox's init did not start");
                }
                r = -EIO;
                goto fail;
        }
        close(ready[0]);
        free(stack);
        sb->init = pid;
        *ret = sb;
        *ret_pid = pid;
        return 0;
fail:
        if (pid > 0) {
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
        }
        for (int i = 0; i < 2; i++) {
                if (sync[i] >= 0)
                        close(sync[i]);
                if (ready[i] >= 0)
                        close(ready[i]);
        }
        free(stack);
        free(sb);
        return r;
}

static const char *const ns_names[] = { "ipc", "uts", "net", "pid", "mnt" }; /* mnt last: it moves the root */
#define NS_COUNT 5

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

static int process_exec(struct backend_sandbox *sb, const struct exec_request *req, struct exec_result *ret,
                        char *why, size_t whylen)
{
        int ns[NS_COUNT], in[2] = { -1, -1 }, out[2] = { -1, -1 }, err[2] = { -1, -1 }, st[2] = { -1, -1 };
        struct exec_result res = { 0 };
        pid_t helper = -1;
        int r = 0;
        bool via_init = false;
        for (int i = 0; i < NS_COUNT; i++)
                ns[i] = -1;
        if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
                r = -errno;
                goto out;
        }
        int ends[3] = { in[0], out[1], err[1] };
        if ((st[0] = request_exec(sb, req->argv, ends)) >= 0) {
                via_init = true;
                goto started;
        }
        /* No exec socket: join the namespaces and the cgroup from a helper. */
        for (int i = 0; i < NS_COUNT; i++) {
                char path[64];
                snprintf(path, sizeof(path), "/proc/%d/ns/%s", (int)sb->init, ns_names[i]);
                if ((ns[i] = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
                        r = errno == ENOENT ? -ESRCH : -errno;
                        snprintf(why, whylen, "the sandbox's init is gone");
                        goto out;
                }
        }
        if (pipe2(st, O_CLOEXEC) < 0) {
                r = -errno;
                goto out;
        }
        helper = fork();
        if (helper < 0) {
                r = -errno;
                goto out;
        }
        if (helper == 0) {
                /* The helper: joins the namespaces, forks the command, reports its pid and status.
                 * It keeps no descriptor of the daemon's, or a concurrent exec's pipes would
                 * stay open in it. */
                int keep[] = { ns[0], ns[1], ns[2], ns[3], ns[4], in[0], out[1], err[1], st[1] };
                close_other_fds(keep, 9);
                for (int i = 0; i < NS_COUNT; i++)
                        if (setns(ns[i], 0) < 0) {
                                write_str(err[1], "tally: could not enter the sandbox's namespaces\n");
                                _exit(126);
                        }
                pid_t cmd = fork();
                if (cmd == 0) {
                        if (cgroup_enter(&sb->cg, 0) < 0) {
                                write_str(err[1], "tally: could not enter the sandbox's cgroup\n");
                                _exit(126);
                        }
                        setsid();
                        dup2(in[0], 0);
                        dup2(out[1], 1);
                        dup2(err[1], 2);
                        close_other_fds(NULL, 0);
                        sigset_t none;
                        sigemptyset(&none);
                        sigprocmask(SIG_SETMASK, &none, NULL);
                        if (chdir(sb->disk) < 0 && chdir("/") < 0)
                                _exit(126);
                        execvpe(req->argv[0], req->argv, sandbox_env);
                        int e = errno;
                        write_str(2, "tally: could not run ");
                        write_str(2, req->argv[0]);
                        write_str(2, ": ");
                        write_str(2, strerrordesc_np(e) ? strerrordesc_np(e) : "error");
                        write_str(2, "\n");
                        _exit(e == ENOENT ? 127 : 126);
                }
                int msg[2] = { cmd, 0 };
                if (write(st[1], &msg[0], sizeof(msg[0])) < 0 || cmd < 0)
                        _exit(1);
                close(in[0]);
                close(out[1]);
                close(err[1]);
                int status = 0;
                while (waitpid(cmd, &status, 0) < 0 && errno == EINTR)
                        ;
                msg[1] = status;
                if (write(st[1], &msg[1], sizeof(msg[1])) < 0)
                        _exit(1);
                _exit(0);
        }
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
        for (int i = 0; i < NS_COUNT; i++)
                if (ns[i] >= 0)
                        close(ns[i]);
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

static int process_stop(struct backend_sandbox *sb)
{
        if (sb->init <= 0)
                return 0;
        /* Killing a pid namespace's init kills every process in it. */
        kill(sb->init, SIGKILL);
        if (sb->is_child)
                while (waitpid(sb->init, NULL, 0) < 0 && errno == EINTR)
                        ;
        sb->init = 0;
        return 0;
}

/* Copies src's disk into dst's with cp(1), keeping owners, modes and links. */
static int copy_disk(const char *src, const char *dst, char *why, size_t whylen)
{
        char from[PATH_MAX + 16];
        snprintf(from, sizeof(from), "%s/.", src);
        if (mkdir(dst, 0755) < 0 && errno != EEXIST)
                return -errno;
        pid_t p = fork();
        if (p < 0)
                return -errno;
        if (p == 0) {
                int null = open("/dev/null", O_RDWR);
                dup2(null, 0);
                dup2(null, 1);
                execl("/bin/cp", "cp", "-a", "--reflink=auto", from, dst, (char *)NULL);
                _exit(127);
        }
        int status;
        while (waitpid(p, &status, 0) < 0 && errno == EINTR)
                ;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                snprintf(why, whylen, "could not copy the sandbox's disk");
                return -EIO;
        }
        return 0;
}

static int process_fork(struct backend_sandbox *src, const struct sandbox_spec *spec, const struct sandbox_cgroup *cg,
                        const char *dir, struct backend_sandbox **ret, pid_t *ret_pid, bool *ret_processes_copied,
                        char *why, size_t whylen)
{
        char disk[PATH_MAX + 8];
        snprintf(disk, sizeof(disk), "%s/disk", dir);
        int r = copy_disk(src->disk, disk, why, whylen);
        if (r < 0)
                return r;
        char **command = NULL;
        if ((r = read_command_file(src->dir, &command)) < 0 && r != -ENOENT) {
                snprintf(why, whylen, "could not read the source's main program: %s", strerror(-r));
                return r;
        }
        struct sandbox_spec copy = *spec;
        copy.command = command;
        r = process_start(&copy, cg, dir, ret, ret_pid, why, whylen);
        if (command) {
                free(command[0]);
                free(command);
        }
        if (r == 0)
                *ret_processes_copied = false;
        return r;
}

static int process_recover(const struct sandbox_record *rec, const struct sandbox_cgroup *cg, const char *dir,
                           struct backend_sandbox **ret)
{
        /* The pid must still be the sandbox's: alive and in its cgroup. */
        char path[64], buf[4096];
        snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)rec->pid);
        FILE *f = rec->pid > 0 ? fopen(path, "re") : NULL;
        if (!f)
                return -ESRCH;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        char needle[EVENT_ID_MAX + 3];
        snprintf(needle, sizeof(needle), "/%s\n", rec->id);
        if (!strstr(buf, needle))
                return -ESRCH;
        struct backend_sandbox *sb = calloc(1, sizeof(*sb));
        if (!sb)
                return -ENOMEM;
        sb->init = rec->pid;
        sb->is_child = false;
        sb->cg = *cg;
        snprintf(sb->id, sizeof(sb->id), "%s", rec->id);
        snprintf(sb->dir, sizeof(sb->dir), "%s", dir);
        snprintf(sb->disk, sizeof(sb->disk), "%s/disk", dir);
        *ret = sb;
        return 0;
}

static void process_free(struct backend_sandbox *sb)
{
        free(sb);
}

const struct backend_ops process_backend = {
        .name = "process",
        .concurrent_exec = true,
        .available = NULL,
        .start = process_start,
        .exec = process_exec,
        .pause = NULL,
        .resume = NULL,
        .fork = process_fork,
        .stop = process_stop,
        .recover = process_recover,
        .free = process_free,
};
