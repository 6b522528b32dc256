/* dispatch.h — one request from its head to its answer, without HTTP: the
 * route (router.h), who is asking (auth.c), whether they may (the route's
 * need, keys belong to people, CSRF, the rate limit), the query and the body;
 * then Idempotency-Key, the handler, and the check that a read used every
 * parameter it was sent. api/http.c drives it, on an HTTP thread or, for the
 * routes that wait, on a worker.
 *
 * Every error becomes the API's JSON error in the reply: nothing here fails
 * otherwise. */
#pragma once

#include "server.h"

#include <stdbool.h>
#include <stddef.h>

/* The first half, on the HTTP thread: route, caller, permission, query and
 * body. Returns true when out already holds the answer (an error); false
 * when the route's handler is to run (dispatch_back). *ret_ri: the route's
 * index (route_count() if none). */
bool dispatch_front(struct api_req *r, struct api_reply *out, size_t *ret_ri);
/* Whether the back half of route ri must run on a worker: a route that waits
 * (on a tally-vmm, on a password hash), or a write with an Idempotency-Key (a
 * retry waits there for the first). */
bool dispatch_on_worker(struct api_req *r, size_t ri);
/* The second half: Idempotency-Key, the handler, the unused-parameter check. */
void dispatch_back(struct api_req *r, size_t ri, struct api_reply *out);
/* Replaces out's body with e as the API's JSON error. */
void dispatch_error(struct api_reply *out, const struct api_error *e);
/* Whether a read failed (5xx) because its pooled connection turned out
 * broken: it may run once more, on the connection reconnected. A write is
 * never repeated: it may have committed. */
bool dispatch_lost_connection(const struct api_req *r, const struct api_reply *out);
