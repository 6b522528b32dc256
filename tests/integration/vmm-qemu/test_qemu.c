/* test_qemu.c — boots one real microVM under TCG inside a real cgroup this
 * test creates, and checks what the qemu backend promises: QEMU and all its
 * threads are in the cgroup from the start (boot CPU is counted there, and the
 * count agrees with the kernel's own per-process accounting), commands run in
 * the guest with their exit code, output, stdin, caps and timeouts, a QMP
 * pause stops CPU from accruing, a copy (fork) carries on the VM's processes
 * in its own cgroup, stop ends QEMU and the counter survives it.
 * The VM is started by a process that exits at once and is taken over by
 * this one (qemu_vm_attach), as a restarted daemon would.
 * Bad input is refused without leaving a process behind.
 *
 * The jail (docs/qemu.md "The jail"), read from the kernel's view of the
 * running QEMU: its uid, gid, capabilities, no_new_privs and seccomp mode
 * in /proc/PID/status, its namespaces, every mount it can see, what its root
 * does and does not hold, the descriptors it has, and who can reach its
 * sockets. Then the cgroup and resource attacks of the sandbox-escape suite
 * that apply to a VM, run from inside the guest: leaving the cgroup (the
 * guest mounts and writes a cgroup tree of its own), forking a hundred
 * processes, flooding the console to fill the host's disk; after each, every
 * QEMU thread is still in the sandbox's cgroup, the cgroup's limit is what
 * the host set, and at the end all the CPU QEMU used (its rusage, from the
 * kernel when it is reaped) is the cgroup's counter.
 *
 * Every call that fails fails the test: a check is never skipped because the
 * command it checks could not run. */
#include "qemu.h"
#include "support.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <grp.h>
#include <time.h>
#include <unistd.h>

#define CGROOT "/sys/fs/cgroup"
/* docs/qemu.md: QEMU's uid and gid are 2,100,000,000 plus its pid. */
#define JAIL_UID_BASE 2100000000ul
/* The console log cap the test asks for (the default is 16 MiB). */
#define TEST_LOG_MAX (256u << 10)

/* A cgroup of the test's: v1 folders in cpuacct and memory, or one v2 folder. */
static bool v2;
struct test_cgroup {
        char name[128];
        char cpu[512];
        char mem[512];
        char procs_cpu[600];
        char procs_mem[600];
        const char *files[3];        /* what QEMU's pid is written into */
};

static int write_file(const char *path, const char *value)
{
        FILE *f = fopen(path, "we");
        if (!f)
                return -errno;
        int r = fputs(value, f) < 0 ? -EIO : 0;
        if (fclose(f) != 0 && r == 0)
                r = -errno;
        return r;
}

static void cgroup_setup(struct test_cgroup *cg, const char *what)
{
        snprintf(cg->name, sizeof(cg->name), "tally-test-vmm-qemu-%d-%s", (int)getpid(), what);
        v2 = access(CGROOT "/cgroup.controllers", F_OK) == 0;
        if (v2) {
                snprintf(cg->cpu, sizeof(cg->cpu), CGROOT "/%s", cg->name);
                snprintf(cg->mem, sizeof(cg->mem), "%s", cg->cpu);
                if (mkdir(cg->cpu, 0755) < 0) {
                        fprintf(stderr, "FAIL: cannot create cgroup %s: %s (the test needs root and cgroups)\n", cg->cpu,
                                strerror(errno));
                        exit(1);
                }
        } else {
                snprintf(cg->cpu, sizeof(cg->cpu), CGROOT "/cpuacct/%s", cg->name);
                snprintf(cg->mem, sizeof(cg->mem), CGROOT "/memory/%s", cg->name);
                if (mkdir(cg->cpu, 0755) < 0 || mkdir(cg->mem, 0755) < 0) {
                        fprintf(stderr, "FAIL: cannot create cgroups %s, %s: %s (the test needs root and cgroup v1 "
                                        "cpuacct and memory)\n", cg->cpu, cg->mem, strerror(errno));
                        rmdir(cg->cpu);
                        exit(1);
                }
        }
        char p[600];
        snprintf(p, sizeof(p), "%s/%s", cg->mem, v2 ? "memory.max" : "memory.limit_in_bytes");
        CHECK(write_file(p, "805306368") == 0, "could not set %s", p);
        snprintf(cg->procs_cpu, sizeof(cg->procs_cpu), "%s/cgroup.procs", cg->cpu);
        snprintf(cg->procs_mem, sizeof(cg->procs_mem), "%s/cgroup.procs", cg->mem);
        cg->files[0] = cg->procs_cpu;
        cg->files[1] = v2 ? NULL : cg->procs_mem;
        cg->files[2] = NULL;
}

static void cgroup_teardown(const struct test_cgroup *cg)
{
        CHECK(rmdir(cg->cpu) == 0 || errno == ENOENT, "could not remove %s: %s", cg->cpu, strerror(errno));
        if (!v2)
                CHECK(rmdir(cg->mem) == 0 || errno == ENOENT, "could not remove %s: %s", cg->mem, strerror(errno));
}

/* The cgroup's CPU counter in ns, read from the kernel's files. */
static uint64_t cgroup_cpu_ns(const struct test_cgroup *cg)
{
        char p[600];
        if (!v2) {
                snprintf(p, sizeof(p), "%s/cpuacct.usage", cg->cpu);
                char *s = test_read_file(p);
                uint64_t v = s ? strtoull(s, NULL, 10) : 0;
                free(s);
                return v;
        }
        snprintf(p, sizeof(p), "%s/cpu.stat", cg->cpu);
        char *s = test_read_file(p);
        uint64_t v = 0;
        char *u = s ? strstr(s, "usage_usec ") : NULL;
        if (u)
                v = strtoull(u + 11, NULL, 10) * 1000;
        free(s);
        return v;
}

/* CPU the kernel charged to process pid itself (all threads, utime + stime), in ns. */
static uint64_t process_cpu_ns(pid_t pid)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
        char *s = test_read_file(p);
        if (!s)
                return 0;
        char *c = strrchr(s, ')');
        unsigned long long ut = 0, st = 0;
        /* fields after the command: state(3) ... utime(14) stime(15) */
        if (c)
                sscanf(c + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st);
        free(s);
        return (uint64_t)(ut + st) * (1000000000ull / (uint64_t)sysconf(_SC_CLK_TCK));
}

/* Whether /proc/<pid>/task/<tid>/cgroup names the test's cgroup for the cpu
 * accounting and memory controllers (v1) or the unified tree (v2). */
static bool thread_in_cgroup(pid_t pid, const char *tid, const struct test_cgroup *cg)
{
        char p[512];
        snprintf(p, sizeof(p), "/proc/%d/task/%s/cgroup", (int)pid, tid);
        char *s = test_read_file(p);
        if (!s)
                return false;
        char want[256];
        bool cpu = false, mem = false;
        for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n")) {
                char *path = strrchr(line, ':');
                if (!path)
                        continue;
                snprintf(want, sizeof(want), ":/%s", cg->name);
                bool ours = strcmp(path, want) == 0;
                if (v2 && strncmp(line, "0::", 3) == 0)
                        cpu = mem = ours;
                if (!v2 && strstr(line, ":cpuacct:"))
                        cpu = ours;
                if (!v2 && strstr(line, ":memory:"))
                        mem = ours;
        }
        free(s);
        return cpu && mem;
}

static int check_threads(pid_t pid, const struct test_cgroup *cg, int *ret_count)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/task", (int)pid);
        DIR *d = opendir(p);
        if (!d)
                return -errno;
        int n = 0, outside = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
                if (e->d_name[0] == '.')
                        continue;
                n++;
                if (!thread_in_cgroup(pid, e->d_name, cg)) {
                        outside++;
                        fprintf(stderr, "thread %s of QEMU %d is outside the sandbox cgroup\n", e->d_name, (int)pid);
                }
        }
        closedir(d);
        *ret_count = n;
        return outside;
}

static void sleep_ms(long ms)
{
        struct timespec ts = { ms / 1000, (ms % 1000) * 1000000 };
        nanosleep(&ts, NULL);
}

static int64_t mono_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs script in the guest; *res is zeroed first, so a failed call leaves
 * NULL strings behind, never garbage. */
static int run(struct qemu_vm *vm, const char *script, const char *in, int64_t timeout_ms, size_t cap,
               struct qemu_exec_result *res)
{
        memset(res, 0, sizeof(*res));
        char *argv[] = { "sh", "-c", (char *)script, NULL };
        struct qemu_exec_request req = {
                .argv = argv, .stdin_data = in, .stdin_len = in ? strlen(in) : 0,
                .timeout_ns = timeout_ms * 1000000, .output_cap = cap,
        };
        char why[256] = "";
        int r = qemu_vm_exec(vm, &req, res, why, sizeof(why));
        if (r < 0)
                fprintf(stderr, "exec %s: %s (%s)\n", script, strerror(-r), why);
        return r;
}

/* run(), and a call that fails fails the test; true when it ran, so the
 * checks of its result follow. */
static bool ran(struct qemu_vm *vm, const char *script, const char *in, int64_t timeout_ms, size_t cap,
                struct qemu_exec_result *res)
{
        int r = run(vm, script, in, timeout_ms, cap, res);
        CHECK(r == 0, "could not run '%s' in the guest: %s", script, strerror(-r));
        return r == 0;
}

static const char *str(const char *s)
{
        return s ? s : "(none)";
}

static void test_bad_input(const char *work)
{
        char why[256];
        struct qemu_vm *vm = NULL;
        struct qemu_vm_spec spec = { .vcpus = 0, .mem_mib = 128, .workdir = work };
        CHECK(qemu_vm_start(&spec, NULL, &vm, why, sizeof(why)) == -EINVAL && !vm, "0 vCPUs accepted");
        spec.vcpus = 17;
        CHECK(qemu_vm_start(&spec, NULL, &vm, why, sizeof(why)) == -EINVAL && !vm, "17 vCPUs accepted");
        spec.vcpus = 1;
        spec.mem_mib = 16;
        CHECK(qemu_vm_start(&spec, NULL, &vm, why, sizeof(why)) == -EINVAL && !vm, "16 MiB accepted");
        spec.mem_mib = 128;
        spec.workdir = "/tmp/a,b";
        CHECK(qemu_vm_start(&spec, NULL, &vm, why, sizeof(why)) == -EINVAL && !vm, "a comma in the folder accepted");
        spec.workdir = work;
        spec.kernel = "/nonexistent/vmlinuz";
        CHECK(qemu_vm_start(&spec, NULL, &vm, why, sizeof(why)) < 0 && !vm, "a missing kernel accepted");
        spec.kernel = NULL;

        /* A cgroup file that cannot be written: QEMU must never run. */
        const char *files[] = { "/sys/fs/cgroup/no-such-tally-cgroup/cgroup.procs", NULL };
        why[0] = 0;
        int r = qemu_vm_start(&spec, files, &vm, why, sizeof(why));
        CHECK(r < 0 && !vm, "start succeeded with an unwritable cgroup file");
        CHECK(strstr(why, "cgroup") != NULL, "the refusal does not name the cgroup: %s", why);
        char log[600];
        snprintf(log, sizeof(log), "%s/qemu.log", work);
        char *s = test_read_file(log);
        CHECK(!s || s[0] == 0, "QEMU ran although its cgroup could not be entered: %s", s ? s : "");
        free(s);
}

/* The value of "Key:" in /proc/<pid>/status (malloc'd), NULL if absent. */
static char *status_field(pid_t pid, const char *key)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/status", (int)pid);
        char *s = test_read_file(p);
        if (!s)
                return NULL;
        char *v = NULL;
        size_t kl = strlen(key);
        for (char *line = strtok(s, "\n"); line; line = strtok(NULL, "\n"))
                if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
                        char *b = line + kl + 1;
                        while (*b == ' ' || *b == '\t')
                                b++;
                        v = strdup(b);
                        break;
                }
        free(s);
        return v;
}

static bool same_ns(pid_t pid, const char *ns)
{
        char a[64], b[64], la[128] = "", lb[128] = "";
        snprintf(a, sizeof(a), "/proc/%d/ns/%s", (int)pid, ns);
        snprintf(b, sizeof(b), "/proc/self/ns/%s", ns);
        ssize_t na = readlink(a, la, sizeof(la) - 1), nb = readlink(b, lb, sizeof(lb) - 1);
        return na > 0 && nb > 0 && na == nb && memcmp(la, lb, (size_t)na) == 0;
}

static bool starts_with_dir(const char *path, const char *dir)
{
        size_t n = strlen(dir);
        return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == 0);
}

/* Whether an unprivileged user (nobody) can connect to a socket in QEMU's
 * folder: a socket the test made there, open to all (0666), so only the
 * folder protects it. Returns the errno connect got (0: it connected). */
static int nobody_connects(const char *qemu_dir)
{
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        if (snprintf(a.sun_path, sizeof(a.sun_path), "%.90s/probe.sock", qemu_dir) >= (int)sizeof(a.sun_path)) {
                CHECK(false, "%s is too long for a socket path", qemu_dir);
                return -1;
        }
        int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        unlink(a.sun_path);
        if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 1) < 0 || chmod(a.sun_path, 0666) < 0) {
                CHECK(false, "could not make a probe socket in %s: %s", qemu_dir, strerror(errno));
                return -1;
        }
        int pfd[2];
        if (pipe(pfd) < 0)
                return -1;
        pid_t c = fork();
        if (c == 0) {
                int e = 0;
                if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
                        e = -1;
                else {
                        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
                        e = connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ? errno : 0;
                }
                ssize_t ignored = write(pfd[1], &e, sizeof(e));
                (void)ignored;
                _exit(0);
        }
        close(pfd[1]);
        int e = -1;
        if (read(pfd[0], &e, sizeof(e)) != (ssize_t)sizeof(e))
                e = -1;
        close(pfd[0]);
        waitpid(c, NULL, 0);
        close(l);
        unlink(a.sun_path);
        return e;
}

/* What the kernel says of the running QEMU: who it runs as, what it may do,
 * what it sees. */
static void test_jail(pid_t pid, const char *work, const char *kernel, const char *initrd, int sentinel_fd)
{
        unsigned long want = JAIL_UID_BASE + (unsigned long)pid;
        char ids[128];
        snprintf(ids, sizeof(ids), "%lu\t%lu\t%lu\t%lu", want, want, want, want);
        const char *keys[] = { "Uid", "Gid" };
        for (int i = 0; i < 2; i++) {
                char *v = status_field(pid, keys[i]);
                CHECK(v && strcmp(v, ids) == 0, "QEMU's %s line is '%s', want '%s'", keys[i], str(v), ids);
                free(v);
        }
        char *groups = status_field(pid, "Groups");
        CHECK(groups && groups[0] == 0, "QEMU keeps supplementary groups '%s'", str(groups));
        free(groups);
        const char *caps[] = { "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb" };
        for (int i = 0; i < 5; i++) {
                char *v = status_field(pid, caps[i]);
                CHECK(v && strcmp(v, "0000000000000000") == 0, "QEMU's %s is %s, want none", caps[i], str(v));
                free(v);
        }
        char *nnp = status_field(pid, "NoNewPrivs"), *sec = status_field(pid, "Seccomp");
        CHECK(nnp && strcmp(nnp, "1") == 0, "QEMU's NoNewPrivs is %s", str(nnp));
        CHECK(sec && strcmp(sec, "2") == 0, "QEMU's Seccomp is %s, want 2 (a filter)", str(sec));
        free(nnp);
        free(sec);
        const char *nss[] = { "mnt", "net", "ipc", "uts", "cgroup" };
        for (int i = 0; i < 5; i++)
                CHECK(!same_ns(pid, nss[i]), "QEMU shares the host's %s namespace", nss[i]);

        /* Every mount QEMU can see: a read-only tmpfs root; read-only binds
         * under /usr, the loader's cache, the guest's kernel and initramfs;
         * three device nodes; and its own folder, the one writable place.
         * No proc, sysfs or cgroup file system: the host's cgroups are out of
         * reach whatever QEMU runs. */
        char qemu_dir[600], p[600];
        snprintf(qemu_dir, sizeof(qemu_dir), "%s/qemu", work);
        snprintf(p, sizeof(p), "/proc/%d/mountinfo", (int)pid);
        char *mi = test_read_file(p);
        CHECK(mi != NULL, "could not read %s", p);
        int mounts = 0, writable = 0;
        bool saw_dir = false;
        for (char *line = mi ? strtok(mi, "\n") : NULL; line; line = strtok(NULL, "\n")) {
                char point[512] = "", opts[256] = "", fstype[64] = "";
                char *dash = strstr(line, " - ");
                if (sscanf(line, "%*s %*s %*s %*s %511s %255s", point, opts) != 2 || !dash ||
                    sscanf(dash + 3, "%63s", fstype) != 1) {
                        CHECK(false, "unreadable mountinfo line: %s", line);
                        continue;
                }
                mounts++;
                bool ro = strncmp(opts, "ro", 2) == 0 && (opts[2] == ',' || opts[2] == 0);
                bool dev = strcmp(point, "/dev/null") == 0 || strcmp(point, "/dev/zero") == 0 ||
                           strcmp(point, "/dev/urandom") == 0;
                bool dir = strcmp(point, qemu_dir) == 0;
                bool root = strcmp(point, "/") == 0;
                bool file_ro = starts_with_dir(point, "/usr") || strcmp(point, "/etc/ld.so.cache") == 0 ||
                               strcmp(point, kernel) == 0 || strcmp(point, initrd) == 0;
                CHECK(root || dev || dir || file_ro, "QEMU sees a mount it does not need: %s (%s)", point, fstype);
                CHECK(strcmp(fstype, "proc") != 0 && strcmp(fstype, "sysfs") != 0 && strcmp(fstype, "cgroup") != 0 &&
                              strcmp(fstype, "cgroup2") != 0,
                      "QEMU sees a %s file system at %s", fstype, point);
                CHECK(!root || (ro && strcmp(fstype, "tmpfs") == 0), "QEMU's root is %s %s", fstype, opts);
                CHECK(!file_ro || ro, "%s is writable in the jail (%s)", point, opts);
                CHECK(!dir || strstr(opts, "noexec"), "QEMU's folder allows exec (%s)", opts);
                if (!ro)
                        writable++;
                saw_dir |= dir;
        }
        free(mi);
        CHECK(saw_dir, "QEMU's own folder %s is not mounted in its jail", qemu_dir);
        CHECK(writable <= 4, "%d writable mounts in the jail (its folder and 3 devices at most)", writable);
        fprintf(stderr, "QEMU %d: uid %lu, %d mounts in its jail, %d writable\n", (int)pid, want, mounts, writable);

        /* Its root seen from the host: none of the host's files, not the
         * test's (or a daemon's) working folder, no way to write. */
        const char *absent[] = { "/etc/passwd", "/proc/1", "/sys/fs/cgroup", "/home", "/var", "/root", "/bin/sh",
                                 "/usr/bin/env" };
        for (size_t i = 0; i < sizeof(absent) / sizeof(absent[0]); i++) {
                snprintf(p, sizeof(p), "/proc/%d/root%s", (int)pid, absent[i]);
                CHECK(access(p, F_OK) < 0, "QEMU's jail holds %s", absent[i]);
        }
        snprintf(p, sizeof(p), "/proc/%d/root%s/qemu.log", (int)pid, work);
        CHECK(access(p, F_OK) < 0, "QEMU's jail holds its working folder's qemu.log");
        /* The path to its folder is in the jail (as empty folders); nothing beside it is. */
        char *sibling = test_tmpdir("vmm-qemu-sibling");
        snprintf(p, sizeof(p), "/proc/%d/root%s", (int)pid, sibling);
        CHECK(access(sibling, F_OK) == 0 && access(p, F_OK) < 0, "QEMU's jail holds %s", sibling);
        rmdir(sibling);
        free(sibling);
        snprintf(p, sizeof(p), "/proc/%d/root/tally-probe", (int)pid);
        CHECK(mkdir(p, 0700) < 0 && errno == EROFS, "the jail's root is writable: %s", strerror(errno));

        /* QEMU's folder is its own, and nobody else can reach its sockets. */
        struct stat st;
        CHECK(stat(qemu_dir, &st) == 0 && st.st_uid == want && st.st_gid == want && (st.st_mode & 0777) == 0700,
              "QEMU's folder is %o %u:%u", (unsigned)(st.st_mode & 0777), (unsigned)st.st_uid, (unsigned)st.st_gid);
        int e = nobody_connects(qemu_dir);
        CHECK(e == EACCES, "user nobody connecting to a socket in QEMU's folder got %s, want EACCES",
              e == 0 ? "a connection" : strerror(e));

        /* The descriptors the starting process had open do not reach QEMU. */
        char want_link[600], link[600];
        snprintf(p, sizeof(p), "/proc/self/fd/%d", sentinel_fd);
        ssize_t wl = readlink(p, want_link, sizeof(want_link) - 1);
        CHECK(wl > 0, "could not read the sentinel's link");
        want_link[wl > 0 ? wl : 0] = 0;
        snprintf(p, sizeof(p), "/proc/%d/fd", (int)pid);
        DIR *d = opendir(p);
        CHECK(d != NULL, "could not list QEMU's descriptors");
        struct dirent *de;
        while (d && (de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                char fp[900];
                snprintf(fp, sizeof(fp), "%s/%s", p, de->d_name);
                ssize_t n = readlink(fp, link, sizeof(link) - 1);
                if (n <= 0)
                        continue;
                link[n] = 0;
                CHECK(strcmp(link, want_link) != 0, "QEMU inherited the starter's descriptor %s as fd %s", link,
                      de->d_name);
        }
        if (d)
                closedir(d);
}

/* The cgroup's procs: exactly QEMU's pid, and every one of its threads in it. */
static void check_contained(pid_t pid, const struct test_cgroup *cg, const char *after)
{
        char *procs = test_read_file(cg->procs_cpu);
        char want[32];
        snprintf(want, sizeof(want), "%d", (int)pid);
        CHECK(procs && strcmp(procs, want) == 0, "after %s the cgroup holds '%s', want only QEMU %d", after,
              str(procs), (int)pid);
        free(procs);
        int n = 0, outside = check_threads(pid, cg, &n);
        CHECK(outside == 0 && n >= 2, "after %s, %d of QEMU's %d threads are outside the cgroup", after, outside, n);
}

/* The sandbox-escape attacks that apply to a VM, from inside the guest. */
static void test_guest_attacks(struct qemu_vm *vm, pid_t pid, const struct test_cgroup *cg, const char *work)
{
        char lim_path[600];
        snprintf(lim_path, sizeof(lim_path), "%s/%s", cg->mem, v2 ? "memory.max" : "memory.limit_in_bytes");
        char *lim_before = test_read_file(lim_path);
        struct qemu_exec_result res;
        int64_t t = mono_ms();

        /* Leave the cgroup and raise the limits: the guest has a cgroup tree
         * of its own kernel's, and moving into its root or lifting its limits
         * there touches nothing of the host. */
        if (ran(vm,
                "mkdir -p /cg && mount -t cgroup2 none /cg && echo +memory +pids > /cg/cgroup.subtree_control; "
                "mkdir /cg/inner && echo $$ > /cg/inner/cgroup.procs && echo $$ > /cg/cgroup.procs && "
                "echo max > /cg/inner/memory.max && echo moved; ls /sys/fs/cgroup | head -3",
                NULL, 30000, 4096, &res))
                CHECK(res.exit_code == 0 && strstr(res.out, "moved"), "the guest could not use its own cgroups: %d %s %s",
                      res.exit_code, str(res.out), str(res.err));
        qemu_exec_result_clear(&res);
        check_contained(pid, cg, "the guest moved itself to its cgroup root");

        fprintf(stderr, "guest cgroup escape tried in %lld ms; QEMU still contained\n", (long long)(mono_ms() - t));
        t = mono_ms();
        /* A hundred processes: they are the guest's, inside QEMU's threads. */
        if (ran(vm, "i=0; while [ $i -lt 100 ]; do sleep 600 & i=$((i+1)); done; ps | grep -c 'sleep 600'", NULL,
                60000, 4096, &res))
                CHECK(res.exit_code == 0 && atoi(str(res.out)) >= 100, "the guest started %s sleepers", str(res.out));
        qemu_exec_result_clear(&res);
        check_contained(pid, cg, "100 processes in the guest");

        fprintf(stderr, "100 processes started in %lld ms; QEMU still contained\n", (long long)(mono_ms() - t));
        t = mono_ms();
        /* Fill the host's disk through the console: QEMU writes its console
         * log up to the cap and no further, and the guest goes on. */
        if (ran(vm, "head -c 400000 /dev/zero | tr '\\000' x > /dev/console; echo flooded", NULL, 120000, 4096, &res))
                CHECK(res.exit_code == 0 && strcmp(res.out, "flooded\n") == 0, "console flood: %d '%s' '%s'",
                      res.exit_code, str(res.out), str(res.err));
        qemu_exec_result_clear(&res);
        fprintf(stderr, "console flooded in %lld ms\n", (long long)(mono_ms() - t));
        char console[600];
        snprintf(console, sizeof(console), "%s/qemu/console.log", work);
        struct stat st;
        CHECK(stat(console, &st) == 0 && st.st_size == TEST_LOG_MAX,
              "the console log is %lld bytes after a 400 kB flood, want the cap of %u", (long long)st.st_size,
              TEST_LOG_MAX);
        if (ran(vm, "echo alive", NULL, 30000, 4096, &res))
                CHECK(strcmp(res.out, "alive\n") == 0, "the guest after the flood said '%s'", str(res.out));
        qemu_exec_result_clear(&res);
        check_contained(pid, cg, "a console flood");

        char *lim_after = test_read_file(lim_path);
        CHECK(lim_before && lim_after && strcmp(lim_before, lim_after) == 0, "the cgroup's limit went from %s to %s",
              str(lim_before), str(lim_after));
        free(lim_before);
        free(lim_after);
}

/* A copy of the running VM carries on its processes and files, in a cgroup
 * of its own, and from then on the two go their separate ways. */
static void test_fork(struct qemu_vm *vm, const struct test_cgroup *cg_copy)
{
        struct qemu_exec_result res;
        if (run(vm, "echo before-fork > /tmp/marker; sleep 1000 >/dev/null 2>&1 & echo $! > /tmp/bgpid", NULL,
                30000, 4096, &res) < 0) {
                CHECK(false, "could not prepare the VM to copy");
                return;
        }
        qemu_exec_result_clear(&res);
        char *copy_dir = test_tmpdir("vmm-qemu-copy");
        struct qemu_vm_spec spec = { .workdir = copy_dir };
        struct qemu_vm *copy = NULL;
        char why[512] = "";
        int64_t t0 = mono_ms();
        int r = qemu_vm_fork(vm, &spec, cg_copy->files, &copy, why, sizeof(why));
        CHECK(r == 0, "qemu_vm_fork: %s: %s", strerror(-r), why);
        if (r < 0) {
                free(copy_dir);
                return;
        }
        fprintf(stderr, "copied the running VM in %lld ms\n", (long long)(mono_ms() - t0));
        pid_t cpid = qemu_vm_pid(copy);
        CHECK(cpid > 0 && cpid != qemu_vm_pid(vm), "the copy has pid %d", (int)cpid);
        int n = 0;
        CHECK(check_threads(cpid, cg_copy, &n) == 0 && n >= 2, "the copy's threads are not all in its cgroup");
        char *uid = status_field(cpid, "Uid");
        char want[64];
        snprintf(want, sizeof(want), "%lu\t", JAIL_UID_BASE + (unsigned long)cpid);
        CHECK(uid && strncmp(uid, want, strlen(want)) == 0, "the copy runs as uid '%s', want %s", str(uid), want);
        free(uid);
        CHECK(run(copy, "cat /tmp/marker; kill -0 $(cat /tmp/bgpid) && echo alive", NULL, 30000, 4096, &res) == 0 &&
                      strcmp(res.out, "before-fork\nalive\n") == 0,
              "the copy lost the source's files or processes: '%s'", res.out ? res.out : "");
        qemu_exec_result_clear(&res);
        CHECK(run(copy, "echo copy > /tmp/marker", NULL, 30000, 4096, &res) == 0, "could not write in the copy");
        qemu_exec_result_clear(&res);
        CHECK(run(vm, "cat /tmp/marker", NULL, 30000, 4096, &res) == 0 && strcmp(res.out, "before-fork\n") == 0,
              "the source saw the copy's write or stopped answering: '%s'", res.out ? res.out : "");
        qemu_exec_result_clear(&res);
        CHECK(cgroup_cpu_ns(cg_copy) > 0, "the copy's cgroup counted no CPU");

        /* Stop a frozen copy: on cgroup v1 a frozen process does not die of
         * SIGKILL until thawed, and stop must say it failed (within its
         * bounded wait) rather than hang or report a live QEMU as stopped;
         * on v2 SIGKILL ends a frozen process and stop succeeds. */
        char frz[600], frz_procs[700], frz_state[700];
        if (v2) {
                snprintf(frz, sizeof(frz), "%s", cg_copy->cpu);
                snprintf(frz_state, sizeof(frz_state), "%s/cgroup.freeze", frz);
        } else {
                snprintf(frz, sizeof(frz), CGROOT "/freezer/%s", cg_copy->name);
                snprintf(frz_state, sizeof(frz_state), "%s/freezer.state", frz);
        }
        snprintf(frz_procs, sizeof(frz_procs), "%s/cgroup.procs", frz);
        char num[32];
        snprintf(num, sizeof(num), "%d", (int)cpid);
        bool frozen = (v2 || (mkdir(frz, 0755) == 0 && write_file(frz_procs, num) == 0)) &&
                      write_file(frz_state, v2 ? "1" : "FROZEN") == 0;
        CHECK(frozen, "could not freeze the copy through %s", frz_state);
        if (frozen) {
                int64_t t_stop = mono_ms();
                int sr = qemu_vm_stop(copy, 300);
                int64_t took = mono_ms() - t_stop;
                fprintf(stderr, "stop of a frozen copy: %s after %lld ms\n", sr < 0 ? strerror(-sr) : "stopped",
                        (long long)took);
                if (v2)
                        CHECK(sr == 0, "stop of a frozen copy on cgroup v2: %s", strerror(-sr));
                else
                        CHECK(sr == -ETIMEDOUT && kill(cpid, 0) == 0 && qemu_vm_pid(copy) == cpid,
                              "stop of a frozen copy returned %d (QEMU %s)", sr,
                              kill(cpid, 0) == 0 ? "still there" : "gone");
                CHECK(took < 8000, "stop of a frozen copy took %lld ms", (long long)took);
                CHECK(write_file(frz_state, v2 ? "0" : "THAWED") == 0, "could not thaw the copy");
        }
        CHECK(qemu_vm_stop(copy, 5000) == 0, "could not stop the copy");
        CHECK(waitpid(cpid, NULL, WNOHANG) == cpid || kill(cpid, 0) < 0, "the copy's QEMU is still there");
        qemu_vm_free(copy);
        if (!v2 && frozen)
                CHECK(rmdir(frz) == 0, "could not remove %s: %s", frz, strerror(errno));
        free(copy_dir);
}

struct background_exec {
        struct qemu_vm *vm;
        int r;
        int64_t returned_ms;
};

static void *exec_long(void *arg)
{
        struct background_exec *b = arg;
        struct qemu_exec_result res;
        b->r = run(b->vm, "sleep 100", NULL, 200000, 4096, &res);
        b->returned_ms = mono_ms();
        if (b->r == 0)
                qemu_exec_result_clear(&res);
        return NULL;
}

int main(void)
{
        /* What the test needs is installed by scripts/lib.sh and built by
         * meson (the kernel by scripts/guest-kernel): its absence is a
         * failure, never a pass or a skip. */
        char why[512] = "";
        if (geteuid() != 0) {
                fprintf(stderr, "FAIL: the qemu test needs root (cgroups, and QEMU's jail)\n");
                return 1;
        }
        if (!qemu_available(why, sizeof(why))) {
                fprintf(stderr, "FAIL: the qemu backend cannot run here: %s\n", why);
                return 1;
        }
        char kernel[4096], initrd[4096];
        if (!realpath(qemu_default_kernel(), kernel) || !realpath(qemu_default_initrd(), initrd)) {
                fprintf(stderr, "FAIL: no guest kernel or initramfs: %s\n", strerror(errno));
                return 1;
        }
        char *work = test_tmpdir("vmm-qemu");
        test_bad_input(work);

        struct test_cgroup cgs[2], *cg = &cgs[0], *cg_copy = &cgs[1];
        cgroup_setup(cg, "vm");
        cgroup_setup(cg_copy, "copy");
        const char *const *files = cg->files;

        struct qemu_vm_spec spec = { .vcpus = 1, .mem_mib = 160, .workdir = work, .kvm = false,
                                     .boot_timeout_ms = 150000, .log_max_bytes = TEST_LOG_MAX };
        struct qemu_vm *vm = NULL;
        /* A descriptor the starting process holds open (not close-on-exec),
         * as a daemon holds its API and broker sockets: QEMU must not get it. */
        char sentinel_path[600];
        snprintf(sentinel_path, sizeof(sentinel_path), "%s/sentinel", work);
        int sentinel = open(sentinel_path, O_RDWR | O_CREAT, 0600);
        CHECK(sentinel >= 0, "could not open %s", sentinel_path);
        uint64_t before = cgroup_cpu_ns(cg);
        CHECK(before == 0, "a fresh cgroup already counts %" PRIu64 " ns", before);
        int64_t t0 = mono_ms();

        /* The VM is started by a process that then exits without stopping it,
         * as a daemon that crashes would; this process takes it over. Being
         * the subreaper, it inherits QEMU (and reaps it at the end). */
        prctl(PR_SET_CHILD_SUBREAPER, 1);
        int pfd[2];
        if (pipe(pfd) < 0)
                return 1;
        pid_t starter = fork();
        if (starter == 0) {
                int sr = qemu_vm_start(&spec, files, &vm, why, sizeof(why));
                pid_t qp = sr == 0 ? qemu_vm_pid(vm) : -1;
                if (sr < 0)
                        fprintf(stderr, "qemu_vm_start: %s: %s\n", strerror(-sr), why);
                ssize_t ignored = write(pfd[1], &qp, sizeof(qp));
                (void)ignored;
                _exit(sr == 0 ? 0 : 1);
        }
        close(pfd[1]);
        pid_t pid = -1;
        if (read(pfd[0], &pid, sizeof(pid)) != (ssize_t)sizeof(pid))
                pid = -1;
        close(pfd[0]);
        waitpid(starter, NULL, 0);
        CHECK(pid > 0, "the VM did not start");
        if (pid <= 0)
                goto out;
        CHECK(qemu_vm_attach(work, getpid(), &vm, why, sizeof(why)) == -ESRCH && !vm,
              "attach took a process that is not the VM's QEMU");
        int r = qemu_vm_attach(work, pid, &vm, why, sizeof(why));
        CHECK(r == 0, "qemu_vm_attach: %s: %s", strerror(-r), why);
        if (r < 0) {
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                goto out;
        }
        CHECK(qemu_vm_pid(vm) == pid, "attached to pid %d, not %d", (int)qemu_vm_pid(vm), (int)pid);
        CHECK(strcmp(qemu_vm_accel(vm), "tcg") == 0, "accelerator is %s", qemu_vm_accel(vm));

        /* Boot, then the first command: exit code, stdout and stderr apart. */
        struct qemu_exec_result res;
        r = run(vm, "echo hello; echo oops >&2; exit 3", NULL, 30000, 4096, &res);
        CHECK(r == 0, "the first command did not run");
        if (r < 0)
                goto stop;
        fprintf(stderr, "booted and ran the first command in %lld ms (TCG)\n", (long long)(mono_ms() - t0));
        CHECK(res.exit_code == 3, "exit code %d, want 3", res.exit_code);
        CHECK(strcmp(res.out, "hello\n") == 0, "stdout '%s', want 'hello\\n'", res.out);
        CHECK(strcmp(res.err, "oops\n") == 0, "stderr '%s', want 'oops\\n'", res.err);
        CHECK(!res.timed_out && !res.out_truncated && !res.err_truncated, "flags set on a plain command");
        qemu_exec_result_clear(&res);

        /* Every QEMU thread is in the cgroup, and the cgroup counted the boot:
         * at least what the kernel charged to the QEMU process itself (its
         * utime+stime, read from /proc independently, in clock ticks). */
        int nthreads = 0;
        int outside = check_threads(pid, cg, &nthreads);
        CHECK(outside == 0, "%d of %d QEMU threads are outside the cgroup", outside, nthreads);
        CHECK(nthreads >= 2, "QEMU has %d threads; expected its vCPU thread and main loop at least", nthreads);
        uint64_t counted = cgroup_cpu_ns(cg), proc = process_cpu_ns(pid);
        uint64_t tick = 1000000000ull / (uint64_t)sysconf(_SC_CLK_TCK);
        fprintf(stderr, "cgroup cpu %" PRIu64 " ns, QEMU process cpu %" PRIu64 " ns, %d threads\n", counted, proc,
                nthreads);
        CHECK(counted >= 500000000ull, "the cgroup counted only %" PRIu64 " ns for a TCG boot", counted);
        CHECK(counted + (uint64_t)nthreads * 2 * tick >= proc,
              "the cgroup counted %" PRIu64 " ns but QEMU alone used %" PRIu64 " ns: boot CPU was lost", counted, proc);

        test_jail(pid, work, kernel, initrd, sentinel);

        /* stdin, a command that is not there, an output cap and a timeout. */
        CHECK(run(vm, "cat", "abc\n", 30000, 4096, &res) == 0 && strcmp(res.out, "abc\n") == 0,
              "stdin did not come back: '%s'", res.out ? res.out : "");
        qemu_exec_result_clear(&res);
        if (ran(vm, "exec /no/such/program", NULL, 30000, 4096, &res))
                CHECK(res.exit_code == 127, "a missing program exited %d, want 127", res.exit_code);
        qemu_exec_result_clear(&res);
        if (ran(vm, "yes tally | head -c 100000; echo done >&2", NULL, 60000, 1000, &res)) {
                CHECK(res.out_len == 1000 && res.out_truncated, "cap 1000: got %zu bytes, truncated %d", res.out_len,
                      res.out_truncated);
                CHECK(strncmp(res.out, "tally\ntally\n", 12) == 0, "capped output is not the command's");
                CHECK(strcmp(res.err, "done\n") == 0 && !res.err_truncated, "stderr '%s'", res.err);
                CHECK(res.exit_code == 0, "exit code %d", res.exit_code);
        }
        qemu_exec_result_clear(&res);
        int64_t t1 = mono_ms();
        if (ran(vm, "sleep 30", NULL, 1000, 4096, &res)) {
                CHECK(res.timed_out, "sleep 30 with a 1 s timeout did not time out");
                CHECK(res.exit_code == 128 + SIGKILL, "timed-out command's exit code %d", res.exit_code);
                CHECK(mono_ms() - t1 < 15000, "the timeout took %lld ms", (long long)(mono_ms() - t1));
        }
        qemu_exec_result_clear(&res);

        /* Something left behind that keeps writing to the command's stdout
         * does not hold the answer back. How much of the writer's output
         * arrives before the shell exits is a race: the answer is the capped
         * output so far, whatever its length. */
        t1 = mono_ms();
        if (ran(vm, "yes tally & echo started", NULL, 30000, 100, &res)) {
                CHECK(res.exit_code == 0 && res.out_len <= 100 && (res.out_truncated || strstr(res.out, "started")),
                      "background writer: exit %d, %zu bytes, truncated %d", res.exit_code, res.out_len,
                      res.out_truncated);
                CHECK(mono_ms() - t1 < 15000, "the answer took %lld ms", (long long)(mono_ms() - t1));
        }
        qemu_exec_result_clear(&res);

        /* A busy guest burns CPU; paused through QMP it burns (almost) none. */
        CHECK(run(vm, "yes >/dev/null 2>&1 &", NULL, 30000, 4096, &res) == 0, "could not start a busy loop");
        qemu_exec_result_clear(&res);
        uint64_t a = cgroup_cpu_ns(cg);
        sleep_ms(1000);
        uint64_t running = cgroup_cpu_ns(cg) - a;
        r = qemu_vm_pause(vm);
        CHECK(r == 0, "QMP stop: %s", strerror(-r));
        sleep_ms(300); /* let the vCPU thread leave the guest */
        a = cgroup_cpu_ns(cg);
        sleep_ms(1000);
        uint64_t paused = cgroup_cpu_ns(cg) - a;
        fprintf(stderr, "cpu over 1 s: running %" PRIu64 " ns, paused %" PRIu64 " ns\n", running, paused);
        /* The machine may be shared, so the busy guest gets what the scheduler
         * gives it; paused, QEMU must use a small fraction of that. */
        CHECK(running >= 100000000ull, "a busy guest used only %" PRIu64 " ns in 1 s", running);
        CHECK(paused <= 20000000ull && paused * 10 <= running, "a paused VM used %" PRIu64 " ns in 1 s", paused);
        r = qemu_vm_resume(vm);
        CHECK(r == 0, "QMP cont: %s", strerror(-r));
        CHECK(run(vm, "pkill yes; echo back", NULL, 30000, 4096, &res) == 0 && strcmp(res.out, "back\n") == 0,
              "no answer after resume");
        qemu_exec_result_clear(&res);

        test_guest_attacks(vm, pid, cg, work);

        test_fork(vm, cg_copy);

stop:;
        if (!v2) {
                char p[600];
                snprintf(p, sizeof(p), "%s/memory.max_usage_in_bytes", cg->mem);
                char *m = test_read_file(p);
                fprintf(stderr, "cgroup memory peak %s bytes (guest RAM %llu MiB)\n", m ? m : "?",
                        (unsigned long long)spec.mem_mib);
                free(m);
        }
        uint64_t last = cgroup_cpu_ns(cg);
        /* Stop while another thread waits for a long command: that call ends too. */
        struct background_exec bg = { .vm = vm, .r = 1 };
        pthread_t th;
        bool threaded = pthread_create(&th, NULL, exec_long, &bg) == 0;
        CHECK(threaded, "could not start a thread");
        sleep_ms(500);
        int64_t stop_ms = mono_ms();
        CHECK(qemu_vm_stop(vm, 5000) == 0, "stop failed");
        if (threaded) {
                pthread_join(th, NULL);
                CHECK(bg.r < 0, "a command outlived its VM");
                CHECK(bg.returned_ms - stop_ms < 10000, "the command's call returned %lld ms after stop",
                      (long long)(bg.returned_ms - stop_ms));
        }
        int wst = 0;
        struct rusage ru;
        memset(&ru, 0, sizeof(ru));
        CHECK(wait4(pid, &wst, 0, &ru) == pid, "QEMU %d was not our (subreaped) child", (int)pid);
        CHECK(kill(pid, 0) < 0 && errno == ESRCH, "QEMU %d still exists after stop", (int)pid);
        CHECK(qemu_vm_pid(vm) == 0, "pid not cleared after stop");
        CHECK(qemu_vm_stop(vm, 5000) == 0, "stopping twice failed");
        uint64_t final = cgroup_cpu_ns(cg);
        CHECK(final >= last, "the counter went back after stop: %" PRIu64 " < %" PRIu64, final, last);
        /* All the CPU QEMU used in its life, every thread's, as the kernel
         * reports it when QEMU is reaped, is the cgroup's counter: the
         * cgroup misses only what the forked child ran before it wrote its
         * pid into cgroup.procs (well under 5 ms), and holds nothing else:
         * at most 1 ms more, the last microseconds of each exiting thread,
         * which the kernel charges to the cgroup after it has summed the
         * thread into its process's total (QEMU's worker threads come and go). */
        uint64_t used = ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ull +
                        ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ull;
        fprintf(stderr, "QEMU used %" PRIu64 " ns of CPU in its life (rusage); its cgroup counted %" PRIu64 " ns\n",
                used, final);
        CHECK(final <= used + 1000000, "the cgroup counted %" PRIu64 " ns, more than QEMU's %" PRIu64,
              final, used);
        CHECK(used <= final + 5000000, "QEMU used %" PRIu64 " ns but its cgroup counted %" PRIu64 " ns", used, final);
        char *procs = test_read_file(cg->procs_cpu);
        CHECK(procs && procs[0] == 0, "the cgroup still holds processes: %s", procs ? procs : "(unreadable)");
        free(procs);
        char *argv[] = { "true", NULL };
        struct qemu_exec_request req = { .argv = argv, .output_cap = 10 };
        CHECK(qemu_vm_exec(vm, &req, &res, why, sizeof(why)) < 0, "exec in a stopped VM succeeded");
out:
        qemu_vm_free(vm);
        if (sentinel >= 0)
                close(sentinel);
        cgroup_teardown(cg);
        cgroup_teardown(cg_copy);
        free(work);
        return test_result();
}
