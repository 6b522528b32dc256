/* process.h — the "process" backend: a sandbox is a jail of Linux namespaces
 * around an init process (tally-sandbox-init, vmm/sandbox-init/), inside the
 * sandbox's cgroup: a user namespace with a uid range of its own (root inside
 * is an unprivileged uid outside), a private root file system with read-only
 * host binaries, its own /proc and a minimal /dev, a size-capped disk at /work,
 * a cgroup namespace, pid/mount/uts/ipc and (unless network is asked for) net
 * namespaces, and a seccomp filter. docs/security.md has the threat model and
 * what each layer stops; it does not stop kernel exploits (use qemu for that). */
#pragma once

#include "backend.h"

extern const struct backend_ops process_backend;
