/* spend.c — GET /v1/spend: per API key, today's (UTC) spend against its daily
 * limit, the burn rate over the last minutes and when the key reaches its
 * limit at that rate (docs/api-usage.md defines each figure).
 *
 * Today's spend is spend_daily.nanodollars, the figure enforcement uses. The
 * burn rate is computed exactly in PostgreSQL numeric from usage_key_hourly
 * (sql/005: usage_hourly per key and hour, rated per hour): the window's rated
 * sums over a common denominator of the three meters' units, divided and
 * rounded once. Scoped to the caller's account
 * and, for an API key, to that key alone. Nothing here writes. */
#include "api.h"
#include "read.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* L = lcm of the three meters' base units per billing unit (docs/billing.md):
 * vCPU-hour 3.6e15/1e3 = 3,600e9 CPU-ns; GiB-hour 2^30 x 3,600e9 byte-ns;
 * GB-month 1e9 x 2,592,000e9 byte-ns. A window's rated sums over L are its
 * exact cost: L/B_cpu = 94371840000000000, L/B_mem = 87890625, L/B_storage = 131072. */
#define SPEND_SQL                                                                                                   \
        "WITH w AS (SELECT t, (t AT TIME ZONE 'UTC')::date AS day,"                                                 \
        "                  CASE WHEN t - date_trunc('hour', t, 'UTC') >= interval '15 minutes'"                     \
        "                       THEN date_trunc('hour', t, 'UTC')"                                                   \
        "                       ELSE date_trunc('hour', t, 'UTC') - interval '1 hour' END AS ws"                     \
        "             FROM (SELECT now() AS t) n),"                                                                  \
        " k AS (SELECT a.id, a.name, a.revoked_at, a.daily_limit_nanodollars, a.limit_policy FROM api_keys a, w"    \
        "        WHERE a.account_id = $1 AND ($2::text IS NULL OR a.id = $2::text)"                                 \
        "          AND ($3::text IS NULL OR a.id COLLATE \"C\" > $3::text COLLATE \"C\")"                            \
        "          AND (a.revoked_at IS NULL OR EXISTS (SELECT 1 FROM spend_daily d"                                 \
        "                WHERE d.key_id = a.id AND d.account_id = $1 AND d.day = w.day))"                            \
        "        ORDER BY a.id COLLATE \"C\" LIMIT $4::int),"                                                        \
        " s AS (SELECT k.*, w.t, w.day, w.ws, coalesce(d.nanodollars, 0) AS spend, key_blocked(k.id, w.t) AS blocked," \
        "              (extract(epoch FROM w.t - w.ws) * 1000000)::bigint AS window_us,"                             \
        "              coalesce(b.n, 0) AS n"                                                                         \
        "         FROM k CROSS JOIN w"                                                                               \
        "         LEFT JOIN spend_daily d ON d.key_id = k.id AND d.account_id = $1 AND d.day = w.day"               \
        "         LEFT JOIN LATERAL ("                                                                               \
        "              SELECT sum(h.cpu_rated * 94371840000000000 + h.memory_rated * 87890625"                       \
        "                         + h.storage_rated * 131072) AS n"                                                  \
        "                FROM usage_key_hourly h"                                                                    \
        "               WHERE h.account_id = $1 AND h.key_id = k.id AND h.hour >= w.ws AND h.hour <= w.t) b ON true),"  \
        " r AS (SELECT s.*, CASE WHEN window_us > 0"                                                                 \
        "                        THEN div(2 * n * 3600000000 + 339738624000000000000000000000 * window_us,"         \
        "                                 2 * 339738624000000000000000000000 * window_us) ELSE 0 END AS burn"       \
        "         FROM s)"                                                                                           \
        " SELECT r.id, r.name, r.revoked_at IS NOT NULL, r.spend, div(2 * spend + 10000000, 20000000),"                     \
        "        daily_limit_nanodollars, limit_policy, blocked, burn,"                                              \
        "        CASE WHEN daily_limit_nanodollars IS NOT NULL AND spend < daily_limit_nanodollars AND burn > 0"     \
        "             THEN to_char((r.t + div((daily_limit_nanodollars - spend)::numeric * 3600 + burn - 1, burn)"     \
        "                              * interval '1 second') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')" \
        "        END,"                                                                                               \
        "        CASE WHEN daily_limit_nanodollars IS NOT NULL"                                                      \
        "             THEN greatest(daily_limit_nanodollars - spend, 0) END,"                                        \
        "        w.day::text, to_char(w.t AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"                     \
        "        to_char(w.ws AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),"                                  \
        "        daily_limit_nanodollars IS NOT NULL AND spend >= daily_limit_nanodollars"                           \
        "   FROM w LEFT JOIN r ON true ORDER BY r.id COLLATE \"C\""

enum {
        COL_ID, COL_NAME, COL_REVOKED, COL_SPEND, COL_SPEND_CENTS, COL_LIMIT, COL_POLICY, COL_BLOCKED, COL_BURN,
        COL_ETA, COL_REMAINING, COL_DAY, COL_AS_OF, COL_WINDOW, COL_REACHED
};

static json_t *int_or_null(const PGresult *res, int row, int col)
{
        return PQgetisnull(res, row, col) ? json_null() : json_integer((json_int_t)read_int64(res, row, col));
}

int api_spend(PGconn *db, const struct api_caller *c, api_param_fn get, void *ctx, struct api_body *ret,
              struct api_error *err)
{
        int limit, r;
        if ((r = read_param_limit(get, ctx, READ_PAGE_DEFAULT, READ_PAGE_MAX, &limit, err)) < 0)
                return r;
        const char *after = NULL;
        json_t *cur = NULL;
        const char *cs = get(ctx, "cursor");
        if (cs) {
                cur = read_cursor_decode(cs);
                if (!cur || json_array_size(cur) != 2 || !json_is_string(json_array_get(cur, 0)) ||
                    strcmp(json_string_value(json_array_get(cur, 0)), "s1") != 0 ||
                    !json_is_string(json_array_get(cur, 1))) {
                        json_decref(cur);
                        return api_fail(err, 400, "invalid_field", "cursor", "cursor is not one this API gave");
                }
                after = json_string_value(json_array_get(cur, 1));
        }
        char lim[16];
        snprintf(lim, sizeof(lim), "%d", limit + 1);
        const char *params[] = { c->account, c->key[0] ? c->key : NULL, after, lim };
        PGresult *res = read_query(db, "spend", SPEND_SQL, 4, params, err);
        if (!res) {
                json_decref(cur);
                return -EIO;
        }
        /* One row even when there is no key (its id NULL): the day and clock. */
        int rows = PQntuples(res) == 1 && PQgetisnull(res, 0, COL_ID) ? 0 : PQntuples(res);
        bool more = rows > limit;
        if (more)
                rows = limit;
        json_t *data = json_array();
        for (int i = 0; i < rows; i++) {
                json_t *eta = PQgetisnull(res, i, COL_ETA) ? json_null() : json_string(PQgetvalue(res, i, COL_ETA));
                json_array_append_new(
                        data,
                        json_pack("{s:s, s:s, s:b, s:I, s:I, s:o, s:s, s:o, s:b, s:b, s:I, s:o}", "key",
                                  PQgetvalue(res, i, COL_ID), "name", PQgetvalue(res, i, COL_NAME), "revoked",
                                  PQgetvalue(res, i, COL_REVOKED)[0] == 't', "spend_nanodollars",
                                  (json_int_t)read_int64(res, i, COL_SPEND), "spend_cents",
                                  (json_int_t)read_int64(res, i, COL_SPEND_CENTS), "limit_nanodollars",
                                  int_or_null(res, i, COL_LIMIT), "limit_policy", PQgetvalue(res, i, COL_POLICY),
                                  "remaining_nanodollars", int_or_null(res, i, COL_REMAINING), "limit_reached",
                                  PQgetvalue(res, i, COL_REACHED)[0] == 't', "blocked",
                                  PQgetvalue(res, i, COL_BLOCKED)[0] == 't', "burn_rate_nanodollars_per_hour",
                                  (json_int_t)read_int64(res, i, COL_BURN), "reaches_limit_at", eta));
        }
        json_t *next = json_null();
        if (more && rows > 0) {
                json_t *a = json_pack("[s, s]", "s1", PQgetvalue(res, rows - 1, COL_ID));
                char *s = read_cursor_encode(a);
                json_decref(a);
                if (s) {
                        json_decref(next);
                        next = json_string(s);
                        free(s);
                }
        }
        /* The day, the instant and the window are the statement's own, the
         * same on every row. */
        json_t *day = json_null(), *as_of = json_null(), *window = json_null();
        if (PQntuples(res) > 0) {
                json_decref(day);
                json_decref(as_of);
                json_decref(window);
                day = json_string(PQgetvalue(res, 0, COL_DAY));
                as_of = json_string(PQgetvalue(res, 0, COL_AS_OF));
                window = json_string(PQgetvalue(res, 0, COL_WINDOW));
        }
        PQclear(res);
        json_decref(cur);
        return read_json_body(json_pack("{s:o, s:o, s:o, s:o, s:o}", "day", day, "as_of", as_of, "burn_window_start",
                                       window, "data", data, "next_cursor", next),
                             ret, err);
}
