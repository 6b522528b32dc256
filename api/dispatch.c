/* dispatch.c — see dispatch.h. Nothing here trusts the caller for its
 * account: it comes from the key or session found in the database, and
 * every handler scopes its SQL to it. No secret (key, cookie, password, CSRF
 * token) is ever logged. */
#include "dispatch.h"

#include "csrf.h"
#include "ratelimit.h"
#include "router.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dispatch_error(struct api_reply *out, const struct api_error *e)
{
        free(out->body);
        out->body = NULL;
        reply_json(out, e->status ? e->status : 500,
                   json_pack("{s:{s:s, s:s, s:s}}", "error", "code", e->code[0] ? e->code : "internal", "message",
                             e->message[0] ? e->message : "internal error", "field", e->field));
}

/* Refuses a query no route could mean: a NUL or invalid UTF-8 in a name or
 * value, too many parameters, or any parameter on a write (no write takes
 * one: like an unknown body field, it is refused rather than ignored). */
static int query_check(struct api_req *r, const struct route *rt, struct api_error *err)
{
        if (r->param_bad)
                return api_fail(err, 400, "invalid_field", "query",
                                "query parameter \"%.64s\" holds a NUL byte or is not UTF-8", r->param_bad);
        if (r->params_over)
                return api_fail(err, 400, "invalid_field", "query", "more than %d query parameters", API_MAX_PARAMS);
        if (req_is_write(rt->method) && r->nparams > 0)
                return api_fail(err, 400, "unknown_parameter", r->param_names[0],
                                "unknown query parameter \"%.64s\" (%s %s takes none)", r->param_names[0],
                                rt->method, rt->pattern);
        return 0;
}

/* After a read answered: a parameter its handler never looked at is one it
 * does not know, refused as an unknown body field is. */
static int query_unused(struct api_req *r, struct api_error *err)
{
        for (int i = 0; i < r->nparams; i++)
                if (!r->param_used[i])
                        return api_fail(err, 400, "unknown_parameter", r->param_names[i],
                                        "unknown query parameter \"%.64s\"", r->param_names[i]);
        return 0;
}

/* The request's Idempotency-Key: only on a write by a caller with an account. */
static const char *idem_header(struct api_req *r)
{
        return req_is_write(r->method) && r->caller.account[0] ? req_header(r, "Idempotency-Key") : NULL;
}

/* The first half of a request, on the HTTP thread: the route, who is
 * asking, CSRF, the rate limit, the query and the body. Returns true when out
 * holds the answer already (an error); false when the route's handler is to
 * run (run_back). *ret_ri: the route's index (ROUTE_NONE if none). */
bool dispatch_front(struct api_req *r, struct api_reply *out, size_t *ret_ri)
{
        struct api_error err = { 0 };
        bool path_known, id_ok;
        char csrf_hash[65] = "";
        size_t ri = route_find(r->method, r->path, r->id, &id_ok, &path_known);
        /* Keys and limits belong to people: an API key is refused on every
         * method and shape of /v1/keys, known or not, before anything else. */
        bool keys_area = strcmp(r->path, "/v1/keys") == 0 || strncmp(r->path, "/v1/keys/", 9) == 0;
        const char *authz = req_header(r, "Authorization");
        if (keys_area && authz) {
                if (auth_resolve(r, csrf_hash, &err) < 0)
                        goto fail;
                if (r->caller.key[0]) {
                        api_fail(&err, 403, "person_required", NULL,
                                 "API keys cannot manage keys or limits (not even their own): a person signed in to "
                                 "the account must do it");
                        goto fail;
                }
        }
        *ret_ri = ri;
        if (ri == route_count()) {
                if (path_known)
                        api_fail(&err, 405, "method_not_allowed", NULL, "%s is not allowed on %s", r->method,
                                 r->path);
                else
                        api_fail(&err, 404, "not_found", NULL, "no route %s", r->path);
                goto fail;
        }
        const struct route *rt = route_at(ri);
        snprintf(r->route, sizeof(r->route), "%s %s", rt->method, rt->pattern);
        if (rt->need != NEED_NONE) {
                if (!r->caller.account[0] && auth_resolve(r, csrf_hash, &err) < 0)
                        goto fail;
                if (rt->need == NEED_PERSON && !r->caller.person[0]) {
                        api_fail(&err, 403, "person_required", NULL,
                                 "%s %s needs a person's session: API keys cannot do this", rt->method, rt->pattern);
                        goto fail;
                }
                if (rt->need == NEED_KEY && !r->caller.key[0]) {
                        api_fail(&err, 403, "key_required", NULL,
                                 "%s %s needs an API key: sandboxes are created for and charged to a key",
                                 rt->method, rt->pattern);
                        goto fail;
                }
                if (csrf_check(r, csrf_hash, &err) < 0)
                        goto fail;
                int64_t retry;
                const char *who = r->caller.key[0] ? r->caller.key : r->caller.person;
                if (!ratelimit_allow(r->srv->rate, who, &retry)) {
                        api_fail(&err, 429, "rate_limited", NULL, "too many requests; retry in %lld s",
                                 (long long)retry);
                        snprintf(out->headers[1], sizeof(out->headers[1]), "Retry-After: %lld", (long long)retry);
                        goto fail;
                }
        }
        if (query_check(r, rt, &err) < 0)
                goto fail;
        if (!id_ok) {
                api_fail(&err, 400, "invalid_field", "id", "the id in the path must be 1 to 64 of A-Z a-z 0-9 _ . : -");
                goto fail;
        }
        if (r->body_len > 0) {
                json_error_t je;
                r->json = json_loadb(r->body, r->body_len, JSON_REJECT_DUPLICATES, &je);
                if (!r->json) {
                        api_fail(&err, 400, "malformed_json", "body", "the body is not JSON: %s (line %d)", je.text,
                                 je.line);
                        goto fail;
                }
                if (!json_is_object(r->json)) {
                        api_fail(&err, 400, "invalid_body", "body", "the body must be a JSON object");
                        goto fail;
                }
        }
        return false;
fail:
        dispatch_error(out, &err);
        if (err.status == 429 && !out->headers[1][0])
                snprintf(out->headers[1], sizeof(out->headers[1]), "Retry-After: 60");
        return true;
}

/* The second half: Idempotency-Key, the handler, and the check that a read
 * used every query parameter it was sent. On a worker for the routes that
 * wait on a tally-vmm and for every write with an Idempotency-Key (a retry
 * waits there for the first), else on the HTTP thread. */
void dispatch_back(struct api_req *r, size_t ri, struct api_reply *out)
{
        struct api_error err = { 0 };
        const char *idem = idem_header(r);
        if (idem) {
                int ir = idem_begin(r, idem, out, &err);
                if (ir < 0) {
                        dispatch_error(out, &err);
                        return;
                }
                if (ir == IDEM_REPLAY)
                        return;
        }
        int rc = route_at(ri)->fn(r, out, &err);
        if (rc < 0)
                dispatch_error(out, &err);
        if (rc < 0 && strcmp(err.code, "host_busy") == 0)
                snprintf(out->headers[1], sizeof(out->headers[1]), "Retry-After: 1");
        else if (out->status < 400 && query_unused(r, &err) < 0)
                dispatch_error(out, &err);
        if (idem)
                idem_finish(r, idem, out);
}

/* A pooled connection is found broken only when a statement fails on it (a
 * PostgreSQL restart breaks every one the pool holds, and the pool resets a
 * connection only once it knows): a read that failed so runs once more, on
 * the same connection reconnected, rather than answer 5xx to the first
 * request on each. A write is never repeated: it may have committed. */
bool dispatch_lost_connection(const struct api_req *r, const struct api_reply *out)
{
        return !req_is_write(r->method) && out->status >= 500 && r->db && PQstatus(r->db) == CONNECTION_BAD;
}

bool dispatch_on_worker(struct api_req *r, size_t ri)
{
        return route_at(ri)->worker || idem_header(r);
}
