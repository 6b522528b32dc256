/* spawn.c — starts one QEMU: a new VM, or the copy of a running one that
 * loads its state (see vm.h, vm_spawn).
 *
 * Order matters: the listening sockets for QMP and the agent exist before
 * QEMU does (QEMU connects to them as a client, so there is no race with a
 * socket file appearing), and the forked child writes its own pid into the
 * sandbox's cgroup files before it execs QEMU, so not one instruction of
 * QEMU or its guest runs outside the cgroup. The child only makes
 * async-signal-safe calls (the daemon that calls us has threads): everything
 * it uses is prepared in a struct launch before the fork. */
#include "jail.h"
#include "sockio.h"
#include "vm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define ARGV_MAX 48

/* Everything one start prepares, then releases (launch_clear) whether QEMU
 * started or not. */
struct launch {
        char kernel[4096], initrd[4096];   /* absolute and free of links: the jail mirrors them */
        char qemu_dir[4200];               /* <workdir>/qemu: QEMU's own folder */
        char console_path[4200];
        char smp[32], mem[32], incoming[32];
        char qmp_dev[4200], agent_dev[4200], console_dev[4300];
        const char *argv[ARGV_MAX];
        int qmp_l, agent_l;                /* the listening sockets QEMU connects to */
        int logfd;                         /* QEMU's stderr */
        int errpipe[2];                    /* the child's struct child_failure, if it fails before exec */
        struct qemu_jail jail;
        bool jailed;                       /* jail is prepared (qemu_jail_clear owed) */
};

/* What the child reports through the error pipe when it cannot exec QEMU. */
struct child_failure {
        int stage;                   /* index of the cgroup file; -1: exec; -2 - n: jail step n */
        int err;
        int op;                      /* the jail's op that failed, or -1 */
};

/* The spec's sizes and paths, checked; the kernel and initramfs resolved into l. */
static int check_spec(const struct qemu_vm_spec *spec, struct launch *l, char *why, size_t whylen)
{
        if (spec->vcpus < 1 || spec->vcpus > 16) {
                qio_set_why(why, whylen, "vcpus must be 1 to 16, not %u", spec->vcpus);
                return -EINVAL;
        }
        if (spec->mem_mib < 64) {
                qio_set_why(why, whylen, "a qemu sandbox needs at least 64 MiB of memory");
                return -EINVAL;
        }
        if (!spec->workdir) {
                qio_set_why(why, whylen, "no working folder given");
                return -EINVAL;
        }
        if (strchr(spec->workdir, ',')) {
                /* QEMU's option syntax would split the socket paths at it. */
                qio_set_why(why, whylen, "the working folder's path holds a comma: %s", spec->workdir);
                return -EINVAL;
        }
        if (spec->kvm && !qemu_kvm_usable()) {
                qio_set_why(why, whylen, "KVM was asked for but /dev/kvm cannot be opened: %m");
                return -ENODEV;
        }
        const char *kernel_arg = spec->kernel ? spec->kernel : qemu_default_kernel();
        const char *initrd_arg = spec->initrd ? spec->initrd : qemu_default_initrd();
        if (!realpath(kernel_arg, l->kernel) || !realpath(initrd_arg, l->initrd) || access(l->kernel, R_OK) < 0 ||
            access(l->initrd, R_OK) < 0) {
                int r = -errno;
                qio_set_why(why, whylen, "guest kernel %s or initramfs %s is missing", kernel_arg, initrd_arg);
                return r;
        }
        return 0;
}

/* The VM's paths and machine, and QEMU's command line, into vm and l.
 * QEMU's sockets and console log are in its own folder, <workdir>/qemu, the
 * one folder of the host it can write; its stderr goes to <workdir>/qemu.log,
 * which it cannot see (the descriptor is opened here). */
static void build_command(const struct qemu_vm_spec *spec, int incoming_fd, struct qemu_vm *vm, struct launch *l)
{
        vm->vcpus = spec->vcpus;
        vm->mem_mib = spec->mem_mib;
        vm->log_max_bytes = spec->log_max_bytes;
        snprintf(vm->kernel, sizeof(vm->kernel), "%s", l->kernel);
        snprintf(vm->initrd, sizeof(vm->initrd), "%s", l->initrd);
        snprintf(vm->qmp_path, sizeof(vm->qmp_path), "%s/qemu/qmp.sock", spec->workdir);
        snprintf(vm->agent_path, sizeof(vm->agent_path), "%s/qemu/agent.sock", spec->workdir);
        snprintf(vm->log_path, sizeof(vm->log_path), "%s/qemu.log", spec->workdir);
        snprintf(l->qemu_dir, sizeof(l->qemu_dir), "%s/qemu", spec->workdir);
        snprintf(l->console_path, sizeof(l->console_path), "%s/qemu/console.log", spec->workdir);
        snprintf(l->smp, sizeof(l->smp), "%u", spec->vcpus);
        snprintf(l->mem, sizeof(l->mem), "%llu", (unsigned long long)spec->mem_mib);
        snprintf(l->qmp_dev, sizeof(l->qmp_dev), "socket,id=qmp,path=%s,reconnect=1", vm->qmp_path);
        snprintf(l->agent_dev, sizeof(l->agent_dev), "socket,id=agent,path=%s,reconnect=1", vm->agent_path);
        snprintf(l->console_dev, sizeof(l->console_dev), "file:%s", l->console_path);
        snprintf(l->incoming, sizeof(l->incoming), "fd:%d", incoming_fd);

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
        const char *argv[] = {
                qemu, "-M", "microvm,isa-serial=on,rtc=on,pit=on,pic=on,acpi=off",
                "-accel", spec->kvm ? "kvm" : "tcg,tb-size=64", "-cpu", spec->kvm ? "host" : "max",
                "-smp", l->smp, "-m", l->mem,
                "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
                "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
                "-kernel", l->kernel, "-initrd", l->initrd,
                "-append", "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init tsc=reliable",
                "-serial", l->console_dev,
                "-chardev", l->agent_dev, "-device", "isa-serial,chardev=agent,iobase=0x2f8,irq=3",
                "-chardev", l->qmp_dev, "-mon", "chardev=qmp,mode=control",
        };
        size_t n = sizeof(argv) / sizeof(argv[0]);
        _Static_assert(sizeof(argv) / sizeof(argv[0]) + 3 <= ARGV_MAX, "ARGV_MAX too small");
        memcpy(l->argv, argv, sizeof(argv));
        if (incoming_fd >= 0) {
                l->argv[n++] = "-incoming";
                l->argv[n++] = l->incoming;
        }
        l->argv[n] = NULL;
        snprintf(vm->qemu, sizeof(vm->qemu), "%s", qemu);
}

/* QEMU's folder and the two sockets it will connect to. */
static int open_sockets(struct qemu_vm *vm, struct launch *l, char *why, size_t whylen)
{
        if (mkdir(l->qemu_dir, 0700) < 0 && errno != EEXIST) {
                int r = -errno;
                qio_set_why(why, whylen, "could not create %s: %s", l->qemu_dir, strerror(-r));
                return r;
        }
        /* A console log left by an earlier QEMU (another uid) would be refused to this one. */
        unlink(l->console_path);
        l->qmp_l = qio_listen_unix(vm->qmp_path);
        if (l->qmp_l < 0) {
                qio_set_why(why, whylen, "could not listen on %s: %s", vm->qmp_path, strerror(-l->qmp_l));
                return l->qmp_l;
        }
        l->agent_l = qio_listen_unix(vm->agent_path);
        if (l->agent_l < 0) {
                qio_set_why(why, whylen, "could not listen on %s: %s", vm->agent_path, strerror(-l->agent_l));
                return l->agent_l;
        }
        return 0;
}

/* The jail's plan, QEMU's log and the child's error pipe. */
static int prepare_jail(const struct qemu_vm_spec *spec, struct qemu_vm *vm, struct launch *l, char *why,
                        size_t whylen)
{
        int r = qemu_jail_prepare(&l->jail, l->argv[0], spec->workdir, l->kernel, l->initrd, spec->kvm, vm->qmp_path,
                                  vm->agent_path, why, whylen);
        if (r < 0)
                return r;
        l->jailed = true;
        if (spec->log_max_bytes)
                l->jail.fsize_max = spec->log_max_bytes;
        l->argv[0] = l->jail.exe;
        snprintf(vm->qemu, sizeof(vm->qemu), "%s", l->jail.exe);
        l->logfd = open(vm->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (l->logfd < 0 || pipe2(l->errpipe, O_CLOEXEC) < 0) {
                r = -errno;
                qio_set_why(why, whylen, "could not create %s: %m", vm->log_path);
                return r;
        }
        return 0;
}

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

__attribute__((noreturn)) static void child_fail(int fd, int stage, int err, int op)
{
        struct child_failure f = { stage, err, op };
        ssize_t ignored = write(fd, &f, sizeof(f));
        (void)ignored;
        _exit(127);
}

/* The forked child, up to exec: async-signal-safe calls only. */
__attribute__((noreturn)) static void child_run(const struct launch *l, const char *const *cgroup_procs_files,
                                                int incoming_fd)
{
        /* The cgroup first: every instruction from here on is counted there. */
        char num[16];
        size_t n = format_pid(num, getpid());
        for (int i = 0; cgroup_procs_files && cgroup_procs_files[i]; i++) {
                int fd = open(cgroup_procs_files[i], O_WRONLY | O_CLOEXEC);
                if (fd < 0 || write(fd, num, n) != (ssize_t)n)
                        child_fail(l->errpipe[1], i, errno, -1);
                close(fd);
        }
        int null = open("/dev/null", O_RDONLY);
        if (null < 0 || dup2(null, 0) < 0 || dup2(l->logfd, 1) < 0 || dup2(l->logfd, 2) < 0)
                child_fail(l->errpipe[1], -1, errno, -1);
        if (null > 2)
                close(null);
        int step = 0, op = -1;
        int jr = qemu_jail_enter(&l->jail, incoming_fd, &step, &op);
        if (jr < 0)
                child_fail(l->errpipe[1], -2 - step, -jr, op);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execve(l->jail.exe, (char *const *)l->argv, l->jail.env);
        child_fail(l->errpipe[1], -1, errno, -1);
}

/* Forks the child that becomes QEMU, and waits until it execed (the error
 * pipe closes) or says why it could not. */
static int fork_qemu(const struct qemu_vm_spec *spec, const char *const *cgroup_procs_files, int incoming_fd,
                     struct qemu_vm *vm, struct launch *l, char *why, size_t whylen)
{
        pid_t pid = fork();
        if (pid < 0) {
                int r = -errno;
                qio_set_why(why, whylen, "could not fork: %m");
                return r;
        }
        if (pid == 0)
                child_run(l, cgroup_procs_files, incoming_fd);
        vm->pid = pid;
        vm->child = true;
        close(l->errpipe[1]);
        l->errpipe[1] = -1;
        struct child_failure f;
        ssize_t got;
        do
                got = read(l->errpipe[0], &f, sizeof(f));
        while (got < 0 && errno == EINTR);
        if (got != (ssize_t)sizeof(f))
                return 0;
        waitpid(pid, NULL, 0);
        vm->pid = 0;
        const char *qemu = spec->qemu_binary ? spec->qemu_binary : QEMU_DEFAULT_BINARY;
        if (f.stage >= 0)
                qio_set_why(why, whylen, "could not put QEMU into cgroup file %s: %s", cgroup_procs_files[f.stage],
                            strerror(f.err));
        else if (f.stage == -1)
                qio_set_why(why, whylen, "could not run %s: %s", qemu, strerror(f.err));
        else if (f.op >= 0 && (size_t)f.op < l->jail.nops)
                qio_set_why(why, whylen, "could not jail QEMU: could not make %s in its jail: %s",
                            l->jail.ops[f.op].path, strerror(f.err));
        else
                qio_set_why(why, whylen, "could not jail QEMU: could not %s: %s", qemu_jail_step_name(-2 - f.stage),
                            strerror(f.err));
        return -f.err;
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

/* Takes QEMU's two connections and enters QMP's command mode. */
static int connect_qemu(struct qemu_vm *vm, struct launch *l, char *why, size_t whylen)
{
        int64_t deadline = time_mono_ms() + QEMU_CONNECT_TIMEOUT_MS;
        vm->qmp.fd = vm_accept(vm, l->qmp_l, deadline);
        if (vm->qmp.fd >= 0)
                vm->agent.fd = vm_accept(vm, l->agent_l, deadline);
        if (vm->qmp.fd < 0 || vm->agent.fd < 0) {
                int r = vm->qmp.fd < 0 ? vm->qmp.fd : vm->agent.fd;
                /* qmp_free and agent_chan_free close only a descriptor */
                if (vm->qmp.fd < 0)
                        vm->qmp.fd = -1;
                if (vm->agent.fd < 0)
                        vm->agent.fd = -1;
                char tail[256];
                log_tail(vm->log_path, tail, sizeof(tail));
                qio_set_why(why, whylen, "QEMU did not start: %s", *tail ? tail : strerror(-r));
                return r;
        }
        int r = qmp_handshake(&vm->qmp, deadline);
        if (r < 0)
                qio_set_why(why, whylen, "QEMU's QMP did not answer: %s", strerror(-r));
        return r;
}

/* Releases what the start prepared: the listeners and their socket files,
 * the log's and the error pipe's descriptors, the jail's plan. */
static void launch_clear(struct qemu_vm *vm, struct launch *l)
{
        if (l->qmp_l >= 0) {
                close(l->qmp_l);
                unlink(vm->qmp_path);
        }
        if (l->agent_l >= 0) {
                close(l->agent_l);
                unlink(vm->agent_path);
        }
        if (l->logfd >= 0)
                close(l->logfd);
        for (int i = 0; i < 2; i++)
                if (l->errpipe[i] >= 0)
                        close(l->errpipe[i]);
        if (l->jailed)
                qemu_jail_clear(&l->jail);
}

int vm_spawn(const struct qemu_vm_spec *spec, const char *const *cgroup_procs_files, int incoming_fd,
             struct qemu_vm **ret, char *why, size_t whylen)
{
        struct launch *l = calloc(1, sizeof(*l));
        if (!l)
                return -ENOMEM;
        l->qmp_l = l->agent_l = l->logfd = l->errpipe[0] = l->errpipe[1] = -1;
        int r = check_spec(spec, l, why, whylen);
        if (r < 0) {
                free(l);
                return r;
        }
        struct qemu_vm *vm = vm_alloc(spec->kvm, spec->boot_timeout_ms);
        if (!vm) {
                free(l);
                return -ENOMEM;
        }
        build_command(spec, incoming_fd, vm, l);
        if ((r = open_sockets(vm, l, why, whylen)) >= 0 && (r = prepare_jail(spec, vm, l, why, whylen)) >= 0 &&
            (r = fork_qemu(spec, cgroup_procs_files, incoming_fd, vm, l, why, whylen)) >= 0)
                r = connect_qemu(vm, l, why, whylen);
        launch_clear(vm, l);
        free(l);
        if (r < 0) {
                if (vm->pid > 0) {
                        kill(vm->pid, SIGKILL);
                        waitpid(vm->pid, NULL, 0);
                }
                vm->pid = 0;
                qemu_vm_free(vm);
                return r;
        }
        *ret = vm;
        return 0;
}

int vm_accept(struct qemu_vm *vm, int lfd, int64_t deadline)
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
                if (vm_gone(vm)) {
                        vm->pid = 0;
                        return -ECHILD;
                }
                if (time_mono_ms() >= deadline)
                        return -ETIMEDOUT;
        }
}
