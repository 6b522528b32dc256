/* api.c — see api.h. libmicrohttpd with a thread per connection: an exec may
 * block its connection for as long as the command runs, and must not hold up
 * anyone else's request.
 *
 * It must hold under abuse by any local process that can open the socket:
 * idle connections are closed after api_idle_timeout_s, one client (a root
 * process, or any other user id) holds at most api_connections_per_client of
 * the api_connections_max connections, and exec output is never held more than
 * once: the answer is escaped while it is sent, from the command's own buffers,
 * and those buffers count against one budget for the whole daemon. */
#include "api.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <jansson.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define BODY_MAX          (8 * 1024 * 1024)
#define EXEC_TIMEOUT_MAX_MS (24LL * 3600 * 1000)
#define REQUEST_TIMEOUT_S 600           /* a request being answered (create waits on its backend) */
#define STREAM_BLOCK      (16 * 1024)   /* bytes of an exec answer made at a time */

struct client {
        pid_t pid;                       /* root's processes count one by one ... */
        uid_t uid;                       /* ... every other user as one client */
        unsigned n;
};

struct vmm_api {
        struct MHD_Daemon *mhd;
        struct vmm *vmm;
        struct vmm_api_settings set;
        char path[108];
        int fd;                          /* ours until MHD_start_daemon; MHD's after, until quiesced */
        atomic_int active;               /* requests being answered */
        atomic_llong output_held;        /* bytes reserved for exec output (2 x output_cap per exec) */
        pthread_mutex_t lock;            /* guards clients */
        struct client *clients;
        size_t nclients;
};

/* What NOTIFY_CONNECTION keeps per connection. */
struct conn {
        struct client who;
        bool counted;
};

struct request {
        char *body;
        size_t len;
        bool too_big;
};

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned int status, json_t *j)
{
        char *text = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        if (!text)
                return MHD_NO;
        size_t len = strlen(text);
        text[len] = '\0';
        struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(resp, "Content-Type", "application/json");
        /* One request per connection: a connection's longer timeout while it is
         * answered (see handle) never carries over to idle time. */
        MHD_add_response_header(resp, "Connection", "close");
        enum MHD_Result r = MHD_queue_response(c, status, resp);
        MHD_destroy_response(resp);
        return r;
}

/* why may hold the client's own bytes (a sandbox id from the URL, jansson's
 * excerpt of a bad body), cut anywhere by a %.64s: where they are not UTF-8
 * jansson refuses the string, and the client got no answer at all. */
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned int status, const char *why)
{
        json_t *text = json_string(why);
        if (!text) {
                char ascii[512];
                size_t i = 0;
                for (; why[i] && i < sizeof(ascii) - 1; i++)
                        ascii[i] = (unsigned char)why[i] < 0x80 ? why[i] : '?';
                ascii[i] = '\0';
                text = json_string(ascii);
        }
        return send_json(c, status, json_pack("{s:o}", "error", text));
}

static unsigned int status_for(int r)
{
        switch (-r) {
        case EINVAL: return 400;
        case EACCES: return 403;
        case ENOENT: return 404;
        case EBUSY: return 409;
        case EOPNOTSUPP: return 422;
        case EAGAIN: return 503;
        case ENOSPC: return 507; /* this host's capacity: the sentence names what is short */
        case ECANCELED: return 503;
        default: return 500;
        }
}

static enum MHD_Result send_result(struct MHD_Connection *c, int r, const char *why, json_t *ok, unsigned int okstatus)
{
        if (r < 0) {
                json_decref(ok);
                return send_error(c, status_for(r), *why ? why : strerror(-r));
        }
        return send_json(c, okstatus, ok ? ok : json_object());
}

static int get_opt_int(json_t *body, const char *name, int64_t min, int64_t max, int64_t def, int64_t *out,
                       char *why, size_t whylen)
{
        json_t *v = json_object_get(body, name);
        if (!v) {
                *out = def;
                return 0;
        }
        if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
                snprintf(why, whylen, "%s must be an integer from %lld to %lld", name, (long long)min, (long long)max);
                return -EINVAL;
        }
        *out = json_integer_value(v);
        return 0;
}

/* ---- exec: the answer is made while it is sent ---- */

/* True if buf is UTF-8 (NULs allowed, as JSON's \u0000): no overlong forms,
 * surrogates or code points past U+10FFFF. */
static bool utf8_valid(const unsigned char *p, size_t len)
{
        size_t i = 0;
        while (i < len) {
                unsigned char c = p[i];
                size_t n;
                uint32_t cp;
                if (c < 0x80) {
                        i++;
                        continue;
                } else if ((c & 0xe0) == 0xc0) {
                        n = 1;
                        cp = c & 0x1f;
                } else if ((c & 0xf0) == 0xe0) {
                        n = 2;
                        cp = c & 0x0f;
                } else if ((c & 0xf8) == 0xf0) {
                        n = 3;
                        cp = c & 0x07;
                } else {
                        return false;
                }
                if (i + n >= len)
                        return false;
                for (size_t k = 1; k <= n; k++) {
                        if ((p[i + k] & 0xc0) != 0x80)
                                return false;
                        cp = cp << 6 | (p[i + k] & 0x3f);
                }
                if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
                    (cp >= 0xd800 && cp <= 0xdfff))
                        return false;
                i += n + 1;
        }
        return true;
}

enum part_kind { PART_TEXT, PART_JSON, PART_BASE64 };

struct part {
        enum part_kind kind;
        const unsigned char *data;       /* PART_TEXT: into stream->text; else the command's output */
        size_t len;
};

/* One exec answer being sent: the command's output (held once, as the
 * backend read it) and where the writer is. */
struct exec_stream {
        struct vmm_api *api;
        long long reserved;              /* bytes counted in api->output_held */
        struct exec_result res;
        char text[4][256];               /* the JSON around the two outputs */
        struct part parts[6];            /* head, 2 x (lead, output), tail */
        int nparts, at_part;
        size_t at;                       /* bytes of the current part done */
};

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Writes what fits of part p from offset *at into out (room bytes); returns bytes written. */
static size_t write_part(const struct part *p, size_t *at, char *out, size_t room)
{
        size_t w = 0;
        if (p->kind == PART_TEXT) {
                size_t n = p->len - *at < room ? p->len - *at : room;
                memcpy(out, p->data + *at, n);
                *at += n;
                return n;
        }
        if (p->kind == PART_BASE64) {
                while (*at < p->len && room - w >= 4) {
                        const unsigned char *s = p->data + *at;
                        size_t n = p->len - *at < 3 ? p->len - *at : 3;
                        uint32_t v = (uint32_t)s[0] << 16 | (n > 1 ? (uint32_t)s[1] << 8 : 0) | (n > 2 ? s[2] : 0);
                        out[w++] = b64[v >> 18 & 63];
                        out[w++] = b64[v >> 12 & 63];
                        out[w++] = n > 1 ? b64[v >> 6 & 63] : '=';
                        out[w++] = n > 2 ? b64[v & 63] : '=';
                        *at += n;
                }
                return w;
        }
        while (*at < p->len && room - w >= 6) {
                unsigned char c = p->data[(*at)++];
                switch (c) {
                case '"': out[w++] = '\\'; out[w++] = '"'; break;
                case '\\': out[w++] = '\\'; out[w++] = '\\'; break;
                case '\n': out[w++] = '\\'; out[w++] = 'n'; break;
                case '\r': out[w++] = '\\'; out[w++] = 'r'; break;
                case '\t': out[w++] = '\\'; out[w++] = 't'; break;
                default:
                        if (c < 0x20 || c == 0x7f) {
                                static const char hex[] = "0123456789abcdef";
                                memcpy(out + w, "\\u00", 4);
                                out[w + 4] = hex[c >> 4];
                                out[w + 5] = hex[c & 15];
                                w += 6;
                        } else {
                                out[w++] = (char)c;
                        }
                }
        }
        return w;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
        struct exec_stream *st = cls;
        size_t w = 0;
        (void)pos;
        while (st->at_part < st->nparts && w < max) {
                const struct part *p = &st->parts[st->at_part];
                size_t n = write_part(p, &st->at, buf + w, max - w);
                w += n;
                if (st->at == p->len) {
                        st->at_part++;
                        st->at = 0;
                } else if (n == 0) {
                        break; /* too little room left for one escaped byte: the next call */
                }
        }
        if (w == 0 && st->at_part == st->nparts)
                return MHD_CONTENT_READER_END_OF_STREAM;
        return (ssize_t)w;
}

static void stream_free(void *cls)
{
        struct exec_stream *st = cls;
        atomic_fetch_sub(&st->api->output_held, st->reserved);
        exec_result_clear(&st->res);
        free(st);
}

/* Adds the parts for one output: "name":"escaped" when it is UTF-8, else
 * "name":null,"name_base64":"...". lead goes before it (a comma, or the head). */
static void add_output(struct exec_stream *st, int text, const char *lead, const char *name, const char *buf,
                       size_t len)
{
        bool utf8 = utf8_valid((const unsigned char *)buf, len);
        int n = snprintf(st->text[text], sizeof(st->text[text]), utf8 ? "%s\"%s\":\"" : "%s\"%s\":null,\"%s_base64\":\"",
                         lead, name, name);
        st->parts[st->nparts++] = (struct part){ PART_TEXT, (const unsigned char *)st->text[text], (size_t)n };
        st->parts[st->nparts++] = (struct part){ utf8 ? PART_JSON : PART_BASE64, (const unsigned char *)buf, len };
}

static enum MHD_Result do_exec(struct vmm_api *a, struct MHD_Connection *c, const char *id, json_t *body)
{
        char why[512] = "";
        const struct vmm_settings *s = vmm_get_settings(a->vmm);
        char **argv = NULL;
        int64_t timeout_ms, cap;
        long long reserved = 0;
        int r;
        if (!json_is_object(body)) {
                r = -EINVAL;
                snprintf(why, sizeof(why), "the request body must be a JSON object");
                goto out;
        }
        json_t *in = json_object_get(body, "stdin");
        if ((r = command_parse(json_object_get(body, "command"), "command", &argv, why, sizeof(why))) < 0 ||
            (r = get_opt_int(body, "timeout_ms", 1, EXEC_TIMEOUT_MAX_MS, s->exec_timeout_default_ms, &timeout_ms,
                             why, sizeof(why))) < 0 ||
            (r = get_opt_int(body, "output_cap", 0, VMM_EXEC_OUTPUT_CAP_MAX,
                             s->exec_output_cap_default < VMM_EXEC_OUTPUT_CAP_MAX ? s->exec_output_cap_default
                                                                                  : VMM_EXEC_OUTPUT_CAP_MAX,
                             &cap, why, sizeof(why))) < 0)
                goto out;
        if (in && !json_is_string(in)) {
                r = -EINVAL;
                snprintf(why, sizeof(why), "stdin must be a string");
                goto out;
        }
        /* Both outputs at their cap, counted before the command runs. */
        reserved = 2 * (long long)cap;
        if (atomic_fetch_add(&a->output_held, reserved) + reserved > a->set.output_held_max) {
                r = -EAGAIN;
                snprintf(why, sizeof(why), "tally-vmm already holds %lld bytes of commands' output (at most %lld): "
                         "try again, or ask for a smaller output_cap", (long long)atomic_load(&a->output_held) - reserved,
                         (long long)a->set.output_held_max);
                goto out;
        }
        /* The connection stays open while the command runs (plus the kill's grace). */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)(timeout_ms / 1000 + 60));
        struct exec_request req = { argv, in ? json_string_value(in) : NULL, in ? json_string_length(in) : 0,
                                    timeout_ms * 1000000, (size_t)cap, NULL };
        struct exec_result res = { 0 };
        if ((r = vmm_exec(a->vmm, id, &req, &res, why, sizeof(why))) < 0)
                goto out;
        command_free(argv);
        struct exec_stream *st = calloc(1, sizeof(*st));
        if (!st) {
                exec_result_clear(&res);
                atomic_fetch_sub(&a->output_held, reserved);
                return MHD_NO;
        }
        st->api = a;
        st->reserved = reserved;
        st->res = res;
        int n = snprintf(st->text[0], sizeof(st->text[0]),
                         "{\"exit_code\":%d,\"timed_out\":%s,\"stdout_truncated\":%s,\"stderr_truncated\":%s",
                         res.exit_code, res.timed_out ? "true" : "false", res.out_truncated ? "true" : "false",
                         res.err_truncated ? "true" : "false");
        st->parts[st->nparts++] = (struct part){ PART_TEXT, (const unsigned char *)st->text[0], (size_t)n };
        add_output(st, 1, ",", "stdout", st->res.out ? st->res.out : "", st->res.out_len);
        add_output(st, 2, "\",", "stderr", st->res.err ? st->res.err : "", st->res.err_len);
        st->parts[st->nparts++] = (struct part){ PART_TEXT, (const unsigned char *)"\"}", 2 };
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read,
                                                                      st, stream_free);
        if (!resp) {
                stream_free(st);
                return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "application/json");
        MHD_add_response_header(resp, "Connection", "close");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
out:
        if (reserved)
                atomic_fetch_sub(&a->output_held, reserved);
        command_free(argv);
        return send_result(c, r, why, NULL, 200);
}

static enum MHD_Result route(struct vmm_api *a, struct MHD_Connection *c, const char *method, const char *url,
                             json_t *body)
{
        char why[512] = "";
        json_t *out = NULL;
        int r;
        bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
        if (strcmp(url, "/v1/status") == 0 && get)
                return send_json(c, 200, vmm_status(a->vmm));
        if (strcmp(url, "/v1/sandboxes") == 0) {
                if (get) {
                        const char *account = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "account");
                        return send_json(c, 200, json_pack("{s:o}", "sandboxes", vmm_list(a->vmm, account)));
                }
                if (!post)
                        return send_error(c, 405, "use GET or POST on /v1/sandboxes");
                struct create_request req;
                if ((r = create_request_parse(body, vmm_get_limits(a->vmm), &req, why, sizeof(why))) < 0)
                        return send_result(c, r, why, NULL, 201);
                r = vmm_create(a->vmm, &req, &out, why, sizeof(why));
                create_request_clear(&req);
                return send_result(c, r, why, out, 201);
        }
        if (strncmp(url, "/v1/sandboxes/", 14) != 0)
                return send_error(c, 404, "no such route");
        char id[EVENT_ID_MAX + 1];
        const char *rest = url + 14, *slash = strchr(rest, '/');
        size_t idlen = slash ? (size_t)(slash - rest) : strlen(rest);
        if (idlen == 0 || idlen > EVENT_ID_MAX)
                return send_error(c, 404, "no such sandbox");
        memcpy(id, rest, idlen);
        id[idlen] = '\0';
        const char *action = slash ? slash + 1 : "";
        if (!*action) {
                if (get) {
                        r = vmm_show(a->vmm, id, &out, why, sizeof(why));
                        return send_result(c, r, why, out, 200);
                }
                if (strcmp(method, "DELETE") == 0) {
                        r = vmm_stop(a->vmm, id, "request", why, sizeof(why));
                        if (r == 0)
                                vmm_show(a->vmm, id, &out, why, sizeof(why));
                        return send_result(c, r, why, out, 200);
                }
                return send_error(c, 405, "use GET or DELETE on a sandbox");
        }
        if (!post)
                return send_error(c, 405, "use POST for sandbox actions");
        if (strcmp(action, "exec") == 0)
                return do_exec(a, c, id, body);
        if (strcmp(action, "pause") == 0)
                r = vmm_pause(a->vmm, id, "request", why, sizeof(why));
        else if (strcmp(action, "resume") == 0)
                r = vmm_resume(a->vmm, id, why, sizeof(why));
        else if (strcmp(action, "stop") == 0)
                r = vmm_stop(a->vmm, id, "request", why, sizeof(why));
        else if (strcmp(action, "fork") == 0) {
                int64_t count;
                if ((r = get_opt_int(body, "count", 1, 10, 1, &count, why, sizeof(why))) < 0)
                        return send_result(c, r, why, NULL, 200);
                r = vmm_fork(a->vmm, id, (int)count, &out, why, sizeof(why));
                return send_result(c, r, why, out, 201);
        } else if (strcmp(action, "timeout") == 0) {
                json_t *t = json_object_get(body, "timeout_s");
                if (!json_is_integer(t)) {
                        snprintf(why, sizeof(why), "timeout_s is required");
                        return send_result(c, -EINVAL, why, NULL, 200);
                }
                r = vmm_set_timeout(a->vmm, id, json_integer_value(t), why, sizeof(why));
        } else {
                return send_error(c, 404, "unknown action (exec, pause, resume, stop, fork, timeout)");
        }
        if (r == 0)
                r = vmm_show(a->vmm, id, &out, why, sizeof(why));
        return send_result(c, r, why, out, 200);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *data, size_t *size, void **con_cls)
{
        struct vmm_api *a = cls;
        struct request *req = *con_cls;
        (void)version;
        if (!req) {
                if (!(req = calloc(1, sizeof(*req))))
                        return MHD_NO;
                *con_cls = req;
                atomic_fetch_add(&a->active, 1); /* until completed() */
                return MHD_YES;
        }
        if (*size) {
                if (req->len + *size > BODY_MAX) {
                        req->too_big = true;
                } else {
                        char *b = realloc(req->body, req->len + *size + 1);
                        if (!b)
                                return MHD_NO;
                        memcpy(b + req->len, data, *size);
                        req->len += *size;
                        b[req->len] = '\0';
                        req->body = b;
                }
                *size = 0;
                return MHD_YES;
        }
        if (req->too_big)
                return send_error(c, 413, "request body larger than 8 MiB");
        /* The whole request is in: it is answered now, however long that takes
         * (exec sets its own, longer, timeout). */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)REQUEST_TIMEOUT_S);
        json_t *body = NULL;
        if (req->len) {
                json_error_t jerr;
                if (!(body = json_loadb(req->body, req->len, JSON_REJECT_DUPLICATES, &jerr))) {
                        char why[300];
                        snprintf(why, sizeof(why), "the body is not JSON: %s at line %d", jerr.text, jerr.line);
                        return send_error(c, 400, why);
                }
        } else {
                body = json_object();
        }
        enum MHD_Result r = route(a, c, method, url, body);
        json_decref(body);
        return r;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
        struct vmm_api *a = cls;
        struct request *req = *con_cls;
        (void)c;
        (void)toe;
        if (req) {
                free(req->body);
                free(req);
                *con_cls = NULL;
                atomic_fetch_sub(&a->active, 1);
        }
}

/* Counts each connection against its client; one over the client's cap is
 * shut down at once (MHD then closes it), so no client can hold every slot. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
        struct vmm_api *a = cls;
        if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
                struct conn *cn = *socket_context;
                if (!cn)
                        return;
                pthread_mutex_lock(&a->lock);
                for (size_t i = 0; cn->counted && i < a->nclients; i++)
                        if (a->clients[i].pid == cn->who.pid && a->clients[i].uid == cn->who.uid) {
                                if (--a->clients[i].n == 0)
                                        a->clients[i] = a->clients[--a->nclients];
                                break;
                        }
                pthread_mutex_unlock(&a->lock);
                free(cn);
                *socket_context = NULL;
                return;
        }
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        int fd = info ? info->connect_fd : -1;
        struct ucred cred = { 0 };
        socklen_t len = sizeof(cred);
        struct conn *cn = calloc(1, sizeof(*cn));
        if (fd < 0 || !cn || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                free(cn);
                if (fd >= 0)
                        shutdown(fd, SHUT_RDWR);
                return;
        }
        cn->who.uid = cred.uid;
        cn->who.pid = cred.uid == 0 ? cred.pid : 0;
        bool refuse = false;
        pthread_mutex_lock(&a->lock);
        size_t i = 0;
        while (i < a->nclients && (a->clients[i].pid != cn->who.pid || a->clients[i].uid != cn->who.uid))
                i++;
        if (i < a->nclients && a->clients[i].n >= a->set.connections_per_client) {
                refuse = true;
        } else if (i == a->nclients) {
                struct client *l = realloc(a->clients, (a->nclients + 1) * sizeof(*l));
                if (l) {
                        a->clients = l;
                        a->clients[a->nclients++] = (struct client){ cn->who.pid, cn->who.uid, 1 };
                        cn->counted = true;
                } else {
                        refuse = true;
                }
        } else {
                a->clients[i].n++;
                cn->counted = true;
        }
        pthread_mutex_unlock(&a->lock);
        *socket_context = cn;
        if (refuse) {
                static _Atomic int64_t last_log;
                int64_t now = time_mono_ns();
                if (now - atomic_load(&last_log) >= NS_PER_SEC) {
                        atomic_store(&last_log, now);
                        log_warn("refusing a connection over its client's limit", "uid=%u pid=%d limit=%u",
                                 (unsigned)cred.uid, (int)cred.pid, a->set.connections_per_client);
                }
                shutdown(fd, SHUT_RDWR);
        }
}

int vmm_api_start(struct vmm *v, const char *path, const struct vmm_api_settings *set, struct vmm_api **ret,
                  char *err, size_t errlen)
{
        struct vmm_api *a = calloc(1, sizeof(*a));
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        int r;
        if (!a)
                return -ENOMEM;
        a->vmm = v;
        a->set = *set;
        a->fd = -1;
        pthread_mutex_init(&a->lock, NULL);
        if (strlen(path) >= sizeof(addr.sun_path)) {
                snprintf(err, errlen, "socket path %s is longer than %zu bytes", path, sizeof(addr.sun_path) - 1);
                r = -ENAMETOOLONG;
                goto fail;
        }
        memcpy(a->path, path, strlen(path) + 1);
        memcpy(addr.sun_path, path, strlen(path) + 1);
        a->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        unlink(path);
        if (a->fd < 0 || bind(a->fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || chmod(path, 0660) < 0 ||
            listen(a->fd, 128) < 0) {
                r = -errno;
                snprintf(err, errlen, "could not listen on %s: %s", path, strerror(errno));
                goto fail;
        }
        /* poll, not select: descriptors past 1024 must work. ITC: quiesce at shutdown. */
        a->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC |
                                          MHD_USE_ERROR_LOG,
                                  0, NULL, NULL, handle, a, MHD_OPTION_LISTEN_SOCKET, a->fd,
                                  MHD_OPTION_NOTIFY_COMPLETED, completed, a, MHD_OPTION_NOTIFY_CONNECTION,
                                  on_connection, a, MHD_OPTION_CONNECTION_LIMIT, set->connections_max,
                                  MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
                                  /* idle: seconds; a request being answered gets longer (handle) */
                                  MHD_OPTION_CONNECTION_TIMEOUT, set->idle_timeout_s, MHD_OPTION_END);
        if (!a->mhd) {
                snprintf(err, errlen, "could not start the HTTP server on %s", path);
                r = -EIO;
                goto fail;
        }
        *ret = a;
        return 0;
fail:
        if (a->fd >= 0) {
                close(a->fd);
                unlink(path);
        }
        pthread_mutex_destroy(&a->lock);
        free(a);
        return r;
}

int vmm_api_stop(struct vmm_api *a, int64_t deadline_mono_ns)
{
        if (!a)
                return 0;
        /* No new connections: the listening socket comes back to us (quiesced,
         * MHD will not close it again) and goes, with its file. */
        MHD_socket fd = MHD_quiesce_daemon(a->mhd);
        if (fd != MHD_INVALID_SOCKET)
                close(fd);
        a->fd = -1;
        unlink(a->path);
        while (atomic_load(&a->active) > 0 && time_mono_ns() < deadline_mono_ns)
                time_sleep_ns(10 * NS_PER_MS);
        int left = atomic_load(&a->active);
        if (left > 0)
                return -ETIMEDOUT; /* a request is stuck in a call that does not return: leave it to the exit */
        MHD_stop_daemon(a->mhd);
        pthread_mutex_destroy(&a->lock);
        free(a->clients);
        free(a);
        return 0;
}

int vmm_api_active(struct vmm_api *a)
{
        return a ? atomic_load(&a->active) : 0;
}
