/* router.h — tally-api's one route table: every route the server answers,
 * who may call it, and whether it runs on a worker. The OpenAPI document is
 * kept equal to it by a test (tests/unit/api/test_openapi.c).
 *
 * A route's index is its identity for the rest of the server (metrics count
 * by it); route_count() stands for "no route" there. */
#pragma once

#include "server.h"

#include <stdbool.h>
#include <stddef.h>

enum route_need {
        NEED_NONE,   /* anyone (health, metrics, the OpenAPI document, sign-in) */
        NEED_ANY,    /* an API key or a person's session */
        NEED_PERSON, /* a person's session: keys and limits (invariant 5) */
        NEED_KEY,    /* an API key: sandboxes are created for, and charged to, a key */
};

struct route {
        const char *method;
        const char *pattern; /* "{id}" matches one path segment */
        api_handler_fn fn;
        enum route_need need;
        bool worker; /* slow (waits on a tally-vmm, or hashes a password): runs on a worker (workers.c),
                      * never on an HTTP thread */
};

/* How many routes there are; also the index that means "none". */
size_t route_count(void);
/* The i-th route (i < route_count()). */
const struct route *route_at(size_t i);
/* The route of method on path: its index, or route_count() when none, with
 * *ret_path_known telling whether another method has that path (405, not
 * 404). For a route found, id gets its {id} segment ("" if none) and
 * *ret_id_ok whether that is a valid id (id_valid). */
size_t route_find(const char *method, const char *path, char id[EVENT_ID_MAX + 1], bool *ret_id_ok,
                  bool *ret_path_known);
