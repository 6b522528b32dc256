/* backend.h — what a sandbox backend does for tally-vmm.
 *
 * The daemon owns everything common to all backends: the sandbox's id and
 * spec, its cgroup (vmm/cgroup.h: created before start, frozen on pause,
 * read for the final CPU counter, removed after stop), its registry record,
 * its events and its timeout. A backend only runs the sandbox: it starts the
 * sandbox's processes *inside the cgroup it is given, before their first
 * instruction*, runs commands in it, and ends it.
 *
 * Backends are listed in one table (vmm/backend.c): "process" (Linux namespaces,
 * vmm/process.c) and a slot for "qemu" (a microVM, vmm/qemu/). "auto" picks
 * qemu when KVM exists and the qemu backend is built, else process.
 *
 * Errors are negative errno; a backend may explain a refusal in the why buffer
 * the daemon passes, which ends up in the API's error message. */
#pragma once

#include "cgroup.h"
#include "event.h"
#include "registry.h"

#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SANDBOX_VCPUS_MAX 16

/* What to run, as asked for by the sandbox's creator. */
struct sandbox_spec {
        char id[EVENT_ID_MAX + 1];
        char account[EVENT_ID_MAX + 1];
        char key[EVENT_ID_MAX + 1];
        uint32_t vcpus;              /* 1..SANDBOX_VCPUS_MAX */
        uint64_t mem_bytes;          /* memory size: the cgroup's limit, the VM's RAM */
        uint64_t disk_bytes;         /* disk size */
        bool internet;               /* false: loopback only (the default); true: the daemon's egress proxy
                                        serves the sandbox (egress.h): the backend gives it the proxy's
                                        address, or refuses if it cannot */
        uint32_t pids_max;           /* the cgroup's pids.max; 0: the backend's default (process: 1024) */
        int64_t lease_deadline_wall_ns; /* the lease's end (CLOCK_REALTIME ns) known at start; 0: none yet
                                           (set_lease sets it after start) */
        char **command;              /* NULL-terminated argv of the sandbox's main program, or NULL for none
                                        (process: an idle init; qemu: the guest agent alone). Borrowed. */
        const char *image;           /* backend-specific image name, NULL or "" for the default. Borrowed. */
};

/* One command to run inside a running sandbox. */
struct exec_request {
        char *const *argv;           /* NULL-terminated; argv[0] is looked up in the sandbox's PATH */
        const char *stdin_data;      /* NULL: stdin is empty */
        size_t stdin_len;
        int64_t timeout_ns;          /* > 0: the command is killed after this long */
        size_t output_cap;           /* bytes kept of stdout and of stderr each; the rest is read and dropped */
        const atomic_int *cancel;    /* may be NULL; once it reads non-zero (the daemon is stopping) the
                                        command is ended as at a timeout and exec returns -ECANCELED */
};

/* What the command did. out and err are malloc'd (NUL-terminated for
 * convenience; they may hold NULs); free them with exec_result_clear. */
struct exec_result {
        int exit_code;               /* exit status; 128 + signal if a signal ended it */
        bool timed_out;              /* killed at the timeout (exit_code then says how it died) */
        char *out;
        size_t out_len;
        bool out_truncated;
        char *err;
        size_t err_len;
        bool err_truncated;
};

void exec_result_clear(struct exec_result *r);

/* A backend's per-sandbox state; each backend defines it. */
struct backend_sandbox;

struct backend_ops {
        const char *name;            /* "process", "qemu" */
        /* true if several exec() calls on one sandbox may run at once; if false
         * the daemon runs a sandbox's commands one after another. */
        bool concurrent_exec;

        /* Memory the backend itself uses beyond the sandbox's memory size (QEMU's
         * own process around the guest's RAM). The cgroup's limit is the size plus
         * this; billing uses the size alone. */
        uint64_t memory_overhead_bytes;

        /* Whether this host can run the backend; if not, why. May be NULL (always). */
        bool (*available)(char *why, size_t whylen);

        /* Whether the backend runs with hardware virtualisation here (qemu: a KVM
         * guest really boots, probed once and remembered). "auto" picks a backend
         * that says so. NULL: no. */
        bool (*accelerated)(void);

        /* Starts the sandbox. cg exists and is empty; every process and thread the
         * sandbox runs must be in it before its first instruction. dir is a folder of
         * the sandbox's own (created, empty, kept until the sandbox is removed), for
         * its disk, sockets and logs. On success *ret is the backend's state and
         * *ret_pid the sandbox's main process on this host (recorded in the registry). */
        int (*start)(const struct sandbox_spec *spec, const struct sandbox_cgroup *cg, const char *dir,
                     struct backend_sandbox **ret, pid_t *ret_pid, char *why, size_t whylen);

        /* Runs one command in the running sandbox. Returns 0 with *ret filled when the
         * command ran (whatever its exit status, also on timeout), or -errno when it
         * could not be run at all. */
        int (*exec)(struct backend_sandbox *sb, const struct exec_request *req, struct exec_result *ret,
                    char *why, size_t whylen);

        /* Called before the daemon freezes the cgroup / after it thaws it (QEMU: QMP
         * stop / cont). NULL: the freezer alone suffices. */
        int (*pause)(struct backend_sandbox *sb);
        int (*resume)(struct backend_sandbox *sb);

        /* Starts one copy of the running sandbox src as a new sandbox (spec, cg and dir
         * as for start; spec->id is the copy's). *ret_processes_copied says whether
         * the copy continues src's processes (true) or only has src's files and spec
         * and started afresh (false). Returns -EOPNOTSUPP, with why, where the backend
         * cannot copy a sandbox at all. NULL: -EOPNOTSUPP. */
        int (*fork)(struct backend_sandbox *src, const struct sandbox_spec *spec, const struct sandbox_cgroup *cg,
                    const char *dir, struct backend_sandbox **ret, pid_t *ret_pid, bool *ret_processes_copied,
                    char *why, size_t whylen);

        /* Sets the sandbox's lease: at deadline_wall_ns (CLOCK_REALTIME) the sandbox
         * is ended by itself (its init, or the kernel), even while tally-vmm is down.
         * 0 = no lease. The daemon calls it after start, on `timeout`, and on resume
         * before thawing. NULL: the backend has no lease of its own. */
        int (*set_lease)(struct backend_sandbox *sb, int64_t deadline_wall_ns);

        /* Ends every process of the sandbox. The cgroup stays (the daemon reads its
         * final counter, then removes it). Stopping a stopped sandbox returns 0. */
        int (*stop)(struct backend_sandbox *sb);

        /* After a daemon restart: takes over a sandbox the registry says is running
         * or paused (rec->pid is its main process). Returns -ESRCH if it is gone. */
        int (*recover)(const struct sandbox_record *rec, const struct sandbox_cgroup *cg, const char *dir,
                       struct backend_sandbox **ret);

        /* Frees the state (after stop, or when the daemon exits leaving the sandbox
         * running for a later recover). Accepts NULL. */
        void (*free)(struct backend_sandbox *sb);
};

/* The backend called name ("process", "qemu"), or NULL if unknown or not built. */
const struct backend_ops *backend_find(const char *name);

/* Resolves "auto" (qemu with KVM when built, else process) or a backend's name.
 * Returns the backend, or NULL with the reason in why (unknown, not built, not
 * available on this host). *ret_reason says why auto chose what it chose. */
const struct backend_ops *backend_resolve(const char *name, const char **ret_reason, char *why, size_t whylen);

/* Names of every backend built in, e.g. "process, qemu". */
const char *backend_names(void);

#ifdef VMM_HAVE_QEMU
/* The qemu backend's operations (vmm/qemu/backend_qemu.c), built with -Dqemu. */
extern const struct backend_ops qemu_backend;
#endif
