/* alerts.c — GET /v1/alerts: the spend alerts the aggregator recorded (one per
 * key, UTC day and threshold: 50, 80, 100 %) with their delivery state, newest
 * first, cursor-paginated. Optional filters: key, state (pending|delivered).
 * Scoped to the caller's account and, for an API key, to that key's alerts.
 * Nothing here writes. */
#include "api.h"
#include "read.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALERTS_SQL                                                                                       \
        "SELECT id, key_id, day::text, threshold_pct, spend_nanodollars, limit_nanodollars,"             \
        "       to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"            \
        "       to_char(delivered_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"           \
        "  FROM alerts"                                                                                  \
        " WHERE account_id = $1 AND ($2::text IS NULL OR key_id = $2::text)"                             \
        "   AND ($3::text IS NULL OR key_id = $3::text)"                                                 \
        "   AND ($4::text IS NULL OR (delivered_at IS NOT NULL) = ($4::text = 'delivered'))"             \
        "   AND ($5::bigint IS NULL OR id < $5::bigint)"                                                 \
        " ORDER BY id DESC LIMIT $6::int"

static bool key_id_valid(const char *s)
{
        size_t n = strlen(s);
        if (n < 1 || n > EVENT_ID_MAX)
                return false;
        return strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-") == n;
}

int api_alerts(PGconn *db, const struct api_caller *c, api_param_fn get, void *ctx, struct api_body *ret,
               struct api_error *err)
{
        int limit, r;
        if ((r = read_param_limit(get, ctx, READ_PAGE_DEFAULT, READ_PAGE_MAX, &limit, err)) < 0)
                return r;
        const char *key = get(ctx, "key");
        if (key && !key_id_valid(key))
                return read_fail(err, 400, "invalid_field", "key", "key is an id: 1 to 64 of A-Z a-z 0-9 _ . : -");
        const char *state = get(ctx, "state");
        if (state && strcmp(state, "pending") != 0 && strcmp(state, "delivered") != 0)
                return read_fail(err, 400, "invalid_field", "state", "state is pending or delivered");
        char before[24] = "";
        const char *cs = get(ctx, "cursor");
        if (cs) {
                json_t *a = read_cursor_decode(cs);
                bool ok = a && json_array_size(a) == 2 && json_is_string(json_array_get(a, 0)) &&
                          !strcmp(json_string_value(json_array_get(a, 0)), "a1") &&
                          json_is_integer(json_array_get(a, 1)) && json_integer_value(json_array_get(a, 1)) > 0;
                if (ok)
                        snprintf(before, sizeof(before), "%lld", (long long)json_integer_value(json_array_get(a, 1)));
                json_decref(a);
                if (!ok)
                        return read_fail(err, 400, "invalid_field", "cursor", "cursor is not one this API gave");
        }
        char lim[16];
        snprintf(lim, sizeof(lim), "%d", limit + 1);
        const char *params[] = { c->account, c->key[0] ? c->key : NULL, key, state, before[0] ? before : NULL, lim };
        PGresult *res = read_query(db, "alerts", ALERTS_SQL, 6, params, err);
        if (!res)
                return -EIO;
        int rows = PQntuples(res);
        bool more = rows > limit;
        if (more)
                rows = limit;
        json_t *data = json_array();
        for (int i = 0; i < rows; i++) {
                bool delivered = !PQgetisnull(res, i, 7);
                json_array_append_new(
                        data, json_pack("{s:I, s:s, s:s, s:i, s:I, s:I, s:s, s:s, s:o}", "id",
                                        (json_int_t)read_int64(res, i, 0), "key", PQgetvalue(res, i, 1), "day",
                                        PQgetvalue(res, i, 2), "threshold_pct", atoi(PQgetvalue(res, i, 3)),
                                        "spend_nanodollars", (json_int_t)read_int64(res, i, 4), "limit_nanodollars",
                                        (json_int_t)read_int64(res, i, 5), "created_at", PQgetvalue(res, i, 6),
                                        "state", delivered ? "delivered" : "pending", "delivered_at",
                                        delivered ? json_string(PQgetvalue(res, i, 7)) : json_null()));
        }
        json_t *next = json_null();
        if (more && rows > 0) {
                json_t *a = json_pack("[s, I]", "a1", (json_int_t)read_int64(res, rows - 1, 0));
                char *s = read_cursor_encode(a);
                json_decref(a);
                if (s) {
                        json_decref(next);
                        next = json_string(s);
                        free(s);
                }
        }
        PQclear(res);
        return read_json_body(json_pack("{s:o, s:o}", "data", data, "next_cursor", next), ret, err);
}
