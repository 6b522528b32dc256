/* idempotency.c — Idempotency-Key on POST, PUT and DELETE.
 *
 * A key is scoped to (account, caller, route, key): the caller is the API
 * key's id or the person, the route its pattern, so one agent never sees
 * another's answer, even of the same account. The first request with a key
 * inserts its row and commits it before it runs: that row is the lock. A retry that finds the row replays
 * the stored answer, waits while the first still runs (then 409), or gets 422
 * when it is a different request (method, path or body). A request is never
 * run twice for one key. Answers are kept 24 hours, never with a secret in
 * them (api_reply.secret_field: the field is stored as null, with
 * "secret_shown_once": true). An answer that says
 * "not now" is not kept — 5xx, 402 (the key's limit) and 409 (the sandbox's
 * state): the row is deleted, so a retry once that changed runs again. */
#include "log.h"
#include "server.h"
#include "timeutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Who the key belongs to: the API key's id, or "person:<id>". */
static void idem_caller(const struct api_req *r, char *out, size_t size)
{
        if (r->caller.key[0])
                snprintf(out, size, "%s", r->caller.key);
        else
                snprintf(out, size, "person:%s", r->caller.person);
}

static bool key_valid(const char *k)
{
        size_t n = strlen(k);
        if (n < 1 || n > 255)
                return false;
        for (; *k; k++)
                if (*k < 0x21 || *k > 0x7e)
                        return false;
        return true;
}

int idem_begin(struct api_req *r, const char *key, struct api_reply *out, struct api_error *err)
{
        if (!key_valid(key))
                return api_fail(err, 400, "invalid_field", "Idempotency-Key",
                                "Idempotency-Key must be 1 to 255 printable ASCII characters");
        /* what the request is: method, path and body */
        size_t ml = strlen(r->method), pl = strlen(r->path);
        char *what = malloc(ml + pl + r->body_len + 3);
        if (!what)
                return api_fail(err, 500, "internal", NULL, "out of memory");
        memcpy(what, r->method, ml);
        what[ml] = '\n';
        memcpy(what + ml + 1, r->path, pl);
        what[ml + 1 + pl] = '\n';
        memcpy(what + ml + pl + 2, r->body, r->body_len);
        char hash[65];
        sha256_hex(what, ml + pl + 2 + r->body_len, hash);
        free(what);
        char caller[EVENT_ID_MAX + 8];
        idem_caller(r, caller, sizeof(caller));
        const char *params[] = { r->caller.account, key, caller, r->route, hash };
        int64_t deadline = time_mono_ms() + req_config(r)->idempotency_wait_ms;
        for (;;) {
                PGconn *db = req_db(r);
                PGresult *res = db_query(db, "expire an idempotency key", PGRES_COMMAND_OK,
                                         "DELETE FROM idempotency_keys WHERE account_id = $1 AND idem_key = $2 "
                                         "AND caller = $3 AND route = $4 AND created_at < now() - interval '24 hours'",
                                         4, params);
                PQclear(res);
                res = db_query(db, "take an idempotency key", PGRES_TUPLES_OK,
                               "INSERT INTO idempotency_keys (account_id, idem_key, request_hash, caller, route) "
                               "VALUES ($1, $2, decode($5, 'hex'), $3, $4) ON CONFLICT DO NOTHING RETURNING 1",
                               5, params);
                if (!res)
                        return api_fail(err, 503, "database_unavailable", NULL, "could not check the Idempotency-Key");
                bool mine = PQntuples(res) == 1;
                PQclear(res);
                if (mine)
                        return IDEM_RUN;
                res = db_query(db, "read an idempotency key", PGRES_TUPLES_OK,
                               "SELECT encode(request_hash, 'hex'), status, body FROM idempotency_keys "
                               "WHERE account_id = $1 AND idem_key = $2 AND caller = $3 AND route = $4",
                               4, params);
                if (!res)
                        return api_fail(err, 503, "database_unavailable", NULL, "could not check the Idempotency-Key");
                if (PQntuples(res) == 1) {
                        if (strcmp(PQgetvalue(res, 0, 0), hash) != 0) {
                                PQclear(res);
                                return api_fail(err, 422, "idempotency_key_reused", "Idempotency-Key",
                                                "this Idempotency-Key was used for a different request (path or "
                                                "body) on this route");
                        }
                        if (!PQgetisnull(res, 0, 1)) {
                                out->status = (int)strtol(PQgetvalue(res, 0, 1), NULL, 10);
                                out->body = strdup(PQgetvalue(res, 0, 2));
                                out->len = out->body ? strlen(out->body) : 0;
                                out->content_type = "application/json";
                                snprintf(out->headers[0], sizeof(out->headers[0]), "Idempotent-Replayed: true");
                                PQclear(res);
                                return IDEM_REPLAY;
                        }
                }
                PQclear(res);
                /* still running (or just expired): wait without holding a connection */
                req_db_release(r);
                if (time_mono_ms() >= deadline)
                        return api_fail(err, 409, "idempotency_key_in_use", "Idempotency-Key",
                                        "a request with this Idempotency-Key is still running; retry later");
                usleep(50 * 1000);
        }
}

void idem_finish(struct api_req *r, const char *key, const struct api_reply *out)
{
        char status[16], caller[EVENT_ID_MAX + 8];
        snprintf(status, sizeof(status), "%d", out->status);
        idem_caller(r, caller, sizeof(caller));
        /* A secret shown once is never stored: the answer is kept with the
         * field null and the fact that it was shown. */
        char *kept = NULL;
        if (out->secret_field && out->body) {
                json_t *j = json_loadb(out->body, out->len, 0, NULL);
                if (json_is_object(j)) {
                        json_object_set_new(j, out->secret_field, json_null());
                        json_object_set_new(j, "secret_shown_once", json_true());
                        kept = json_dumps(j, JSON_COMPACT);
                }
                json_decref(j);
                if (!kept)
                        kept = strdup("{\"secret_shown_once\":true}");
        }
        const char *params[] = { r->caller.account, key, caller, r->route, status,
                                 kept ? kept : out->body ? out->body : "" };
        PGresult *res;
        if (out->status >= 500 || out->status == 402 || out->status == 409 || out->status == 429 ||
            (out->secret_field && !kept))
                res = db_query(req_db(r), "release an idempotency key", PGRES_COMMAND_OK,
                               "DELETE FROM idempotency_keys WHERE account_id = $1 AND idem_key = $2 "
                               "AND caller = $3 AND route = $4",
                               4, params);
        else
                res = db_query(req_db(r), "store an idempotent answer", PGRES_COMMAND_OK,
                               "UPDATE idempotency_keys SET status = $5::int, body = $6 "
                               "WHERE account_id = $1 AND idem_key = $2 AND caller = $3 AND route = $4",
                               6, params);
        PQclear(res);
        free(kept);
}
