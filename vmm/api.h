/* api.h — tally-vmm's local control API: HTTP/1.1 with JSON bodies over a unix
 * socket (only this host's users with access to the socket file may call it).
 * Routes, all under /v1 (docs/vmm.md):
 *   GET  /status                    the daemon: host, cgroup version, backends, control readiness
 *   GET  /sandboxes[?account=ID]    list
 *   POST /sandboxes                 create (spec.h)
 *   GET  /sandboxes/ID              show
 *   DELETE /sandboxes/ID            stop (same as POST .../stop)
 *   POST /sandboxes/ID/exec         {"command": [argv] | "sh text", "stdin": str, "timeout_ms": n, "output_cap": n}
 *   POST /sandboxes/ID/pause|resume|stop
 *   POST /sandboxes/ID/fork         {"count": 1..10}
 *   POST /sandboxes/ID/timeout      {"timeout_s": n}   (extends the lease from now)
 * Errors are 4xx/5xx with {"error": "a sentence"}. */
#pragma once

#include "vmm.h"

struct vmm_api;

/* Listens on path (replacing a stale socket file). Returns 0 or -errno with err. */
int vmm_api_start(struct vmm *v, const char *path, struct vmm_api **ret, char *err, size_t errlen);
/* Stops listening and removes the socket file. Accepts NULL. */
void vmm_api_stop(struct vmm_api *a);
