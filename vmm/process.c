/* process.c — the process backend's operation table (see process.h) and
 * the operations short enough to need no file of their own: stop, fork,
 * the lease, recovery after a restart.
 *
 * The backend's parts (process_sandbox.h): process_spawn.c starts a
 * sandbox's init in its namespaces and cgroup, process_exec.c runs a command
 * in it, process_files.c keeps the files it leaves in the sandbox's folder. */
#include "process.h"
#include "jail.h"
#include "process_sandbox.h"
#include "registry.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

void exec_result_clear(struct exec_result *r)
{
        if (!r)
                return;
        free(r->out);
        free(r->err);
        memset(r, 0, sizeof(*r));
}

static int process_start(const struct sandbox_spec *spec, const struct sandbox_cgroup *cg, const char *dir,
                         struct backend_sandbox **ret, pid_t *ret_pid, char *why, size_t whylen)
{
        return process_start_init(spec, cg, dir, NULL, ret, ret_pid, why, whylen);
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
        if ((r = process_read_command(src->dir, &command)) < 0 && r != -ENOENT) {
                snprintf(why, whylen, "could not read the source's main program: %s", strerror(-r));
                return r;
        }
        struct sandbox_spec copy = *spec;
        copy.command = command;
        r = process_start_init(&copy, cg, dir, src, ret, ret_pid, why, whylen);
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
        int r = process_write_lease(sb->dir, deadline_wall_ns);
        if (r < 0)
                return r;
        struct sockaddr_un a;
        if (!process_init_socket_path(sb->dir, &a))
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
