/* process.h — the "process" backend: a sandbox is a set of Linux namespaces
 * (pid, mount, uts, ipc and, unless network is asked for, net) around an init
 * process, inside the sandbox's cgroup. It shares the host's root file system
 * (read-write), so it isolates accounting and process trees, not a hostile
 * program: use the qemu backend for untrusted code. */
#pragma once

#include "backend.h"

extern const struct backend_ops process_backend;
