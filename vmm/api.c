/* api.c — see api.h. libmicrohttpd with a thread per connection: an exec may
 * block its connection for as long as the command runs, and must not hold up
 * anyone else's request.
 *
 * It must hold under abuse by any local process that can open the socket:
 * idle connections are closed after api_idle_timeout_s, one client (a root
 * process, or any other user id) holds at most api_connections_per_client of
 * the api_connections_max connections, and exec output is never held more than
 * once: the answer is escaped while it is sent, from the command's own buffers,
 * and those buffers count against one budget for the whole daemon.
 *
 * Over TCP (tls_listen) it must serve no one but tally-api: libmicrohttpd
 * with GnuTLS asks every client for its certificate, and before the first
 * byte of a request is acted on, handle() has GnuTLS verify it against the
 * client CA and the name tls_client_name; a connection without one, or with
 * any other, is closed unanswered. libmicrohttpd only *requests* a client
 * certificate and verifies nothing itself: that check is the whole guard. */
#include "api.h"
#include "api_create.h"
#include "api_exec.h"
#include "api_reply.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <netdb.h>
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
#define REQUEST_TIMEOUT_S 600           /* a request being answered (create waits on its backend) */

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
        struct exec_budget exec_budget;  /* exec output held at once (api_exec.h) */
        pthread_mutex_t lock;            /* guards clients */
        struct client *clients;
        size_t nclients;
        struct MHD_Daemon *tls_mhd;      /* the API over TCP with mutual TLS, or NULL */
        int tls_fd;                      /* as fd, for tls_mhd */
        int tls_port;
        char *tls_client_name;
        struct create_calls creates;     /* creates' request ids, and the cancelled ones (api_create.h) */
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

static enum MHD_Result route(struct vmm_api *a, struct MHD_Connection *c, const char *method, const char *url,
                             json_t *body)
{
        char why[512] = "";
        json_t *out = NULL;
        int r;
        bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
        if (strcmp(url, "/v1/status") == 0 && get)
                return vmm_reply_json(c, 200, vmm_status(a->vmm));
        if (strcmp(url, "/v1/sandboxes") == 0) {
                if (get) {
                        const char *account = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "account");
                        return vmm_reply_json(c, 200, json_pack("{s:o}", "sandboxes", vmm_list(a->vmm, account)));
                }
                if (!post)
                        return vmm_reply_error(c, 405, "use GET or POST on /v1/sandboxes");
                return vmm_api_create(c, a->vmm, &a->creates, body);
        }
        if (strcmp(url, "/v1/creates/cancel") == 0)
                return post ? vmm_api_create_cancel(c, a->vmm, &a->creates, body)
                            : vmm_reply_error(c, 405, "use POST on /v1/creates/cancel");
        if (strncmp(url, "/v1/sandboxes/", 14) != 0)
                return vmm_reply_error(c, 404, "no such route");
        char id[EVENT_ID_MAX + 1];
        const char *rest = url + 14, *slash = strchr(rest, '/');
        size_t idlen = slash ? (size_t)(slash - rest) : strlen(rest);
        if (idlen == 0 || idlen > EVENT_ID_MAX)
                return vmm_reply_error(c, 404, "no such sandbox");
        memcpy(id, rest, idlen);
        id[idlen] = '\0';
        const char *action = slash ? slash + 1 : "";
        if (!*action) {
                if (get) {
                        r = vmm_show(a->vmm, id, &out, why, sizeof(why));
                        return vmm_reply_result(c, r, why, out, 200);
                }
                if (strcmp(method, "DELETE") == 0) {
                        r = vmm_stop(a->vmm, id, "request", why, sizeof(why));
                        if (r == 0)
                                vmm_show(a->vmm, id, &out, why, sizeof(why));
                        return vmm_reply_result(c, r, why, out, 200);
                }
                return vmm_reply_error(c, 405, "use GET or DELETE on a sandbox");
        }
        if (!post)
                return vmm_reply_error(c, 405, "use POST for sandbox actions");
        if (strcmp(action, "exec") == 0)
                return vmm_api_exec(c, a->vmm, &a->exec_budget, id, body);
        if (strcmp(action, "pause") == 0)
                r = vmm_pause(a->vmm, id, "request", why, sizeof(why));
        else if (strcmp(action, "resume") == 0)
                r = vmm_resume(a->vmm, id, why, sizeof(why));
        else if (strcmp(action, "stop") == 0)
                r = vmm_stop(a->vmm, id, "request", why, sizeof(why));
        else if (strcmp(action, "fork") == 0) {
                int64_t count;
                if ((r = vmm_body_opt_int(body, "count", 1, 10, 1, &count, why, sizeof(why))) < 0)
                        return vmm_reply_result(c, r, why, NULL, 200);
                r = vmm_fork(a->vmm, id, (int)count, &out, why, sizeof(why));
                return vmm_reply_result(c, r, why, out, 201);
        } else if (strcmp(action, "timeout") == 0) {
                json_t *t = json_object_get(body, "timeout_s");
                if (!json_is_integer(t)) {
                        snprintf(why, sizeof(why), "timeout_s is required");
                        return vmm_reply_result(c, -EINVAL, why, NULL, 200);
                }
                r = vmm_set_timeout(a->vmm, id, json_integer_value(t), why, sizeof(why));
        } else {
                return vmm_reply_error(c, 404, "unknown action (exec, pause, resume, stop, fork, timeout)");
        }
        if (r == 0)
                r = vmm_show(a->vmm, id, &out, why, sizeof(why));
        return vmm_reply_result(c, r, why, out, 200);
}

/* Whether connection c may be served: any connection of the unix socket
 * (its file's mode is the guard there); one of the TLS listener only when its
 * client showed a certificate the client CA signed, valid now, for
 * tls_client_name (and for client use, when it names uses). Fails closed:
 * whatever cannot be read refuses. Each refusal is logged, at most once a
 * second. */
static bool tls_client_allowed(struct vmm_api *a, struct MHD_Connection *c)
{
        const union MHD_ConnectionInfo *d = MHD_get_connection_info(c, MHD_CONNECTION_INFO_DAEMON);
        if (d && d->daemon == a->mhd)
                return true;
        const union MHD_ConnectionInfo *ti = MHD_get_connection_info(c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
        char reason[256] = "no TLS session";
        bool ok = false;
        if (d && d->daemon == a->tls_mhd && ti && ti->tls_session) {
                gnutls_session_t s = (gnutls_session_t)ti->tls_session;
                gnutls_typed_vdata_st want[] = {
                        { .type = GNUTLS_DT_DNS_HOSTNAME, .data = (unsigned char *)a->tls_client_name },
                        { .type = GNUTLS_DT_KEY_PURPOSE_OID, .data = (unsigned char *)GNUTLS_KP_TLS_WWW_CLIENT },
                };
                unsigned int status = 0;
                int r;
                if (gnutls_certificate_type_get(s) != GNUTLS_CRT_X509 || !gnutls_certificate_get_peers(s, NULL)) {
                        snprintf(reason, sizeof(reason), "no client certificate");
                } else if ((r = gnutls_certificate_verify_peers(s, want, 2, &status)) < 0) {
                        snprintf(reason, sizeof(reason), "%s", gnutls_strerror(r));
                } else if (status != 0) {
                        gnutls_datum_t out = { 0 };
                        if (gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &out, 0) == 0) {
                                snprintf(reason, sizeof(reason), "%s", (const char *)out.data);
                                gnutls_free(out.data);
                        } else {
                                snprintf(reason, sizeof(reason), "verification status %#x", status);
                        }
                } else {
                        ok = true;
                }
        }
        if (!ok) {
                static _Atomic int64_t last_log;
                int64_t now = time_mono_ns();
                char peer[INET6_ADDRSTRLEN] = "?";
                const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
                if (ci && ci->client_addr)
                        getnameinfo(ci->client_addr,
                                    ci->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                            : sizeof(struct sockaddr_in),
                                    peer, sizeof(peer), NULL, 0, NI_NUMERICHOST);
                if (now - atomic_load(&last_log) >= NS_PER_SEC) {
                        atomic_store(&last_log, now);
                        log_warn("refusing a TLS client", "peer=%s want=%s reason=\"%s\"", peer, a->tls_client_name,
                                 reason);
                }
        }
        return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *data, size_t *size, void **con_cls)
{
        struct vmm_api *a = cls;
        struct request *req = *con_cls;
        (void)version;
        if (!req) {
                if (a->tls_mhd && !tls_client_allowed(a, c))
                        return MHD_NO; /* closed unanswered */
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
                return vmm_reply_error(c, 413, "request body larger than 8 MiB");
        /* The whole request is in: it is answered now, however long that takes
         * (exec sets its own, longer, timeout). */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)REQUEST_TIMEOUT_S);
        json_t *body = NULL;
        if (req->len) {
                json_error_t jerr;
                if (!(body = json_loadb(req->body, req->len, JSON_REJECT_DUPLICATES, &jerr))) {
                        char why[300];
                        snprintf(why, sizeof(why), "the body is not JSON: %s at line %d", jerr.text, jerr.line);
                        return vmm_reply_error(c, 400, why);
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

/* Checks what the TLS listener is given before it starts, so that a bad file
 * is refused with its reason (libmicrohttpd would only fail). */
static int tls_check(const struct vmm_api_settings *set, char *err, size_t errlen)
{
        gnutls_certificate_credentials_t cred;
        int r;
        if (!set->tls_cert_pem || !set->tls_key_pem || !set->tls_client_ca_pem || !set->tls_client_name ||
            !*set->tls_client_name) {
                snprintf(err, errlen, "tls_listen needs tls_cert, tls_key, tls_client_ca and tls_client_name");
                return -EINVAL;
        }
        if (gnutls_certificate_allocate_credentials(&cred) < 0) {
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        gnutls_datum_t cert = { (unsigned char *)set->tls_cert_pem, (unsigned int)strlen(set->tls_cert_pem) };
        gnutls_datum_t key = { (unsigned char *)set->tls_key_pem, (unsigned int)strlen(set->tls_key_pem) };
        gnutls_datum_t ca = { (unsigned char *)set->tls_client_ca_pem, (unsigned int)strlen(set->tls_client_ca_pem) };
        if ((r = gnutls_certificate_set_x509_key_mem(cred, &cert, &key, GNUTLS_X509_FMT_PEM)) < 0) {
                snprintf(err, errlen, "tls_cert and tls_key are not a PEM certificate and its key: %s",
                         gnutls_strerror(r));
                r = -EINVAL;
        } else if ((r = gnutls_certificate_set_x509_trust_mem(cred, &ca, GNUTLS_X509_FMT_PEM)) <= 0) {
                snprintf(err, errlen, "tls_client_ca holds no PEM certificate%s%s", r < 0 ? ": " : "",
                         r < 0 ? gnutls_strerror(r) : "");
                r = -EINVAL;
        } else {
                r = 0;
        }
        gnutls_certificate_free_credentials(cred);
        return r;
}

/* A listening TCP socket on "ADDRESS:PORT" or "[IPV6]:PORT" (ADDRESS may be a
 * name). Returns the socket, or -errno with err. */
static int tcp_listen(const char *where, int *ret_port, char *err, size_t errlen)
{
        char host[256];
        const char *port = strrchr(where, ':');
        size_t hl = port ? (size_t)(port - where) : 0;
        if (hl > 1 && where[0] == '[' && where[hl - 1] == ']') {
                where++;
                hl -= 2;
        }
        if (!port || hl == 0 || hl >= sizeof(host) || !port[1]) {
                snprintf(err, errlen, "tls_listen %s is not ADDRESS:PORT", where);
                return -EINVAL;
        }
        memcpy(host, where, hl);
        host[hl] = '\0';
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE },
                        *res = NULL;
        int g = getaddrinfo(host, port + 1, &hints, &res);
        if (g != 0) {
                snprintf(err, errlen, "tls_listen %s: %s", where, gai_strerror(g));
                return -EINVAL;
        }
        int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, r = 0;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
            bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 128) < 0 ||
            getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
                r = -errno;
                snprintf(err, errlen, "could not listen on %s: %s", where, strerror(errno));
                if (fd >= 0)
                        close(fd);
        }
        freeaddrinfo(res);
        if (r < 0)
                return r;
        *ret_port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                    : ((struct sockaddr_in *)&ss)->sin_port);
        return fd;
}

/* The TLS listener: the same handler, budget and counts as the socket; a
 * client there is a peer address (MHD's per-IP limit), a connection's
 * handshake has the idle timeout. */
static int tls_start(struct vmm_api *a, const struct vmm_api_settings *set, char *err, size_t errlen)
{
        int r;
        if ((r = tls_check(set, err, errlen)) < 0)
                return r;
        if (!(a->tls_client_name = strdup(set->tls_client_name)))
                return -ENOMEM;
        if ((a->tls_fd = tcp_listen(set->tls_listen, &a->tls_port, err, errlen)) < 0)
                return a->tls_fd;
        a->tls_mhd = MHD_start_daemon(
                MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG |
                        MHD_USE_TLS,
                0, NULL, NULL, handle, a, MHD_OPTION_LISTEN_SOCKET, a->tls_fd, MHD_OPTION_NOTIFY_COMPLETED, completed,
                a, MHD_OPTION_CONNECTION_LIMIT, set->connections_max, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                set->connections_per_client, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024),
                MHD_OPTION_CONNECTION_TIMEOUT, set->idle_timeout_s, MHD_OPTION_HTTPS_MEM_CERT, set->tls_cert_pem,
                MHD_OPTION_HTTPS_MEM_KEY, set->tls_key_pem, MHD_OPTION_HTTPS_MEM_TRUST, set->tls_client_ca_pem,
                MHD_OPTION_HTTPS_PRIORITIES, "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2", MHD_OPTION_END);
        if (!a->tls_mhd) {
                snprintf(err, errlen, "could not start the TLS listener on %s (is libmicrohttpd built with TLS?)",
                         set->tls_listen);
                close(a->tls_fd);
                a->tls_fd = -1;
                return -EIO;
        }
        return 0;
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
        atomic_init(&a->exec_budget.held, 0);
        a->exec_budget.max = set->output_held_max;
        a->fd = -1;
        a->tls_fd = -1;
        pthread_mutex_init(&a->lock, NULL);
        create_calls_init(&a->creates);
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
        if (set->tls_listen && *set->tls_listen && (r = tls_start(a, set, err, errlen)) < 0) {
                MHD_stop_daemon(a->mhd); /* closes a->fd */
                a->fd = -1;
                unlink(path);
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
        create_calls_destroy(&a->creates);
        free(a->tls_client_name);
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
        if (a->tls_mhd && (fd = MHD_quiesce_daemon(a->tls_mhd)) != MHD_INVALID_SOCKET)
                close(fd);
        a->tls_fd = -1;
        while (atomic_load(&a->active) > 0 && time_mono_ns() < deadline_mono_ns)
                time_sleep_ns(10 * NS_PER_MS);
        int left = atomic_load(&a->active);
        if (left > 0)
                return -ETIMEDOUT; /* a request is stuck in a call that does not return: leave it to the exit */
        MHD_stop_daemon(a->mhd);
        if (a->tls_mhd)
                MHD_stop_daemon(a->tls_mhd);
        pthread_mutex_destroy(&a->lock);
        create_calls_destroy(&a->creates);
        free(a->clients);
        free(a->tls_client_name);
        free(a);
        return 0;
}

int vmm_api_tls_port(const struct vmm_api *a)
{
        return a && a->tls_mhd ? a->tls_port : 0;
}

int vmm_api_active(struct vmm_api *a)
{
        return a ? atomic_load(&a->active) : 0;
}
