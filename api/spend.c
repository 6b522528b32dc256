/* spend.c — GET /v1/spend: per API key, today's spend against its daily
 * limit (the account's day, in its time zone: spend_day, sql/017; or the day
 * asked for), the burn rate and when the key reaches its limit at that rate
 * (docs/api-usage.md defines each figure).
 *
 * Today's spend is spend_daily.nanodollars, the figure enforcement uses. The
 * burn rate and the instant come from sql/016's spend_projection_of over the
 * key's points of today (spend_rate_points): the one projection the warning
 * before the limit (sql/016 spend_projection) records too, so the two name the
 * same instant. Scoped to the caller's account and, for an API key, to that
 * key alone. Nothing here writes. */
#include "api.h"
#include "read.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SPEND_SQL(KEY_FILTER, ORDER, OUTER_ORDER)                                                                    \
        "SELECT k.id, k.name, k.revoked, k.spend, div(2 * k.spend + 10000000, 20000000), k.lim, k.policy, k.blocked," \
        "       k.burn, w.day::text, (extract(epoch FROM w.t) * 1000000)::bigint,"                                    \
        "       (extract(epoch FROM k.window_start) * 1000000)::bigint, k.reaches_us, w.zone, w.today,"               \
        "       (extract(epoch FROM zone_day_start(w.zone, w.day)) * 1000000)::bigint,"                               \
        "       (extract(epoch FROM zone_day_start(w.zone, w.day + 1)) * 1000000)::bigint"                            \
        "  FROM (SELECT t, zone, coalesce($5::date, today) AS day, coalesce($5::date, today) = today AS today"         \
        "          FROM (SELECT t, account_zone($1) AS zone, (spend_day($1, t)).day AS today"                         \
        "                  FROM (SELECT now() AS t) n) n2) w"                                                          \
        "  LEFT JOIN LATERAL ("                                                                                       \
        "       SELECT a.id, a.name, a.revoked_at IS NOT NULL AS revoked, coalesce(d.nanodollars, 0) AS spend,"        \
        "              a.daily_limit_nanodollars AS lim, a.limit_policy AS policy,"                                     \
        /* key_blocked(a.id, w.t) of sql/002 written out: a SQL function call is parsed on every call */            \
        "              EXISTS (SELECT 1 FROM key_blocks b WHERE b.key_id = a.id AND b.day = w.day) AS blocked,"        \
        /* a day other than today has no burn and no instant */                                                     \
        "              CASE WHEN w.today THEN coalesce(pr.burn_nanodollars_per_hour, 0) ELSE 0 END AS burn,"           \
        "              CASE WHEN w.today THEN pr.window_start END AS window_start,"                                    \
        "              CASE WHEN w.today THEN pr.reaches_limit_us::bigint END AS reaches_us"                           \
        "         FROM api_keys a"                                                                                     \
        "         LEFT JOIN spend_daily d ON d.key_id = a.id AND d.day = w.day AND d.account_id = $1"                  \
        "         LEFT JOIN spend_rate_points p ON p.key_id = a.id AND p.day = w.day"                                  \
        "         LEFT JOIN LATERAL spend_projection_of(coalesce(p.a_at, p.b_at),"                                     \
        "                                               coalesce(p.a_nanodollars, p.b_nanodollars), p.last_at,"        \
        "                                               p.last_nanodollars, a.daily_limit_nanodollars, w.t) pr ON true"\
        "        WHERE a.account_id = $1 AND " KEY_FILTER                                                              \
        "          AND ($3::text IS NULL OR a.id COLLATE \"C\" > $3::text COLLATE \"C\")"                                 \
        "          AND (a.revoked_at IS NULL OR d.key_id IS NOT NULL)" ORDER ") k ON true" OUTER_ORDER

/* Two texts, each planned once per connection with a plan fit for it: an
 * API key reads its own row by primary key (at most one row: nothing to sort
 * or cut), a person the account's keys in pages. */
static const char spend_sql_key[] = SPEND_SQL("a.id = $2::text", "", "");
static const char spend_sql_account[] = SPEND_SQL("$2::text IS NULL", " ORDER BY a.id COLLATE \"C\" LIMIT $4::int",
                                                  " ORDER BY k.id COLLATE \"C\"");

enum {
        COL_ID, COL_NAME, COL_REVOKED, COL_SPEND, COL_SPEND_CENTS, COL_LIMIT, COL_POLICY, COL_BLOCKED, COL_BURN,
        COL_DAY, COL_AS_OF_US, COL_WINDOW_US, COL_REACHES_US, COL_ZONE, COL_TODAY, COL_DAY_START_US, COL_DAY_END_US
};

/* The last instant RFC 3339's four-digit years can name: 9999-12-31T23:59:59.999999Z. */
#define TIME_MAX_US INT64_C(253402300799999999)

/* us (Unix microseconds, 0 <= us <= TIME_MAX_US) as RFC 3339 in UTC, always
 * with six decimals when micro is true, none otherwise. */
static json_t *time_json(int64_t us, bool micro)
{
        time_t t = (time_t)(us / 1000000);
        struct tm tm;
        char buf[80];
        gmtime_r(&t, &tm);
        if (micro)
                snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long long)(us % 1000000));
        else
                snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        return json_string(buf);
}

/* A column of Unix microseconds as RFC 3339, or null. */
static json_t *time_or_null(const PGresult *res, int row, int col, bool micro)
{
        if (PQgetisnull(res, row, col))
                return json_null();
        int64_t us = read_int64(res, row, col);
        return us < 0 || us > TIME_MAX_US ? json_null() : time_json(us, micro);
}

static json_t *int_or_null(const PGresult *res, int row, int col)
{
        return PQgetisnull(res, row, col) ? json_null() : json_integer((json_int_t)read_int64(res, row, col));
}

/* YYYY-MM-DD naming a day that exists (years 1 to 9999). */
static bool date_valid(const char *s)
{
        static const int mdays[] = { 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
        if (strlen(s) != 10 || s[4] != '-' || s[7] != '-')
                return false;
        for (int i = 0; i < 10; i++)
                if (i != 4 && i != 7 && (s[i] < '0' || s[i] > '9'))
                        return false;
        int y = atoi(s), m = atoi(s + 5), d = atoi(s + 8);
        if (y < 1 || m < 1 || m > 12 || d < 1 || d > mdays[m - 1])
                return false;
        return m != 2 || d < 29 || (y % 4 == 0 && (y % 100 != 0 || y % 400 == 0));
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
        const char *day = get(ctx, "day");
        if (day && !date_valid(day)) {
                json_decref(cur);
                return api_fail(err, 400, "invalid_field", "day", "day is a date, YYYY-MM-DD (a day of the account's "
                                                                  "time zone)");
        }
        char lim[16];
        snprintf(lim, sizeof(lim), "%d", limit + 1);
        const char *params[] = { c->account, c->key[0] ? c->key : NULL, after, lim, day };
        PGresult *res = read_query(db, "spend", c->key[0] ? spend_sql_key : spend_sql_account, 5, params, err);
        if (!res) {
                json_decref(cur);
                return -EIO;
        }
        /* One row even when there is no key (its id NULL): the day and clock. */
        int rows = PQntuples(res) == 1 && PQgetisnull(res, 0, COL_ID) ? 0 : PQntuples(res);
        bool more = rows > limit;
        if (more)
                rows = limit;
        int64_t as_of_us = PQntuples(res) > 0 ? read_int64(res, 0, COL_AS_OF_US) : 0;
        json_t *data = json_array();
        for (int i = 0; i < rows; i++) {
                bool has_limit = !PQgetisnull(res, i, COL_LIMIT);
                int64_t spend = read_int64(res, i, COL_SPEND), cap = has_limit ? read_int64(res, i, COL_LIMIT) : 0;
                json_array_append_new(
                        data,
                        json_pack("{s:s, s:s, s:b, s:I, s:I, s:o, s:s, s:o, s:b, s:b, s:I, s:o, s:o}", "key",
                                  PQgetvalue(res, i, COL_ID), "name", PQgetvalue(res, i, COL_NAME), "revoked",
                                  PQgetvalue(res, i, COL_REVOKED)[0] == 't', "spend_nanodollars", (json_int_t)spend,
                                  "spend_cents", (json_int_t)read_int64(res, i, COL_SPEND_CENTS), "limit_nanodollars",
                                  int_or_null(res, i, COL_LIMIT), "limit_policy", PQgetvalue(res, i, COL_POLICY),
                                  "remaining_nanodollars",
                                  has_limit ? json_integer((json_int_t)(spend < cap ? cap - spend : 0)) : json_null(),
                                  "limit_reached", has_limit && spend >= cap, "blocked",
                                  PQgetvalue(res, i, COL_BLOCKED)[0] == 't', "burn_rate_nanodollars_per_hour",
                                  (json_int_t)read_int64(res, i, COL_BURN), "burn_window_start",
                                  time_or_null(res, i, COL_WINDOW_US, true), "reaches_limit_at",
                                  time_or_null(res, i, COL_REACHES_US, true)));
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
        /* The day and the instant are the statement's own, the same on every
         * row. Each key's burn has its own window (burn_window_start of its
         * row); the answer's is null since the projection moved to sql/016. */
        json_t *body = json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "day", json_null(), "as_of",
                                 json_null(), "burn_window_start", json_null(), "time_zone", json_null(), "today",
                                 json_null(), "day_start", json_null(), "day_end", json_null(), "data", data,
                                 "next_cursor", next);
        if (PQntuples(res) > 0) {
                /* The day is the account's (its time zone, said in time_zone), with the instants it
                 * starts and ends: 23 or 25 hours apart on a change of daylight saving time. */
                json_object_set_new(body, "day", json_string(PQgetvalue(res, 0, COL_DAY)));
                json_object_set_new(body, "as_of", time_json(as_of_us, true));
                json_object_set_new(body, "time_zone", json_string(PQgetvalue(res, 0, COL_ZONE)));
                json_object_set_new(body, "today", json_boolean(PQgetvalue(res, 0, COL_TODAY)[0] == 't'));
                json_object_set_new(body, "day_start", time_json(read_int64(res, 0, COL_DAY_START_US), false));
                json_object_set_new(body, "day_end", time_json(read_int64(res, 0, COL_DAY_END_US), false));
        }
        PQclear(res);
        json_decref(cur);
        return read_json_body(body, ret, err);
}
