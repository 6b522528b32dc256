/* account.c — GET and PUT /v1/account/settings: the account's time zone,
 * whose days the daily limits, spend and alerts count and whose calendar
 * months the invoices are (docs/billing.md "Days and time zones").
 *
 * Anyone of the account may read it (an agent needs it to read /v1/spend's
 * days); only a person changes it, through account_set_time_zone (sql/017),
 * which validates the zone, rebuilds the account's days and audits the change
 * in one transaction. Never an API key. */
#include "db.h"
#include "log.h"
#include "server.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

/* The settings as the API shows them: the zone, today's date in it and the
 * instants today starts and ends (UTC), its length in hours (23, 24 or 25) and
 * the zone's offset now. */
#define SETTINGS_SQL                                                                                                  \
        "SELECT a.id, a.time_zone, d.day::text, to_char(d.s AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "   \
        "       to_char(d.e AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "                                  \
        "       (extract(epoch FROM d.e - d.s) / 3600)::int, "                                                       \
        "       extract(epoch FROM now() AT TIME ZONE a.time_zone - now() AT TIME ZONE 'UTC')::int "                   \
        "  FROM accounts a "                                                                                          \
        " CROSS JOIN LATERAL (SELECT x.day, zone_day_start(a.time_zone, x.day) AS s, "                               \
        "                            zone_day_start(a.time_zone, x.day + 1) AS e "                                   \
        "                       FROM (SELECT zone_day(a.time_zone, now()) AS day) x) d "                              \
        " WHERE a.id = $1"

int account_settings_read(PGconn *db, const char *account, json_t **ret, struct api_error *err)
{
        const char *p[] = { account };
        PGresult *res = db_query(db, "read the account's settings", PGRES_TUPLES_OK, SETTINGS_SQL, 1, p);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not read the account's settings");
        if (PQntuples(res) != 1) {
                PQclear(res);
                return api_fail(err, 404, "not_found", NULL, "no account %s", account);
        }
        /* the zone's offset now, +HH:MM (tzdata's offsets are under a day) */
        int off = (int)(strtol(PQgetvalue(res, 0, 6), NULL, 10) % 86400), a = off < 0 ? -off : off;
        char offset[16];
        snprintf(offset, sizeof(offset), "%c%02d:%02d", off < 0 ? '-' : '+', a / 3600 % 24, a % 3600 / 60);
        *ret = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:s}", "account", PQgetvalue(res, 0, 0), "time_zone",
                         PQgetvalue(res, 0, 1), "day", PQgetvalue(res, 0, 2), "day_start", PQgetvalue(res, 0, 3),
                         "day_end", PQgetvalue(res, 0, 4), "day_hours", (int)strtol(PQgetvalue(res, 0, 5), NULL, 10),
                         "utc_offset", offset);
        PQclear(res);
        return 0;
}

static int settings_reply(PGconn *db, const char *account, struct api_reply *out, struct api_error *err)
{
        json_t *j = NULL;
        int rc = account_settings_read(db, account, &j, err);
        return rc < 0 ? rc : reply_json(out, 200, j);
}

int h_account_settings_get(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        return settings_reply(req_db(r), r->caller.account, out, err);
}

int account_time_zone_set(PGconn *db, const char *account, const char *zone, const char *actor, char ret_old[64],
                          struct api_error *err)
{
        const char *p[] = { account, zone, actor };
        PGresult *res = PQexecParams(db, "SELECT old_zone FROM account_set_time_zone($1, $2, $3)", 3, NULL, p, NULL,
                                     NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
                int rc;
                if (state && strcmp(state, "22023") == 0) /* invalid_parameter_value */
                        rc = api_fail(err, 400, "invalid_field", "time_zone",
                                      "time_zone must be an IANA zone name PostgreSQL knows, such as Europe/Berlin");
                else if (state && strcmp(state, "P0002") == 0) /* no_data_found */
                        rc = api_fail(err, 404, "not_found", NULL, "no account %s", account);
                else {
                        log_error("could not set the account's time zone", "account=%s error=\"%s\"", account,
                                  PQresultErrorMessage(res));
                        rc = api_fail(err, 503, "database_unavailable", NULL, "could not set the time zone");
                }
                PQclear(res);
                return rc;
        }
        snprintf(ret_old, 64, "%s", PQntuples(res) == 1 ? PQgetvalue(res, 0, 0) : "");
        PQclear(res);
        log_info("time zone set", "account=%s actor=%s old=%s new=%s", account, actor, ret_old, zone);
        return 0;
}

/* PUT /v1/account/settings {"time_zone": "Europe/Berlin"}: person only. */
int h_account_settings_put(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "time_zone", NULL };
        int rc;
        if (!r->json)
                return api_fail(err, 400, "missing_field", "time_zone", "time_zone is required (an IANA zone name)");
        if ((rc = body_check_fields(r->json, allowed, err)) < 0)
                return rc;
        json_t *v = json_object_get(r->json, "time_zone");
        if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 63)
                return api_fail(err, 400, v ? "invalid_field" : "missing_field", "time_zone",
                                "time_zone is required: an IANA zone name such as Europe/Berlin");
        char actor[EVENT_ID_MAX + 8], old[64];
        snprintf(actor, sizeof(actor), "person:%s", r->caller.person);
        if ((rc = account_time_zone_set(req_db(r), r->caller.account, json_string_value(v), actor, old, err)) < 0)
                return rc;
        return settings_reply(req_db(r), r->caller.account, out, err);
}
