/* tally-sandbox-init — pid 1 of a process sandbox, and the jail it builds.
 *
 * tally-vmm clone()s this program's process into the sandbox's namespaces and
 * cgroup and execs it at once (vmm/sandbox-init/jail.h has the descriptors and
 * the configuration it is given). Being a fresh single-threaded program, it can
 * then use ordinary calls: nothing here runs in a copy of the threaded daemon.
 *
 * As host root, before any sandbox code runs, it builds the jail:
 *   - a per-sandbox uid range (a user namespace, root inside = an unprivileged
 *     uid outside, no capability on the host) whose lock it holds while alive;
 *   - the disk: a size-capped ext4 image on a loop device (or a tmpfs for tiny
 *     disks) mounted at /work, with /tmp on it, so writing past disk_mib is ENOSPC;
 *   - a private root (pivot_root onto a tmpfs): read-only binds of the host's
 *     /usr (and /lib*, /bin, /sbin as they are on the host), a generated /etc,
 *     a minimal /dev, its own /proc over an empty folder, nothing of the state
 *     folder and no vmm socket;
 *   - a cgroup namespace rooted at the sandbox's cgroup (entered after the
 *     daemon put us there), with no cgroup file system mounted;
 *   - a seccomp filter every sandbox process runs under.
 * Then it drops its own capabilities and serves exec requests: each command is
 * forked, joins the user namespace as its root, loads the filter and execs.
 * It also ends the sandbox at its lease (the lease file), whether tally-vmm is
 * up or not.
 *
 * This file is the builder's main flow, in the order the jail needs (its
 * steps are in the files named): the configuration and failures (builder.h),
 * the uid range, user namespace, filter and capabilities (confine.h), the root
 * and its disk (root.h, disk.h, copy.h), the hostname, loopback and cgroup
 * namespace, the pivot, then the exec server and lease (serve.h). Also the
 * --join mode that runs one command in a running sandbox's namespaces. */


#include "builder.h"
#include "confine.h"
#include "jail.h"
#include "root.h"
#include "serve.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int init_main(void)
{
        report_fd = JAIL_FD_READY;
        /* Before anything is opened that could take its number. */
        int listen_fd = fcntl(JAIL_FD_LISTEN, F_GETFD) >= 0 ? JAIL_FD_LISTEN : -1;
        if (listen_fd >= 0)
                fcntl(listen_fd, F_SETFD, FD_CLOEXEC);
        signal(SIGPIPE, SIG_IGN); /* a daemon that hung up must not end the init */
        read_config();
        if (!cfg.id || !cfg.dir || !cfg.disk_bytes)
                fail("incomplete configuration");
        bool network = cfg.network && strcmp(cfg.network, "1") == 0;
        uint64_t disk_bytes = strtoull(cfg.disk_bytes, NULL, 10);
        prctl(PR_SET_NAME, JAIL_INIT_NAME, 0, 0, 0);
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
                fail("could not make the mounts private");

        uint32_t base = JAIL_UID_BASE + take_uid_slot(cfg.id) * JAIL_UID_COUNT;
        char root[PATH_MAX], p[PATH_MAX];
        path(root, sizeof(root), cfg.dir, "root");
        lease_open(cfg.dir);
        int console = -1;
        if (cfg.argv[0]) {
                path(p, sizeof(p), cfg.dir, "console.log");
                if ((console = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)) < 0)
                        fail("could not open the console log");
        }
        make_root(root, disk_bytes, base, network);

        if (sethostname(cfg.id, strlen(cfg.id)) < 0)
                fail("could not set the host name");
        /* Only loopback, and up, so local servers work (and the egress proxy's listener, which
         * tally-vmm may already have brought up). */
        jail_loopback_up();
        if (network)
                use_egress_env();
        /* The daemon has put us in the sandbox's cgroup: that is now "/". */
        if (unshare(CLONE_NEWCGROUP) < 0)
                fail("could not create the cgroup namespace");
        if (chdir(root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0)
                fail("could not pivot to the sandbox's root");
        if (umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
                fail("could not detach the host's root");
        if (mount(NULL, "/", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
                fail("could not make the root read-only");
        make_userns(base);
        build_filter();
        lease_check();

        setsid();
        struct sigaction sa = { .sa_handler = on_sigchld, .sa_flags = SA_NOCLDSTOP };
        sigaction(SIGCHLD, &sa, NULL);
        sigset_t chld, none;
        sigemptyset(&chld);
        sigaddset(&chld, SIGCHLD);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &chld, NULL);
        drop_capabilities();
        if (cfg.argv[0]) {
                pid_t c = fork();
                if (c < 0)
                        fail("could not start the main program");
                if (c == 0) {
                        dup2(console, 1);
                        dup2(console, 2);
                        exec_in_jail(cfg.argv);
                }
                close(console);
        }
        ssize_t w = write(JAIL_FD_READY, "ok", 2);
        (void)w;
        close(JAIL_FD_READY);
        serve(listen_fd, &none);
}

/* ---- join: exec without the init's socket ---- */

/* LeakSanitizer's end-of-process check cannot run once --join is in the
 * sandbox's pid namespace: it clones a tracer to stop and read this process,
 * the clone lands in that namespace, where the tracer's getppid() is 0, not
 * the parent's host pid; it takes this as "parent gone" and exits, and the
 * parent spins in sched_yield() forever waiting for it (the exec never ended:
 * the vmm test's bad-input case hung to its timeout). The mount namespace
 * hides the host's /proc as well. So in a leak-checking build the check runs
 * before the cgroup and the namespaces are entered (the tracer is then no task
 * of the sandbox's pids.max, nor billed to it; the check does not run again at
 * exit), and join_main ends with _exit. */
static void leak_check_on_host(void)
{
#if defined(__SANITIZE_ADDRESS__)
        __lsan_do_leak_check();
#endif
}

static int join_main(void)
{
        report_fd = 2;
        read_config();
        if (!cfg.pid || !cfg.argv[0])
                fail("tally: incomplete configuration");
        if (cfg.network && strcmp(cfg.network, "1") == 0)
                use_egress_env();
        fcntl(JAIL_FD_STATUS, F_SETFD, FD_CLOEXEC);
        char num[24];
        snprintf(num, sizeof(num), "%d", (int)getpid());
        leak_check_on_host();
        for (int i = 0; i < cfg.ncgroups; i++) {
                char p[PATH_MAX + 16];
                snprintf(p, sizeof(p), "%s/cgroup.procs", cfg.cgroups[i]);
                int fd = open(p, O_WRONLY | O_CLOEXEC);
                if (fd < 0 || write(fd, num, strlen(num)) < 0)
                        fail("tally: could not enter the sandbox's cgroup");
                close(fd);
        }
        /* The user namespace: the one the init holds a descriptor of. */
        char dirpath[64];
        snprintf(dirpath, sizeof(dirpath), "/proc/%s/fd", cfg.pid);
        for (int fd = 0; fd < 64 && userns_fd < 0; fd++) {
                char link[96], target[64];
                snprintf(link, sizeof(link), "%s/%d", dirpath, fd);
                ssize_t n = readlink(link, target, sizeof(target) - 1);
                if (n > 0 && (target[n] = '\0', strncmp(target, "user:[", 6) == 0))
                        userns_fd = open(link, O_RDONLY | O_CLOEXEC);
        }
        if (userns_fd < 0)
                fail("tally: could not find the sandbox's user namespace");
        static const char *const ns[] = { "ipc", "uts", "net", "cgroup", "pid", "mnt" }; /* mnt last: it moves the root */
        for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
                char p[64];
                snprintf(p, sizeof(p), "/proc/%s/ns/%s", cfg.pid, ns[i]);
                int fd = open(p, O_RDONLY | O_CLOEXEC);
                if (fd < 0 || setns(fd, 0) < 0)
                        fail("tally: could not enter the sandbox's %s namespace", ns[i]);
                close(fd);
        }
        build_filter();
        pid_t c = fork();
        if (c == 0)
                exec_in_jail(cfg.argv);
        int msg[2] = { c, 0 };
        if (write(JAIL_FD_STATUS, &msg[0], sizeof(msg[0])) < 0 || c < 0)
                _exit(1);
        close(0);
        close(1);
        close(2);
        while (waitpid(c, &msg[1], 0) < 0 && errno == EINTR)
                ;
        if (write(JAIL_FD_STATUS, &msg[1], sizeof(msg[1])) < 0)
                _exit(1);
        _exit(0); /* no exit handlers inside the sandbox's namespaces: see leak_check_on_host */
}

int main(int argc, char **argv)
{
        if (argc > 1 && strcmp(argv[1], "--join") == 0)
                return join_main();
        return init_main();
}
