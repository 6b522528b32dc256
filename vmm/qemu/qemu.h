/* qemu.h — one QEMU microVM sandbox, seen from the host.
 *
 * A VM is QEMU's `microvm` machine (KVM where /dev/kvm can be opened, else
 * TCG) booting Debian's kernel (scripts/guest-kernel) with tally's initramfs
 * (vmm/guest/): busybox and the guest agent, which runs commands sent over
 * the VM's second serial port (framing: vmm/guest/protocol.h). QEMU is placed
 * in the sandbox's cgroup between fork and exec, so the VM's every thread and
 * its boot CPU are counted there. Pause and resume go through QMP (stop/cont);
 * the caller applies the cgroup freezer around them.
 *
 * QEMU runs jailed (jail.h, docs/qemu.md "The jail"): as uid and gid
 * QEMU_JAIL_UID_BASE + its pid, with no capabilities, in its own mount,
 * network, IPC, UTS and cgroup namespaces whose root holds only what it
 * needs, under QEMU's seccomp filter (-sandbox on, everything denied that
 * can be). The caller must be root.
 *
 * This module knows nothing of the daemon: it takes the cgroup as a list of
 * files to write QEMU's pid into (v1 cgroup.procs or tasks of every hierarchy,
 * or the v2 folder's cgroup.procs). Errors are negative errno; where a
 * function takes a why buffer it explains a failure there in a sentence a
 * user can act on.
 *
 * Threads: exec runs one command at a time. While it runs, another thread may
 * call pause, resume or stop (an exec caught by stop returns an error; one
 * caught by pause waits, its host-side guard held back while paused). Start,
 * fork, attach and free are not to overlap anything else on the same VM. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct qemu_vm_spec {
        uint32_t vcpus;              /* -smp; 1..16 */
        uint64_t mem_mib;            /* -m; at least 64 */
        const char *kernel;          /* NULL: qemu_default_kernel() */
        const char *initrd;          /* NULL: qemu_default_initrd() */
        const char *workdir;         /* exists; gets qemu/ (QEMU's own folder: qmp.sock and agent.sock
                                      * while connecting, console.log), jail/ (its root's mount point),
                                      * qemu.log (QEMU's stderr) */
        bool kvm;                    /* true: -accel kvm (fails where /dev/kvm cannot be used); false: TCG */
        const char *qemu_binary;     /* NULL: qemu-system-x86_64 from PATH */
        int64_t boot_timeout_ms;     /* how long the first exec waits for the agent; 0: 120 s */
        uint64_t log_max_bytes;      /* the largest file QEMU may write (console log); 0: 16 MiB */
};

/* One command for the guest agent; argv[0] is looked up in the guest's PATH. */
struct qemu_exec_request {
        char *const *argv;           /* NULL-terminated, at least one element */
        const char *stdin_data;      /* NULL: empty stdin */
        size_t stdin_len;
        int64_t timeout_ns;          /* > 0: the guest kills the command after this long */
        size_t output_cap;           /* bytes kept of stdout and of stderr each; the rest is dropped */
};

/* What the command did; out and err are malloc'd and NUL-terminated (they may
 * hold NULs too); qemu_exec_result_clear frees them. */
struct qemu_exec_result {
        int exit_code;               /* 128 + signal if a signal ended it */
        bool timed_out;
        char *out;
        size_t out_len;
        bool out_truncated;
        char *err;
        size_t err_len;
        bool err_truncated;
};

void qemu_exec_result_clear(struct qemu_exec_result *r);

struct qemu_vm;

/* Whether KVM can be used here (/dev/kvm opens read-write). */
bool qemu_kvm_usable(void);

/* Whether a KVM guest really boots here: starts one small VM with KVM in
 * workdir and waits up to timeout_ms for its agent. /dev/kvm may open and yet
 * be unusable (nested hosts whose KVM lacks what the guest needs); callers
 * choosing between KVM and TCG ask this once, at start. */
bool qemu_kvm_boots(const char *workdir, int64_t timeout_ms, char *why, size_t whylen);

/* Whether the qemu backend can run on this host at all (QEMU, kernel and
 * initramfs present); if not, why. */
bool qemu_available(char *why, size_t whylen);

/* The kernel and initramfs the build made: $TALLY_GUEST_KERNEL and
 * $TALLY_GUEST_INITRD when set, else the files in the build folder. */
const char *qemu_default_kernel(void);
const char *qemu_default_initrd(void);

/* Starts a VM. cgroup_procs_files is a NULL-terminated list of files QEMU's
 * pid is written into before QEMU's first instruction (NULL or empty: none).
 * Returns once QEMU runs and its QMP and agent channels are connected; the
 * guest is still booting (qemu_vm_wait_ready, or the first exec, waits). */
int qemu_vm_start(const struct qemu_vm_spec *spec, const char *const *cgroup_procs_files, struct qemu_vm **ret,
                  char *why, size_t whylen);

/* Takes over a VM started earlier (by a process that has since exited) from
 * its workdir and QEMU's pid: QEMU reconnects its QMP and agent channels to
 * new sockets within a second or two. -ESRCH if pid is not that VM's QEMU.
 * A command that was running when the old process went is not reported. */
int qemu_vm_attach(const char *workdir, pid_t pid, struct qemu_vm **ret, char *why, size_t whylen);

/* Waits until the guest agent has said it is ready, at most timeout_ms. */
int qemu_vm_wait_ready(struct qemu_vm *vm, int64_t timeout_ms, char *why, size_t whylen);

/* Runs one command in the guest (waiting for the boot first). Returns 0 with
 * *ret filled when it ran, whatever its exit status; -errno when it could not
 * be run (-ETIMEDOUT: the guest did not answer; the VM is then unusable). */
int qemu_vm_exec(struct qemu_vm *vm, const struct qemu_exec_request *req, struct qemu_exec_result *ret,
                 char *why, size_t whylen);

/* QMP stop / cont: the guest's vCPUs halt / run again. */
int qemu_vm_pause(struct qemu_vm *vm);
int qemu_vm_resume(struct qemu_vm *vm);

/* Starts a copy of the running VM src: src is paused, its whole state (RAM,
 * vCPUs, devices) saved to a file in spec->workdir through QMP migrate, src
 * resumed (unless it was paused), and a new QEMU started in the copy's
 * cgroup that loads the state and runs on from there, processes and all.
 * Of spec only workdir and boot_timeout_ms count: the copy is src's machine.
 * Returns once the copy's agent answers. */
int qemu_vm_fork(struct qemu_vm *src, const struct qemu_vm_spec *spec, const char *const *cgroup_procs_files,
                 struct qemu_vm **ret, char *why, size_t whylen);

/* Asks QEMU to quit (QMP quit), SIGKILLs it after grace_ms, and reaps it.
 * Stopping a stopped VM returns 0. */
int qemu_vm_stop(struct qemu_vm *vm, int grace_ms);

/* QEMU's pid (0 once stopped), and the accelerator it runs on ("kvm", "tcg"). */
pid_t qemu_vm_pid(const struct qemu_vm *vm);
const char *qemu_vm_accel(const struct qemu_vm *vm);

/* Frees the handle; a VM not stopped keeps running. Accepts NULL. */
void qemu_vm_free(struct qemu_vm *vm);
