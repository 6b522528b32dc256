/* api_create.h — the create route of tally-vmm's API, and the one guard that
 * no create outlives its caller (docs/vmm.md, "Creates nobody waits for").
 *
 * A create can take long (a boot, a host that was frozen mid-create), and its
 * caller may give up first: tally-api bounds a create at 90 s. A sandbox made
 * for a caller that is gone is running and billed, and nobody has its id. So:
 * - before making it and once it is ready, the create looks at its own
 *   connection: if the caller has hung up, nothing is made, or what was made
 *   is stopped at once, and the answer is 409;
 * - a create may carry "request_id" (tally-api sends one with every create);
 *   POST /v1/creates/cancel {"request_id"} stops the sandbox made for it, or,
 *   if that create has not come yet, makes it refused (409) when it comes.
 *   tally-api sends the cancel when a create's call ended with no answer, and
 *   sends it again until the host answers.
 * The last CREATE_CALLS_KEPT request ids are remembered, in memory only. */
#pragma once

#include "vmm.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>

#define CREATE_CALLS_KEPT 4096
#define REQUEST_ID_MAX    64 /* [A-Za-z0-9_.:-]{1,64}, as any id of events */

struct create_call {
        char request_id[REQUEST_ID_MAX + 1];
        char sandbox[EVENT_ID_MAX + 1];  /* "" until the create made one */
        bool cancelled;
};

struct create_calls {
        pthread_mutex_t lock;
        struct create_call ring[CREATE_CALLS_KEPT];
        unsigned next;                   /* the slot taken next (the oldest once full) */
};

void create_calls_init(struct create_calls *cc);
void create_calls_destroy(struct create_calls *cc);
/* Whether the peer of connection c has hung up (or half-closed: a caller of
 * this API never does while it waits for an answer). */
bool vmm_api_caller_gone(struct MHD_Connection *c);
/* POST /v1/sandboxes. body is borrowed. */
enum MHD_Result vmm_api_create(struct MHD_Connection *c, struct vmm *v, struct create_calls *cc, json_t *body);
/* POST /v1/creates/cancel {"request_id": id}: 200 {"request_id", "stopped": sandbox id or null}. */
enum MHD_Result vmm_api_create_cancel(struct MHD_Connection *c, struct vmm *v, struct create_calls *cc,
                                      json_t *body);
