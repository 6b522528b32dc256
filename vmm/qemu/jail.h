/* jail.h — the confinement one QEMU process runs in, after Firecracker's
 * jailer: an unprivileged uid of its own, a private mount namespace whose root
 * is an empty read-only tmpfs holding only what QEMU needs (its binary and
 * libraries, its firmware, the guest's kernel and initramfs, a few device
 * nodes, and the one folder it may write: its sockets and console log), new
 * network, IPC, UTS and cgroup namespaces, no capabilities, no_new_privs, and
 * a file size limit. QEMU's own seccomp filter (-sandbox) goes on top.
 *
 * qemu_jail_prepare runs in the caller (it allocates and reads the host's
 * files); qemu_jail_enter runs in the forked child between fork and exec and
 * makes only async-signal-safe calls (raw syscalls on strings prepared
 * beforehand), because the daemon that forks has threads. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* QEMU's uid and gid are this base plus QEMU's own pid: unique among running
 * QEMUs without any allocation state, and outside the ranges Debian gives
 * users and system accounts. pid_max is at most 2^22, so the uids stay below
 * 2^31. */
#define QEMU_JAIL_UID_BASE 2100000000u
/* The largest file QEMU may write (its console log; its stderr): a guest
 * printing to its console without end cannot fill the host's disk. */
#define QEMU_JAIL_FSIZE_MAX (UINT64_C(16) << 20)

enum jail_op_kind { JAIL_MKDIR, JAIL_SYMLINK, JAIL_BIND_RO, JAIL_BIND_RW, JAIL_BIND_DEV, JAIL_NODE };

struct jail_op {
        enum jail_op_kind kind;
        bool file;                   /* binds: the source is not a folder (a file is made to mount on) */
        char *path;                  /* the path inside the jail, which is the host's path */
        char *full;                  /* root + path: where it is made before pivot_root */
        char *target;                /* JAIL_SYMLINK: the link's text */
        dev_t rdev;                  /* JAIL_NODE: a character device made for QEMU's uid alone */
};

struct qemu_jail {
        char root[4096];             /* host folder the jail's tmpfs is mounted on (in QEMU's namespace only) */
        char run_dir[4096];          /* host folder QEMU may write: its sockets and console log */
        char exe[4096];              /* the QEMU binary, an absolute path (the same inside the jail) */
        char *sockets[3];            /* files QEMU connects to, chowned to its uid (NULL-terminated) */
        char *env[3];                /* QEMU's whole environment */
        uint32_t uid_base;
        uint64_t fsize_max;
        int cap_last;
        bool nodes;                  /* the root holds a JAIL_NODE, so it is not mounted nodev */
        struct jail_op *ops;
        size_t nops, cap;
};

/* Plans the jail for a QEMU binary (a name looked up in PATH, or a path) in
 * workdir: <workdir>/qemu becomes QEMU's folder (made 0700 here; owned by
 * QEMU's uid once it runs), <workdir>/jail the mount point of its root.
 * qmp_sock and agent_sock are in the run folder. */
int qemu_jail_prepare(struct qemu_jail *j, const char *binary, const char *workdir, const char *kernel,
                      const char *initrd, bool kvm, const char *qmp_sock, const char *agent_sock, char *why,
                      size_t whylen);

/* In the child, after it entered its cgroup and before exec: builds the jail,
 * enters it and drops to QEMU's uid. keep_fd (or -1) stays open across exec;
 * every other descriptor above 2 is closed at exec. Returns 0, or a negative
 * errno with *ret_step set to a qemu_jail_step_name index (and *ret_op to the
 * failing op for JAIL_STEP_OP). */
int qemu_jail_enter(const struct qemu_jail *j, int keep_fd, int *ret_step, int *ret_op);

/* What a failed step was, for an error message. */
const char *qemu_jail_step_name(int step);

void qemu_jail_clear(struct qemu_jail *j);
