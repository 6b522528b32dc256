/* vmm_hosts.h — the hosts' tally-vmm daemons tally-api forwards the sandbox
 * lifecycle to (api/sandboxes.c): one vmm client (vmm/client.h) per socket of
 * the vmm_sockets setting, a create's turn among them, and the map from a
 * daemon's refusal to the API's error.
 *
 * The daemons trust whoever opens their socket: nothing here checks tenancy,
 * the callers do (sandboxes.c). */
#pragma once

#include "api.h"

#include <jansson.h>
#include <stddef.h>

struct vmm_hosts;

/* One host per name of the comma-separated socket list. Returns 0 and *ret,
 * or a negative errno with err filled (-EINVAL: the list names none). */
int vmm_hosts_new(const char *sockets, struct vmm_hosts **ret, char *err, size_t errlen);
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
