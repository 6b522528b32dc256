/* vmm_hosts.h — the hosts' tally-vmm daemons tally-api forwards the sandbox
 * lifecycle to (api/sandboxes.c): one vmm client (vmm/client.h) per entry of
 * the vmm_sockets setting — a unix socket's path, or HOST_ID=https://ADDRESS:PORT
 * for a daemon reached over mutual TLS, whose certificate must name HOST_ID —
 * a create's turn among them, and the map from a daemon's refusal to the
 * API's error.
 *
 * One host's trouble must never hold the API: every call has a total time
 * bound (VMM_CALL_*), at most calls_per_host calls run on one host at once
 * (a call that cannot get a slot soon is refused, -EBUSY), and a thread per
 * host probes its GET /v1/status every 2 s, so creates and listing skip a
 * host that does not answer and /healthz can say so.
 *
 * The daemons trust whoever opens their socket or shows tally-api's
 * certificate: nothing here checks tenancy, the callers do (sandboxes.c). */
#pragma once

#include "api.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Total bounds of one call, connect included (docs/api.md "Sandbox hosts").
 * Reads and the quick commands (pause, resume, stop, delete, timeout): */
#define VMM_CALL_SHORT_MS 10000
/* A create's bound is the setting vmm_create_timeout_s (90 s: the vmm bounds
 * a sandbox's start at 60 s, process_spawn.c INIT_READY_TIMEOUT_MS; QEMU's
 * boot is within it too). */
/* A fork makes up to 10 copies. */
#define VMM_CALL_FORK_MS 120000
/* An exec: its own timeout_ms plus this. */
#define VMM_CALL_EXEC_MARGIN_MS 10000
/* Below tally-vmm's api_connections_per_client (16), leaving room for the
 * watch's probe and a CLI. */
#define VMM_CALLS_PER_HOST_DEFAULT 8

struct vmm_hosts;

/* tally-api's side of the TLS transport (settings vmm_tls_*): file paths,
 * borrowed; needed only when an entry is https. */
struct vmm_hosts_tls {
        const char *cert;   /* tally-api's client certificate (PEM) */
        const char *key;    /* ... its key */
        const char *ca;     /* the CA that signs the hosts' certificates */
};

/* One host per entry of the comma-separated list (it may name none: hosts
 * then come from the registry). Returns 0 and *ret, or a negative errno with
 * err filled (-EINVAL: an entry is malformed, or an https entry lacks tls's
 * files or cannot read them). tls's paths are kept for the registry's hosts. */
int vmm_hosts_new(const char *sockets, const struct vmm_hosts_tls *tls, struct vmm_hosts **ret, char *err,
                  size_t errlen);
/* Accepts NULL. */
void vmm_hosts_free(struct vmm_hosts *h);
int vmm_hosts_count(const struct vmm_hosts *h);
/* Calls in flight on one host at most (before vmm_hosts_watch). */
void vmm_hosts_set_limit(struct vmm_hosts *h, int calls_per_host);
/* Starts the watch (one thread a host; vmm_hosts_free stops it). 0 or -errno. */
int vmm_hosts_watch(struct vmm_hosts *h);
/* Whether host i is not known down (the last probe or connect succeeded, or
 * none ran yet) and not retired. */
bool vmm_hosts_ready(struct vmm_hosts *h, int i);
/* Whether host i is left out of everything: the registry added it and then
 * forgot it or moved it to another address, or its entry reaches a host an
 * earlier entry reaches already.
 * Lists, caps and /healthz pass over it (healthz shows it, "retired"). */
bool vmm_hosts_retired(struct vmm_hosts *h, int i);
/* What a create asks of a host (MiB; the vmm's defaults when it says none). */
struct vmm_want {
        int64_t vcpus, memory_mib, disk_mib;
};
/* The host a create goes to (docs/api.md, "Placement"): among the ready
 * hosts other than skip (-1: none to skip), the one with room for want whose
 * fullest resource (promised + want, per mille of what it may promise) is
 * lowest, of PLACE_SAMPLE taken in turn, else of all; with room for it on
 * none, the least full (its tally-vmm refuses with 507 if it must). -1 when
 * no host is ready. */
int vmm_hosts_next(struct vmm_hosts *h, int skip, const struct vmm_want *want);
/* The host registry's rows (host_states: n of host_id, effective_state and
 * address, NULL when none): a create goes only to a host that is `ready`
 * there, or has no row and came from vmm_sockets. With discovery on, each
 * row whose address is https://ADDRESS:PORT and whose host id no host has
 * yet is added as a host (its certificate must name that id, as for a
 * vmm_sockets entry) and watched. Call from one thread only. */
void vmm_hosts_set_states(struct vmm_hosts *h, int n, const char *const *host_ids, const char *const *states,
                          const char *const *addresses);
/* Whether vmm_hosts_set_states adds the registry's hosts (before watching). */
void vmm_hosts_discover(struct vmm_hosts *h, bool on);
/* Counts want as promised on host i until its next probe says what it has
 * promised (so creates between two probes do not all pick one host). */
void vmm_hosts_promise(struct vmm_hosts *h, int i, const struct vmm_want *want);
/* The index of the host whose tally-vmm said it is host_id, -1 when none
 * has (yet). */
int vmm_hosts_find(struct vmm_hosts *h, const char *host_id);
/* One call to host i's tally-vmm, all of it within timeout_ms; a POST without
 * a body sends {}. Returns the HTTP status with *ret the parsed answer (the
 * caller decrefs; NULL when none), or a negative errno (logged here, once):
 * -EBUSY, no slot on the host within a short wait (nothing was sent);
 * -ENOTCONN, the daemon could not be reached (nothing was sent; the host is
 * marked down until its probe answers); -ETIMEDOUT, no answer in time (the
 * daemon may have acted); -EIO, another failure after sending. */
long vmm_hosts_call(struct vmm_hosts *h, int i, const char *method, const char *path, json_t *body, int64_t timeout_ms,
                    json_t **ret);
/* Queues a cancel of the create sent to host i with request_id whose call
 * ended with no answer (-ETIMEDOUT, -EIO: the host may make it yet): host i's
 * watch sends POST /v1/creates/cancel at its next answered probe, and again
 * until the host answers it, so the sandbox is stopped, or the create refused
 * when it comes (vmm/api_create.h). At most 64 wait per host. */
void vmm_hosts_cancel_create(struct vmm_hosts *h, int i, const char *request_id);
/* /healthz's "hosts": [{"index", "host", "reachable", "last_ok",
 * "calls_in_flight"}] (new reference); *ret_all_up whether every host is ready. */
json_t *vmm_hosts_health(struct vmm_hosts *h, bool *ret_all_up);
/* {"index": i, "host": its host_id or null} (new reference). */
json_t *vmm_hosts_describe(struct vmm_hosts *h, int i);
/* Turns a daemon's refusal (status, its answer j, borrowed) — or a negative
 * status, an unreachable daemon — into the API's error. Returns api_fail's. */
int vmm_hosts_error(long status, const json_t *j, struct api_error *err);
