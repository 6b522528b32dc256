/* api.h — tally-vmm's control API: HTTP/1.1 with JSON bodies over a unix
 * socket (only this host's users with access to the socket file may call it)
 * and, when tls_listen is set, the same API over TCP with mutual TLS (only a
 * client whose certificate the client CA signed for tls_client_name).
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

/* The most output of each stream (stdout, stderr) one exec may ask to get
 * back. The daemon holds a command's output until its answer is sent, so this
 * bounds what one exec costs it (twice this; see output_held_max). */
#define VMM_EXEC_OUTPUT_CAP_MAX (16LL * 1024 * 1024)

struct vmm_api_settings {
        unsigned int idle_timeout_s;          /* an idle connection is closed after this */
        unsigned int connections_max;         /* connections open at once, in all */
        unsigned int connections_per_client;  /* ... and per client: a root process, or another user id */
        long long output_held_max;            /* exec output held at once, all execs together (2 x cap each) */
        /* The API over TCP with mutual TLS: off when tls_listen is NULL or
         * empty. The listener has the same caps and timeouts as the socket
         * (connections_max of its own; a client there is one peer address).
         * The PEM texts are borrowed until vmm_api_start returns. */
        const char *tls_listen;               /* ADDRESS:PORT, [IPV6]:PORT */
        const char *tls_cert_pem;             /* this host's certificate (chain), named by its host_id */
        const char *tls_key_pem;              /* ... and its key */
        const char *tls_client_ca_pem;        /* the CA that signs the clients' certificates */
        const char *tls_client_name;          /* the name a client's certificate must carry */
};

struct vmm_api;

/* Listens on path (replacing a stale socket file), and on set->tls_listen
 * when set. Returns 0 or -errno with err. */
int vmm_api_start(struct vmm *v, const char *path, const struct vmm_api_settings *set, struct vmm_api **ret,
                  char *err, size_t errlen);
/* Stops taking connections (the socket file goes at once), waits until
 * deadline_mono_ns for the requests being answered, then stops and frees.
 * Returns 0, or -ETIMEDOUT if requests are still being answered then: the
 * server is left as it is (its threads still use the vmm), for the process
 * to exit. Accepts NULL. */
int vmm_api_stop(struct vmm_api *a, int64_t deadline_mono_ns);
/* The TCP port the TLS listener took (tls_listen's, or the one port 0
 * chose), 0 when it is off. */
int vmm_api_tls_port(const struct vmm_api *a);
/* Requests being answered now. */
int vmm_api_active(struct vmm_api *a);
