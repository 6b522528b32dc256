/* process_spawn.c — starts a process sandbox's init (see process_sandbox.h).
 *
 * The daemon clone()s the sandbox's init into new pid, mount, uts, ipc and
 * net namespaces (the net one always: loopback alone, egress only through
 * the daemon's proxy, egress.h); the clone child waits on a pipe until the
 * daemon has written its pid into every folder of the cgroup, so not one
 * instruction of the sandbox runs outside it, then execs tally-sandbox-init
 * (vmm/sandbox-init/), which builds the jail and answers "ok" (or why not)
 * on its ready pipe.
 *
 * Code between clone and exec runs in a copy of a threaded process, so it
 * makes system calls only: no malloc, no stdio, no locks (a malloc lock held by
 * another thread at the clone hung the old in-daemon init for good). Everything
 * it needs is prepared before the clone; the jail itself is built after exec. */
#include "jail.h"
#include "process_sandbox.h"

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
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define INIT_STACK_SIZE (64 * 1024)
#define INIT_READY_TIMEOUT_MS 60000 /* making and mounting a large disk included */

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

const char *process_init_program(void)
{
        pthread_once(&init_path_once, find_init_path);
        return init_path[0] ? init_path : NULL;
}

bool process_available(char *why, size_t whylen)
{
        if (process_init_program())
                return true;
        snprintf(why, whylen, "the process backend needs %s beside tally-vmm (or at %s)", JAIL_INIT_NAME,
                 SANDBOX_INIT_INSTALL_PATH);
        return false;
}

int process_jail_config(const char *const *keys, size_t nkeys, char *const *argv)
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

int process_place_fds(const int *from, const int *to, int n)
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

void process_say(int fd, const char *s)
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
        if (process_place_fds(a->fds, to, 3) < 0) {
                process_say(a->fds[0], "could not pass descriptors to " JAIL_INIT_NAME);
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
        process_say(JAIL_FD_READY, "could not run " JAIL_INIT_NAME);
        _exit(127);
}

/* The init's exec socket, <dir>/init.sock; -1 (exec then joins the namespaces
 * itself) if the path is too long for a unix socket or it cannot be made. */
static int open_init_socket(const char *dir)
{
        struct sockaddr_un a;
        if (!process_init_socket_path(dir, &a))
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

/* What one start holds until the init answered: the pipes, the init's exec
 * socket and configuration (the init keeps its copies), the clone's stack. */
struct init_start {
        int sync[2];                 /* the daemon writes a byte once the child is in the cgroup */
        int ready[2];                /* the init's "ok" or why not, then end of file */
        int listen_fd;
        int config;
        char *stack;
        pid_t pid;                   /* the init, once cloned */
};

/* The files the init and a later fork read, and the cgroup's pids.max. */
static int prepare_files(const struct sandbox_spec *spec, const struct sandbox_cgroup *cg, const char *dir,
                         char *why, size_t whylen)
{
        int r;
        if ((r = process_write_command(dir, spec->command)) < 0) {
                snprintf(why, whylen, "could not record the main program: %s", strerror(-r));
                return r;
        }
        uint64_t pids_max = spec->pids_max ? spec->pids_max : JAIL_PIDS_MAX_DEFAULT;
        if ((r = cgroup_set_pids_max(cg, pids_max)) < 0) {
                snprintf(why, whylen, "could not set the sandbox's pids.max (is the pids controller there?): %s",
                         strerror(-r));
                return r;
        }
        if ((r = process_write_lease(dir, process_start_deadline(spec, dir))) < 0) {
                snprintf(why, whylen, "could not write the sandbox's lease: %s", strerror(-r));
                return r;
        }
        return 0;
}

/* The jail's configuration for the init of spec (sandbox-init/jail.h). */
static int init_config(const struct sandbox_spec *spec, const char *dir, const struct backend_sandbox *copy_from,
                       char *why, size_t whylen)
{
        char k_id[EVENT_ID_MAX + 8], k_dir[PATH_MAX + 8], k_disk[48], k_net[16], k_copy[32];
        char k_copy_id[EVENT_ID_MAX + 16];
        snprintf(k_id, sizeof(k_id), "id=%s", spec->id);
        snprintf(k_dir, sizeof(k_dir), "dir=%s", dir);
        snprintf(k_disk, sizeof(k_disk), "disk_bytes=%" PRIu64, spec->disk_bytes);
        snprintf(k_net, sizeof(k_net), "network=%d", spec->internet ? 1 : 0);
        snprintf(k_copy, sizeof(k_copy), "copy_from=%d", copy_from ? (int)copy_from->init : 0);
        snprintf(k_copy_id, sizeof(k_copy_id), "copy_from_id=%s", copy_from ? copy_from->id : "");
        const char *keys[] = { k_id, k_dir, k_disk, k_net, k_copy, k_copy_id };
        int config = process_jail_config(keys, 6, spec->command);
        if (config < 0)
                snprintf(why, whylen, "could not pass the jail's configuration: %s", strerror(-config));
        return config;
}

/* Clones the init into its namespaces; it waits on s->sync before it execs. */
static int clone_init(struct init_start *s, const char *init, const char *dir, char *why, size_t whylen)
{
        if (pipe2(s->sync, O_CLOEXEC) < 0 || pipe2(s->ready, O_CLOEXEC) < 0 || !(s->stack = malloc(INIT_STACK_SIZE)))
                return errno ? -errno : -ENOMEM;
        s->listen_fd = open_init_socket(dir);
        struct clone_args args = { s->sync[0], { s->ready[1], s->listen_fd, s->config }, init };
        int flags = CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET;
        s->pid = clone(clone_child, s->stack + INIT_STACK_SIZE, flags | SIGCHLD, &args);
        if (s->pid < 0) {
                int r = -errno;
                snprintf(why, whylen, "could not create the sandbox's namespaces: %s", strerror(-r));
                return r;
        }
        close(s->sync[0]);
        close(s->ready[1]);
        s->sync[0] = s->ready[1] = -1;
        if (s->listen_fd >= 0)
                close(s->listen_fd); /* the init keeps its copy */
        close(s->config);
        s->listen_fd = s->config = -1;
        return 0;
}

/* Puts the init into its cgroup, then lets it run. */
static int release_init(struct init_start *s, const struct sandbox_cgroup *cg, char *why, size_t whylen)
{
        int r = cgroup_enter(cg, s->pid);
        if (r < 0) {
                snprintf(why, whylen, "could not move the sandbox into its cgroup: %s", strerror(-r));
                return r;
        }
        if (write(s->sync[1], "g", 1) != 1)
                return -errno;
        close(s->sync[1]);
        s->sync[1] = -1;
        return 0;
}

/* Waits for the init's answer on fd: "ok" once its jail is built. The init
 * closes its end after "ok" or its reason: read to the end of file. */
static int wait_init_ready(int fd, char *why, size_t whylen)
{
        char reply[600];
        ssize_t n = 0;
        for (;;) {
                struct pollfd p = { fd, POLLIN, 0 };
                int pr = poll(&p, 1, INIT_READY_TIMEOUT_MS);
                if (pr < 0 && errno == EINTR)
                        continue;
                ssize_t m = pr == 1 ? read(fd, reply + n, sizeof(reply) - 1 - (size_t)n) : -1;
                if (m <= 0)
                        break;
                n += m;
                if ((size_t)n == sizeof(reply) - 1)
                        break;
        }
        if (n == 2 && memcmp(reply, "ok", 2) == 0)
                return 0;
        if (n > 0) {
                reply[n] = '\0';
                snprintf(why, whylen, "could not build the sandbox's jail: %s", reply);
        } else {
                snprintf(why, whylen, "the sandbox's init did not start");
        }
        return -EIO;
}

/* Releases what the start held; on failure (r < 0) the init is killed and reaped too. */
static void init_start_clear(struct init_start *s, int r)
{
        if (r < 0 && s->pid > 0) {
                kill(s->pid, SIGKILL);
                waitpid(s->pid, NULL, 0);
        }
        for (int i = 0; i < 2; i++) {
                if (s->sync[i] >= 0)
                        close(s->sync[i]);
                if (s->ready[i] >= 0)
                        close(s->ready[i]);
        }
        if (s->listen_fd >= 0)
                close(s->listen_fd);
        if (s->config >= 0)
                close(s->config);
        free(s->stack);
}

int process_start_init(const struct sandbox_spec *spec, const struct sandbox_cgroup *cg, const char *dir,
                       const struct backend_sandbox *copy_from, struct backend_sandbox **ret, pid_t *ret_pid,
                       char *why, size_t whylen)
{
        if (spec->image && *spec->image) {
                snprintf(why, whylen, "the process backend has no images (its root holds the host's /usr, read-only) "
                         "(image \"%.64s\"); use the qemu backend", spec->image);
                return -EINVAL;
        }
        const char *init = process_init_program();
        if (!init) {
                process_available(why, whylen);
                return -ENOENT;
        }
        struct backend_sandbox *sb = calloc(1, sizeof(*sb));
        if (!sb)
                return -ENOMEM;
        sb->cg = *cg;
        sb->internet = spec->internet;
        sb->is_child = true;
        snprintf(sb->id, sizeof(sb->id), "%s", spec->id);
        snprintf(sb->dir, sizeof(sb->dir), "%s", dir);
        struct init_start s = { .sync = { -1, -1 }, .ready = { -1, -1 }, .listen_fd = -1, .config = -1, .pid = -1 };
        int r = prepare_files(spec, cg, dir, why, whylen);
        if (r >= 0 && (r = s.config = init_config(spec, dir, copy_from, why, whylen)) >= 0 &&
            (r = clone_init(&s, init, dir, why, whylen)) >= 0 && (r = release_init(&s, cg, why, whylen)) >= 0)
                r = wait_init_ready(s.ready[0], why, whylen);
        init_start_clear(&s, r);
        if (r < 0) {
                free(sb);
                return r;
        }
        sb->init = s.pid;
        *ret = sb;
        *ret_pid = s.pid;
        return 0;
}
