/* destinations.c — where a person's account sends its spend alerts
 * (sql/009, docs/alerts.md): webhook URLs with a signing secret shown once,
 * email addresses; list, disable, send a test event, resend a delivery.
 *
 * Only a person of the account may call these (NEED_PERSON in router.c's
 * route table: an API key gets 403 before they run); every statement is
 * scoped to the caller's account and every change is audited in the same
 * transaction. The secret is returned by create and never again. */
#include "destinations.h"

#include "db.h"
#include "log.h"
#include "read.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEST_COLUMNS                                                                     \
        "id, kind, url, email, enabled, "                                                \
        "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "     \
        "to_char(disabled_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
#define DEST_MAX 50 /* destinations per account */

static json_t *opt_str(PGresult *res, int i, int col)
{
        return PQgetisnull(res, i, col) ? json_null() : json_string(PQgetvalue(res, i, col));
}

static json_t *dest_row(PGresult *res, int i)
{
        json_t *d = json_pack("{s:s, s:s, s:b, s:s}", "id", PQgetvalue(res, i, 0), "kind", PQgetvalue(res, i, 1),
                              "enabled", PQgetvalue(res, i, 4)[0] == 't', "created_at", PQgetvalue(res, i, 5));
        json_object_set_new(d, "url", opt_str(res, i, 2));
        json_object_set_new(d, "email", opt_str(res, i, 3));
        json_object_set_new(d, "disabled_at", opt_str(res, i, 6));
        return d;
}

/* http or https with a host; the notifier decides at send time whether plain
 * http is allowed to that host (its allow_http setting). */
static bool url_acceptable(const char *url)
{
        CURLU *u = curl_url();
        char *scheme = NULL, *host = NULL;
        bool ok = u && strlen(url) <= 2048 && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
                  curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
                  curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
                  (strcmp(scheme, "https") == 0 || strcmp(scheme, "http") == 0) && host[0];
        curl_free(scheme);
        curl_free(host);
        curl_url_cleanup(u);
        return ok;
}

static bool email_acceptable(const char *e)
{
        size_t n = strlen(e);
        const char *at = strchr(e, '@');
        return n >= 3 && n <= 254 && at && at != e && at[1] && !strchr(at + 1, '@') &&
               strcspn(e, " \t\r\n<>,;\"\\") == n;
}

int h_destinations_list(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        const char *params[] = { r->caller.account };
        PGresult *res = db_query(req_db(r), "list alert destinations", PGRES_TUPLES_OK,
                                 "SELECT " DEST_COLUMNS " FROM alert_destinations WHERE account_id = $1 ORDER BY id",
                                 1, params);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not list the destinations");
        json_t *list = json_array();
        for (int i = 0; i < PQntuples(res); i++)
                json_array_append_new(list, dest_row(res, i));
        PQclear(res);
        return reply_json(out, 200, json_pack("{s:o}", "destinations", list));
}

int h_destinations_create(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "kind", "url", "email", NULL };
        int rc;
        if (!r->json)
                return api_fail(err, 400, "missing_field", "kind", "kind is required: \"webhook\" or \"email\"");
        if ((rc = body_check_fields(r->json, allowed, err)) < 0)
                return rc;
        const char *kind = json_string_value(json_object_get(r->json, "kind"));
        const char *url = json_string_value(json_object_get(r->json, "url"));
        const char *email = json_string_value(json_object_get(r->json, "email"));
        char secret[80] = "", hex[65], idhex[17], id[24];
        if (!kind || (strcmp(kind, "webhook") != 0 && strcmp(kind, "email") != 0))
                return api_fail(err, 400, "invalid_field", "kind", "kind must be \"webhook\" or \"email\"");
        if (strcmp(kind, "webhook") == 0) {
                if (json_object_get(r->json, "email"))
                        return api_fail(err, 400, "invalid_field", "email", "a webhook has a url, not an email");
                if (!url || !url_acceptable(url))
                        return api_fail(err, 400, "invalid_field", "url",
                                        "url must be an https:// (or operator-allowed http://) URL of at most 2048 "
                                        "characters");
                if (secret_hex(hex, 32) < 0)
                        return api_fail(err, 500, "internal", NULL, "could not make a secret");
                snprintf(secret, sizeof(secret), "whsec_%s", hex);
                email = NULL;
        } else {
                if (json_object_get(r->json, "url"))
                        return api_fail(err, 400, "invalid_field", "url", "an email destination has an email, not a url");
                if (!email || !email_acceptable(email))
                        return api_fail(err, 400, "invalid_field", "email", "email must be one address");
                url = NULL;
        }
        if (secret_hex(idhex, 8) < 0)
                return api_fail(err, 500, "internal", NULL, "could not make an id");
        snprintf(id, sizeof(id), "dst_%s", idhex);
        char actor[EVENT_ID_MAX + 8], max[16];
        snprintf(actor, sizeof(actor), "person:%s", r->caller.person);
        snprintf(max, sizeof(max), "%d", DEST_MAX);
        PGconn *db = req_db(r);
        const char *params[] = { id, r->caller.account, kind, url, email, secret[0] ? secret : NULL, actor, max };
        if (!db_exec_logged(db, "BEGIN"))
                return api_fail(err, 503, "database_unavailable", NULL, "could not create the destination");
        /* A lock per account, held to the commit, serialises creations; the count, in
         * the next statement, sees every creation committed before. (Not the account's
         * row lock: FOR UPDATE needs an UPDATE grant on accounts, which tally_api has not.) */
        const char *lock_params[] = { r->caller.account };
        PGresult *res = db_query(db, "lock the account's destinations", PGRES_TUPLES_OK,
                                 "SELECT pg_advisory_xact_lock(hashtextextended('alert_destinations:' || $1, 0))", 1,
                                 lock_params);
        if (!res) {
                db_exec_logged(db, "ROLLBACK");
                return api_fail(err, 503, "database_unavailable", NULL, "could not create the destination");
        }
        PQclear(res);
        res = db_query(db, "create an alert destination", PGRES_TUPLES_OK,
                       "WITH acct AS (SELECT id FROM accounts WHERE id = $2),"
                       " ins AS (INSERT INTO alert_destinations (id, account_id, kind, url, email, secret, "
                       "  created_by) SELECT $1, $2, $3, $4, $5, $6, $7 FROM acct"
                       "  WHERE (SELECT count(*) FROM alert_destinations WHERE account_id = $2 AND enabled)"
                       "        < $8::int"
                       "  RETURNING " DEST_COLUMNS "),"
                       " aud AS (INSERT INTO audit_log (account_id, actor, action, object_id, new_value)"
                       "  SELECT $2, $7, 'alert_destination.create', id,"
                       "         jsonb_build_object('kind', kind, 'url', url, 'email', email) FROM ins)"
                       " SELECT * FROM ins",
                       8, params);
        if (!res) {
                db_exec_logged(db, "ROLLBACK");
                return api_fail(err, 503, "database_unavailable", NULL, "could not create the destination");
        }
        if (PQntuples(res) != 1) {
                PQclear(res);
                db_exec_logged(db, "ROLLBACK");
                return api_fail(err, 409, "too_many", NULL, "an account has at most %d enabled destinations",
                                DEST_MAX);
        }
        json_t *d = dest_row(res, 0);
        PQclear(res);
        if (!db_exec_logged(db, "COMMIT")) {
                json_decref(d);
                return api_fail(err, 503, "database_unavailable", NULL, "could not create the destination");
        }
        /* Shown here once; no route reads it back. */
        json_object_set_new(d, "secret", secret[0] ? json_string(secret) : json_null());
        log_info("alert destination created", "destination=%s kind=%s account=%s person=%s", id, kind,
                 r->caller.account, r->caller.person);
        out->secret_field = "secret"; /* shown once: an Idempotency-Key replay never shows it */
        return reply_json(out, 201, d);
}

int h_destination_disable(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        char actor[EVENT_ID_MAX + 8];
        snprintf(actor, sizeof(actor), "person:%s", r->caller.person);
        const char *params[] = { r->id, r->caller.account, actor };
        /* Its pending deliveries fail now, in the same transaction (a
         * notifier holding one mid-send waits on the row and finds it failed). */
        PGresult *res = db_query(req_db(r), "disable an alert destination", PGRES_TUPLES_OK,
                                 "WITH upd AS (UPDATE alert_destinations SET enabled = false,"
                                 "  disabled_at = coalesce(disabled_at, now()) WHERE id = $1 AND account_id = $2"
                                 "  RETURNING " DEST_COLUMNS "),"
                                 " dl AS (UPDATE alert_deliveries SET state = 'failed', last_error = 'destination disabled'"
                                 "  WHERE destination_id IN (SELECT id FROM upd) AND state = 'pending'),"
                                 " aud AS (INSERT INTO audit_log (account_id, actor, action, object_id, new_value)"
                                 "  SELECT $2, $3, 'alert_destination.disable', id, jsonb_build_object('enabled', false)"
                                 "  FROM upd)"
                                 " SELECT * FROM upd",
                                 3, params);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not disable the destination");
        if (PQntuples(res) != 1) {
                PQclear(res);
                return api_fail(err, 404, "not_found", "id", "no destination %s", r->id);
        }
        json_t *d = dest_row(res, 0);
        PQclear(res);
        log_info("alert destination disabled", "destination=%s account=%s person=%s", r->id, r->caller.account,
                 r->caller.person);
        return reply_json(out, 200, d);
}

static json_t *delivery_answer(PGresult *res)
{
        return json_pack("{s:I, s:s, s:s, s:s}", "delivery_id", (json_int_t)strtoll(PQgetvalue(res, 0, 0), NULL, 10),
                         "event_id", PQgetvalue(res, 0, 1), "destination", PQgetvalue(res, 0, 2), "state", "pending");
}

int h_destination_test(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        char actor[EVENT_ID_MAX + 8];
        snprintf(actor, sizeof(actor), "person:%s", r->caller.person);
        const char *params[] = { r->id, r->caller.account, actor };
        PGresult *res = db_query(
                req_db(r), "queue a test event", PGRES_TUPLES_OK,
                "WITH e AS (SELECT gen_random_uuid() AS id),"
                " ins AS (INSERT INTO alert_deliveries (destination_id, account_id, event_id, type, payload, requested_by)"
                "  SELECT d.id, d.account_id, e.id, 'test',"
                "   jsonb_build_object('version', 1, 'id', e.id::text, 'type', 'test', 'account', d.account_id,"
                "     'time', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')), $3"
                "  FROM alert_destinations d, e WHERE d.id = $1 AND d.account_id = $2 AND d.enabled"
                "  RETURNING id, event_id::text, destination_id)"
                " SELECT ins.*, pg_notify('tally_alert_deliveries', '') FROM ins",
                3, params);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not queue the test event");
        if (PQntuples(res) != 1) {
                PQclear(res);
                return api_fail(err, 404, "not_found", "id", "no enabled destination %s", r->id);
        }
        json_t *a = delivery_answer(res);
        PQclear(res);
        return reply_json(out, 202, a);
}

int h_delivery_resend(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        char actor[EVENT_ID_MAX + 8];
        snprintf(actor, sizeof(actor), "person:%s", r->caller.person);
        char *end;
        long long did = strtoll(r->id, &end, 10);
        if (*end || did <= 0)
                return api_fail(err, 404, "not_found", "id", "no delivery %s", r->id);
        const char *params[] = { r->id, r->caller.account, actor };
        PGresult *res = db_query(
                req_db(r), "resend a delivery", PGRES_TUPLES_OK,
                "WITH src AS (SELECT d.*, t.enabled FROM alert_deliveries d JOIN alert_destinations t"
                "             ON t.id = d.destination_id WHERE d.id = $1::bigint AND d.account_id = $2),"
                " ins AS (INSERT INTO alert_deliveries (alert_id, destination_id, account_id, event_id, type, payload,"
                "  resend_of, requested_by)"
                "  SELECT alert_id, destination_id, account_id, event_id, type, payload, id, $3 FROM src"
                "   WHERE enabled AND state <> 'pending'"
                "  RETURNING id, event_id::text, destination_id)"
                " SELECT ins.*, pg_notify('tally_alert_deliveries', ''), src.enabled, src.state"
                "   FROM src LEFT JOIN ins ON true",
                3, params);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not resend");
        if (PQntuples(res) != 1) {
                PQclear(res);
                return api_fail(err, 404, "not_found", "id", "no delivery %s", r->id);
        }
        if (PQgetisnull(res, 0, 0)) {
                bool enabled = PQgetvalue(res, 0, 4)[0] == 't';
                PQclear(res);
                return api_fail(err, 409, "conflict", "id",
                                enabled ? "the delivery is still pending" : "its destination is disabled");
        }
        json_t *a = delivery_answer(res);
        PQclear(res);
        log_info("alert delivery resent", "delivery=%s account=%s person=%s", r->id, r->caller.account,
                 r->caller.person);
        return reply_json(out, 202, a);
}

/* The account's deliveries, newest first: every attempt's outcome, the test
 * events and resends included (GET /v1/alerts lists only the alerts'). */
#define DELIVERIES_SQL                                                                                     \
        "SELECT d.id, d.destination_id, d.event_id::text, d.type, d.state, d.attempts, d.last_error,"     \
        "       to_char(d.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"           \
        "       to_char(d.delivered_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"         \
        "       to_char(d.next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"      \
        "       d.resend_of, d.alert_id, t.enabled, d.requested_by"                                         \
        "  FROM alert_deliveries d JOIN alert_destinations t ON t.id = d.destination_id"                   \
        " WHERE d.account_id = $1 AND ($2::text IS NULL OR d.destination_id = $2::text)"                   \
        "   AND ($3::bigint IS NULL OR d.id < $3::bigint)"                                                 \
        " ORDER BY d.id DESC LIMIT $4::int"

static json_t *opt_int(PGresult *res, int i, int col)
{
        return PQgetisnull(res, i, col) ? json_null() : json_integer((json_int_t)read_int64(res, i, col));
}

int h_deliveries_list(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        int limit, rc;
        if ((rc = read_param_limit(req_param, r, READ_PAGE_DEFAULT, READ_PAGE_MAX, &limit, err)) < 0)
                return rc;
        const char *dest = req_param(r, "destination");
        if (dest && (strlen(dest) < 1 || strlen(dest) > 64 ||
                     strspn(dest, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-") != strlen(dest)))
                return api_fail(err, 400, "invalid_field", "destination", "destination is a destination's id");
        char before[24] = "";
        const char *cs = req_param(r, "cursor");
        if (cs) {
                json_t *a = read_cursor_decode(cs);
                bool ok = a && json_array_size(a) == 2 && json_is_string(json_array_get(a, 0)) &&
                          !strcmp(json_string_value(json_array_get(a, 0)), "d1") &&
                          json_is_integer(json_array_get(a, 1)) && json_integer_value(json_array_get(a, 1)) > 0;
                if (ok)
                        snprintf(before, sizeof(before), "%lld", (long long)json_integer_value(json_array_get(a, 1)));
                json_decref(a);
                if (!ok)
                        return api_fail(err, 400, "invalid_field", "cursor", "cursor is not one this API gave");
        }
        char lim[16];
        snprintf(lim, sizeof(lim), "%d", limit + 1);
        const char *params[] = { r->caller.account, dest, before[0] ? before : NULL, lim };
        PGresult *res = read_query(req_db(r), "alert deliveries", DELIVERIES_SQL, 4, params, err);
        if (!res)
                return -EIO;
        int rows = PQntuples(res);
        bool more = rows > limit;
        if (more)
                rows = limit;
        json_t *data = json_array();
        for (int i = 0; i < rows; i++) {
                json_t *d = json_pack("{s:I, s:s, s:s, s:s, s:s, s:i, s:s, s:b}", "id",
                                      (json_int_t)read_int64(res, i, 0), "destination", PQgetvalue(res, i, 1),
                                      "event_id", PQgetvalue(res, i, 2), "type", PQgetvalue(res, i, 3), "state",
                                      PQgetvalue(res, i, 4), "attempts", atoi(PQgetvalue(res, i, 5)), "created_at",
                                      PQgetvalue(res, i, 7), "destination_enabled", PQgetvalue(res, i, 12)[0] == 't');
                json_object_set_new(d, "last_error", opt_str(res, i, 6));
                json_object_set_new(d, "delivered_at", opt_str(res, i, 8));
                json_object_set_new(d, "next_attempt_at",
                                    strcmp(PQgetvalue(res, i, 4), "pending") ? json_null() : opt_str(res, i, 9));
                json_object_set_new(d, "resend_of", opt_int(res, i, 10));
                json_object_set_new(d, "alert_id", opt_int(res, i, 11));
                json_object_set_new(d, "requested_by", opt_str(res, i, 13));
                json_array_append_new(data, d);
        }
        json_t *next = json_null();
        if (more && rows > 0) {
                json_t *a = json_pack("[s, I]", "d1", (json_int_t)read_int64(res, rows - 1, 0));
                char *c = read_cursor_encode(a);
                json_decref(a);
                if (c) {
                        next = json_string(c);
                        free(c);
                }
        }
        PQclear(res);
        return reply_json(out, 200, json_pack("{s:o, s:o}", "data", data, "next_cursor", next));
}

/* The outbox as Prometheus gauges for tally-api's /metrics, which never
 * takes a database connection: the janitor (or any holder of a connection)
 * refreshes the figures, /metrics writes the last ones. */
static _Atomic int64_t m_pending = -1, m_delivered = -1, m_failed = -1, m_oldest_s = -1;

int alert_metrics_refresh(PGconn *db)
{
        PGresult *res = PQexec(db, "SELECT count(*) FILTER (WHERE state = 'pending'),"
                                   " count(*) FILTER (WHERE state = 'delivered'),"
                                   " count(*) FILTER (WHERE state = 'failed'),"
                                   " coalesce(extract(epoch FROM now() - min(created_at) FILTER"
                                   "  (WHERE state = 'pending'))::bigint, 0)"
                                   " FROM alert_deliveries");
        if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
                log_warn("could not read the alert outbox", "error=\"%s\"", PQerrorMessage(db));
                PQclear(res);
                return -EIO;
        }
        atomic_store(&m_pending, strtoll(PQgetvalue(res, 0, 0), NULL, 10));
        atomic_store(&m_delivered, strtoll(PQgetvalue(res, 0, 1), NULL, 10));
        atomic_store(&m_failed, strtoll(PQgetvalue(res, 0, 2), NULL, 10));
        atomic_store(&m_oldest_s, strtoll(PQgetvalue(res, 0, 3), NULL, 10));
        PQclear(res);
        return 0;
}

void alert_metrics_write(FILE *f)
{
        if (atomic_load(&m_pending) < 0)
                return; /* not read yet */
        fprintf(f,
                "# HELP tally_api_alert_deliveries Alert deliveries in the outbox by state (refreshed by the janitor).\n"
                "# TYPE tally_api_alert_deliveries gauge\n"
                "tally_api_alert_deliveries{state=\"pending\"} %" PRId64 "\n"
                "tally_api_alert_deliveries{state=\"delivered\"} %" PRId64 "\n"
                "tally_api_alert_deliveries{state=\"failed\"} %" PRId64 "\n"
                "# HELP tally_api_alert_oldest_pending_seconds Age of the oldest pending delivery (0: none).\n"
                "# TYPE tally_api_alert_oldest_pending_seconds gauge\n"
                "tally_api_alert_oldest_pending_seconds %" PRId64 "\n",
                atomic_load(&m_pending), atomic_load(&m_delivered), atomic_load(&m_failed), atomic_load(&m_oldest_s));
}
