/* alerts.c — GET /v1/alerts: the spend alerts the aggregator recorded (one per
 * key, UTC day and threshold: 50, 80, 100 %) with their delivery state, newest
 * first, cursor-paginated, and the spend.limit_projected warnings (sql/009).
 * Optional filters: key, state (pending|delivered|failed). A person's
 * session also sees each alert's deliveries (an API key does not: they name
 * the account's destinations).
 * Scoped to the caller's account and, for an API key, to that key's alerts.
 * Nothing here writes. */
#include "api.h"
#include "read.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* state: delivered once any destination got the event (alerts.delivered_at,
 * written by tally-notifier), no_destination when it has no delivery (the
 * account had no enabled destination: nothing will send it), failed when it
 * has deliveries and all failed, else pending. Deliveries (a person's session only, $7) are listed per alert. */
#define ALERTS_SQL                                                                                       \
        "SELECT a.id, a.key_id, a.day::text, a.threshold_pct, a.spend_nanodollars, a.limit_nanodollars," \
        "       to_char(a.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"          \
        "       to_char(a.delivered_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"        \
        "       a.type, a.event_id::text,"                                                              \
        "       to_char(a.projected_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),"           \
        "       st.state, CASE WHEN $7::bool THEN coalesce(dl.list, '[]') END"                          \
        "  FROM alerts a"                                                                               \
        "  CROSS JOIN LATERAL (SELECT CASE WHEN a.delivered_at IS NOT NULL THEN 'delivered'"            \
        "         WHEN NOT EXISTS (SELECT 1 FROM alert_deliveries x WHERE x.alert_id = a.id)"           \
        "          THEN 'no_destination'"                                                              \
        "         WHEN EXISTS (SELECT 1 FROM alert_deliveries x WHERE x.alert_id = a.id)"               \
        "          AND NOT EXISTS (SELECT 1 FROM alert_deliveries x WHERE x.alert_id = a.id"            \
        "                          AND x.state <> 'failed') THEN 'failed'"                              \
        "         ELSE 'pending' END AS state) st"                                                      \
        "  LEFT JOIN LATERAL (SELECT json_agg(json_build_object('id', d.id, 'destination', d.destination_id," \
        "         'state', d.state, 'attempts', d.attempts, 'last_error', d.last_error,"                \
        "         'next_attempt_at', to_char(d.next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')," \
        "         'delivered_at', to_char(d.delivered_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')," \
        "         'resend_of', d.resend_of) ORDER BY d.id)::text AS list"                               \
        "         FROM alert_deliveries d WHERE d.alert_id = a.id AND $7::bool) dl ON true"             \
        " WHERE a.account_id = $1 AND ($2::text IS NULL OR a.key_id = $2::text)"                        \
        "   AND ($3::text IS NULL OR a.key_id = $3::text)"                                              \
        "   AND ($4::text IS NULL OR st.state = $4::text)"                                              \
        "   AND ($5::bigint IS NULL OR a.id < $5::bigint)"                                              \
        " ORDER BY a.id DESC LIMIT $6::int"

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
                return api_fail(err, 400, "invalid_field", "key", "key is an id: 1 to 64 of A-Z a-z 0-9 _ . : -");
        const char *state = get(ctx, "state");
        if (state && strcmp(state, "pending") != 0 && strcmp(state, "delivered") != 0 && strcmp(state, "failed") != 0 &&
            strcmp(state, "no_destination") != 0)
                return api_fail(err, 400, "invalid_field", "state",
                                "state is pending, delivered, failed or no_destination");
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
                        return api_fail(err, 400, "invalid_field", "cursor", "cursor is not one this API gave");
        }
        char lim[16];
        snprintf(lim, sizeof(lim), "%d", limit + 1);
        const char *params[] = { c->account, c->key[0] ? c->key : NULL, key, state, before[0] ? before : NULL, lim,
                                 c->person[0] ? "true" : "false" };
        PGresult *res = read_query(db, "alerts", ALERTS_SQL, 7, params, err);
        if (!res)
                return -EIO;
        int rows = PQntuples(res);
        bool more = rows > limit;
        if (more)
                rows = limit;
        json_t *data = json_array();
        for (int i = 0; i < rows; i++) {
                bool delivered = !PQgetisnull(res, i, 7);
                bool threshold = strcmp(PQgetvalue(res, i, 8), "spend.threshold_reached") == 0;
                json_t *a = json_pack("{s:I, s:s, s:s, s:s, s:s, s:I, s:I, s:s, s:s, s:o}", "id",
                                      (json_int_t)read_int64(res, i, 0), "event_id", PQgetvalue(res, i, 9), "type",
                                      PQgetvalue(res, i, 8), "key", PQgetvalue(res, i, 1), "day",
                                      PQgetvalue(res, i, 2), "spend_nanodollars", (json_int_t)read_int64(res, i, 4),
                                      "limit_nanodollars", (json_int_t)read_int64(res, i, 5), "created_at",
                                      PQgetvalue(res, i, 6), "state", PQgetvalue(res, i, 11), "delivered_at",
                                      delivered ? json_string(PQgetvalue(res, i, 7)) : json_null());
                json_object_set_new(a, "threshold_pct",
                                    threshold ? json_integer(atoi(PQgetvalue(res, i, 3))) : json_null());
                json_object_set_new(a, "projected_at",
                                    PQgetisnull(res, i, 10) ? json_null() : json_string(PQgetvalue(res, i, 10)));
                if (!PQgetisnull(res, i, 12)) {
                        json_t *dl = json_loads(PQgetvalue(res, i, 12), 0, NULL);
                        json_object_set_new(a, "deliveries", dl ? dl : json_array());
                }
                json_array_append_new(data, a);
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
