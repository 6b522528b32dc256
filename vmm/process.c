/* process.c — the process backend (see process.h).
 *
 * Start: the daemon clone()s the sandbox's init into new pid, mount, uts, ipc
 * and net namespaces (the net one always: loopback alone, egress only through
 * the daemon's proxy, egress.h); the clone child waits on a pipe until
 * the daemon has written its pid into every folder of the cgroup, so not one
 * instruction of the sandbox runs outside it, then execs tally-sandbox-init
 * (vmm/sandbox-init/), which builds the jail and serves exec requests.
 * Exec: the init forks the command on request (its exec socket), so the
 * command starts inside the jail and the cgroup. Without that socket a forked
 * helper execs tally-sandbox-init --join, which enters the cgroup and the
 * namespaces and runs the command in the jail.
 *
 * Code between fork/clone and exec runs in a copy of a threaded process, so it
 * makes system calls only: no malloc, no stdio, no locks (a malloc lock held by
 * another thread at the clone hung the old in-daemon init for good). Everything
 * it needs is prepared before the clone; the jail itself is built after exec. */
#include "process.h"
#include "jail.h"
#include "log.h"
#include "registry.h"
#include "spec.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define INIT_STACK_SIZE (64 * 1024)
#define COMMAND_FILE "command"   /* the main program's argv, NUL-separated, for fork after a restart */
#define INIT_REQUEST_MAX (SPEC_COMMAND_BYTES_MAX + 64)
#define INIT_READY_TIMEOUT_MS 60000 /* making and mounting a large disk included */

struct backend_sandbox {
        pid_t init;                  /* the sandbox's pid 1, as this host sees it */
        bool is_child;               /* init is this daemon's child (reaped on stop) */
        bool internet;               /* the init sets the egress proxy in commands' environment */
        struct sandbox_cgroup cg;
        char id[EVENT_ID_MAX + 1];
        char dir[PATH_MAX];
};

void exec_result_clear(struct exec_result *r)
{
        if (!r)
                return;
        free(r->out);
        free(r->err);
        memset(r, 0, sizeof(*r));
}

/* ---- finding tally-sandbox-init ---- */

static pthread_once_t init_path_once = PTHREAD_ONCE_INIT;
static char init_path[PATH_MAX];

static void find_init_path(void)
{
        const char *env = getenv("TALLY_SANDBOX_INIT");
        if (env && *env && access(env, X_OK) == 0) {
                snprintf(init_path, sizeof(init_path), "%s", env);
                return;
        }
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (n > 0) {
                self[n] = '\0';
                char beside[PATH_MAX + 32];
                snprintf(beside, sizeof(beside), "%s/" JAIL_INIT_NAME, dirname(self));
                if (access(beside, X_OK) == 0 && strlen(beside) < sizeof(init_path)) {
                        snprintf(init_path, sizeof(init_path), "%s", beside);
                        return;
                }
        }
        static const char *const known[] = { SANDBOX_INIT_BUILD_PATH, SANDBOX_INIT_INSTALL_PATH };
        for (size_t i = 0; i < 2; i++)
                if (access(known[i], X_OK) == 0) {
                        snprintf(init_path, sizeof(init_path), "%s", known[i]);
                        return;
                }
}

/* The init program's path, or NULL if it is nowhere to be found. */
static const char *sandbox_init_path(void)
{
        pthread_once(&init_path_once, find_init_path);
        return init_path[0] ? init_path : NULL;
}

static bool process_available(char *why, size_t whylen)
{
        if (sandbox_init_path())
                return true;
        snprintf(why, whylen, "the process backend needs %s beside tally-vmm (or at %s)", JAIL_INIT_NAME,
                 SANDBOX_INIT_INSTALL_PATH);
        return false;
}

/* The jail's configuration (jail.h): NUL-terminated strings in a memfd the
 * init reads. keys[] are "key=value"; argv may be NULL. Returns the fd. */
static int make_config(const char *const *keys, size_t nkeys, char *const *argv)
{
        int fd = memfd_create("tally-jail", MFD_CLOEXEC);
        if (fd < 0)
                return -errno;
        FILE *f = fdopen(dup(fd), "we");
        if (!f) {
                int e = errno;
                close(fd);
                return -e;
        }
        for (size_t i = 0; i < nkeys; i++)
                fwrite(keys[i], 1, strlen(keys[i]) + 1, f);
        fwrite("--", 1, 3, f);
        for (char *const *a = argv; a && *a; a++)
                fwrite(*a, 1, strlen(*a) + 1, f);
        if (fclose(f) != 0) {
                int e = errno;
                close(fd);
                return -e;
        }
        return fd;
}

/* In a child of the threaded daemon: puts from[i] at descriptor to[i] (from -1:
 * closed), /dev/null at 0-2 unless given, closes the rest. Syscalls only. */
static int place_fds(const int *from, const int *to, int n)
{
        int high[8];
        for (int i = 0; i < n; i++)
                if ((high[i] = from[i] >= 0 ? fcntl(from[i], F_DUPFD, 16) : -1) < 0 && from[i] >= 0)
                        return -1;
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        for (int t = 0; t < 3; t++) {
                bool given = false;
                for (int i = 0; i < n; i++)
                        given |= to[i] == t;
                if (!given && null >= 0)
                        dup2(null, t);
        }
        for (int i = 0; i < n; i++) {
                if (high[i] >= 0) {
                        if (dup2(high[i], to[i]) < 0)
                                return -1;
                } else {
                        close(to[i]);
                }
        }
        close_range(JAIL_FD_CONFIG + 1, ~0U, 0);
        return 0;
}

static void write_str(int fd, const char *s)
{
        ssize_t r = write(fd, s, strlen(s));
        (void)r;
}

struct clone_args {
        int sync_r;                  /* the daemon writes a byte once the child is in the cgroup */
        int fds[3];                  /* ready, listen (or -1), config */
        const char *path;
};

/* The clone child: in the copy of the threaded daemon, system calls only. */
static int clone_child(void *arg)
{
        struct clone_args *a = arg;
        char byte;
        if (read(a->sync_r, &byte, 1) != 1)
                _exit(1); /* the daemon gave up before the cgroup held us */
        static const int to[3] = { JAIL_FD_READY, JAIL_FD_LISTEN, JAIL_FD_CONFIG };
        if (place_fds(a->fds, to, 3) < 0) {
                write_str(a->fds[0], "could not pass descriptors to " JAIL_INIT_NAME);
                _exit(1);
        }
        /* tally-vmm blocks SIGINT and SIGTERM in every thread (it waits for them
         * with sigwaitinfo); a blocked mask survives exec, so clear it. */
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        char *const argv[] = { (char *)JAIL_INIT_NAME, NULL };
        char *const envp[] = { NULL };
        execve(a->path, argv, envp);
        write_str(JAIL_FD_READY, "could not run " JAIL_INIT_NAME);
        _exit(127);
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


/* The lease file: a fixed-width decimal so that rewriting it in place (the
 * init keeps it open) never leaves a shorter number behind. */
static int write_lease(const char *dir, int64_t deadline_wall_ns)
{
        char path[PATH_MAX + 16], text[32];
        snprintf(path, sizeof(path), "%s/" JAIL_LEASE_FILE, dir);
        int n = snprintf(text, sizeof(text), "%020lld\n", (long long)(deadline_wall_ns > 0 ? deadline_wall_ns : 0));
        int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        int r = pwrite(fd, text, (size_t)n, 0) == n ? 0 : -EIO;
        if (close(fd) < 0 && r == 0)
                r = -errno;
        return r;
}

/* The deadline the daemon recorded before start. The daemon's spec carries it
 * when it fills lease_deadline_wall_ns; until then, read from the record
 * (dir is <state_dir>/vmm/<id>). 0 if unknown. */
static int64_t start_deadline(const struct sandbox_spec *spec, const char *dir)
{
        if (spec->lease_deadline_wall_ns > 0)
                return spec->lease_deadline_wall_ns;
        char state[PATH_MAX];
        snprintf(state, sizeof(state), "%s", dir);
        for (int up = 0; up < 2; up++) {
                char *slash = strrchr(state, '/');
                if (!slash || slash == state)
                        return 0;
                *slash = '\0';
        }
        struct sandbox_record rec;
        if (registry_read(state, spec->id, &rec) < 0)
                return 0;
        int64_t deadline = rec.timeout_ns;
        sandbox_record_clear(&rec);
        return deadline;
}

/* Starts an init for spec; copy_from is a running sandbox whose disk is
 * copied in (fork), or NULL. */
static int start_init(const struct sandbox_spec *spec, const struct sandbox_cgroup *cg, const char *dir,
                      const struct backend_sandbox *copy_from, struct backend_sandbox **ret, pid_t *ret_pid,
                      char *why, size_t whylen)
{
        struct backend_sandbox *sb = calloc(1, sizeof(*sb));
        char *stack = NULL;
        int sync[2] = { -1, -1 }, ready[2] = { -1, -1 }, listen_fd = -1, config = -1;
        pid_t pid = -1;
        int r;
        if (spec->image && *spec->image) {
                snprintf(why, whylen, "the process backend has no images (its root holds the host's /usr, read-only) "
                         "(image \"%.64s\"); use the qemu backend", spec->image);
                free(sb);
                return -EINVAL;
        }
        if (!sb)
                return -ENOMEM;
        const char *init = sandbox_init_path();
        if (!init) {
                process_available(why, whylen);
                free(sb);
                return -ENOENT;
        }
        sb->cg = *cg;
        sb->internet = spec->internet;
        sb->is_child = true;
        snprintf(sb->id, sizeof(sb->id), "%s", spec->id);
        snprintf(sb->dir, sizeof(sb->dir), "%s", dir);
        if ((r = write_command_file(dir, spec->command)) < 0) {
                snprintf(why, whylen, "could not record the main program: %s", strerror(-r));
                goto fail;
        }
        uint64_t pids_max = spec->pids_max ? spec->pids_max : JAIL_PIDS_MAX_DEFAULT;
        if ((r = cgroup_set_pids_max(cg, pids_max)) < 0) {
                snprintf(why, whylen, "could not set the sandbox's pids.max (is the pids controller there?): %s",
                         strerror(-r));
                goto fail;
        }
        if ((r = write_lease(dir, start_deadline(spec, dir))) < 0) {
                snprintf(why, whylen, "could not write the sandbox's lease: %s", strerror(-r));
                goto fail;
        }
        char k_id[EVENT_ID_MAX + 8], k_dir[PATH_MAX + 8], k_disk[48], k_net[16], k_copy[32];
        char k_copy_id[EVENT_ID_MAX + 16];
        snprintf(k_id, sizeof(k_id), "id=%s", spec->id);
        snprintf(k_dir, sizeof(k_dir), "dir=%s", dir);
        snprintf(k_disk, sizeof(k_disk), "disk_bytes=%" PRIu64, spec->disk_bytes);
        snprintf(k_net, sizeof(k_net), "network=%d", spec->internet ? 1 : 0);
        snprintf(k_copy, sizeof(k_copy), "copy_from=%d", copy_from ? (int)copy_from->init : 0);
        snprintf(k_copy_id, sizeof(k_copy_id), "copy_from_id=%s", copy_from ? copy_from->id : "");
        const char *keys[] = { k_id, k_dir, k_disk, k_net, k_copy, k_copy_id };
        if ((config = make_config(keys, 6, spec->command)) < 0) {
                r = config;
                snprintf(why, whylen, "could not pass the jail's configuration: %s", strerror(-r));
                goto fail;
        }
        if (pipe2(sync, O_CLOEXEC) < 0 || pipe2(ready, O_CLOEXEC) < 0 || !(stack = malloc(INIT_STACK_SIZE))) {
                r = errno ? -errno : -ENOMEM;
                goto fail;
        }
        listen_fd = open_init_socket(dir);
        struct clone_args args = { sync[0], { ready[1], listen_fd, config }, init };
        int flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET;
        pid = clone(clone_child, stack + INIT_STACK_SIZE, flags | SIGCHLD, &args);
        if (pid < 0) {
                r = -errno;
                snprintf(why, whylen, "could not create the sandbox's namespaces: %s", strerror(-r));
                goto fail;
        }
        close(sync[0]);
        close(ready[1]);
        sync[0] = ready[1] = -1;
        if (listen_fd >= 0)
                close(listen_fd); /* the init keeps its copy */
        close(config);
        listen_fd = config = -1;
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
        char reply[600];
        ssize_t n = 0;
        for (;;) {
                struct pollfd p = { ready[0], POLLIN, 0 };
                int pr = poll(&p, 1, INIT_READY_TIMEOUT_MS);
                if (pr < 0 && errno == EINTR)
                        continue;
                ssize_t m = pr == 1 ? read(ready[0], reply + n, sizeof(reply) - 1 - (size_t)n) : -1;
                if (m <= 0)
                        break;
                n += m;
                if ((size_t)n == sizeof(reply) - 1)
                        break;
        }
        if (n != 2 || memcmp(reply, "ok", 2) != 0) {
                if (n > 0) {
                        reply[n] = '\0';
                        snprintf(why, whylen, "could not build the sandbox's jail: %s", reply);
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
        if (listen_fd >= 0)
                close(listen_fd);
        if (config >= 0)
                close(config);
        free(stack);
        free(sb);
        return r;
}

static int process_start(const struct sandbox_spec *spec, const struct sandbox_cgroup *cg, const char *dir,
                         struct backend_sandbox **ret, pid_t *ret_pid, char *why, size_t whylen)
{
        return start_init(spec, cg, dir, NULL, ret, ret_pid, why, whylen);
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

static int process_exec(struct backend_sandbox *sb, const struct exec_request *req, struct exec_result *ret,
                        char *why, size_t whylen)
{
        int config = -1, in[2] = { -1, -1 }, out[2] = { -1, -1 }, err[2] = { -1, -1 }, st[2] = { -1, -1 };
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
        const char *init = sandbox_init_path();
        if (!init || kill(sb->init, 0) < 0) {
                r = init ? -ESRCH : -ENOENT;
                snprintf(why, whylen, init ? "the sandbox's init is gone" : "%s is missing", JAIL_INIT_NAME);
                goto out;
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
        if ((config = make_config(keys, 2 + sb->cg.ndirs, req->argv)) < 0) {
                r = config;
                config = -1;
                goto out;
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
                /* In the copy of the threaded daemon: system calls only, then exec. */
                const int from[5] = { in[0], out[1], err[1], st[1], config };
                static const int to[5] = { 0, 1, 2, JAIL_FD_STATUS, JAIL_FD_CONFIG };
                if (place_fds(from, to, 5) < 0)
                        _exit(126);
                sigset_t none; /* the daemon's blocked signals survive exec */
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                char *const argv[] = { (char *)JAIL_INIT_NAME, (char *)"--join", NULL };
                char *const envp[] = { NULL };
                execve(init, argv, envp);
                write_str(2, "tally: could not run " JAIL_INIT_NAME "\n");
                _exit(126);
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
        if (config >= 0)
                close(config);
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

/* The copy's init copies the source's /work into its own disk (as host root,
 * before its jail closes and before its main program runs), moving the files
 * into its own uid range. */
static int process_fork(struct backend_sandbox *src, const struct sandbox_spec *spec, const struct sandbox_cgroup *cg,
                        const char *dir, struct backend_sandbox **ret, pid_t *ret_pid, bool *ret_processes_copied,
                        char *why, size_t whylen)
{
        char **command = NULL;
        int r;
        if ((r = read_command_file(src->dir, &command)) < 0 && r != -ENOENT) {
                snprintf(why, whylen, "could not read the source's main program: %s", strerror(-r));
                return r;
        }
        struct sandbox_spec copy = *spec;
        copy.command = command;
        r = start_init(&copy, cg, dir, src, ret, ret_pid, why, whylen);
        if (command) {
                free(command[0]);
                free(command);
        }
        if (r == 0)
                *ret_processes_copied = false;
        return r;
}

/* Writes the deadline where the init reads it, then tells the init to read
 * it now (without waiting: the sandbox may be frozen; a frozen init reads it
 * when thawed, and its timer, if it fired meanwhile, makes it read it too). */
static int process_set_lease(struct backend_sandbox *sb, int64_t deadline_wall_ns)
{
        int r = write_lease(sb->dir, deadline_wall_ns);
        if (r < 0)
                return r;
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        if (snprintf(a.sun_path, sizeof(a.sun_path), "%s/init.sock", sb->dir) >= (int)sizeof(a.sun_path))
                return 0;
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return 0;
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
                ssize_t n = send(fd, JAIL_LEASE_REQUEST, sizeof(JAIL_LEASE_REQUEST), MSG_NOSIGNAL);
                (void)n;
        }
        close(fd);
        return 0;
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
        /* Only a sandbox with internet has network counters (the egress proxy's). */
        char net[PATH_MAX + 16];
        snprintf(net, sizeof(net), "%s/" SANDBOX_NET_FILE, dir);
        sb->internet = access(net, F_OK) == 0;
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
        .available = process_available,
        .start = process_start,
        .exec = process_exec,
        .pause = NULL,
        .resume = NULL,
        .fork = process_fork,
        .stop = process_stop,
        .recover = process_recover,
        .set_lease = process_set_lease,
        .free = process_free,
};
