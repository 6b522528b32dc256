/* read.h — what the read-side handlers (usage.c, spend.c, alerts.c) share:
 * RFC 3339 times, opaque cursors, page limits, JSON
 * bodies and running a parameterized query with its result checked. Private
 * to api/: the server only sees api.h. Nothing here writes to the database. */
#pragma once

#include "api.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#define READ_PAGE_DEFAULT 100
#define READ_PAGE_MAX     1000

/* Parses an RFC 3339 date-time ("2026-11-01T00:00:00Z", "...T02:00:00.5+02:00")
 * into Unix microseconds. Lowercase t/z are allowed as RFC 3339 says; a
 * leap second (:60) is refused. Returns 0 or -EINVAL. */
int read_time_parse(const char *s, int64_t *ret_us);
/* Formats Unix microseconds as RFC 3339 in UTC ("2026-11-01T00:00:00Z", with
 * .ffffff only when the microseconds are not zero). */
void read_time_format(char *buf, size_t size, int64_t us);

/* The `limit` parameter: absent -> def; else an integer 1..max, or a 400
 * naming "limit". */
int read_param_limit(api_param_fn get, void *ctx, int def, int max, int *ret, struct api_error *err);

/* A cursor is a JSON array, hex-encoded so that it is opaque and URL-safe.
 * read_cursor_encode returns a malloc'd string; read_cursor_decode returns the
 * array (caller decrefs) or NULL for anything malformed. */
char *read_cursor_encode(json_t *array);
json_t *read_cursor_decode(const char *s);

/* Makes an application/json body from o (which it steals). Returns 0 or -ENOMEM. */
int read_json_body(json_t *o, struct api_body *ret, struct api_error *err);

/* Runs a parameterized statement expecting rows, as a statement prepared on
 * db the first time this text runs there (named for a hash of the text), so
 * it is planned once per connection (a connection whose statements were
 * discarded simply prepares again). Call it outside a transaction: preparing
 * after the first attempt fails would find an aborted one. Returns the
 * result, or NULL after logging "could not <what>" and filling a 500 error. */
PGresult *read_query(PGconn *db, const char *what, const char *sql, int n, const char *const *params,
                    struct api_error *err);

/* Parameter types for read_query_typed (PostgreSQL's pg_type OIDs). */
#define READ_INT4        23
#define READ_TEXT        25
#define READ_TEXT_ARRAY  1009
#define READ_TIMESTAMPTZ 1184

/* read_query with the parameters' types given (n of them): a parameter typed
 * timestamptz is parsed once when bound, where one sent as text and cast in
 * the SQL is parsed again for every row a generic plan compares it with. */
PGresult *read_query_typed(PGconn *db, const char *what, const char *sql, int n, const Oid *types,
                           const char *const *params, struct api_error *err);

/* A bigint or numeric column value as an int64 (the column must hold an integer). */
int64_t read_int64(const PGresult *res, int row, int col);
