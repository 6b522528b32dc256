/* api_reply.h — the answers of tally-vmm's local API (api.c, api_exec.c):
 * JSON bodies, errors as {"error": "a sentence"} with the HTTP status an
 * operation's -errno maps to (vmm.h lists them), and optional integer fields
 * of a request's body. Every answer closes its connection. */
#pragma once

#include <jansson.h>
#include <microhttpd.h>
#include <stddef.h>
#include <stdint.h>

/* Queues j (stolen: always freed) as the answer with status. */
enum MHD_Result vmm_reply_json(struct MHD_Connection *c, unsigned int status, json_t *j);
/* {"error": why}. why may hold the client's own bytes (a sandbox id from the
 * URL, jansson's excerpt of a bad body), cut anywhere by a %.64s: where they
 * are not UTF-8 jansson would refuse the string and the client get no answer
 * at all, so such bytes are sent as '?'. */
enum MHD_Result vmm_reply_error(struct MHD_Connection *c, unsigned int status, const char *why);
/* The HTTP status of an operation's -errno (400, 403, 404, 409, 422, 503, 507, else 500). */
unsigned int vmm_reply_status_for(int r);
/* r < 0: the error (why, or strerror when why is empty), and ok is freed;
 * else ok (stolen; NULL: {}) with okstatus. */
enum MHD_Result vmm_reply_result(struct MHD_Connection *c, int r, const char *why, json_t *ok, unsigned int okstatus);
/* The integer field name of body, from min to max, or def when absent. 0, or
 * -EINVAL with why. */
int vmm_body_opt_int(json_t *body, const char *name, int64_t min, int64_t max, int64_t def, int64_t *out, char *why,
                     size_t whylen);
