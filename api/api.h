/* api.h — the contract between tally-api's HTTP server (routing, sign-in,
 * keys, limits, sandboxes, idempotency: api/server.c and friends) and its
 * read-side handlers (usage, spend, alerts, CSV, the OpenAPI document:
 * api/usage.c and friends).
 *
 * The read handlers never see HTTP: they take a database connection, the
 * authenticated caller and a query-parameter lookup, and return a body or an
 * error. Every query they run is parameterized and scoped to caller->account
 * in SQL; an API key caller sees only what that key created. They never
 * write. */
#pragma once

#include "event.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

/* Who is asking, as the server authenticated it. Exactly one of key and
 * person is non-empty. */
struct api_caller {
        char account[EVENT_ID_MAX + 1];
        char key[EVENT_ID_MAX + 1];    /* an API key's id (agents), or "" */
        char person[EVENT_ID_MAX + 1]; /* a signed-in person's id, or "" */
};

/* An error answer: status (4xx/5xx), a stable machine code ("invalid_field",
 * "not_found", ...), a message for people, and the field at fault ("" if none).
 * The server renders {"error": {"code", "message", "field"}}. */
struct api_error {
        int status;
        char code[32];
        char message[256];
        char field[64];
};

/* Fills *err (status, code, field — NULL for none — and a printf message) and
 * returns -EINVAL for a 4xx status, -EIO for 5xx, so that a handler can
 * `return api_fail(...)`. The one error helper of every handler (api/read.c). */
int api_fail(struct api_error *err, int status, const char *code, const char *field, const char *fmt, ...)
        __attribute__((format(printf, 5, 6)));

/* Looks up one query-string parameter; NULL when absent. Repeated parameters
 * (?meter=cpu&meter=memory) are joined with commas by the server. */
typedef const char *(*api_param_fn)(void *ctx, const char *name);

/* A body the handler made: malloc'd, the caller frees it. */
struct api_body {
        char *data;
        size_t len;
        const char *content_type; /* static: "application/json" or "text/csv; charset=utf-8" */
};

/* GET /v1/usage (from, to, granularity, group_by, meter, cursor,
 * limit); csv selects text/csv. Returns 0 and fills *ret, or a negative errno
 * with *err filled (status 4xx for the caller's mistakes, 500 otherwise). */
int api_usage(PGconn *db, const struct api_caller *c, api_param_fn get, void *ctx, bool csv, struct api_body *ret,
              struct api_error *err);

/* GET /v1/spend: today's spend per key against its limit, burn rate, ETA. */
int api_spend(PGconn *db, const struct api_caller *c, api_param_fn get, void *ctx, struct api_body *ret,
              struct api_error *err);

/* GET /v1/alerts: alerts with their delivery state, cursor-paginated. */
int api_alerts(PGconn *db, const struct api_caller *c, api_param_fn get, void *ctx, struct api_body *ret,
               struct api_error *err);

/* GET /v1/openapi.json: the OpenAPI 3.1 document of every route (static). */
const char *api_openapi_json(void);
