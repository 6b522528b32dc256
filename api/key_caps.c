/* key_caps.c — per-key caps on what a key may hold at once: sandboxes not
 * stopped, and their memory. Like the daily limit, only a person of the key's
 * account sets them (the route table in router.c refuses API keys on every
 * /v1/keys route); each change is audited in the same transaction. tally-api
 * enforces them at create and fork (sandboxes.c). */
#include "db.h"
#include "log.h"
#include "server.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CAP_SANDBOXES_MAX 1000000
#define CAP_MEMORY_MIB_MAX (INT64_C(1) << 40)

static json_t *caps_json(PGresult *res)
{
        json_t *j = json_pack("{s:s}", "id", PQgetvalue(res, 0, 0));
        for (int c = 1; c <= 2; c++)
                json_object_set_new(j, c == 1 ? "max_sandboxes" : "max_memory_mib",
                                    PQgetisnull(res, 0, c) ? json_null()
                                                           : json_integer(strtoll(PQgetvalue(res, 0, c), NULL, 10)));
        return j;
}

int key_caps_read(PGconn *db, const char *account, const char *key, int64_t *ret_sandboxes, int64_t *ret_memory_mib)
{
        const char *p[] = { key, account };
        PGresult *res = db_query(db, "read a key's caps", PGRES_TUPLES_OK,
                                 "SELECT max_sandboxes, max_memory_mib FROM api_keys WHERE id = $1 AND account_id = $2",
                                 2, p);
        if (!res)
                return -EAGAIN;
        *ret_sandboxes = PQntuples(res) == 1 && !PQgetisnull(res, 0, 0) ? strtoll(PQgetvalue(res, 0, 0), NULL, 10) : -1;
        *ret_memory_mib = PQntuples(res) == 1 && !PQgetisnull(res, 0, 1) ? strtoll(PQgetvalue(res, 0, 1), NULL, 10)
                                                                          : -1;
        PQclear(res);
        return 0;
}

int h_key_caps_get(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        const char *p[] = { r->id, r->caller.account };
        PGresult *res = db_query(req_db(r), "read a key's caps", PGRES_TUPLES_OK,
                                 "SELECT id, max_sandboxes, max_memory_mib FROM api_keys "
                                 "WHERE id = $1 AND account_id = $2",
                                 2, p);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not read the key's caps");
        if (PQntuples(res) != 1) {
                PQclear(res);
                return api_fail(err, 404, "not_found", "id", "no key %s", r->id);
        }
        json_t *j = caps_json(res);
        PQclear(res);
        return reply_json(out, 200, j);
}

/* One cap of the body: an integer in [0, max] or null (no cap) into buf ("" for null). */
static int parse_cap(json_t *v, const char *name, int64_t max, char buf[24], struct api_error *err)
{
        if (!v || json_is_null(v)) {
                buf[0] = '\0';
                return 0;
        }
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max)
                return api_fail(err, 400, "invalid_field", name, "%s must be an integer from 0 to %" PRId64 ", or null",
                                name, max);
        snprintf(buf, 24, "%" PRId64, (int64_t)json_integer_value(v));
        return 0;
}

int h_key_caps_put(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "max_sandboxes", "max_memory_mib", NULL };
        char sb[24], mem[24], actor[EVENT_ID_MAX + 8];
        int rc;
        if ((rc = body_check_fields(r->json, allowed, err)) < 0 ||
            (rc = parse_cap(json_object_get(r->json, "max_sandboxes"), "max_sandboxes", CAP_SANDBOXES_MAX, sb,
                            err)) < 0 ||
            (rc = parse_cap(json_object_get(r->json, "max_memory_mib"), "max_memory_mib", CAP_MEMORY_MIB_MAX, mem,
                            err)) < 0)
                return rc;
        snprintf(actor, sizeof(actor), "person:%s", r->caller.person);
        PGconn *db = req_db(r);
        if (!db_exec_logged(db, "BEGIN"))
                return api_fail(err, 503, "database_unavailable", NULL, "could not set the caps");
        /* locked first, in a statement of its own: the old values audited are the ones replaced */
        const char *p[] = { r->id, r->caller.account, sb[0] ? sb : NULL, mem[0] ? mem : NULL, actor };
        PGresult *res = db_query(db, "lock a key", PGRES_TUPLES_OK,
                                 "SELECT 1 FROM api_keys WHERE id = $1 AND account_id = $2 FOR UPDATE", 2, p);
        bool locked = res != NULL;
        PQclear(res);
        res = !locked ? NULL
                      : db_query(db, "set a key's caps", PGRES_TUPLES_OK,
                                 "WITH old AS (SELECT max_sandboxes AS s, max_memory_mib AS m FROM api_keys "
                                 "             WHERE id = $1 AND account_id = $2), "
                                 "     upd AS (UPDATE api_keys SET max_sandboxes = $3::int, "
                                 "             max_memory_mib = $4::bigint "
                                 "             WHERE id = $1 AND account_id = $2 "
                                 "             RETURNING id, max_sandboxes, max_memory_mib), "
                                 "     aud AS (INSERT INTO audit_log (account_id, actor, action, object_id, old_value, "
                                 "             new_value) SELECT $2, $5, 'key.caps', $1, "
                                 "             jsonb_build_object('max_sandboxes', old.s, 'max_memory_mib', old.m), "
                                 "             jsonb_build_object('max_sandboxes', upd.max_sandboxes, "
                                 "                                'max_memory_mib', upd.max_memory_mib) FROM old, upd) "
                                 "SELECT id, max_sandboxes, max_memory_mib FROM upd",
                                 5, p);
        if (!res) {
                db_exec_logged(db, "ROLLBACK");
                return api_fail(err, 503, "database_unavailable", NULL, "could not set the caps");
        }
        if (PQntuples(res) != 1) {
                PQclear(res);
                db_exec_logged(db, "ROLLBACK");
                return api_fail(err, 404, "not_found", "id", "no key %s", r->id);
        }
        json_t *j = caps_json(res);
        PQclear(res);
        if (!db_exec_logged(db, "COMMIT")) {
                json_decref(j);
                return api_fail(err, 503, "database_unavailable", NULL, "could not set the caps");
        }
        log_info("caps set", "key=%s account=%s person=%s max_sandboxes=%s max_memory_mib=%s", r->id,
                 r->caller.account, r->caller.person, sb[0] ? sb : "none", mem[0] ? mem : "none");
        return reply_json(out, 200, j);
}
