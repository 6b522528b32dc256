/* vmm_hosts.h — the hosts' tally-vmm daemons tally-api forwards the sandbox
 * lifecycle to (api/sandboxes.c): one vmm client (vmm/client.h) per entry of
 * the vmm_sockets setting — a unix socket's path, or HOST_ID=https://ADDRESS:PORT
 * for a daemon reached over mutual TLS, whose certificate must name HOST_ID —
 * a create's turn among them, and the map from a daemon's refusal to the
 * API's error.
 *
 * The daemons trust whoever opens their socket or shows tally-api's
 * certificate: nothing here checks tenancy, the callers do (sandboxes.c). */
#pragma once

#include "api.h"

#include <jansson.h>
#include <stddef.h>

struct vmm_hosts;

/* tally-api's side of the TLS transport (settings vmm_tls_*): file paths,
 * borrowed; needed only when an entry is https. */
struct vmm_hosts_tls {
        const char *cert;   /* tally-api's client certificate (PEM) */
        const char *key;    /* ... its key */
        const char *ca;     /* the CA that signs the hosts' certificates */
};

/* One host per entry of the comma-separated list. Returns 0 and *ret, or a
 * negative errno with err filled (-EINVAL: the list names none, an entry is
 * malformed, or an https entry lacks tls's files or cannot read them). */
int vmm_hosts_new(const char *sockets, const struct vmm_hosts_tls *tls, struct vmm_hosts **ret, char *err,
                  size_t errlen);
/* Accepts NULL. */
void vmm_hosts_free(struct vmm_hosts *h);
int vmm_hosts_count(const struct vmm_hosts *h);
/* The host a create goes to: the next in turn. */
int vmm_hosts_next(struct vmm_hosts *h);
/* One call to host i's tally-vmm; a POST without a body sends {}. Returns the
 * HTTP status with *ret the parsed answer (the caller decrefs; NULL when
 * none), or a negative errno when the daemon cannot be reached (logged here,
 * once: "could not reach tally-vmm"). */
long vmm_hosts_call(struct vmm_hosts *h, int i, const char *method, const char *path, json_t *body, json_t **ret);
/* Turns a daemon's refusal (status, its answer j, borrowed) — or a negative
 * status, an unreachable daemon — into the API's error. Returns api_fail's. */
int vmm_hosts_error(long status, const json_t *j, struct api_error *err);
