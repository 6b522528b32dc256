/* request.c — the request as handlers see it (server.h): its database
 * connection, headers, cookies and query parameters, and the small helpers
 * every handler shares (replies, body fields, queries, ids). */
#include "log.h"
#include "server.h"
#include "utf8.h"

#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int reply_json(struct api_reply *out, int status, json_t *json)
{
        out->status = status;
        out->body = json ? json_dumps(json, JSON_COMPACT) : strdup("{}");
        out->len = out->body ? strlen(out->body) : 0;
        out->content_type = "application/json";
        json_decref(json);
        return 0;
}

int reply_body(struct api_reply *out, struct api_body *b, const char *csv_name)
{
        out->status = 200;
        out->body = b->data;
        out->len = b->len;
        out->content_type = b->content_type;
        if (csv_name && b->content_type && strncmp(b->content_type, "text/csv", 8) == 0)
                snprintf(out->headers[0], sizeof(out->headers[0]), "Content-Disposition: attachment; filename=\"%s\"",
                         csv_name);
        return 0;
}

int body_check_fields(json_t *body, const char *const *allowed, struct api_error *err)
{
        if (!body)
                return 0;
        if (!json_is_object(body))
                return api_fail(err, 400, "invalid_body", "body", "the body must be a JSON object");
        const char *k;
        json_t *v;
        json_object_foreach(body, k, v) {
                bool ok = false;
                for (const char *const *a = allowed; *a && !ok; a++)
                        ok = strcmp(*a, k) == 0;
                if (!ok)
                        return api_fail(err, 400, "unknown_field", k, "unknown field \"%.64s\"", k);
        }
        return 0;
}

PGresult *db_query(PGconn *db, const char *what, ExecStatusType want, const char *sql, int n,
                   const char *const *params)
{
        PGresult *res = PQexecParams(db, sql, n, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(res) == want)
                return res;
        log_error("could not run a query", "what=\"%s\" error=\"%s\"", what, PQerrorMessage(db));
        PQclear(res);
        return NULL;
}

bool id_valid(const char *s)
{
        size_t n = strlen(s);
        if (n < 1 || n > EVENT_ID_MAX)
                return false;
        for (; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
                      *s == '_' || *s == '.' || *s == ':' || *s == '-'))
                        return false;
        return true;
}

PGconn *req_db(struct api_req *r)
{
        if (!r->db)
                r->db = db_pool_get(r->srv->pool);
        return r->db;
}

void req_db_release(struct api_req *r)
{
        if (r->db)
                db_pool_put(r->srv->pool, r->db);
        r->db = NULL;
}

const char *req_header(struct api_req *r, const char *name)
{
        return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

bool req_client_gone(struct api_req *r)
{
        if (!r->conn)
                return false;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci)
                return false;
        /* (the request's body is read whole before a worker runs it: what is
         * left to read is a next request's, or the hang-up) */
        struct pollfd p = { .fd = ci->connect_fd, .events = POLLRDHUP };
        return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

const char *req_cookie(struct api_req *r, const char *name)
{
        return MHD_lookup_connection_value(r->conn, MHD_COOKIE_KIND, name);
}

const struct api_config *req_config(struct api_req *r)
{
        return r->srv->cfg;
}

struct vmm_hosts *req_vmm_hosts(struct api_req *r)
{
        return r->srv->hosts;
}

const char *req_param(void *ctx, const char *name)
{
        struct api_req *r = ctx;
        int first = -1, count = 0;
        size_t total = 0;
        for (int i = 0; i < r->nparams; i++)
                if (strcmp(r->param_names[i], name) == 0) {
                        if (first < 0)
                                first = i;
                        count++;
                        total += strlen(r->param_values[i]) + 1;
                        r->param_used[i] = true;
                }
        if (count <= 1)
                return first < 0 ? NULL : r->param_values[first];
        if (r->joined[first])
                return r->joined[first];
        char *j = malloc(total), *p = j;
        if (!j)
                return r->param_values[first];
        for (int i = 0; i < r->nparams; i++)
                if (strcmp(r->param_names[i], name) == 0) {
                        if (p != j)
                                *p++ = ',';
                        size_t n = strlen(r->param_values[i]);
                        memcpy(p, r->param_values[i], n);
                        p += n;
                }
        *p = '\0';
        r->joined[first] = j;
        return j;
}

bool req_is_write(const char *method)
{
        return strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0;
}

/* Collects the query's parameters as libmicrohttpd decoded them (with their
 * lengths: a %00 decodes to a NUL that a C string would silently end at). */
static enum MHD_Result collect_param(void *cls, enum MHD_ValueKind kind, const char *key, size_t key_size,
                                     const char *value, size_t value_size)
{
        struct api_req *r = cls;
        (void)kind;
        if (!value)
                value_size = 0;
        bool ok = memchr(key, '\0', key_size) == NULL && (!value || memchr(value, '\0', value_size) == NULL) &&
                  utf8_valid(key, key_size) &&
                  (!value || utf8_valid(value, value_size));
        if (!ok && !r->param_bad)
                r->param_bad = key;
        if (r->nparams < API_MAX_PARAMS) {
                r->param_names[r->nparams] = key;
                r->param_values[r->nparams] = value ? value : "";
                r->nparams++;
        } else {
                r->params_over = true;
        }
        return MHD_YES;
}

void req_collect_query(struct api_req *r)
{
        MHD_get_connection_values_n(r->conn, MHD_GET_ARGUMENT_KIND, collect_param, r);
}
