/* confine.c — see confine.h. */
#include "confine.h"
#include "builder.h"
#include "jail.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define EGRESS_URL "http://127.0.0.1:" JAIL_STR(JAIL_EGRESS_PORT)
#define JAIL_STR(x) JAIL_STR_(x)
#define JAIL_STR_(x) #x

/* Every command's environment; with internet the egress proxy is named in it
 * (the only way out of the sandbox's network namespace). */
static char *sandbox_env[] = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG=C.UTF-8",
        "TERM=dumb",
        "HOME=/work",
        NULL, /* from here: set by use_egress_env() */
        NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        NULL,
};

void use_egress_env(void)
{
        static char *const proxy[] = { "HTTP_PROXY=" EGRESS_URL, "HTTPS_PROXY=" EGRESS_URL, "ALL_PROXY=" EGRESS_URL,
                                       "http_proxy=" EGRESS_URL, "https_proxy=" EGRESS_URL, "all_proxy=" EGRESS_URL,
                                       "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1" };
        for (size_t i = 0; i < sizeof(proxy) / sizeof(proxy[0]); i++)
                sandbox_env[4 + i] = proxy[i];
}

int userns_fd = -1;
static struct sock_fprog filter;    /* the seccomp filter, exported once */

uint32_t take_uid_slot(const char *id)
{
        uint32_t h = 2166136261u;
        for (const char *p = id; *p; p++)
                h = (h ^ (uint8_t)*p) * 16777619u;
        if (mkdir(JAIL_SLOT_DIR, 0700) < 0 && errno != EEXIST)
                fail("could not create %s", JAIL_SLOT_DIR);
        for (uint32_t k = 0; k < JAIL_SLOTS; k++) {
                uint32_t slot = (h + k) % JAIL_SLOTS;
                char lock[64];
                snprintf(lock, sizeof(lock), JAIL_SLOT_DIR "/%u", slot);
                int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
                if (fd < 0)
                        fail("could not open %s", lock);
                if (flock(fd, LOCK_EX | LOCK_NB) == 0)
                        return slot; /* fd stays open (and locked) while this init lives */
                close(fd);
        }
        errno = EAGAIN;
        fail("no free uid range (%u sandboxes hold one each)", JAIL_SLOTS);
}

void make_userns(uint32_t base)
{
        int up[2], down[2];
        if (pipe2(up, O_CLOEXEC) < 0 || pipe2(down, O_CLOEXEC) < 0)
                fail("could not make a pipe");
        pid_t c = fork();
        if (c < 0)
                fail("could not fork");
        if (c == 0) {
                char b = 'x';
                if (unshare(CLONE_NEWUSER) < 0)
                        _exit(1);
                if (write(up[1], &b, 1) != 1 || read(down[0], &b, 1) < 0)
                        _exit(1);
                _exit(0);
        }
        close(up[1]);
        close(down[0]);
        char b, p[64], map[64];
        if (read(up[0], &b, 1) != 1) {
                errno = 0;
                fail("could not create the sandbox's user namespace (user namespaces disabled?)");
        }
        snprintf(map, sizeof(map), "0 %u %u\n", base, JAIL_UID_COUNT);
        snprintf(p, sizeof(p), "/proc/%d/uid_map", (int)c);
        write_file(p, map, 0644);
        snprintf(p, sizeof(p), "/proc/%d/gid_map", (int)c);
        write_file(p, map, 0644);
        snprintf(p, sizeof(p), "/proc/%d/ns/user", (int)c);
        if ((userns_fd = open(p, O_RDONLY | O_CLOEXEC)) < 0)
                fail("could not open the sandbox's user namespace");
        ssize_t w = write(down[1], &b, 1);
        (void)w;
        close(up[0]);
        close(down[1]);
        waitpid(c, NULL, 0);
}

/* Refused with EPERM (ENOSYS for clone3, so libc falls back to clone, whose
 * namespace flags can be checked). Learnt from Docker's default profile: calls
 * that reach the host kernel's global state, load code into it, or leave the
 * namespaces. The user namespace already strips host capabilities; this is
 * the second wall, and it closes what a namespace root could still do. */
static const char *const refused[] = {
        /* file systems: cgroup (release_agent), fuse, anything mountable */
        "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
        "fspick", "mount_setattr",
        /* namespaces: no new user namespace, no joining another */
        "unshare", "setns",
        /* kernel code and the machine */
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "create_module", "reboot",
        "swapon", "swapoff", "acct", "iopl", "ioperm", "syslog", "quotactl", "quotactl_fd", "nfsservctl",
        "lookup_dcookie", "uselib", "_sysctl", "vm86", "vm86old", "get_kernel_syms", "query_module",
        /* clocks */
        "settimeofday", "clock_settime", "clock_settime64", "clock_adjtime", "clock_adjtime64", "adjtimex", "stime",
        /* tracing and bpf, keyrings, file handles (the "shocker" escape), io_uring, userfaultfd */
        "bpf", "perf_event_open", "add_key", "request_key", "keyctl", "open_by_handle_at", "name_to_handle_at",
        "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "fanotify_init",
};

void build_filter(void)
{
        scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
        if (!ctx) {
                errno = ENOMEM;
                fail("could not build the seccomp filter");
        }
        int r = 0;
        for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]) && r == 0; i++) {
                int nr = seccomp_syscall_resolve_name(refused[i]);
                if (nr == __NR_SCMP_ERROR)
                        continue; /* not on this architecture */
                r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
        }
        if (r == 0)
                r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
        static const uint64_t ns_flags[] = { CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWPID,
                                             CLONE_NEWNET, CLONE_NEWUTS, CLONE_NEWIPC };
        for (size_t i = 0; i < sizeof(ns_flags) / sizeof(ns_flags[0]) && r == 0; i++)
                r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                                     SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
        if (r < 0) {
                errno = -r;
                fail("could not build the seccomp filter");
        }
        int mem = memfd_create("seccomp", MFD_CLOEXEC);
        if (mem < 0 || (r = seccomp_export_bpf(ctx, mem)) < 0) {
                errno = mem < 0 ? errno : -r;
                fail("could not export the seccomp filter");
        }
        seccomp_release(ctx);
        off_t len = lseek(mem, 0, SEEK_END);
        struct sock_filter *prog = len > 0 ? malloc((size_t)len) : NULL;
        if (!prog || pread(mem, prog, (size_t)len, 0) != len) {
                errno = EIO;
                fail("could not read the seccomp filter");
        }
        close(mem);
        filter.len = (unsigned short)((size_t)len / sizeof(struct sock_filter));
        filter.filter = prog;
}

/* In a child forked for one command: becomes the sandbox's root (in its user
 * namespace: no host capability), under the filter, and execs argv. stdio is
 * set; every other descriptor is closed. */
_Noreturn void exec_in_jail(char *const argv[])
{
        setsid();
        if (setns(userns_fd, CLONE_NEWUSER) < 0) {
                dprintf(2, "tally: could not enter the sandbox's user namespace: %s\n", strerror(errno));
                _exit(126);
        }
        close_range(3, ~0U, 0);
        if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) {
                dprintf(2, "tally: could not become the sandbox's root: %s\n", strerror(errno));
                _exit(126);
        }
        if (chdir("/work") < 0 && chdir("/") < 0)
                _exit(126);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGCHLD, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) < 0) {
                dprintf(2, "tally: could not load the seccomp filter: %s\n", strerror(errno));
                _exit(126);
        }
        execvpe(argv[0], argv, sandbox_env);
        int e = errno;
        dprintf(2, "tally: could not run %s: %s\n", argv[0], strerror(e));
        _exit(e == ENOENT ? 127 : 126);
}

void drop_capabilities(void)
{
        /* From here the init only forks, kills and reads its descriptors. It keeps
         * what it needs in the sandbox's user namespace as that namespace's owner. */
        struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
        struct __user_cap_data_struct d[2] = { { 0 } };
        if (syscall(SYS_capset, &h, d) < 0)
                fail("could not drop the init's capabilities");
}
