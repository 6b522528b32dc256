/* vm.h — one QEMU VM as the qemu backend's parts share it (internal: the
 * daemon sees only qemu.h).
 *
 * struct qemu_vm owns QEMU's process (reaped by qemu_vm_stop or
 * qemu_vm_free when it is our child), its QMP client (qmp.h) and its agent
 * channel (agent_chan.h), and remembers the machine a copy must be started
 * with. It is made by vm_alloc and filled either by vm_spawn (spawn.c: a new
 * QEMU) or by qemu_vm_attach (takeover.c: a QEMU a previous daemon started);
 * qemu.c holds the operations on a running VM. */
#pragma once

#include "agent_chan.h"
#include "qemu.h"
#include "qmp.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define QEMU_DEFAULT_BINARY "qemu-system-x86_64"
/* How long QEMU may take to connect its sockets (at start, or reconnecting after a takeover). */
#define QEMU_CONNECT_TIMEOUT_MS 10000
#define QEMU_BOOT_TIMEOUT_DEFAULT_MS 120000

struct qemu_vm {
        pid_t pid;                   /* 0 once stopped */
        bool child;                  /* pid is our child (reaped with waitpid) */
        bool paused;                 /* QMP stop was the last word (atomic: exec reads it) */
        bool stopped;                /* stop was called (atomic) */
        const char *accel;           /* "kvm" or "tcg" (static) */
        int64_t boot_timeout_ms;
        struct qmp qmp;
        struct agent_chan agent;
        char log_path[4096];         /* QEMU's stderr, <workdir>/qemu.log */
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

/* A VM handle with nothing connected and no process (pid 0), or NULL when
 * memory ran out; qemu_vm_free frees it. */
struct qemu_vm *vm_alloc(bool kvm, int64_t boot_timeout_ms);

/* Starts QEMU for spec, jailed (jail.h), in the cgroup files given; with
 * incoming_fd >= 0, QEMU loads a running VM's state from that descriptor
 * instead of booting (fork). *ret is the new VM, its QMP and agent channels
 * connected. */
int vm_spawn(const struct qemu_vm_spec *spec, const char *const *cgroup_procs_files, int incoming_fd,
             struct qemu_vm **ret, char *why, size_t whylen);

/* Accepts QEMU's connection on the listening socket lfd before deadline,
 * watching that QEMU still runs (-ECHILD, and vm->pid 0, once it is gone). */
int vm_accept(struct qemu_vm *vm, int lfd, int64_t deadline);

/* Whether QEMU is gone (reaping it when it is our child; a zombie someone
 * else must reap counts as gone). */
bool vm_gone(struct qemu_vm *vm);
