/* api.c — see api.h. libmicrohttpd with a thread per connection: an exec may
 * block its connection for as long as the command runs, and must not hold up
 * anyone else's request. */
#include "api.h"
#include "log.h"

#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define BODY_MAX          (8 * 1024 * 1024)
#define EXEC_TIMEOUT_MAX_MS (24LL * 3600 * 1000)
#define OUTPUT_CAP_MAX    (64LL * 1024 * 1024)

struct vmm_api {
        struct MHD_Daemon *mhd;
        struct vmm *vmm;
        char path[108];
        int fd;
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
        enum MHD_Result r = MHD_queue_response(c, status, resp);
        MHD_destroy_response(resp);
        return r;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned int status, const char *why)
{
        return send_json(c, status, json_pack("{s:s}", "error", why));
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

/* Output as a JSON string when it is UTF-8, else base64 under name_base64. */
static void set_output(json_t *o, const char *name, const char *buf, size_t len)
{
        json_t *s = json_stringn(buf ? buf : "", len);
        if (s) {
                json_object_set_new(o, name, s);
                return;
        }
        char *b64 = malloc(4 * ((len + 2) / 3) + 1);
        if (!b64)
                return;
        EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)buf, (int)len);
        char key[64];
        snprintf(key, sizeof(key), "%s_base64", name);
        json_object_set_new(o, key, json_string(b64));
        json_object_set_new(o, name, json_null());
        free(b64);
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

static enum MHD_Result do_exec(struct vmm_api *a, struct MHD_Connection *c, const char *id, json_t *body)
{
        char why[512] = "";
        const struct vmm_settings *s = vmm_get_settings(a->vmm);
        char **argv = NULL;
        int64_t timeout_ms, cap;
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
            (r = get_opt_int(body, "output_cap", 0, OUTPUT_CAP_MAX, s->exec_output_cap_default, &cap, why,
                             sizeof(why))) < 0)
                goto out;
        if (in && !json_is_string(in)) {
                r = -EINVAL;
                snprintf(why, sizeof(why), "stdin must be a string");
                goto out;
        }
        struct exec_request req = { argv, in ? json_string_value(in) : NULL, in ? json_string_length(in) : 0,
                                    timeout_ms * 1000000, (size_t)cap, NULL };
        struct exec_result res = { 0 };
        if ((r = vmm_exec(a->vmm, id, &req, &res, why, sizeof(why))) < 0)
                goto out;
        json_t *o = json_pack("{s:i, s:b, s:b, s:b}", "exit_code", res.exit_code, "timed_out", res.timed_out,
                              "stdout_truncated", res.out_truncated, "stderr_truncated", res.err_truncated);
        set_output(o, "stdout", res.out, res.out_len);
        set_output(o, "stderr", res.err, res.err_len);
        exec_result_clear(&res);
        command_free(argv);
        return send_json(c, 200, o);
out:
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
        struct request *req = *con_cls;
        (void)cls;
        (void)c;
        (void)toe;
        if (req) {
                free(req->body);
                free(req);
                *con_cls = NULL;
        }
}

int vmm_api_start(struct vmm *v, const char *path, struct vmm_api **ret, char *err, size_t errlen)
{
        struct vmm_api *a = calloc(1, sizeof(*a));
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        int r;
        if (!a)
                return -ENOMEM;
        a->vmm = v;
        a->fd = -1;
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
        a->mhd = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                          MHD_USE_ERROR_LOG,
                                  0, NULL, NULL, handle, a, MHD_OPTION_LISTEN_SOCKET, a->fd,
                                  MHD_OPTION_NOTIFY_COMPLETED, completed, a, MHD_OPTION_CONNECTION_LIMIT,
                                  (unsigned int)512, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
                                  /* exec may run for a day; the peer is a local process */
                                  MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)(25 * 3600), MHD_OPTION_END);
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
        free(a);
        return r;
}

void vmm_api_stop(struct vmm_api *a)
{
        if (!a)
                return;
        MHD_stop_daemon(a->mhd);
        close(a->fd);
        unlink(a->path);
        free(a);
}
