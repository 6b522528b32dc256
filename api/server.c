/* server.c — tally-api's HTTP server: libmicrohttpd with an epoll polling
 * thread pool and explicit limits, the one route table, who may call what,
 * CSRF, rate limits, idempotency, JSON errors, the access log and /metrics.
 *
 * Nothing here trusts the caller for its account: it comes from the key or
 * session found in the database, and every handler scopes its SQL to it. No
 * secret (key, cookie, password, CSRF token) is ever logged. */
#include "destinations.h"
#include "invoices.h"
#include "log.h"
#include "server.h"
#include "static.h"
#include "vmm_hosts.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the route table: every route the server answers, in one place ---- */

enum need {
        NEED_NONE,   /* anyone (health, metrics, the OpenAPI document, sign-in) */
        NEED_ANY,    /* an API key or a person's session */
        NEED_PERSON, /* a person's session: keys and limits (invariant 5) */
        NEED_KEY,    /* an API key: sandboxes are created for, and charged to, a key */
};

static int h_healthz(struct api_req *r, struct api_reply *out, struct api_error *err);
static int h_metrics(struct api_req *r, struct api_reply *out, struct api_error *err);
static int h_usage(struct api_req *r, struct api_reply *out, struct api_error *err);
static int h_spend(struct api_req *r, struct api_reply *out, struct api_error *err);
static int h_alerts(struct api_req *r, struct api_reply *out, struct api_error *err);
static int h_openapi(struct api_req *r, struct api_reply *out, struct api_error *err);

struct route {
        const char *method;
        const char *pattern; /* "{id}" matches one path segment */
        api_handler_fn fn;
        enum need need;
        bool worker; /* slow (waits on a tally-vmm, or hashes a password): runs on a worker (workers.c),
                      * never on an HTTP thread */
};

static const struct route routes[] = {
        { "GET", "/", h_static_index, NEED_NONE, false },
        { "GET", "/static/{id}", h_static_file, NEED_NONE, false },
        { "GET", "/healthz", h_healthz, NEED_NONE, false },
        { "GET", "/metrics", h_metrics, NEED_NONE, false },
        { "GET", "/v1/openapi.json", h_openapi, NEED_NONE, false },
        { "POST", "/v1/sessions", h_session_create, NEED_NONE, true }, /* the password hash is slow */
        { "GET", "/v1/sessions/current", h_session_get, NEED_PERSON, false },
        { "DELETE", "/v1/sessions/current", h_session_delete, NEED_PERSON, false },
        { "GET", "/v1/keys", h_keys_list, NEED_PERSON, false },
        { "POST", "/v1/keys", h_keys_create, NEED_PERSON, false },
        { "GET", "/v1/keys/{id}", h_key_get, NEED_PERSON, false },
        { "DELETE", "/v1/keys/{id}", h_key_revoke, NEED_PERSON, false },
        { "PUT", "/v1/keys/{id}/limit", h_key_limit_put, NEED_PERSON, false },
        { "DELETE", "/v1/keys/{id}/limit", h_key_limit_delete, NEED_PERSON, false },
        { "GET", "/v1/keys/{id}/caps", h_key_caps_get, NEED_PERSON, false },
        { "PUT", "/v1/keys/{id}/caps", h_key_caps_put, NEED_PERSON, false },
        { "PUT", "/v1/keys/{id}/internet", h_key_internet_put, NEED_PERSON, false },
        { "GET", "/v1/sandboxes", h_sandboxes_list, NEED_ANY, true },
        { "POST", "/v1/sandboxes", h_sandboxes_create, NEED_KEY, true },
        { "GET", "/v1/sandboxes/{id}", h_sandbox_get, NEED_ANY, true },
        { "DELETE", "/v1/sandboxes/{id}", h_sandbox_delete, NEED_ANY, true },
        { "POST", "/v1/sandboxes/{id}/exec", h_sandbox_exec, NEED_ANY, true },
        { "POST", "/v1/sandboxes/{id}/pause", h_sandbox_pause, NEED_ANY, true },
        { "POST", "/v1/sandboxes/{id}/resume", h_sandbox_resume, NEED_ANY, true },
        { "POST", "/v1/sandboxes/{id}/fork", h_sandbox_fork, NEED_ANY, true },
        { "POST", "/v1/sandboxes/{id}/timeout", h_sandbox_timeout, NEED_ANY, true },
        { "GET", "/v1/usage", h_usage, NEED_ANY, false },
        { "GET", "/v1/spend", h_spend, NEED_ANY, false },
        { "GET", "/v1/alerts", h_alerts, NEED_ANY, false },
        { "GET", "/v1/invoices", h_invoices_list, NEED_PERSON, false },
        { "GET", "/v1/invoices/current", h_invoice_current, NEED_PERSON, false },
        { "GET", "/v1/invoices/{id}", h_invoice_get, NEED_PERSON, false },
        { "GET", "/v1/alert-destinations", h_destinations_list, NEED_PERSON, false },
        { "POST", "/v1/alert-destinations", h_destinations_create, NEED_PERSON, false },
        { "DELETE", "/v1/alert-destinations/{id}", h_destination_disable, NEED_PERSON, false },
        { "POST", "/v1/alert-destinations/{id}/test", h_destination_test, NEED_PERSON, false },
        { "POST", "/v1/alert-deliveries/{id}/resend", h_delivery_resend, NEED_PERSON, false },
};
#define NROUTES (sizeof(routes) / sizeof(routes[0]))
#define ROUTE_NONE NROUTES /* metrics slot for requests that matched no route */

/* ---- metrics: counters per route and status, a latency histogram ---- */

static const int64_t bucket_us[] = { 1000, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 5000000 };
#define NBUCKETS (sizeof(bucket_us) / sizeof(bucket_us[0]))

struct metrics {
        _Atomic uint64_t by_status[NROUTES + 1][600];
        _Atomic uint64_t buckets[NROUTES + 1][NBUCKETS + 1];
        _Atomic uint64_t sum_us[NROUTES + 1];
};

struct api_server {
        const struct api_config *cfg;
        struct MHD_Daemon *mhd;
        struct db_pool *pool;
        struct work_pool *workers;
        struct vmm_hosts *hosts;
        struct metrics *metrics;
        int port;
        pthread_t janitor;
        bool janitor_started, stopping;
        pthread_mutex_t lock;
        pthread_cond_t wake;
};

/* The longest URL and the most header bytes a request may have; beyond,
 * 414 and 431 (tally's JSON). A request head past libmicrohttpd's memory for
 * a connection (CONNECTION_MEMORY, which holds it whole) is refused by
 * libmicrohttpd itself before tally sees it. */
#define URL_MAX 8192
#define HEADERS_MAX 16384
#define CONNECTION_MEMORY (64 * 1024)

enum phase {
        PHASE_READING, /* the request and its body are being read */
        PHASE_QUEUED,  /* on a worker (waiting or running); the connection is suspended */
        PHASE_DONE,    /* out holds the answer, to be sent */
};

/* Per connection: the body collected across handler calls, and the request
 * while a worker runs it. */
struct conn_state {
        char *body;
        size_t len;
        bool too_big;
        bool answered; /* the answer is queued; what still comes is dropped */
        bool started;  /* handle() has seen the request's head */
        size_t uri_len; /* the URI as sent, with its query */
        struct timespec start;
        enum phase phase;
        struct MHD_Connection *conn;
        struct api_req r;
        struct api_reply out;
        size_t ri;
        struct work_job job;
};

/* ---- small helpers handlers share ---- */

int reply_json(struct api_reply *out, int status, json_t *json)
{
        out->status = status;
        out->body = json ? json_dumps(json, JSON_COMPACT) : strdup("{}");
        out->len = out->body ? strlen(out->body) : 0;
        out->content_type = "application/json";
        json_decref(json);
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

static bool is_write(const char *method)
{
        return strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0;
}

/* Whether s[0..n) is UTF-8 (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t n)
{
        for (size_t i = 0; i < n;) {
                unsigned char c = s[i];
                size_t len;
                uint32_t cp;
                if (c < 0x80) {
                        i++;
                        continue;
                } else if ((c & 0xe0) == 0xc0) {
                        len = 2;
                        cp = c & 0x1f;
                } else if ((c & 0xf0) == 0xe0) {
                        len = 3;
                        cp = c & 0x0f;
                } else if ((c & 0xf8) == 0xf0) {
                        len = 4;
                        cp = c & 0x07;
                } else {
                        return false;
                }
                if (i + len > n)
                        return false;
                for (size_t k = 1; k < len; k++) {
                        if ((s[i + k] & 0xc0) != 0x80)
                                return false;
                        cp = cp << 6 | (s[i + k] & 0x3f);
                }
                static const uint32_t min[] = { 0, 0, 0x80, 0x800, 0x10000 };
                if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                        return false;
                i += len;
        }
        return true;
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
                  utf8_valid((const unsigned char *)key, key_size) &&
                  (!value || utf8_valid((const unsigned char *)value, value_size));
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
        if (is_write(rt->method) && r->nparams > 0)
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

static const char *idem_header(struct api_req *r)
{
        return is_write(r->method) && r->caller.account[0] ? req_header(r, "Idempotency-Key") : NULL;
}

/* ---- the built-in routes ---- */

static int h_healthz(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        PGresult *res = PQexec(req_db(r), "SELECT 1");
        bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;
        PQclear(res);
        if (!ok)
                return api_fail(err, 503, "database_unavailable", NULL, "the database does not answer");
        return reply_json(out, 200, json_pack("{s:s}", "status", "ok"));
}

static int h_metrics(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        struct metrics *m = r->srv->metrics;
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f)
                return api_fail(err, 500, "internal", NULL, "out of memory");
        fprintf(f, "# HELP tally_api_requests_total Requests answered, by route and status.\n"
                   "# TYPE tally_api_requests_total counter\n");
        for (size_t i = 0; i <= NROUTES; i++)
                for (int s = 100; s < 600; s++) {
                        uint64_t n = atomic_load(&m->by_status[i][s]);
                        if (n)
                                fprintf(f, "tally_api_requests_total{method=\"%s\",route=\"%s\",status=\"%d\"} %llu\n",
                                        i < NROUTES ? routes[i].method : "", i < NROUTES ? routes[i].pattern : "none",
                                        s, (unsigned long long)n);
                }
        fprintf(f, "# HELP tally_api_request_duration_seconds Time from the request's first byte to its answer.\n"
                   "# TYPE tally_api_request_duration_seconds histogram\n");
        for (size_t i = 0; i <= NROUTES; i++) {
                uint64_t cum = 0, total = 0;
                for (size_t b = 0; b <= NBUCKETS; b++)
                        total += atomic_load(&m->buckets[i][b]);
                if (!total)
                        continue;
                const char *method = i < NROUTES ? routes[i].method : "";
                const char *pat = i < NROUTES ? routes[i].pattern : "none";
                for (size_t b = 0; b < NBUCKETS; b++) {
                        cum += atomic_load(&m->buckets[i][b]);
                        fprintf(f, "tally_api_request_duration_seconds_bucket{method=\"%s\",route=\"%s\",le=\"%lld.%06lld\"} %llu\n",
                                method, pat, (long long)(bucket_us[b] / 1000000), (long long)(bucket_us[b] % 1000000),
                                (unsigned long long)cum);
                }
                uint64_t sum = atomic_load(&m->sum_us[i]);
                fprintf(f, "tally_api_request_duration_seconds_bucket{method=\"%s\",route=\"%s\",le=\"+Inf\"} %llu\n",
                        method, pat, (unsigned long long)total);
                fprintf(f, "tally_api_request_duration_seconds_sum{method=\"%s\",route=\"%s\"} %llu.%06llu\n", method,
                        pat, (unsigned long long)(sum / 1000000), (unsigned long long)(sum % 1000000));
                fprintf(f, "tally_api_request_duration_seconds_count{method=\"%s\",route=\"%s\"} %llu\n", method, pat,
                        (unsigned long long)total);
        }
        int size, in_use;
        uint64_t waits;
        db_pool_stats(r->srv->pool, &size, &in_use, &waits);
        /* this request holds no connection: /metrics never takes one */
        fprintf(f, "# HELP tally_api_db_pool_connections Connections in the database pool.\n"
                   "# TYPE tally_api_db_pool_connections gauge\ntally_api_db_pool_connections %d\n"
                   "# HELP tally_api_db_pool_in_use Connections held by requests now.\n"
                   "# TYPE tally_api_db_pool_in_use gauge\ntally_api_db_pool_in_use %d\n"
                   "# HELP tally_api_db_pool_waits_total Times a request waited for a free connection.\n"
                   "# TYPE tally_api_db_pool_waits_total counter\ntally_api_db_pool_waits_total %llu\n",
                size, in_use, (unsigned long long)waits);
        int running, queued;
        work_pool_stats(r->srv->workers, &running, &queued);
        fprintf(f, "# HELP tally_api_workers_running Requests running on a worker (waiting on a tally-vmm).\n"
                   "# TYPE tally_api_workers_running gauge\ntally_api_workers_running %d\n"
                   "# HELP tally_api_workers_queued Requests waiting for a worker.\n"
                   "# TYPE tally_api_workers_queued gauge\ntally_api_workers_queued %d\n",
                running, queued);
        alert_metrics_write(f);
        fclose(f);
        out->status = 200;
        out->body = buf;
        out->len = len;
        out->content_type = "text/plain; version=0.0.4";
        return 0;
}

static int from_body(struct api_reply *out, struct api_body *b)
{
        out->status = 200;
        out->body = b->data;
        out->len = b->len;
        out->content_type = b->content_type;
        return 0;
}

static int h_usage(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        const char *accept = req_header(r, "Accept");
        bool csv = accept && strstr(accept, "text/csv");
        struct api_body b = { 0 };
        int rc = api_usage(req_db(r), &r->caller, req_param, r, csv, &b, err);
        return rc < 0 ? rc : from_body(out, &b);
}

static int h_spend(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        struct api_body b = { 0 };
        int rc = api_spend(req_db(r), &r->caller, req_param, r, &b, err);
        return rc < 0 ? rc : from_body(out, &b);
}

static int h_alerts(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        struct api_body b = { 0 };
        int rc = api_alerts(req_db(r), &r->caller, req_param, r, &b, err);
        return rc < 0 ? rc : from_body(out, &b);
}

static int h_openapi(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        (void)r;
        const char *doc = api_openapi_json();
        out->status = 200;
        out->body = strdup(doc);
        out->len = out->body ? strlen(out->body) : 0;
        out->content_type = "application/json";
        return out->body ? 0 : api_fail(err, 500, "internal", NULL, "out of memory");
}

/* ---- dispatch ---- */

/* Matches path against pattern, copying the {id} segment into id. */
static bool match(const char *pattern, const char *path, char id[EVENT_ID_MAX + 1], bool *ret_id_ok)
{
        while (*pattern && *path) {
                if (strncmp(pattern, "{id}", 4) == 0) {
                        size_t n = strcspn(path, "/");
                        if (n == 0)
                                return false;
                        *ret_id_ok = n <= EVENT_ID_MAX;
                        size_t c = n <= EVENT_ID_MAX ? n : EVENT_ID_MAX;
                        memcpy(id, path, c);
                        id[c] = '\0';
                        if (!*ret_id_ok || !id_valid(id))
                                *ret_id_ok = false;
                        pattern += 4;
                        path += n;
                        continue;
                }
                if (*pattern != *path)
                        return false;
                pattern++;
                path++;
        }
        return !*pattern && !*path;
}

static void error_reply(struct api_reply *out, const struct api_error *e)
{
        free(out->body);
        out->body = NULL;
        reply_json(out, e->status ? e->status : 500,
                   json_pack("{s:{s:s, s:s, s:s}}", "error", "code", e->code[0] ? e->code : "internal", "message",
                             e->message[0] ? e->message : "internal error", "field", e->field));
}

/* The first half of a request, on the HTTP thread: the route, who is
 * asking, CSRF, the rate limit, the query and the body. Returns true when out
 * holds the answer already (an error); false when the route's handler is to
 * run (run_back). *ret_ri: the route's index (ROUTE_NONE if none). */
static bool run_front(struct api_req *r, struct api_reply *out, size_t *ret_ri)
{
        struct api_error err = { 0 };
        const struct api_config *cfg = r->srv->cfg;
        size_t ri = ROUTE_NONE;
        bool path_known = false, id_ok = true;
        char csrf_hash[65] = "";
        for (size_t i = 0; i < NROUTES; i++) {
                char id[EVENT_ID_MAX + 1] = "";
                bool ok = true;
                if (!match(routes[i].pattern, r->path, id, &ok))
                        continue;
                path_known = true;
                if (strcmp(routes[i].method, r->method) == 0) {
                        ri = i;
                        id_ok = ok;
                        memcpy(r->id, id, sizeof(r->id));
                        break;
                }
        }
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
        if (ri == ROUTE_NONE) {
                if (path_known)
                        api_fail(&err, 405, "method_not_allowed", NULL, "%s is not allowed on %s", r->method,
                                 r->path);
                else
                        api_fail(&err, 404, "not_found", NULL, "no route %s", r->path);
                goto fail;
        }
        const struct route *rt = &routes[ri];
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
                if (r->caller.person[0] && is_write(r->method)) {
                        const char *token = req_header(r, "X-CSRF-Token");
                        char h[65];
                        if (token)
                                sha256_hex(token, strlen(token), h);
                        if (!token || CRYPTO_memcmp(h, csrf_hash, 64) != 0) {
                                api_fail(&err, 403, "csrf_required", "X-CSRF-Token",
                                         "a write with a session needs the session's X-CSRF-Token header");
                                goto fail;
                        }
                }
                int64_t retry;
                const char *who = r->caller.key[0] ? r->caller.key : r->caller.person;
                if (!rate_allow(cfg, who, &retry)) {
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
        error_reply(out, &err);
        if (err.status == 429 && !out->headers[1][0])
                snprintf(out->headers[1], sizeof(out->headers[1]), "Retry-After: 60");
        return true;
}

/* The second half: Idempotency-Key, the handler, and the check that a read
 * used every query parameter it was sent. On a worker for the routes that
 * wait on a tally-vmm and for every write with an Idempotency-Key (a retry
 * waits there for the first), else on the HTTP thread. */
static void run_back(struct api_req *r, size_t ri, struct api_reply *out)
{
        struct api_error err = { 0 };
        const char *idem = idem_header(r);
        if (idem) {
                int ir = idem_begin(r, idem, out, &err);
                if (ir < 0) {
                        error_reply(out, &err);
                        return;
                }
                if (ir == IDEM_REPLAY)
                        return;
        }
        int rc = routes[ri].fn(r, out, &err);
        if (rc < 0)
                error_reply(out, &err);
        else if (out->status < 400 && query_unused(r, &err) < 0)
                error_reply(out, &err);
        if (idem)
                idem_finish(r, idem, out);
}

/* A pooled connection is found broken only when a statement fails on it (a
 * PostgreSQL restart breaks every one the pool holds, and the pool resets a
 * connection only once it knows): a read that failed so runs once more, on
 * the same connection reconnected, rather than answer 5xx to the first
 * request on each. A write is never repeated: it may have committed. */
static bool lost_connection(const struct api_req *r, const struct api_reply *out)
{
        return !is_write(r->method) && out->status >= 500 && r->db && PQstatus(r->db) == CONNECTION_BAD;
}

static int64_t elapsed_us(const struct timespec *start)
{
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        return (int64_t)(now.tv_sec - start->tv_sec) * 1000000 + (now.tv_nsec - start->tv_nsec) / 1000;
}

static enum MHD_Result send_reply(struct MHD_Connection *c, struct api_reply *out)
{
        struct MHD_Response *resp =
                out->body ? MHD_create_response_from_buffer(out->len, out->body, MHD_RESPMEM_MUST_FREE)
                          : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
        out->body = NULL; /* the response owns it now */
        if (!resp)
                return MHD_NO;
        MHD_add_response_header(resp, "Content-Type", out->content_type ? out->content_type : "application/json");
        MHD_add_response_header(resp, "Cache-Control", "no-store");
        for (int i = 0; i < 2; i++) {
                char *colon = strchr(out->headers[i], ':');
                if (!out->headers[i][0] || !colon)
                        continue;
                *colon = '\0';
                MHD_add_response_header(resp, out->headers[i], colon + 2);
        }
        enum MHD_Result ret = MHD_queue_response(c, (unsigned)out->status, resp);
        MHD_destroy_response(resp);
        return ret;
}

static void account_request(struct api_server *s, size_t ri, struct api_req *r, int status, int64_t us)
{
        struct metrics *m = s->metrics;
        if (status >= 100 && status < 600)
                atomic_fetch_add(&m->by_status[ri][status], 1);
        size_t b = 0;
        while (b < NBUCKETS && us > bucket_us[b])
                b++;
        atomic_fetch_add(&m->buckets[ri][b], 1);
        atomic_fetch_add(&m->sum_us[ri], (uint64_t)us);
        log_info("request", "method=%s route=%s path=%s status=%d duration_us=%lld key=%s person=%s ip=%s", r->method,
                 ri < NROUTES ? routes[ri].pattern : "none", r->path, status, (long long)us,
                 r->caller.key[0] ? r->caller.key : "-", r->caller.person[0] ? r->caller.person : "-", r->ip);
}

static void client_ip(struct MHD_Connection *c, char *out, size_t size)
{
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        snprintf(out, size, "-");
        if (!ci || !ci->client_addr)
                return;
        const struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_INET)
                inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)size);
        else if (sa->sa_family == AF_INET6)
                inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)size);
}

/* A worker's half of a request (work_job.run): the back, once more on a
 * fresh connection when a read found its connection broken; then the
 * connection is resumed, and libmicrohttpd calls handle() again to send. */
static void run_job(struct work_job *j, bool cancelled)
{
        struct conn_state *st = (struct conn_state *)((char *)j - offsetof(struct conn_state, job));
        struct api_req *r = &st->r;
        if (cancelled) {
                struct api_error e = { 0 };
                api_fail(&e, 503, "unavailable", NULL, "tally-api is stopping; retry");
                error_reply(&st->out, &e);
        } else {
                run_back(r, st->ri, &st->out);
                if (lost_connection(r, &st->out)) {
                        log_warn("lost the database connection: running the request again on a new one",
                                 "method=%s path=%s status=%d", r->method, r->path, st->out.status);
                        db_pool_reset(r->srv->pool, r->db);
                        free(st->out.body);
                        st->out = (struct api_reply){ 0 };
                        run_back(r, st->ri, &st->out);
                }
        }
        req_db_release(r);
        st->phase = PHASE_DONE;
        MHD_resume_connection(st->conn);
}

/* Hands the request's back half to a worker; the connection is suspended
 * until it is done. Returns false (out filled with 429) when the caller's
 * queue is full. */
static bool to_worker(struct api_server *s, struct conn_state *st)
{
        struct api_req *r = &st->r;
        req_db_release(r);
        if (!r->caller.account[0]) {
                /* a sign-in: every sign-in is one tenant, each address one of its callers */
                snprintf(st->job.account, sizeof(st->job.account), "(sign-in)");
                snprintf(st->job.who, sizeof(st->job.who), "%s", r->ip);
        } else {
                snprintf(st->job.account, sizeof(st->job.account), "%s", r->caller.account);
                if (r->caller.key[0])
                        snprintf(st->job.who, sizeof(st->job.who), "%s", r->caller.key);
                else
                        snprintf(st->job.who, sizeof(st->job.who), "person:%s", r->caller.person);
        }
        st->job.run = run_job;
        st->phase = PHASE_QUEUED;
        /* suspended first: the worker may be done (and resume) before submit returns */
        MHD_suspend_connection(st->conn);
        int rc = work_pool_submit(s->workers, &st->job);
        if (rc == 0)
                return true;
        struct api_error e = { 0 };
        if (rc == -EBUSY) {
                api_fail(&e, 429, "too_many_requests", NULL,
                         "too many requests of this account (or sign-ins) are waiting; retry in 1 s");
                snprintf(st->out.headers[1], sizeof(st->out.headers[1]), "Retry-After: 1");
        } else {
                api_fail(&e, 503, "unavailable", NULL, "tally-api cannot take the request now; retry");
        }
        error_reply(&st->out, &e);
        st->phase = PHASE_DONE;
        MHD_resume_connection(st->conn);
        return false;
}

static struct conn_state *conn_state_new(void)
{
        struct conn_state *st = calloc(1, sizeof(*st));
        if (st)
                clock_gettime(CLOCK_MONOTONIC, &st->start);
        return st;
}

/* libmicrohttpd's first look at a request: the URI as sent, query and all
 * (handle() sees the path without it). What it returns is the request's
 * state from then on. */
static void *uri_seen(void *cls, const char *uri, struct MHD_Connection *c)
{
        (void)cls;
        (void)c;
        struct conn_state *st = conn_state_new();
        if (st)
                st->uri_len = strlen(uri);
        return st;
}

/* Answers now, before the body is read: the request is refused whole
 * (libmicrohttpd closes the connection after the answer). */
static enum MHD_Result refuse_early(struct api_server *s, struct MHD_Connection *c, struct conn_state *st,
                                    const char *method, const char *url, struct api_error *e, size_t *size)
{
        struct api_req r = { .srv = s, .method = method, .path = url, .conn = c };
        struct api_reply out = { 0 };
        client_ip(c, r.ip, sizeof(r.ip));
        error_reply(&out, e);
        st->answered = true;
        *size = 0;
        int status = out.status;
        enum MHD_Result ret = send_reply(c, &out);
        free(out.body);
        account_request(s, ROUTE_NONE, &r, status, elapsed_us(&st->start));
        return ret;
}

static enum MHD_Result header_bytes(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
        (void)kind;
        *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4; /* ": " and CRLF, or "&" and "=" */
        return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *data, size_t *size, void **con_cls)
{
        struct api_server *s = cls;
        struct conn_state *st = *con_cls;
        (void)version;
        if (!st) {
                if (!(st = conn_state_new()))
                        return MHD_NO;
                st->uri_len = strlen(url);
                *con_cls = st;
        }
        if (!st->started) {
                st->started = true;
                struct api_error e = { 0 };
                size_t hb = 0;
                MHD_get_connection_values(c, MHD_HEADER_KIND, header_bytes, &hb);
                if (st->uri_len > URL_MAX) {
                        api_fail(&e, 414, "uri_too_long", NULL, "the URL is longer than %d bytes", URL_MAX);
                        return refuse_early(s, c, st, method, url, &e, size);
                }
                if (hb > HEADERS_MAX) {
                        api_fail(&e, 431, "headers_too_large", NULL, "the headers are larger than %d bytes",
                                 HEADERS_MAX);
                        return refuse_early(s, c, st, method, url, &e, size);
                }
                const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
                if (!cl || strtoll(cl, NULL, 10) <= s->cfg->body_max_bytes)
                        return MHD_YES;
                /* Declared too big: answered now, the body is never read. */
                api_fail(&e, 413, "body_too_large", "body", "the body is larger than %lld bytes",
                         (long long)s->cfg->body_max_bytes);
                return refuse_early(s, c, st, method, url, &e, size);
        }
        if (st->answered) {
                *size = 0;
                return MHD_YES;
        }
        if (st->phase == PHASE_QUEUED)
                return MHD_YES; /* not called while suspended; nothing to do if it were */
        if (st->phase == PHASE_DONE)
                goto send;
        if (*size) {
                if (!st->too_big && st->len + *size > (size_t)s->cfg->body_max_bytes) {
                        st->too_big = true;
                        free(st->body);
                        st->body = NULL;
                        st->len = 0;
                }
                if (!st->too_big) {
                        char *b = realloc(st->body, st->len + *size + 1);
                        if (!b)
                                return MHD_NO;
                        memcpy(b + st->len, data, *size);
                        st->len += *size;
                        b[st->len] = '\0';
                        st->body = b;
                }
                *size = 0;
                return MHD_YES;
        }
        if (st->too_big) {
                struct api_error e = { 0 };
                api_fail(&e, 413, "body_too_large", "body", "the body is larger than %lld bytes",
                         (long long)s->cfg->body_max_bytes);
                return refuse_early(s, c, st, method, url, &e, size);
        }
        st->r = (struct api_req){ .srv = s, .method = method, .path = url, .conn = c };
        st->conn = c;
        struct api_req *r = &st->r;
        client_ip(c, r->ip, sizeof(r->ip));
        r->body = st->body ? st->body : "";
        r->body_len = st->len;
        MHD_get_connection_values_n(c, MHD_GET_ARGUMENT_KIND, collect_param, r);
        for (int attempt = 0;; attempt++) {
                st->ri = ROUTE_NONE;
                bool done = run_front(r, &st->out, &st->ri);
                if (!done && (routes[st->ri].worker || idem_header(r))) {
                        to_worker(s, st);
                        return MHD_YES;
                }
                if (!done)
                        run_back(r, st->ri, &st->out);
                if (attempt > 0 || !lost_connection(r, &st->out))
                        break;
                log_warn("lost the database connection: running the request again on a new one",
                         "method=%s path=%s status=%d", method, url, st->out.status);
                db_pool_reset(s->pool, r->db);
                free(st->out.body);
                st->out = (struct api_reply){ 0 };
                memset(&r->caller, 0, sizeof(r->caller));
                json_decref(r->json);
                r->json = NULL;
        }
send:
        req_db_release(&st->r);
        json_decref(st->r.json);
        st->r.json = NULL;
        for (int i = 0; i < API_MAX_PARAMS; i++) {
                free(st->r.joined[i]);
                st->r.joined[i] = NULL;
        }
        int status = st->out.status;
        enum MHD_Result ret = send_reply(c, &st->out);
        free(st->out.body);
        st->out.body = NULL;
        st->answered = true;
        account_request(s, st->ri, &st->r, status, elapsed_us(&st->start));
        return ret;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
        (void)cls;
        (void)c;
        (void)toe;
        struct conn_state *st = *con_cls;
        if (st) {
                /* (a connection libmicrohttpd closed before the answer was sent — a
                 * client that went away while its request was on a worker — still
                 * holds its request's JSON and joined parameters) */
                json_decref(st->r.json);
                for (int i = 0; i < API_MAX_PARAMS; i++)
                        free(st->r.joined[i]);
                free(st->out.body);
                free(st->body);
                free(st);
        }
        *con_cls = NULL;
}

/* Once a minute: expired sessions, idempotency answers older than 24 hours
 * and sign-in windows that ended go. */
static void *janitor(void *arg)
{
        struct api_server *s = arg;
        pthread_mutex_lock(&s->lock);
        while (!s->stopping) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_sec += 60;
                pthread_cond_timedwait(&s->wake, &s->lock, &until);
                if (s->stopping)
                        break;
                pthread_mutex_unlock(&s->lock);
                PGconn *db = db_pool_get(s->pool);
                PQclear(db_query(db, "remove expired sessions", PGRES_COMMAND_OK,
                                 "DELETE FROM sessions WHERE expires_at < now()", 0, NULL));
                PQclear(db_query(db, "remove old idempotency keys", PGRES_COMMAND_OK,
                                 "DELETE FROM idempotency_keys WHERE created_at < now() - interval '24 hours'", 0, NULL));
                char window[24];
                snprintf(window, sizeof(window), "%lld", (long long)s->cfg->signin_window_s);
                const char *wp[] = { window };
                PQclear(db_query(db, "remove ended sign-in windows", PGRES_COMMAND_OK,
                                 "DELETE FROM signin_attempts "
                                 "WHERE window_start < now() - $1::bigint * interval '1 second'",
                                 1, wp));
                alert_metrics_refresh(db);
                db_pool_put(s->pool, db);
                pthread_mutex_lock(&s->lock);
        }
        pthread_mutex_unlock(&s->lock);
        return NULL;
}

int api_server_start(const struct api_config *cfg, struct api_server **ret, char *err, size_t errlen)
{
        struct api_server *s = calloc(1, sizeof(*s));
        int r;
        if (!s || !(s->metrics = calloc(1, sizeof(*s->metrics)))) {
                free(s);
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        s->cfg = cfg;
        pthread_mutex_init(&s->lock, NULL);
        pthread_cond_init(&s->wake, NULL);
        if ((r = vmm_hosts_new(cfg->vmm_sockets, &s->hosts, err, errlen)) < 0)
                goto fail;
        if ((r = db_pool_new(cfg->database_url, (int)cfg->db_pool_size, cfg->statement_timeout_ms, &s->pool, err,
                               errlen)) < 0)
                goto fail;
        struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)cfg->port) };
        struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->port) };
        const struct sockaddr *sa;
        struct work_limits lim = { cfg->workers, cfg->workers_per_key, cfg->workers_per_account, cfg->queue_per_account,
                                   cfg->queue_max };
        if ((r = work_pool_new(&lim, &s->workers, err, errlen)) < 0)
                goto fail;
        unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
        if (inet_pton(AF_INET, cfg->listen_address, &a4.sin_addr) == 1) {
                sa = (const struct sockaddr *)&a4;
        } else if (inet_pton(AF_INET6, cfg->listen_address, &a6.sin6_addr) == 1) {
                sa = (const struct sockaddr *)&a6;
                flags |= MHD_USE_IPv6;
        } else {
                snprintf(err, errlen, "listen_address \"%s\" is not an IPv4 or IPv6 address", cfg->listen_address);
                r = -EINVAL;
                goto fail;
        }
        s->mhd = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR, sa,
                                  MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->threads, MHD_OPTION_CONNECTION_LIMIT,
                                  (unsigned)cfg->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                  (unsigned)cfg->per_ip_connections, MHD_OPTION_CONNECTION_TIMEOUT,
                                  (unsigned)cfg->connection_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                  (size_t)CONNECTION_MEMORY, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
                                  MHD_OPTION_URI_LOG_CALLBACK, uri_seen, s,
                                  MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_END);
        if (!s->mhd) {
                snprintf(err, errlen, "could not listen on %s port %lld", cfg->listen_address, (long long)cfg->port);
                r = -EADDRINUSE;
                goto fail;
        }
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
        s->port = di ? di->port : (int)cfg->port;
        {
                PGconn *db = db_pool_get(s->pool);
                alert_metrics_refresh(db);
                db_pool_put(s->pool, db);
        }
        if (pthread_create(&s->janitor, NULL, janitor, s) == 0)
                s->janitor_started = true;
        *ret = s;
        return 0;
fail:
        api_server_stop(s);
        return r;
}

const char *api_route(size_t i, const char **ret_method)
{
        if (i >= NROUTES)
                return NULL;
        *ret_method = routes[i].method;
        return routes[i].pattern;
}

int api_server_port(struct api_server *s)
{
        return s->port;
}

void api_server_stop(struct api_server *s)
{
        if (!s)
                return;
        if (s->janitor_started) {
                pthread_mutex_lock(&s->lock);
                s->stopping = true;
                pthread_cond_signal(&s->wake);
                pthread_mutex_unlock(&s->lock);
                pthread_join(s->janitor, NULL);
        }
        /* Queued requests are answered 503; running ones get 5 s. libmicrohttpd
         * cannot stop with a connection suspended: if one still runs on a
         * tally-vmm, the daemon is left to the process's exit. */
        bool idle = work_pool_free(s->workers, 5000);
        if (s->mhd && idle)
                MHD_stop_daemon(s->mhd);
        pthread_mutex_destroy(&s->lock);
        pthread_cond_destroy(&s->wake);
        db_pool_free(s->pool);
        vmm_hosts_free(s->hosts);
        free(s->metrics);
        free(s);
}
