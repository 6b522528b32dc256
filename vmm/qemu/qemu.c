/* qemu.c — the operations on one QEMU microVM (see qemu.h): whether the
 * host can run one, start, wait for the boot, exec, pause, resume, fork
 * (a copy through QMP migrate), stop, and the handle's end.
 *
 * The parts live beside it: spawn.c starts a QEMU, takeover.c attaches to
 * one a previous daemon started, qmp.c talks QMP, agent_chan.c talks to the
 * guest agent, sockio.c holds the socket I/O they share, vm.h the handle. */
#include "sockio.h"
#include "vm.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* How long stop waits for QEMU to go after SIGKILL. */
#define STOP_KILL_WAIT_MS 5000

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
                qio_set_why(why, whylen, "/dev/kvm cannot be opened");
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
                qio_set_why(why, whylen, "%s is not installed (Debian package qemu-system-x86)", QEMU_DEFAULT_BINARY);
                return false;
        }
        if (access(qemu_default_kernel(), R_OK) < 0) {
                qio_set_why(why, whylen, "no guest kernel at %s (scripts/guest-kernel fetches it)", qemu_default_kernel());
                return false;
        }
        if (access(qemu_default_initrd(), R_OK) < 0) {
                qio_set_why(why, whylen, "no guest initramfs at %s (built with vmm/guest)", qemu_default_initrd());
                return false;
        }
        return true;
}


struct qemu_vm *vm_alloc(bool kvm, int64_t boot_timeout_ms)
{
        struct qemu_vm *vm = calloc(1, sizeof(*vm));
        if (!vm)
                return NULL;
        qmp_init(&vm->qmp);
        agent_chan_init(&vm->agent);
        vm->accel = kvm ? "kvm" : "tcg";
        vm->boot_timeout_ms = boot_timeout_ms > 0 ? boot_timeout_ms : QEMU_BOOT_TIMEOUT_DEFAULT_MS;
        return vm;
}

int qemu_vm_start(const struct qemu_vm_spec *spec, const char *const *cgroup_procs_files, struct qemu_vm **ret,
                  char *why, size_t whylen)
{
        return vm_spawn(spec, cgroup_procs_files, -1, ret, why, whylen);
}

int qemu_vm_wait_ready(struct qemu_vm *vm, int64_t timeout_ms, char *why, size_t whylen)
{
        return agent_chan_wait_ready(&vm->agent, timeout_ms, why, whylen);
}

int qemu_vm_exec(struct qemu_vm *vm, const struct qemu_exec_request *req, struct qemu_exec_result *ret,
                 char *why, size_t whylen)
{
        if (!req->argv || !req->argv[0]) {
                qio_set_why(why, whylen, "no command given");
                return -EINVAL;
        }
        if (vm->agent.broken || vm->agent.fd < 0 || __atomic_load_n(&vm->stopped, __ATOMIC_ACQUIRE)) {
                qio_set_why(why, whylen, "the VM is not running or its agent stopped answering");
                return -ESRCH;
        }
        int r = agent_chan_wait_ready(&vm->agent, vm->boot_timeout_ms, why, whylen);
        if (r < 0)
                return r;
        return agent_chan_exec(&vm->agent, req, &vm->paused, ret, why, whylen);
}

/* --- pause, resume, fork, stop --- */

int qemu_vm_pause(struct qemu_vm *vm)
{
        int r = qmp_command(&vm->qmp, "stop");
        if (r >= 0)
                __atomic_store_n(&vm->paused, true, __ATOMIC_RELEASE);
        return r;
}

int qemu_vm_resume(struct qemu_vm *vm)
{
        int r = qmp_command(&vm->qmp, "cont");
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
        int r = qmp_command(&src->qmp, "stop");
        if (r < 0) {
                qio_set_why(why, whylen, "could not pause the VM to copy it: %s", strerror(-r));
                return r;
        }
        /* No bandwidth cap: the copy is local; QEMU's default of 32 MiB/s
         * would make a copy of a large VM take seconds per GiB. */
        r = qmp_call(&src->qmp, "{\"execute\":\"migrate-set-parameters\",\"arguments\":{\"max-bandwidth\":1099511627776}}",
                     NULL);
        if (r >= 0)
                r = qmp_send_fd(&src->qmp, "tally-fork", fd);
        if (r >= 0)
                r = qmp_call(&src->qmp, "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:tally-fork\"}}", NULL);
        if (r < 0) {
                qio_set_why(why, whylen, "QEMU refused to send the VM's state: %s", strerror(-r));
                return r;
        }
        int64_t deadline = time_mono_ms() + 120000;
        for (;;) {
                json_t *st = NULL;
                r = qmp_call(&src->qmp, "{\"execute\":\"query-migrate\"}", &st);
                if (r < 0) {
                        qio_set_why(why, whylen, "could not follow the VM's state saving: %s", strerror(-r));
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
                        qio_set_why(why, whylen, "sending the VM's state failed: %s", *detail ? detail : "(no detail)");
                        return -EIO;
                }
                if (time_mono_ms() >= deadline) {
                        qio_set_why(why, whylen, "sending the VM's state took over 120 s");
                        return -ETIMEDOUT;
                }
                usleep(20000);
        }
}

/* Waits until an incoming copy has loaded its state, and lets it run. */
static int wait_running(struct qemu_vm *vm, int64_t timeout_ms, char *why, size_t whylen)
{
        int64_t deadline = time_mono_ms() + timeout_ms;
        for (;;) {
                json_t *st = NULL;
                int r = qmp_call(&vm->qmp, "{\"execute\":\"query-status\"}", &st);
                if (r < 0) {
                        qio_set_why(why, whylen, "the copy's QEMU did not answer: %s", strerror(-r));
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
                        r = qmp_command(&vm->qmp, "cont");
                        if (r < 0) {
                                qio_set_why(why, whylen, "the copy did not start: %s", strerror(-r));
                                return r;
                        }
                        continue;
                }
                if (!waiting) {
                        qio_set_why(why, whylen, "the copy did not load the VM's state (QEMU says %s; see %s)", now,
                                vm->log_path);
                        return -EIO;
                }
                if (time_mono_ms() >= deadline) {
                        qio_set_why(why, whylen, "the copy did not load the VM's state within %lld ms",
                                (long long)timeout_ms);
                        return -ETIMEDOUT;
                }
                usleep(20000);
        }
}

int qemu_vm_fork(struct qemu_vm *src, const struct qemu_vm_spec *spec, const char *const *cgroup_procs_files,
                 struct qemu_vm **ret, char *why, size_t whylen)
{
        if (src->pid <= 0 || src->qmp.fd < 0 || src->agent.broken) {
                qio_set_why(why, whylen, "the VM to copy is not running");
                return -ESRCH;
        }
        if (!spec->workdir) {
                qio_set_why(why, whylen, "no working folder given for the copy");
                return -EINVAL;
        }
        if (src->vcpus == 0 || src->mem_mib == 0 || !src->kernel[0] || !src->initrd[0]) {
                qio_set_why(why, whylen, "the VM's machine is not known, so it cannot be copied");
                return -EOPNOTSUPP;
        }
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
                int r = -errno;
                qio_set_why(why, whylen, "could not create a socket pair: %m");
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
                        qio_set_why(why, whylen, "could not move a descriptor: %s", strerror(-r));
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
                int c = qmp_command(&src->qmp, "cont");
                if (c < 0 && r >= 0) {
                        qio_set_why(why, whylen, "the VM did not resume after being copied: %s", strerror(-c));
                        r = c;
                }
        }
        /* The copy's agent sits where the source's was, between commands.
         * Bytes sent to it before the state is loaded would be lost with the
         * serial port's old state, so the ping waits for "running". */
        if (r >= 0)
                r = wait_running(vm, 60000, why, whylen);
        if (r >= 0)
                r = agent_chan_ping(&vm->agent);
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

bool vm_gone(struct qemu_vm *vm)
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
        qmp_quit(&vm->qmp);
        int64_t deadline = time_mono_ms() + grace_ms;
        bool dead = false;
        while (!(dead = vm_gone(vm)) && time_mono_ms() < deadline)
                usleep(20000);
        if (!dead) {
                /* A QEMU in a frozen cgroup (v1) does not die of SIGKILL until
                 * thawed: the wait is bounded, and its end is an error, so a
                 * caller never takes a live QEMU for stopped. */
                kill(vm->pid, SIGKILL);
                deadline = time_mono_ms() + STOP_KILL_WAIT_MS;
                while (!(dead = vm_gone(vm)) && time_mono_ms() < deadline)
                        usleep(10000);
                if (!dead)
                        return -ETIMEDOUT;
        }
        vm->pid = 0;
        /* Shut down, not closed: an exec in another thread may still be reading;
         * it sees the end of the stream. qemu_vm_free closes them. */
        qmp_shutdown(&vm->qmp);
        agent_chan_shutdown(&vm->agent);
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
        qmp_free(&vm->qmp);
        agent_chan_free(&vm->agent);
        free(vm);
}