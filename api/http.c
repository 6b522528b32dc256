/* http.c — see http.h. libmicrohttpd with an internal epoll polling thread
 * pool and explicit limits (connections, per address, timeout, memory); the
 * body is collected across the handler's calls; a request whose handler waits
 * is handed to a worker (workers.c) with its connection suspended. */
#include "http.h"

#include "access_log.h"
#include "dispatch.h"
#include "log.h"
#include "metrics.h"
#include "router.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

struct http_server {
        struct api_server *srv;
        struct MHD_Daemon *mhd;
        int port;
};

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

/* A request answered: counted for /metrics, and one line of the access log. */
static void account_request(struct api_server *s, size_t ri, struct api_req *r, int status, int64_t us)
{
        api_metrics_count(s->metrics, ri, status, us);
        access_log_request(r, ri < route_count() ? route_at(ri)->pattern : "none", status, us);
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
                dispatch_error(&st->out, &e);
        } else {
                dispatch_back(r, st->ri, &st->out);
                if (dispatch_lost_connection(r, &st->out)) {
                        log_warn("lost the database connection: running the request again on a new one",
                                 "method=%s path=%s status=%d", r->method, r->path, st->out.status);
                        db_pool_reset(r->srv->pool, r->db);
                        free(st->out.body);
                        st->out = (struct api_reply){ 0 };
                        dispatch_back(r, st->ri, &st->out);
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
        dispatch_error(&st->out, &e);
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
        dispatch_error(&out, e);
        st->answered = true;
        *size = 0;
        int status = out.status;
        enum MHD_Result ret = send_reply(c, &out);
        free(out.body);
        account_request(s, route_count(), &r, status, elapsed_us(&st->start));
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
        req_collect_query(r);
        for (int attempt = 0;; attempt++) {
                st->ri = route_count();
                bool done = dispatch_front(r, &st->out, &st->ri);
                if (!done && dispatch_on_worker(r, st->ri)) {
                        to_worker(s, st);
                        return MHD_YES;
                }
                if (!done)
                        dispatch_back(r, st->ri, &st->out);
                if (attempt > 0 || !dispatch_lost_connection(r, &st->out))
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

int http_start(struct api_server *srv, struct http_server **ret, char *err, size_t errlen)
{
        const struct api_config *cfg = srv->cfg;
        struct sockaddr_in6 a6 = { .sin6_family = AF_INET6, .sin6_port = htons((uint16_t)cfg->port) };
        struct sockaddr_in a4 = { .sin_family = AF_INET, .sin_port = htons((uint16_t)cfg->port) };
        const struct sockaddr *sa;
        unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
        if (inet_pton(AF_INET, cfg->listen_address, &a4.sin_addr) == 1) {
                sa = (const struct sockaddr *)&a4;
        } else if (inet_pton(AF_INET6, cfg->listen_address, &a6.sin6_addr) == 1) {
                sa = (const struct sockaddr *)&a6;
                flags |= MHD_USE_IPv6;
        } else {
                snprintf(err, errlen, "listen_address \"%s\" is not an IPv4 or IPv6 address", cfg->listen_address);
                return -EINVAL;
        }
        struct http_server *h = calloc(1, sizeof(*h));
        if (!h) {
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        h->srv = srv;
        h->mhd = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, handle, srv, MHD_OPTION_SOCK_ADDR, sa,
                                  MHD_OPTION_THREAD_POOL_SIZE, (unsigned)cfg->threads, MHD_OPTION_CONNECTION_LIMIT,
                                  (unsigned)cfg->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                  (unsigned)cfg->per_ip_connections, MHD_OPTION_CONNECTION_TIMEOUT,
                                  (unsigned)cfg->connection_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                  (size_t)CONNECTION_MEMORY, MHD_OPTION_NOTIFY_COMPLETED, completed, srv,
                                  MHD_OPTION_URI_LOG_CALLBACK, uri_seen, srv,
                                  MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024, MHD_OPTION_END);
        if (!h->mhd) {
                free(h);
                snprintf(err, errlen, "could not listen on %s port %lld", cfg->listen_address, (long long)cfg->port);
                return -EADDRINUSE;
        }
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
        h->port = di ? di->port : (int)cfg->port;
        *ret = h;
        return 0;
}

int http_port(const struct http_server *h)
{
        return h->port;
}

void http_stop(struct http_server *h)
{
        if (!h)
                return;
        MHD_stop_daemon(h->mhd);
        free(h);
}

void http_abandon(struct http_server *h)
{
        free(h);
}
