/* qemu.c — starts, drives and ends one QEMU microVM (see qemu.h).
 *
 * Order matters at start: the listening sockets for QMP and the agent exist
 * before QEMU does (QEMU connects to them as a client, so there is no race
 * with a socket file appearing), and the forked child writes its own pid into
 * the sandbox's cgroup files before it execs QEMU, so not one instruction of
 * QEMU or its guest runs outside the cgroup. The child only makes
 * async-signal-safe calls: the daemon that calls us has threads. */
#include "qemu.h"
#include "beneath.h"
#include "jail.h"
#include "protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define QEMU_DEFAULT_BINARY "qemu-system-x86_64"
#define START_TIMEOUT_MS 10000
#define QMP_TIMEOUT_MS 5000
/* How long past the command's own timeout the host waits for the agent's answer. */
#define EXEC_SLACK_MS 10000
/* How long stop waits for QEMU to go after SIGKILL. */
#define STOP_KILL_WAIT_MS 5000

struct qemu_vm {
        pid_t pid;
        bool child;                  /* pid is our child (reaped with waitpid) */
        bool ready;                  /* the agent said it is ready */
        bool broken;                 /* the agent channel lost sync: no more execs */
        int qmp;
        int agent;
        char qmp_buf[8192];
        size_t qmp_len;
        int64_t boot_timeout_ms;
        const char *accel;
        bool paused;                 /* QMP stop was the last word (atomic: exec reads it) */
        bool stopped;                /* stop was called (atomic) */
        pthread_mutex_t qmp_lock;    /* one QMP exchange at a time */
        char log_path[4096];
        char qmp_path[4096];         /* the sockets QEMU connects to (in its own folder) */
        char agent_path[4096];
        uint64_t log_max_bytes;
        /* What a copy must be started with (fork): the same machine. */
        uint32_t vcpus;
        uint64_t mem_mib;
        char kernel[4096];
        char initrd[4096];
        char qemu[4096];
};

static void set_why(char *why, size_t whylen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_why(char *why, size_t whylen, const char *fmt, ...)
{
        if (!why || whylen == 0)
                return;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
}

/* Copies src into dst, truncating to size - 1 bytes. */
static void copy_str(char *dst, size_t size, const char *src)
{
        size_t n = strnlen(src, size - 1);
        memcpy(dst, src, n);
        dst[n] = 0;
}

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Milliseconds left until deadline (-1: no deadline), for poll. */
static int left_ms(int64_t deadline)
{
        if (deadline < 0)
                return -1;
        int64_t l = deadline - now_ms();
        return l < 0 ? 0 : l > 60000 ? 60000 : (int)l;
}

void qemu_exec_result_clear(struct qemu_exec_result *r)
{
        if (!r)
                return;
        free(r->out);
        free(r->err);
        memset(r, 0, sizeof(*r));
}

bool qemu_kvm_usable(void)
{
        int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return false;
        close(fd);
        return true;
}

bool qemu_kvm_boots(const char *workdir, int64_t timeout_ms, char *why, size_t whylen)
{
        if (!qemu_kvm_usable()) {
                set_why(why, whylen, "/dev/kvm cannot be opened");
                return false;
        }
        struct qemu_vm_spec spec = { .vcpus = 1, .mem_mib = 128, .workdir = workdir, .kvm = true };
        struct qemu_vm *vm = NULL;
        if (qemu_vm_start(&spec, NULL, &vm, why, whylen) < 0)
                return false;
        int r = qemu_vm_wait_ready(vm, timeout_ms, why, whylen);
        qemu_vm_stop(vm, 1000);
        qemu_vm_free(vm);
        return r == 0;
}

const char *qemu_default_kernel(void)
{
        const char *e = getenv("TALLY_GUEST_KERNEL");
        return e && *e ? e : TALLY_GUEST_KERNEL_PATH;
}

const char *qemu_default_initrd(void)
{
        const char *e = getenv("TALLY_GUEST_INITRD");
        return e && *e ? e : TALLY_GUEST_INITRD_PATH;
}

static bool in_path(const char *name)
{
        if (strchr(name, '/'))
                return access(name, X_OK) == 0;
        const char *path = getenv("PATH");
        if (!path)
                path = "/usr/bin:/bin";
        char buf[4096];
        while (*path) {
                size_t n = strcspn(path, ":");
                if (snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, path, name) < (int)sizeof(buf) &&
                    access(buf, X_OK) == 0)
                        return true;
                path += n;
                if (*path == ':')
                        path++;
        }
        return false;
}

bool qemu_available(char *why, size_t whylen)
{
        if (!in_path(QEMU_DEFAULT_BINARY)) {
                set_why(why, whylen, "%s is not installed (Debian package qemu-system-x86)", QEMU_DEFAULT_BINARY);
                return false;
        }
        if (access(qemu_default_kernel(), R_OK) < 0) {
                set_why(why, whylen, "no guest kernel at %s (scripts/guest-kernel fetches it)", qemu_default_kernel());
                return false;
        }
        if (access(qemu_default_initrd(), R_OK) < 0) {
                set_why(why, whylen, "no guest initramfs at %s (built with vmm/guest)", qemu_default_initrd());
                return false;
        }
        return true;
}

/* A listening unix socket at path (replacing a stale file). */
static int listen_unix(const char *path)
{
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        if (strlen(path) >= sizeof(a.sun_path))
                return -ENAMETOOLONG;
        strcpy(a.sun_path, path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        unlink(path);
        if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 1) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        return fd;
}

static bool gone(struct qemu_vm *vm);
static int agent_ping(struct qemu_vm *vm);

/* Accepts QEMU's connection on lfd, watching that QEMU is still alive. */
static int accept_qemu(struct qemu_vm *vm, int lfd, int64_t deadline)
{
        for (;;) {
                struct pollfd p = { lfd, POLLIN, 0 };
                int n = poll(&p, 1, 100);
                if (n < 0 && errno != EINTR)
                        return -errno;
                if (n > 0) {
                        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
                        if (fd >= 0)
                                return fd;
                        if (errno != EINTR && errno != EAGAIN)
                                return -errno;
                }
                if (gone(vm)) {
                        vm->pid = 0;
                        return -ECHILD;
                }
                if (now_ms() >= deadline)
                        return -ETIMEDOUT;
        }
}

static int write_all(int fd, const void *buf, size_t len, int64_t deadline)
{
        const char *p = buf;
        while (len > 0) {
                struct pollfd pf = { fd, POLLOUT, 0 };
                int n = poll(&pf, 1, left_ms(deadline));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        return -ETIMEDOUT;
                ssize_t w = send(fd, p, len, MSG_NOSIGNAL);
                if (w < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                p += w;
                len -= (size_t)w;
        }
        return 0;
}

static int read_all(int fd, void *buf, size_t len, int64_t deadline)
{
        char *p = buf;
        while (len > 0) {
                struct pollfd pf = { fd, POLLIN, 0 };
                int n = poll(&pf, 1, left_ms(deadline));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0) {
                        if (deadline >= 0 && now_ms() >= deadline)
                                return -ETIMEDOUT;
                        continue;
                }
                ssize_t r = read(fd, p, len);
                if (r == 0)
                        return -EPIPE;
                if (r < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                p += r;
                len -= (size_t)r;
        }
        return 0;
}

/* --- QMP: one JSON object a line; events are skipped. --- */

/* Reads the next line (NUL-terminated in vm->qmp_buf's front; consumed by the next call). */
static int qmp_read_line(struct qemu_vm *vm, char **ret, int64_t deadline)
{
        for (;;) {
                char *nl = memchr(vm->qmp_buf, '\n', vm->qmp_len);
                if (nl) {
                        *nl = 0;
                        *ret = vm->qmp_buf;
                        return (int)(nl - vm->qmp_buf) + 1;
                }
                if (vm->qmp_len == sizeof(vm->qmp_buf) - 1)
                        return -EMSGSIZE;
                struct pollfd pf = { vm->qmp, POLLIN, 0 };
                int n = poll(&pf, 1, left_ms(deadline));
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        return -ETIMEDOUT;
                ssize_t r = read(vm->qmp, vm->qmp_buf + vm->qmp_len, sizeof(vm->qmp_buf) - 1 - vm->qmp_len);
                if (r == 0)
                        return -EPIPE;
                if (r < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                vm->qmp_len += (size_t)r;
        }
}

static void qmp_consume(struct qemu_vm *vm, int n)
{
        memmove(vm->qmp_buf, vm->qmp_buf + n, vm->qmp_len - (size_t)n);
        vm->qmp_len -= (size_t)n;
}

/* Waits for a line holding one of the keys (e.g. "return"); 0 if it came,
 * -EIO if QEMU answered with "error". */
static int qmp_wait_value(struct qemu_vm *vm, const char *key, int64_t deadline, json_t **ret_value)
{
        for (;;) {
                char *line = NULL;
                int n = qmp_read_line(vm, &line, deadline);
                if (n < 0)
                        return n;
                json_t *j = json_loads(line, 0, NULL);
                qmp_consume(vm, n);
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

static int qmp_wait(struct qemu_vm *vm, const char *key, int64_t deadline)
{
        return qmp_wait_value(vm, key, deadline, NULL);
}

/* Sends one command (a JSON object without the newline) and waits for its
 * answer; *ret_value, if asked for, is the "return" member (a new reference). */
static int qmp_call(struct qemu_vm *vm, const char *json, json_t **ret_value)
{
        if (vm->qmp < 0 || __atomic_load_n(&vm->stopped, __ATOMIC_ACQUIRE))
                return -ESRCH;
        pthread_mutex_lock(&vm->qmp_lock);
        int64_t deadline = now_ms() + QMP_TIMEOUT_MS;
        int r = write_all(vm->qmp, json, strlen(json), deadline);
        if (r >= 0)
                r = write_all(vm->qmp, "\n", 1, deadline);
        if (r >= 0)
                r = qmp_wait_value(vm, "return", deadline, ret_value);
        pthread_mutex_unlock(&vm->qmp_lock);
        return r;
}

static int qmp_command(struct qemu_vm *vm, const char *command)
{
        char buf[128];
        snprintf(buf, sizeof(buf), "{\"execute\":\"%s\"}", command);
        return qmp_call(vm, buf, NULL);
}

/* Hands fd to QEMU under name (QMP getfd: the descriptor travels with the
 * command as SCM_RIGHTS over the QMP socket). */
static int qmp_send_fd(struct qemu_vm *vm, const char *name, int fd)
{
        if (vm->qmp < 0 || __atomic_load_n(&vm->stopped, __ATOMIC_ACQUIRE))
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
        pthread_mutex_lock(&vm->qmp_lock);
        int64_t deadline = now_ms() + QMP_TIMEOUT_MS;
        ssize_t w;
        do
                w = sendmsg(vm->qmp, &msg, MSG_NOSIGNAL);
        while (w < 0 && errno == EINTR);
        int r = w < 0 ? -errno : 0;
        if (r >= 0 && w < len)
                r = write_all(vm->qmp, cmd + w, (size_t)(len - w), deadline);
        if (r >= 0)
                r = qmp_wait_value(vm, "return", deadline, NULL);
        pthread_mutex_unlock(&vm->qmp_lock);
        return r;
}

/* --- start --- */

/* In the forked child: decimal pid without stdio. */
static size_t format_pid(char *buf, pid_t pid)
{
        char tmp[16];
        size_t n = 0, i = 0;
        unsigned long v = (unsigned long)pid;
        do {
                tmp[n++] = (char)('0' + v % 10);
                v /= 10;
        } while (v);
        while (n)
                buf[i++] = tmp[--n];
        return i;
}

struct child_failure {
        int stage;                   /* index of the cgroup file; -1: exec; -2 - n: jail step n */
        int err;
        int op;                      /* the jail's op that failed, or -1 */
};

static void child_fail(int fd, int stage, int err, int op)
{
        struct child_failure f = { stage, err, op };
        ssize_t ignored = write(fd, &f, sizeof(f));
        (void)ignored;
        _exit(127);
}

/* The last line of QEMU's log, for an error message. */
static void log_tail(const char *path, char *buf, size_t len)
{
        buf[0] = 0;
        FILE *f = fopen(path, "re");
        if (!f)
                return;
        char line[512];
        while (fgets(line, sizeof(line), f))
                if (line[0] != '\n') {
                        size_t n = strnlen(line, len - 1);
                        memcpy(buf, line, n);
                        buf[n] = 0;
                }
        fclose(f);
        buf[strcspn(buf, "\n")] = 0;
}

#define ARGV_MAX 48

/* Starts QEMU for spec, jailed (jail.h); with incoming_fd >= 0, QEMU loads a
 * running VM's state from that descriptor instead of booting (fork). */
static int vm_spawn(const struct qemu_vm_spec *spec, const char *const *cgroup_procs_files, int incoming_fd,
                    struct qemu_vm **ret, char *why, size_t whylen)
{
        if (spec->vcpus < 1 || spec->vcpus > 16) {
                set_why(why, whylen, "vcpus must be 1 to 16, not %u", spec->vcpus);
                return -EINVAL;
        }
        if (spec->mem_mib < 64) {
                set_why(why, whylen, "a qemu sandbox needs at least 64 MiB of memory");
                return -EINVAL;
        }
        if (!spec->workdir) {
                set_why(why, whylen, "no working folder given");
                return -EINVAL;
        }
        if (strchr(spec->workdir, ',')) {
                /* QEMU's option syntax would split the socket paths at it. */
                set_why(why, whylen, "the working folder's path holds a comma: %s", spec->workdir);
                return -EINVAL;
        }
        if (spec->kvm && !qemu_kvm_usable()) {
                set_why(why, whylen, "KVM was asked for but /dev/kvm cannot be opened: %m");
                return -ENODEV;
        }
        /* Absolute and free of links: the jail mirrors them at these paths. */
        const char *kernel_arg = spec->kernel ? spec->kernel : qemu_default_kernel();
        const char *initrd_arg = spec->initrd ? spec->initrd : qemu_default_initrd();
        char kernel[4096], initrd[4096];
        if (!realpath(kernel_arg, kernel) || !realpath(initrd_arg, initrd) || access(kernel, R_OK) < 0 ||
            access(initrd, R_OK) < 0) {
                int r = -errno;
                set_why(why, whylen, "guest kernel %s or initramfs %s is missing", kernel_arg, initrd_arg);
                return r;
        }

        struct qemu_vm *vm = calloc(1, sizeof(*vm));
        if (!vm)
                return -ENOMEM;
        vm->qmp = vm->agent = -1;
        pthread_mutex_init(&vm->qmp_lock, NULL);
        vm->accel = spec->kvm ? "kvm" : "tcg";
        vm->boot_timeout_ms = spec->boot_timeout_ms > 0 ? spec->boot_timeout_ms : 120000;
        vm->vcpus = spec->vcpus;
        vm->mem_mib = spec->mem_mib;
        vm->log_max_bytes = spec->log_max_bytes;
        snprintf(vm->kernel, sizeof(vm->kernel), "%s", kernel);
        snprintf(vm->initrd, sizeof(vm->initrd), "%s", initrd);

        /* QEMU's sockets and console log are in its own folder, <workdir>/qemu,
         * the one folder of the host it can write; its stderr goes to
         * <workdir>/qemu.log, which it cannot see (the descriptor is opened here). */
        char console_path[4200], smp[32], mem[32], incoming[32];
        char qmp_dev[4200], agent_dev[4200], console_dev[4300];
        int r, qmp_l = -1, agent_l = -1, logfd = -1, errpipe[2] = { -1, -1 };
        struct qemu_jail jail;
        bool jailed = false;
        snprintf(vm->qmp_path, sizeof(vm->qmp_path), "%s/qemu/qmp.sock", spec->workdir);
        snprintf(vm->agent_path, sizeof(vm->agent_path), "%s/qemu/agent.sock", spec->workdir);
        snprintf(console_path, sizeof(console_path), "%s/qemu/console.log", spec->workdir);
        snprintf(vm->log_path, sizeof(vm->log_path), "%s/qemu.log", spec->workdir);
        snprintf(smp, sizeof(smp), "%u", spec->vcpus);
        snprintf(mem, sizeof(mem), "%llu", (unsigned long long)spec->mem_mib);
        snprintf(qmp_dev, sizeof(qmp_dev), "socket,id=qmp,path=%s,reconnect=1", vm->qmp_path);
        snprintf(agent_dev, sizeof(agent_dev), "socket,id=agent,path=%s,reconnect=1", vm->agent_path);
        snprintf(console_dev, sizeof(console_dev), "file:%s", console_path);
        snprintf(incoming, sizeof(incoming), "fd:%d", incoming_fd);

        /* microvm with the legacy PIT and PIC, and without ACPI: with ACPI on,
         * the kernel routes the PIT's interrupt to the wrong IOAPIC pin, never
         * gets a tick, and under TCG hangs calibrating its timers. The MP
         * table QEMU writes without ACPI routes it right. The console (ttyS0)
         * goes to a file; the agent has ttyS1 to itself. TCG's translation
         * cache is held to 64 MiB (QEMU's default is 1 GiB), so QEMU's own
         * memory stays small beside the guest's in the sandbox's cgroup.
         * -sandbox: QEMU's seccomp filter, with everything it can deny denied
         * (no exec or fork, no setuid, no scheduler or priority changes, no
         * obsolete calls); it applies to all of QEMU's threads. */
        const char *qemu = spec->qemu_binary ? spec->qemu_binary : QEMU_DEFAULT_BINARY;
        const char *argv[ARGV_MAX] = {
                qemu, "-M", "microvm,isa-serial=on,rtc=on,pit=on,pic=on,acpi=off",
                "-accel", spec->kvm ? "kvm" : "tcg,tb-size=64", "-cpu", spec->kvm ? "host" : "max",
                "-smp", smp, "-m", mem,
                "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
                "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
                "-kernel", kernel, "-initrd", initrd,
                "-append", "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init tsc=reliable",
                "-serial", console_dev,
                "-chardev", agent_dev, "-device", "isa-serial,chardev=agent,iobase=0x2f8,irq=3",
                "-chardev", qmp_dev, "-mon", "chardev=qmp,mode=control",
                NULL, NULL, NULL,
        };
        snprintf(vm->qemu, sizeof(vm->qemu), "%s", qemu);
        if (incoming_fd >= 0) {
                size_t n = 0;
                while (argv[n])
                        n++;
                argv[n] = "-incoming";
                argv[n + 1] = incoming;
        }

        char qemu_dir[4200];
        snprintf(qemu_dir, sizeof(qemu_dir), "%s/qemu", spec->workdir);
        if (mkdir(qemu_dir, 0700) < 0 && errno != EEXIST) {
                r = -errno;
                set_why(why, whylen, "could not create %s: %s", qemu_dir, strerror(-r));
                goto fail;
        }
        /* A console log left by an earlier QEMU (another uid) would be refused to this one. */
        unlink(console_path);
        qmp_l = listen_unix(vm->qmp_path);
        if (qmp_l < 0) {
                r = qmp_l;
                set_why(why, whylen, "could not listen on %s: %s", vm->qmp_path, strerror(-r));
                goto fail;
        }
        agent_l = listen_unix(vm->agent_path);
        if (agent_l < 0) {
                r = agent_l;
                set_why(why, whylen, "could not listen on %s: %s", vm->agent_path, strerror(-r));
                goto fail;
        }
        r = qemu_jail_prepare(&jail, qemu, spec->workdir, kernel, initrd, spec->kvm, vm->qmp_path, vm->agent_path,
                              why, whylen);
        if (r < 0)
                goto fail;
        jailed = true;
        if (spec->log_max_bytes)
                jail.fsize_max = spec->log_max_bytes;
        argv[0] = jail.exe;
        snprintf(vm->qemu, sizeof(vm->qemu), "%s", jail.exe);
        logfd = open(vm->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (logfd < 0 || pipe2(errpipe, O_CLOEXEC) < 0) {
                r = -errno;
                set_why(why, whylen, "could not create %s: %m", vm->log_path);
                goto fail;
        }

        pid_t pid = fork();
        if (pid < 0) {
                r = -errno;
                set_why(why, whylen, "could not fork: %m");
                goto fail;
        }
        if (pid == 0) {
                /* The cgroup first: every instruction from here on is counted there. */
                char num[16];
                size_t n = format_pid(num, getpid());
                for (int i = 0; cgroup_procs_files && cgroup_procs_files[i]; i++) {
                        int fd = open(cgroup_procs_files[i], O_WRONLY | O_CLOEXEC);
                        if (fd < 0 || write(fd, num, n) != (ssize_t)n)
                                child_fail(errpipe[1], i, errno, -1);
                        close(fd);
                }
                int null = open("/dev/null", O_RDONLY);
                if (null < 0 || dup2(null, 0) < 0 || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
                        child_fail(errpipe[1], -1, errno, -1);
                if (null > 2)
                        close(null);
                int step = 0, op = -1;
                int jr = qemu_jail_enter(&jail, incoming_fd, &step, &op);
                if (jr < 0)
                        child_fail(errpipe[1], -2 - step, -jr, op);
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                execve(jail.exe, (char *const *)argv, jail.env);
                child_fail(errpipe[1], -1, errno, -1);
        }
        vm->pid = pid;
        vm->child = true;
        close(errpipe[1]);
        errpipe[1] = -1;
        struct child_failure f;
        ssize_t got;
        do
                got = read(errpipe[0], &f, sizeof(f));
        while (got < 0 && errno == EINTR);
        if (got == (ssize_t)sizeof(f)) {
                waitpid(pid, NULL, 0);
                vm->pid = 0;
                r = -f.err;
                if (f.stage >= 0)
                        set_why(why, whylen, "could not put QEMU into cgroup file %s: %s", cgroup_procs_files[f.stage],
                                strerror(f.err));
                else if (f.stage == -1)
                        set_why(why, whylen, "could not run %s: %s", qemu, strerror(f.err));
                else if (f.op >= 0 && (size_t)f.op < jail.nops)
                        set_why(why, whylen, "could not jail QEMU: could not make %s in its jail: %s",
                                jail.ops[f.op].path, strerror(f.err));
                else
                        set_why(why, whylen, "could not jail QEMU: could not %s: %s", qemu_jail_step_name(-2 - f.stage),
                                strerror(f.err));
                goto fail;
        }

        int64_t deadline = now_ms() + START_TIMEOUT_MS;
        vm->qmp = accept_qemu(vm, qmp_l, deadline);
        if (vm->qmp >= 0)
                vm->agent = accept_qemu(vm, agent_l, deadline);
        if (vm->qmp < 0 || vm->agent < 0) {
                r = vm->qmp < 0 ? vm->qmp : vm->agent;
                char tail[256];
                log_tail(vm->log_path, tail, sizeof(tail));
                set_why(why, whylen, "QEMU did not start: %s", *tail ? tail : strerror(-r));
                goto fail;
        }
        r = qmp_wait(vm, "QMP", deadline);
        if (r >= 0)
                r = qmp_command(vm, "qmp_capabilities");
        if (r < 0) {
                set_why(why, whylen, "QEMU's QMP did not answer: %s", strerror(-r));
                goto fail;
        }
        close(qmp_l);
        close(agent_l);
        unlink(vm->qmp_path);
        unlink(vm->agent_path);
        close(logfd);
        close(errpipe[0]);
        qemu_jail_clear(&jail);
        *ret = vm;
        return 0;

fail:
        if (vm->pid > 0) {
                kill(vm->pid, SIGKILL);
                waitpid(vm->pid, NULL, 0);
        }
        if (qmp_l >= 0) {
                close(qmp_l);
                unlink(vm->qmp_path);
        }
        if (agent_l >= 0) {
                close(agent_l);
                unlink(vm->agent_path);
        }
        if (logfd >= 0)
                close(logfd);
        if (errpipe[0] >= 0)
                close(errpipe[0]);
        if (errpipe[1] >= 0)
                close(errpipe[1]);
        if (jailed)
                qemu_jail_clear(&jail);
        vm->pid = 0;
        qemu_vm_free(vm);
        return r;
}

int qemu_vm_start(const struct qemu_vm_spec *spec, const char *const *cgroup_procs_files, struct qemu_vm **ret,
                  char *why, size_t whylen)
{
        return vm_spawn(spec, cgroup_procs_files, -1, ret, why, whylen);
}

/* The path in a "socket,id=ID,path=PATH,..." argument, into buf. */
static bool socket_arg_path(const char *arg, const char *id, char *buf, size_t size)
{
        char key[64];
        snprintf(key, sizeof(key), "socket,id=%s,path=", id);
        if (strncmp(arg, key, strlen(key)) != 0)
                return false;
        const char *p = arg + strlen(key);
        size_t n = strcspn(p, ",");
        if (n >= size)
                return false;
        memcpy(buf, p, n);
        buf[n] = 0;
        return true;
}

/* Whether /proc/<pid>/cmdline is the QEMU of workdir: its QMP socket is
 * workdir's (<workdir>/qemu/qmp.sock; <workdir>/qmp.sock for a QEMU started
 * before the jail). Guards against a recycled pid. Fills vm's machine and
 * socket paths; *ret_kvm says whether it runs on KVM. */
static bool is_our_qemu(pid_t pid, const char *workdir, bool *ret_kvm, struct qemu_vm *vm)
{
        char p[64], buf[16384];
        snprintf(p, sizeof(p), "/proc/%d/cmdline", (int)pid);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return false;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return false;
        buf[n] = 0;
        char jailed[4200], old[4200];
        snprintf(jailed, sizeof(jailed), "%s/qemu/qmp.sock", workdir);
        snprintf(old, sizeof(old), "%s/qmp.sock", workdir);
        bool ours = false, kvm = false;
        for (char *a = buf; a < buf + n; a += strlen(a) + 1) {
                if (socket_arg_path(a, "qmp", vm->qmp_path, sizeof(vm->qmp_path)))
                        ours = strcmp(vm->qmp_path, jailed) == 0 || strcmp(vm->qmp_path, old) == 0;
                socket_arg_path(a, "agent", vm->agent_path, sizeof(vm->agent_path));
                if (strcmp(a, "kvm") == 0)
                        kvm = true;
                const char *next = a + strlen(a) + 1;
                if (next >= buf + n)
                        continue;
                if (a == buf)
                        copy_str(vm->qemu, sizeof(vm->qemu), a);
                if (strcmp(a, "-smp") == 0)
                        vm->vcpus = (uint32_t)strtoul(next, NULL, 10);
                else if (strcmp(a, "-m") == 0)
                        vm->mem_mib = strtoull(next, NULL, 10);
                else if (strcmp(a, "-kernel") == 0)
                        copy_str(vm->kernel, sizeof(vm->kernel), next);
                else if (strcmp(a, "-initrd") == 0)
                        copy_str(vm->initrd, sizeof(vm->initrd), next);
        }
        *ret_kvm = kvm;
        return ours && vm->agent_path[0];
}

/* The real uid and gid of pid (its jail's), from /proc. */
static int process_ids(pid_t pid, uid_t *ret_uid, gid_t *ret_gid)
{
        char p[64], line[256];
        snprintf(p, sizeof(p), "/proc/%d/status", (int)pid);
        FILE *f = fopen(p, "re");
        if (!f)
                return -errno;
        unsigned long uid = 0, gid = 0;
        int found = 0;
        while (fgets(line, sizeof(line), f)) {
                if (sscanf(line, "Uid: %lu", &uid) == 1)
                        found |= 1;
                else if (sscanf(line, "Gid: %lu", &gid) == 1)
                        found |= 2;
        }
        fclose(f);
        if (found != 3)
                return -EIO;
        *ret_uid = (uid_t)uid;
        *ret_gid = (gid_t)gid;
        return 0;
}

static int agent_ping(struct qemu_vm *vm)
{
        unsigned char h[AGENT_HEADER_LEN] = { AGENT_MAGIC0, AGENT_MAGIC1, AGENT_PING, 0, 0, 0, 0 };
        return write_all(vm->agent, h, sizeof(h), now_ms() + QMP_TIMEOUT_MS);
}

int qemu_vm_attach(const char *workdir, pid_t pid, struct qemu_vm **ret, char *why, size_t whylen)
{
        bool kvm = false;
        struct qemu_vm *vm = calloc(1, sizeof(*vm));
        if (!vm)
                return -ENOMEM;
        if (pid <= 0 || !is_our_qemu(pid, workdir, &kvm, vm)) {
                set_why(why, whylen, "no QEMU of this sandbox runs as pid %d", (int)pid);
                free(vm);
                return -ESRCH;
        }
        vm->pid = pid;
        vm->child = false;
        vm->qmp = vm->agent = -1;
        pthread_mutex_init(&vm->qmp_lock, NULL);
        vm->accel = kvm ? "kvm" : "tcg";
        vm->boot_timeout_ms = 120000;
        snprintf(vm->log_path, sizeof(vm->log_path), "%s/qemu.log", workdir);
        uid_t uid = 0;
        gid_t gid = 0;
        int r = process_ids(pid, &uid, &gid);
        if (r < 0) {
                set_why(why, whylen, "could not read QEMU %d's uid: %s", (int)pid, strerror(-r));
                qemu_vm_free(vm);
                return r;
        }
        int qmp_l = listen_unix(vm->qmp_path), agent_l = listen_unix(vm->agent_path);
        if (qmp_l < 0 || agent_l < 0) {
                r = qmp_l < 0 ? qmp_l : agent_l;
                set_why(why, whylen, "could not listen in %s: %s", workdir, strerror(-r));
                goto out;
        }
        /* The jailed QEMU connects as its own uid, to sockets only it (and root) may use. It
         * runs, and its folder is its own: a link it put in a socket's place is never followed. */
        if (uid != 0 && ((r = beneath_give(vm->qmp_path, uid, gid, 0600)) < 0 ||
                         (r = beneath_give(vm->agent_path, uid, gid, 0600)) < 0)) {
                set_why(why, whylen, "could not give QEMU %d its sockets: %s", (int)pid, strerror(-r));
                goto out;
        }
        /* QEMU retries its connections every second (reconnect=1). */
        int64_t deadline = now_ms() + START_TIMEOUT_MS;
        vm->qmp = accept_qemu(vm, qmp_l, deadline);
        if (vm->qmp >= 0)
                vm->agent = accept_qemu(vm, agent_l, deadline);
        r = vm->qmp < 0 ? vm->qmp : vm->agent < 0 ? vm->agent : 0;
        if (r < 0) {
                set_why(why, whylen, "QEMU %d did not reconnect: %s", (int)pid, strerror(-r));
                goto out;
        }
        r = qmp_wait(vm, "QMP", deadline);
        if (r >= 0)
                r = qmp_command(vm, "qmp_capabilities");
        if (r >= 0)
                r = agent_ping(vm); /* the next wait for ready takes the answer */
        if (r < 0)
                set_why(why, whylen, "QEMU %d did not answer after reconnecting: %s", (int)pid, strerror(-r));
out:
        if (qmp_l >= 0)
                close(qmp_l);
        if (agent_l >= 0)
                close(agent_l);
        unlink(vm->qmp_path);
        unlink(vm->agent_path);
        if (r < 0) {
                qemu_vm_free(vm);
                return r;
        }
        *ret = vm;
        return 0;
}

/* --- the agent channel --- */

/* Reads the next frame, skipping bytes before the magic. *ret_payload is malloc'd. */
static int agent_read_frame(struct qemu_vm *vm, int *ret_type, unsigned char **ret_payload, uint32_t *ret_len,
                            int64_t deadline)
{
        unsigned char c, h[5];
        int r, state = 0;
        while (state < 2) {
                r = read_all(vm->agent, &c, 1, deadline);
                if (r < 0)
                        return r;
                if (state == 0)
                        state = c == AGENT_MAGIC0;
                else
                        state = c == AGENT_MAGIC1 ? 2 : c == AGENT_MAGIC0;
        }
        r = read_all(vm->agent, h, sizeof(h), deadline);
        if (r < 0)
                return r;
        uint32_t len = agent_get_u32(h + 1);
        if (len > AGENT_PAYLOAD_MAX)
                return -EPROTO;
        unsigned char *p = malloc(len + 1);
        if (!p)
                return -ENOMEM;
        r = read_all(vm->agent, p, len, deadline);
        if (r < 0) {
                free(p);
                return r;
        }
        p[len] = 0;
        *ret_type = h[0];
        *ret_payload = p;
        *ret_len = len;
        return 0;
}

int qemu_vm_wait_ready(struct qemu_vm *vm, int64_t timeout_ms, char *why, size_t whylen)
{
        if (vm->ready)
                return 0;
        if (vm->agent < 0 || vm->broken) {
                set_why(why, whylen, "the VM is not running");
                return -ESRCH;
        }
        int64_t deadline = now_ms() + timeout_ms;
        for (;;) {
                int type;
                unsigned char *p;
                uint32_t len;
                int r = agent_read_frame(vm, &type, &p, &len, deadline);
                if (r < 0) {
                        if (r == -ETIMEDOUT)
                                set_why(why, whylen, "the guest did not boot within %lld ms", (long long)timeout_ms);
                        else
                                set_why(why, whylen, "the guest's agent channel failed while booting: %s", strerror(-r));
                        return r;
                }
                free(p);
                if (type == AGENT_READY) {
                        vm->ready = true;
                        return 0;
                }
        }
}

/* Appends len bytes to a capped buffer. */
static int append(char **buf, size_t *blen, bool *truncated, size_t cap, const unsigned char *p, size_t len)
{
        size_t keep = len;
        if (keep > cap - *blen)
                keep = cap - *blen;
        if (keep < len)
                *truncated = true;
        if (keep == 0)
                return 0;
        char *n = realloc(*buf, *blen + keep + 1);
        if (!n)
                return -ENOMEM;
        memcpy(n + *blen, p, keep);
        *blen += keep;
        n[*blen] = 0;
        *buf = n;
        return 0;
}

int qemu_vm_exec(struct qemu_vm *vm, const struct qemu_exec_request *req, struct qemu_exec_result *ret,
                 char *why, size_t whylen)
{
        if (!req->argv || !req->argv[0]) {
                set_why(why, whylen, "no command given");
                return -EINVAL;
        }
        if (vm->broken || vm->agent < 0 || __atomic_load_n(&vm->stopped, __ATOMIC_ACQUIRE)) {
                set_why(why, whylen, "the VM is not running or its agent stopped answering");
                return -ESRCH;
        }
        int r = qemu_vm_wait_ready(vm, vm->boot_timeout_ms, why, whylen);
        if (r < 0)
                return r;

        uint64_t timeout_ms = req->timeout_ns > 0 ? ((uint64_t)req->timeout_ns + 999999) / 1000000 : 0;
        if (timeout_ms > UINT32_MAX)
                timeout_ms = UINT32_MAX;
        size_t cap = req->output_cap > AGENT_PAYLOAD_MAX ? AGENT_PAYLOAD_MAX : req->output_cap;
        size_t len = 16, argc = 0;
        for (; req->argv[argc]; argc++)
                len += strlen(req->argv[argc]) + 1;
        len += req->stdin_len;
        if (len > AGENT_PAYLOAD_MAX) {
                set_why(why, whylen, "the command and its stdin exceed %u bytes", AGENT_PAYLOAD_MAX);
                return -E2BIG;
        }
        unsigned char *msg = malloc(AGENT_HEADER_LEN + len);
        if (!msg)
                return -ENOMEM;
        unsigned char *p = msg;
        *p++ = AGENT_MAGIC0;
        *p++ = AGENT_MAGIC1;
        *p++ = AGENT_EXEC;
        agent_put_u32(p, (uint32_t)len), p += 4;
        agent_put_u32(p, (uint32_t)timeout_ms), p += 4;
        agent_put_u32(p, (uint32_t)cap), p += 4;
        agent_put_u32(p, (uint32_t)argc), p += 4;
        agent_put_u32(p, (uint32_t)req->stdin_len), p += 4;
        for (size_t i = 0; i < argc; i++) {
                size_t l = strlen(req->argv[i]) + 1;
                memcpy(p, req->argv[i], l);
                p += l;
        }
        if (req->stdin_len)
                memcpy(p, req->stdin_data, req->stdin_len);

        /* The agent enforces the timeout; the host only guards against a guest that stopped answering. */
        int64_t deadline = timeout_ms ? now_ms() + (int64_t)timeout_ms + EXEC_SLACK_MS : -1;
        r = write_all(vm->agent, msg, AGENT_HEADER_LEN + len, deadline);
        free(msg);
        if (r < 0) {
                vm->broken = true;
                set_why(why, whylen, "could not send the command to the guest: %s", strerror(-r));
                return r;
        }

        struct qemu_exec_result res = { 0 };
        for (;;) {
                int type;
                unsigned char *f;
                uint32_t flen;
                r = agent_read_frame(vm, &type, &f, &flen, deadline);
                if (r == -ETIMEDOUT && __atomic_load_n(&vm->paused, __ATOMIC_ACQUIRE)) {
                        /* Paused meanwhile: the guest's clock stands still too. */
                        deadline = now_ms() + EXEC_SLACK_MS;
                        continue;
                }
                if (r < 0) {
                        vm->broken = true;
                        set_why(why, whylen, "the guest agent did not answer: %s", strerror(-r));
                        goto fail;
                }
                if (type == AGENT_STDOUT)
                        r = append(&res.out, &res.out_len, &res.out_truncated, cap, f, flen);
                else if (type == AGENT_STDERR)
                        r = append(&res.err, &res.err_len, &res.err_truncated, cap, f, flen);
                else if (type == AGENT_DONE && flen >= 7) {
                        res.exit_code = (int)agent_get_u32(f);
                        res.timed_out = f[4];
                        res.out_truncated |= f[5];
                        res.err_truncated |= f[6];
                        free(f);
                        break;
                } else if (type == AGENT_ERROR) {
                        set_why(why, whylen, "the guest agent could not run the command: %s", (char *)f);
                        free(f);
                        r = -EIO;
                        goto fail;
                }
                free(f);
                if (r < 0)
                        goto fail;
        }
        if (!res.out && !(res.out = calloc(1, 1)))
                goto nomem;
        if (!res.err && !(res.err = calloc(1, 1)))
                goto nomem;
        *ret = res;
        return 0;
nomem:
        r = -ENOMEM;
fail:
        qemu_exec_result_clear(&res);
        return r;
}

/* --- pause, resume, fork, stop --- */

int qemu_vm_pause(struct qemu_vm *vm)
{
        int r = qmp_command(vm, "stop");
        if (r >= 0)
                __atomic_store_n(&vm->paused, true, __ATOMIC_RELEASE);
        return r;
}

int qemu_vm_resume(struct qemu_vm *vm)
{
        int r = qmp_command(vm, "cont");
        if (r >= 0)
                __atomic_store_n(&vm->paused, false, __ATOMIC_RELEASE);
        return r;
}

/* Sends src's whole state down fd (one end of a socket pair whose other end
 * a copy's QEMU reads with -incoming) with QMP migrate, leaving src paused.
 * The state never touches the disk, and the jailed QEMU needs neither a
 * shell nor a file to write it to (its seccomp filter forbids spawning one). */
static int send_state(struct qemu_vm *src, int fd, char *why, size_t whylen)
{
        int r = qmp_command(src, "stop");
        if (r < 0) {
                set_why(why, whylen, "could not pause the VM to copy it: %s", strerror(-r));
                return r;
        }
        /* No bandwidth cap: the copy is local; QEMU's default of 32 MiB/s
         * would make a copy of a large VM take seconds per GiB. */
        r = qmp_call(src, "{\"execute\":\"migrate-set-parameters\",\"arguments\":{\"max-bandwidth\":1099511627776}}",
                     NULL);
        if (r >= 0)
                r = qmp_send_fd(src, "tally-fork", fd);
        if (r >= 0)
                r = qmp_call(src, "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:tally-fork\"}}", NULL);
        if (r < 0) {
                set_why(why, whylen, "QEMU refused to send the VM's state: %s", strerror(-r));
                return r;
        }
        int64_t deadline = now_ms() + 120000;
        for (;;) {
                json_t *st = NULL;
                r = qmp_call(src, "{\"execute\":\"query-migrate\"}", &st);
                if (r < 0) {
                        set_why(why, whylen, "could not follow the VM's state saving: %s", strerror(-r));
                        return r;
                }
                const char *status = json_string_value(json_object_get(st, "status"));
                bool done = status && strcmp(status, "completed") == 0;
                bool failed = status && (strcmp(status, "failed") == 0 || strcmp(status, "cancelled") == 0);
                char detail[256] = "";
                const char *e = json_string_value(json_object_get(st, "error-desc"));
                if (e)
                        snprintf(detail, sizeof(detail), "%s", e);
                json_decref(st);
                if (done)
                        return 0;
                if (failed) {
                        set_why(why, whylen, "sending the VM's state failed: %s", *detail ? detail : "(no detail)");
                        return -EIO;
                }
                if (now_ms() >= deadline) {
                        set_why(why, whylen, "sending the VM's state took over 120 s");
                        return -ETIMEDOUT;
                }
                usleep(20000);
        }
}

/* Waits until an incoming copy has loaded its state, and lets it run. */
static int wait_running(struct qemu_vm *vm, int64_t timeout_ms, char *why, size_t whylen)
{
        int64_t deadline = now_ms() + timeout_ms;
        for (;;) {
                json_t *st = NULL;
                int r = qmp_call(vm, "{\"execute\":\"query-status\"}", &st);
                if (r < 0) {
                        set_why(why, whylen, "the copy's QEMU did not answer: %s", strerror(-r));
                        return r;
                }
                const char *status = json_string_value(json_object_get(st, "status"));
                bool running = status && strcmp(status, "running") == 0;
                bool waiting = status && (strcmp(status, "inmigrate") == 0 || strcmp(status, "restore-vm") == 0 ||
                                          strcmp(status, "prelaunch") == 0);
                char now[64];
                snprintf(now, sizeof(now), "%s", status ? status : "unknown");
                json_decref(st);
                if (running)
                        return 0;
                if (strcmp(now, "paused") == 0) {
                        /* Loaded. The source was paused while its state was saved,
                         * and a copy starts in the state the source was in. */
                        r = qmp_command(vm, "cont");
                        if (r < 0) {
                                set_why(why, whylen, "the copy did not start: %s", strerror(-r));
                                return r;
                        }
                        continue;
                }
                if (!waiting) {
                        set_why(why, whylen, "the copy did not load the VM's state (QEMU says %s; see %s)", now,
                                vm->log_path);
                        return -EIO;
                }
                if (now_ms() >= deadline) {
                        set_why(why, whylen, "the copy did not load the VM's state within %lld ms",
                                (long long)timeout_ms);
                        return -ETIMEDOUT;
                }
                usleep(20000);
        }
}

int qemu_vm_fork(struct qemu_vm *src, const struct qemu_vm_spec *spec, const char *const *cgroup_procs_files,
                 struct qemu_vm **ret, char *why, size_t whylen)
{
        if (src->pid <= 0 || src->qmp < 0 || src->broken) {
                set_why(why, whylen, "the VM to copy is not running");
                return -ESRCH;
        }
        if (!spec->workdir) {
                set_why(why, whylen, "no working folder given for the copy");
                return -EINVAL;
        }
        if (src->vcpus == 0 || src->mem_mib == 0 || !src->kernel[0] || !src->initrd[0]) {
                set_why(why, whylen, "the VM's machine is not known, so it cannot be copied");
                return -EOPNOTSUPP;
        }
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
                int r = -errno;
                set_why(why, whylen, "could not create a socket pair: %m");
                return r;
        }
        /* The copy's end must not be 0, 1 or 2 (a daemon started with closed
         * stdio), which the child replaces with /dev/null and its log. */
        if (sv[1] <= 2) {
                int moved = fcntl(sv[1], F_DUPFD_CLOEXEC, 3);
                int r = moved < 0 ? -errno : 0;
                close(sv[1]);
                sv[1] = moved;
                if (r < 0) {
                        close(sv[0]);
                        set_why(why, whylen, "could not move a descriptor: %s", strerror(-r));
                        return r;
                }
        }
        /* The copy is the same machine: size, kernel and initramfs are the
         * source's. It starts first, waiting for the state on its end of the
         * pair, while the source still runs. */
        struct qemu_vm_spec copy = *spec;
        copy.vcpus = src->vcpus;
        copy.mem_mib = src->mem_mib;
        copy.kernel = src->kernel;
        copy.initrd = src->initrd;
        copy.kvm = strcmp(src->accel, "kvm") == 0;
        copy.qemu_binary = src->qemu[0] ? src->qemu : NULL;
        if (!copy.log_max_bytes)
                copy.log_max_bytes = src->log_max_bytes;
        struct qemu_vm *vm = NULL;
        int r = vm_spawn(&copy, cgroup_procs_files, sv[1], &vm, why, whylen);
        close(sv[1]);
        if (r < 0) {
                close(sv[0]);
                return r;
        }
        bool was_paused = __atomic_load_n(&src->paused, __ATOMIC_ACQUIRE);
        r = send_state(src, sv[0], why, whylen);
        close(sv[0]);
        /* The source goes on whatever happened to the copy. */
        if (!was_paused) {
                int c = qmp_command(src, "cont");
                if (c < 0 && r >= 0) {
                        set_why(why, whylen, "the VM did not resume after being copied: %s", strerror(-c));
                        r = c;
                }
        }
        /* The copy's agent sits where the source's was, between commands.
         * Bytes sent to it before the state is loaded would be lost with the
         * serial port's old state, so the ping waits for "running". */
        if (r >= 0)
                r = wait_running(vm, 60000, why, whylen);
        if (r >= 0)
                r = agent_ping(vm);
        if (r >= 0)
                r = qemu_vm_wait_ready(vm, 60000, why, whylen);
        if (r >= 0 && was_paused)
                r = qemu_vm_pause(vm);
        if (r < 0) {
                qemu_vm_stop(vm, 1000);
                qemu_vm_free(vm);
                return r;
        }
        *ret = vm;
        return 0;
}

/* Whether pid is gone (reaping it when it is our child; a zombie someone
 * else must reap counts as gone). */
static bool gone(struct qemu_vm *vm)
{
        if (vm->child) {
                pid_t w = waitpid(vm->pid, NULL, WNOHANG);
                if (w == vm->pid)
                        return true;
                if (w < 0 && errno == ECHILD)
                        vm->child = false; /* reaped elsewhere, or not ours after all */
                else
                        return false;
        }
        if (kill(vm->pid, 0) < 0 && errno == ESRCH)
                return true;
        char p[64], buf[512];
        snprintf(p, sizeof(p), "/proc/%d/stat", (int)vm->pid);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return true;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return true;
        buf[n] = 0;
        char *c = strrchr(buf, ')');
        return c && (c[2] == 'Z' || c[2] == 'X');
}

int qemu_vm_stop(struct qemu_vm *vm, int grace_ms)
{
        if (vm->pid <= 0)
                return 0;
        __atomic_store_n(&vm->stopped, true, __ATOMIC_RELEASE);
        /* quit's answer may never come (QEMU exits); its absence is fine. */
        if (vm->qmp >= 0) {
                char q[] = "{\"execute\":\"quit\"}\n";
                pthread_mutex_lock(&vm->qmp_lock);
                write_all(vm->qmp, q, sizeof(q) - 1, now_ms() + 1000);
                pthread_mutex_unlock(&vm->qmp_lock);
        }
        int64_t deadline = now_ms() + grace_ms;
        bool dead = false;
        while (!(dead = gone(vm)) && now_ms() < deadline)
                usleep(20000);
        if (!dead) {
                /* A QEMU in a frozen cgroup (v1) does not die of SIGKILL until
                 * thawed: the wait is bounded, and its end is an error, so a
                 * caller never takes a live QEMU for stopped. */
                kill(vm->pid, SIGKILL);
                deadline = now_ms() + STOP_KILL_WAIT_MS;
                while (!(dead = gone(vm)) && now_ms() < deadline)
                        usleep(10000);
                if (!dead)
                        return -ETIMEDOUT;
        }
        vm->pid = 0;
        /* Shut down, not closed: an exec in another thread may still be reading;
         * it sees the end of the stream. qemu_vm_free closes them. */
        if (vm->qmp >= 0)
                shutdown(vm->qmp, SHUT_RDWR);
        if (vm->agent >= 0)
                shutdown(vm->agent, SHUT_RDWR);
        return 0;
}

pid_t qemu_vm_pid(const struct qemu_vm *vm)
{
        return vm->pid;
}

const char *qemu_vm_accel(const struct qemu_vm *vm)
{
        return vm->accel;
}

void qemu_vm_free(struct qemu_vm *vm)
{
        if (!vm)
                return;
        /* A QEMU whose stop timed out (frozen) and that has died since is reaped here. */
        if (vm->child && vm->pid > 0)
                waitpid(vm->pid, NULL, WNOHANG);
        if (vm->qmp >= 0)
                close(vm->qmp);
        if (vm->agent >= 0)
                close(vm->agent);
        pthread_mutex_destroy(&vm->qmp_lock);
        free(vm);
}
