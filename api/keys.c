/* keys.c — API keys and their daily limits, which only a person of the key's
 * account may change (invariant 5: the route table in router.c refuses
 * API keys before these run). Every change is written to audit_log in the
 * same transaction. Raising a limit above today's spend (or removing it, or
 * making it alert_only) deletes today's key_blocks row in that transaction:
 * the vmm and the aggregator read that table, so they see it at once.
 * The key's internet permission (whether its sandboxes may ask for internet)
 * is the account's decision in the same way: only a person sets it. */
#include "db.h"
#include "log.h"
#include "server.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEY_COLUMNS                                                                                          \
        "id, name, prefix, daily_limit_nanodollars, limit_policy, "                                          \
        "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), "                         \
        "to_char(revoked_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), internet, max_sandboxes, "      \
        "max_memory_mib"

#define LIMIT_MAX INT64_C(1000000000000000000) /* a billion dollars a day, in nano-dollars */

static json_t *key_row(PGresult *res, int i)
{
        json_t *k = json_pack("{s:s, s:s, s:s, s:s, s:s}", "id", PQgetvalue(res, i, 0), "name", PQgetvalue(res, i, 1),
                              "prefix", PQgetvalue(res, i, 2), "limit_policy", PQgetvalue(res, i, 4), "created_at",
                              PQgetvalue(res, i, 5));
        json_object_set_new(k, "daily_limit_nanodollars",
                            PQgetisnull(res, i, 3) ? json_null()
                                                   : json_integer(strtoll(PQgetvalue(res, i, 3), NULL, 10)));
        json_object_set_new(k, "revoked_at", PQgetisnull(res, i, 6) ? json_null() : json_string(PQgetvalue(res, i, 6)));
        json_object_set_new(k, "internet", json_boolean(strcmp(PQgetvalue(res, i, 7), "t") == 0));
        /* its caps (key_caps.c), null where none */
        for (int c = 8; c <= 9; c++)
                json_object_set_new(k, c == 8 ? "max_sandboxes" : "max_memory_mib",
                                    PQgetisnull(res, i, c) ? json_null()
                                                           : json_integer(strtoll(PQgetvalue(res, i, c), NULL, 10)));
        return k;
}

/* Reads the limit fields of a body: daily_limit_nanodollars (an integer in
 * [0, 10^18] or null) into *ret_limit ("" for null), policy into ret_policy. */
int key_limit_parse(json_t *lim, json_t *pol, bool limit_required, char ret_limit[24], char ret_policy[16],
                    struct api_error *err)
{
        if (!lim) {
                if (limit_required)
                        return api_fail(err, 400, "missing_field", "daily_limit_nanodollars",
                                        "daily_limit_nanodollars is required (an integer, or null for no limit)");
                ret_limit[0] = '\0';
        } else if (json_is_null(lim)) {
                ret_limit[0] = '\0';
        } else if (!json_is_integer(lim) || json_integer_value(lim) < 0 || json_integer_value(lim) > LIMIT_MAX) {
                return api_fail(err, 400, "invalid_field", "daily_limit_nanodollars",
                                "daily_limit_nanodollars must be an integer from 0 to 10^18, or null");
        } else {
                snprintf(ret_limit, 24, "%" PRId64, (int64_t)json_integer_value(lim));
        }
        if (pol && !json_is_null(pol)) {
                const char *p = json_string_value(pol);
                if (!p || (strcmp(p, "pause") != 0 && strcmp(p, "stop") != 0 && strcmp(p, "alert_only") != 0))
                        return api_fail(err, 400, "invalid_field", "policy",
                                        "policy must be \"pause\", \"stop\" or \"alert_only\"");
                snprintf(ret_policy, 16, "%s", p);
        } else {
                ret_policy[0] = '\0';
        }
        return 0;
}

int key_create(PGconn *db, const char *account, const char *actor, const char *name, json_t *limit,
               const char *policy, json_t **ret, struct api_error *err)
{
        char secret[64], hash[65], idhex[17], id[24], prefix[API_KEY_PREFIX_LEN + 1], lim[24], pol[16];
        int rc;
        json_t *polj = policy ? json_string(policy) : NULL;
        rc = key_limit_parse(limit, polj, false, lim, pol, err);
        json_decref(polj);
        if (rc < 0)
                return rc;
        if (api_key_generate(secret, sizeof(secret)) < 0 || secret_hex(idhex, 8) < 0)
                return api_fail(err, 500, "internal", NULL, "could not make a key");
        snprintf(id, sizeof(id), "key_%s", idhex);
        snprintf(prefix, sizeof(prefix), "%.*s", API_KEY_PREFIX_LEN, secret);
        sha256_hex(secret, strlen(secret), hash);
        const char *params[] = { id, account, name ? name : "", hash, prefix, lim[0] ? lim : NULL,
                                 pol[0] ? pol : "pause", actor };
        if (!db_exec_logged(db, "BEGIN"))
                return api_fail(err, 503, "database_unavailable", NULL, "could not create the key");
        PGresult *res = db_query(db, "insert a key", PGRES_TUPLES_OK,
                                 "INSERT INTO api_keys (id, account_id, name, key_hash, prefix, daily_limit_nanodollars, "
                                 "limit_policy, created_by) "
                                 "SELECT $1, $2, $3, decode($4, 'hex'), $5, $6::bigint, $7, $8 "
                                 "WHERE EXISTS (SELECT 1 FROM accounts WHERE id = $2) RETURNING " KEY_COLUMNS,
                                 8, params);
        if (!res) {
                db_exec_logged(db, "ROLLBACK");
                return api_fail(err, 503, "database_unavailable", NULL, "could not create the key");
        }
        if (PQntuples(res) != 1) {
                PQclear(res);
                db_exec_logged(db, "ROLLBACK");
                return api_fail(err, 404, "not_found", "account", "no account %s", account);
        }
        json_t *k = key_row(res, 0);
        PQclear(res);
        char *newv = json_dumps(k, JSON_COMPACT);
        const char *ap[] = { account, actor, id, newv };
        res = db_query(db, "audit a key", PGRES_COMMAND_OK,
                       "INSERT INTO audit_log (account_id, actor, action, object_id, new_value) "
                       "VALUES ($1, $2, 'key.create', $3, $4::jsonb)",
                       4, ap);
        free(newv);
        if (!res || !db_exec_logged(db, "COMMIT")) {
                PQclear(res);
                db_exec_logged(db, "ROLLBACK");
                json_decref(k);
                return api_fail(err, 503, "database_unavailable", NULL, "could not create the key");
        }
        PQclear(res);
        json_object_set_new(k, "key", json_string(secret));
        *ret = k;
        return 0;
}

int h_keys_create(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "name", "daily_limit_nanodollars", "policy", NULL };
        int rc;
        if ((rc = body_check_fields(r->json, allowed, err)) < 0)
                return rc;
        json_t *name = json_object_get(r->json, "name"), *pol = json_object_get(r->json, "policy");
        if (name && (!json_is_string(name) || json_string_length(name) > 200))
                return api_fail(err, 400, "invalid_field", "name", "name must be a string of at most 200 bytes");
        if (pol && !json_is_string(pol))
                return api_fail(err, 400, "invalid_field", "policy",
                                "policy must be \"pause\", \"stop\" or \"alert_only\"");
        char actor[EVENT_ID_MAX + 8];
        snprintf(actor, sizeof(actor), "person:%s", r->caller.person);
        json_t *k;
        if ((rc = key_create(req_db(r), r->caller.account, actor, json_string_value(name),
                             json_object_get(r->json, "daily_limit_nanodollars"), json_string_value(pol), &k, err)) < 0)
                return rc;
        log_info("key created", "key=%s account=%s person=%s", json_string_value(json_object_get(k, "id")),
                 r->caller.account, r->caller.person);
        out->secret_field = "key"; /* shown once: an Idempotency-Key replay never shows it */
        return reply_json(out, 201, k);
}

int h_keys_list(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        const char *cursor = req_param(r, "cursor"), *limit = req_param(r, "limit");
        long n = 100;
        if (limit) {
                char *end;
                n = strtol(limit, &end, 10);
                if (*end || n < 1 || n > 1000)
                        return api_fail(err, 400, "invalid_field", "limit", "limit must be an integer from 1 to 1000");
        }
        if (cursor && !id_valid(cursor))
                return api_fail(err, 400, "invalid_field", "cursor", "cursor is not one this server gave");
        char nbuf[16];
        snprintf(nbuf, sizeof(nbuf), "%ld", n + 1);
        const char *params[] = { r->caller.account, cursor ? cursor : "", nbuf };
        PGresult *res = db_query(req_db(r), "list keys", PGRES_TUPLES_OK,
                                 "SELECT " KEY_COLUMNS " FROM api_keys WHERE account_id = $1 AND id > $2 "
                                 "ORDER BY id LIMIT $3::int",
                                 3, params);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not list the keys");
        json_t *keys = json_array();
        int rows = PQntuples(res);
        for (int i = 0; i < rows && i < n; i++)
                json_array_append_new(keys, key_row(res, i));
        json_t *body = json_pack("{s:o}", "keys", keys);
        json_object_set_new(body, "next_cursor", rows > n ? json_string(PQgetvalue(res, (int)n - 1, 0)) : json_null());
        PQclear(res);
        return reply_json(out, 200, body);
}

int h_key_get(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        const char *params[] = { r->id, r->caller.account };
        PGresult *res = db_query(req_db(r), "read a key", PGRES_TUPLES_OK,
                                 "SELECT " KEY_COLUMNS " FROM api_keys WHERE id = $1 AND account_id = $2", 2, params);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not read the key");
        if (PQntuples(res) != 1) {
                PQclear(res);
                return api_fail(err, 404, "not_found", "id", "no key %s", r->id);
        }
        json_t *k = key_row(res, 0);
        PQclear(res);
        return reply_json(out, 200, k);
}

int h_key_revoke(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        PGconn *db = req_db(r);
        char actor[EVENT_ID_MAX + 8];
        snprintf(actor, sizeof(actor), "person:%s", r->caller.person);
        const char *params[] = { r->id, r->caller.account, actor };
        if (!db_exec_logged(db, "BEGIN"))
                return api_fail(err, 503, "database_unavailable", NULL, "could not revoke the key");
        PGresult *res = db_query(db, "revoke a key", PGRES_TUPLES_OK,
                                 "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now()) "
                                 "WHERE id = $1 AND account_id = $2 RETURNING " KEY_COLUMNS,
                                 2, params);
        if (!res) {
                db_exec_logged(db, "ROLLBACK");
                return api_fail(err, 503, "database_unavailable", NULL, "could not revoke the key");
        }
        if (PQntuples(res) != 1) {
                PQclear(res);
                db_exec_logged(db, "ROLLBACK");
                return api_fail(err, 404, "not_found", "id", "no key %s", r->id);
        }
        json_t *k = key_row(res, 0);
        PQclear(res);
        res = db_query(db, "audit a revocation", PGRES_COMMAND_OK,
                       "INSERT INTO audit_log (account_id, actor, action, object_id, new_value) "
                       "VALUES ($2, $3, 'key.revoke', $1, jsonb_build_object('revoked', true))",
                       3, params);
        if (!res || !db_exec_logged(db, "COMMIT")) {
                PQclear(res);
                json_decref(k);
                return api_fail(err, 503, "database_unavailable", NULL, "could not revoke the key");
        }
        PQclear(res);
        auth_cache_forget_key(r->id);
        log_info("key revoked", "key=%s account=%s person=%s", r->id, r->caller.account, r->caller.person);
        return reply_json(out, 200, k);
}

/* Sets the limit (lim "" = none) and policy (pol "" = unchanged), audits, and
 * lifts today's block when the key may spend again. */
int key_limit_set(PGconn *db, const char *account, const char *key_id, const char *actor, const char *lim,
                  const char *pol, json_t **ret, struct api_error *err)
{
        if (!db_exec_logged(db, "BEGIN"))
                return api_fail(err, 503, "database_unavailable", NULL, "could not set the limit");
        const char *p1[] = { key_id, account };
        PGresult *res = db_query(db, "lock a key", PGRES_TUPLES_OK,
                                 "SELECT daily_limit_nanodollars, limit_policy FROM api_keys "
                                 "WHERE id = $1 AND account_id = $2 FOR UPDATE",
                                 2, p1);
        if (!res)
                goto db_fail;
        if (PQntuples(res) != 1) {
                PQclear(res);
                db_exec_logged(db, "ROLLBACK");
                return api_fail(err, 404, "not_found", "id", "no key %s", key_id);
        }
        PQclear(res);
        const char *p2[] = { key_id, account, lim[0] ? lim : NULL, pol[0] ? pol : NULL, actor };
        res = db_query(db, "set a limit", PGRES_COMMAND_OK,
                       "WITH old AS (SELECT daily_limit_nanodollars AS l, limit_policy AS p FROM api_keys "
                       "             WHERE id = $1 AND account_id = $2), "
                       "     upd AS (UPDATE api_keys SET daily_limit_nanodollars = $3::bigint, "
                       "             limit_policy = coalesce($4, limit_policy) WHERE id = $1 AND account_id = $2 "
                       "             RETURNING daily_limit_nanodollars AS l, limit_policy AS p) "
                       "INSERT INTO audit_log (account_id, actor, action, object_id, old_value, new_value) "
                       "SELECT $2, $5, 'key.limit', $1, "
                       "       jsonb_build_object('daily_limit_nanodollars', old.l, 'policy', old.p), "
                       "       jsonb_build_object('daily_limit_nanodollars', upd.l, 'policy', upd.p) FROM old, upd",
                       5, p2);
        if (!res)
                goto db_fail;
        PQclear(res);
        /* Today's spend against the new limit: a key that may spend again is unblocked now. */
        const char *p3[] = { key_id, account };
        res = db_query(db, "lift a block", PGRES_TUPLES_OK,
                       "WITH k AS (SELECT daily_limit_nanodollars AS l, limit_policy AS p FROM api_keys WHERE id = $1), "
                       "     s AS (SELECT coalesce((SELECT nanodollars FROM spend_daily WHERE key_id = $1 "
                       "                            AND day = account_day($2, now())), 0) AS spend), "
                       "     d AS (DELETE FROM key_blocks b USING k, s WHERE b.key_id = $1 AND b.account_id = $2 "
                       "            AND b.day = account_day($2, now()) "
                       "            AND (k.l IS NULL OR k.l > s.spend OR k.p = 'alert_only') RETURNING 1) "
                       "SELECT s.spend, (SELECT count(*) FROM d), "
                       "       EXISTS (SELECT 1 FROM key_blocks WHERE key_id = $1 "
                       "               AND day = account_day($2, now())) FROM s",
                       2, p3);
        if (!res)
                goto db_fail;
        long long spend = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        bool lifted = strtoll(PQgetvalue(res, 0, 1), NULL, 10) > 0;
        PQclear(res);
        const char *p4[] = { key_id, account };
        res = db_query(db, "read a key", PGRES_TUPLES_OK,
                       "SELECT " KEY_COLUMNS ", key_blocked(id) FROM api_keys WHERE id = $1 AND account_id = $2", 2,
                       p4);
        if (!res)
                goto db_fail;
        json_t *k = key_row(res, 0);
        bool blocked = strcmp(PQgetvalue(res, 0, 10), "t") == 0;
        PQclear(res);
        if (!db_exec_logged(db, "COMMIT")) {
                json_decref(k);
                return api_fail(err, 503, "database_unavailable", NULL, "could not set the limit");
        }
        json_object_set_new(k, "spend_today_nanodollars", json_integer(spend));
        json_object_set_new(k, "block_lifted", json_boolean(lifted));
        json_object_set_new(k, "blocked_today", json_boolean(blocked));
        log_info("limit set", "key=%s account=%s actor=%s limit=%s policy=%s block_lifted=%s", key_id, account, actor,
                 lim[0] ? lim : "none", pol[0] ? pol : "unchanged", lifted ? "true" : "false");
        *ret = k;
        return 0;
db_fail:
        db_exec_logged(db, "ROLLBACK");
        return api_fail(err, 503, "database_unavailable", NULL, "could not set the limit");
}

static int set_limit(struct api_req *r, const char *lim, const char *pol, struct api_reply *out,
                     struct api_error *err)
{
        char actor[EVENT_ID_MAX + 8];
        snprintf(actor, sizeof(actor), "person:%s", r->caller.person);
        json_t *k = NULL;
        int rc = key_limit_set(req_db(r), r->caller.account, r->id, actor, lim, pol, &k, err);
        return rc < 0 ? rc : reply_json(out, 200, k);
}

int h_key_limit_put(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "daily_limit_nanodollars", "policy", NULL };
        int rc;
        if (!r->json)
                return api_fail(err, 400, "missing_field", "daily_limit_nanodollars",
                                "daily_limit_nanodollars is required (an integer, or null for no limit)");
        if ((rc = body_check_fields(r->json, allowed, err)) < 0)
                return rc;
        char lim[24], pol[16];
        if ((rc = key_limit_parse(json_object_get(r->json, "daily_limit_nanodollars"), json_object_get(r->json, "policy"),
                              true, lim, pol, err)) < 0)
                return rc;
        return set_limit(r, lim, pol, out, err);
}

int h_key_limit_delete(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        return set_limit(r, "", "", out, err);
}

/* PUT /v1/keys/{id}/internet {"internet": bool}: whether sandboxes this key
 * creates or forks may ask for internet. Audited like a limit. */
int h_key_internet_put(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "internet", NULL };
        int rc;
        if ((rc = body_check_fields(r->json, allowed, err)) < 0)
                return rc;
        json_t *v = json_object_get(r->json, "internet");
        if (!json_is_boolean(v))
                return api_fail(err, 400, v ? "invalid_field" : "missing_field", "internet",
                                "internet is required: true or false");
        PGconn *db = req_db(r);
        char actor[EVENT_ID_MAX + 8];
        snprintf(actor, sizeof(actor), "person:%s", r->caller.person);
        const char *p[] = { r->id, r->caller.account, json_is_true(v) ? "true" : "false", actor };
        PGresult *res = db_query(db, "set a key's internet permission", PGRES_TUPLES_OK,
                                 "WITH old AS (SELECT internet AS i FROM api_keys WHERE id = $1 AND account_id = $2 "
                                 "             FOR UPDATE), "
                                 "     upd AS (UPDATE api_keys SET internet = $3::boolean "
                                 "             WHERE id = $1 AND account_id = $2 RETURNING internet AS i), "
                                 "     audit AS (INSERT INTO audit_log (account_id, actor, action, object_id, old_value, "
                                 "                                      new_value) "
                                 "             SELECT $2, $4, 'key.internet', $1, jsonb_build_object('internet', old.i), "
                                 "                    jsonb_build_object('internet', upd.i) FROM old, upd) "
                                 "SELECT " KEY_COLUMNS " FROM api_keys WHERE id = $1 AND account_id = $2",
                                 4, p);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not set the key's internet permission");
        if (PQntuples(res) != 1) {
                PQclear(res);
                return api_fail(err, 404, "not_found", "id", "no key %s", r->id);
        }
        json_t *k = key_row(res, 0);
        PQclear(res);
        /* the SELECT saw the row before the update (one snapshot): answer with what was set */
        json_object_set_new(k, "internet", json_boolean(json_is_true(v)));
        log_info("key internet set", "key=%s account=%s person=%s internet=%s", r->id, r->caller.account,
                 r->caller.person, json_is_true(v) ? "true" : "false");
        return reply_json(out, 200, k);
}
