/* process_sandbox.h — one sandbox of the process backend as the backend's
 * parts share it (internal: the daemon sees only process.h's table).
 *
 * process_spawn.c starts a sandbox's init (tally-sandbox-init) in its
 * namespaces and cgroup, process_exec.c runs a command in it,
 * process_files.c keeps the files the backend leaves in the sandbox's
 * folder, process.c holds the table and the remaining operations.
 *
 * Code that runs between fork/clone and exec (process_place_fds,
 * process_say) makes system calls only: the daemon has threads. Errors are
 * negative errno; a why buffer, where given, explains a refusal. */
#pragma once

#include "backend.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/un.h>

struct backend_sandbox {
        pid_t init;                  /* the sandbox's pid 1, as this host sees it */
        bool is_child;               /* init is this daemon's child (reaped on stop) */
        bool internet;               /* the init sets the egress proxy in commands' environment */
        struct sandbox_cgroup cg;
        char id[EVENT_ID_MAX + 1];
        char dir[PATH_MAX];
};

/* process_spawn.c */

/* tally-sandbox-init's path (TALLY_SANDBOX_INIT, beside tally-vmm, or where
 * the build or the install put it), or NULL if it is nowhere to be found. */
const char *process_init_program(void);

/* Whether the init program exists; if not, why. */
bool process_available(char *why, size_t whylen);

/* The jail's configuration (sandbox-init/jail.h): NUL-terminated strings in
 * a memfd the init reads. keys[] are "key=value"; argv may be NULL. Returns
 * the fd (the caller closes it). */
int process_jail_config(const char *const *keys, size_t nkeys, char *const *argv);

/* In a child of the threaded daemon: puts from[i] at descriptor to[i] (from
 * -1: closed; n at most 8), /dev/null at 0-2 unless given, closes the rest.
 * System calls only. Returns 0 or -1. */
int process_place_fds(const int *from, const int *to, int n);

/* Writes s to fd, ignoring failure (a child's last word). System calls only. */
void process_say(int fd, const char *s);

/* Starts an init for spec in cg, its folder dir; copy_from is a running
 * sandbox whose disk is copied in (fork), or NULL. *ret is the new sandbox
 * (process_free frees it), *ret_pid its init. */
int process_start_init(const struct sandbox_spec *spec, const struct sandbox_cgroup *cg, const char *dir,
                       const struct backend_sandbox *copy_from, struct backend_sandbox **ret, pid_t *ret_pid,
                       char *why, size_t whylen);

/* process_exec.c: the backend's exec operation (backend.h). */
int process_exec(struct backend_sandbox *sb, const struct exec_request *req, struct exec_result *ret, char *why,
                 size_t whylen);

/* process_files.c */

/* Records the sandbox's main program (command may be NULL: none) in dir, for
 * a fork after a restart. */
int process_write_command(const char *dir, char **command);

/* The main program recorded at start: a malloc'd NULL-terminated argv whose
 * strings live in one block (free(argv[0]) then free(argv)), or NULL for none.
 * -ENOENT when nothing was recorded. */
int process_read_command(const char *dir, char ***ret);

/* Writes the lease's end (CLOCK_REALTIME ns; 0: none) where the init reads it. */
int process_write_lease(const char *dir, int64_t deadline_wall_ns);

/* The lease's end known before start: the spec's, else the registry's
 * record (dir is <state_dir>/vmm/<id>). 0 if unknown. */
int64_t process_start_deadline(const struct sandbox_spec *spec, const char *dir);

/* The path of the init's exec socket, <dir>/init.sock, into a's sun_path;
 * false if it is too long for a unix socket. */
bool process_init_socket_path(const char *dir, struct sockaddr_un *a);
