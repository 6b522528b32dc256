/* vmm_hosts.c — see vmm_hosts.h. */
#include "vmm_hosts.h"

#include "client.h"
#include "log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_HOSTS 64

/* A host that does not accept within this is down; an answer may take as long
 * as the command it runs (the vmm bounds exec's timeout). */
#define VMM_CONNECT_TIMEOUT_MS 5000

struct vmm_hosts {
        struct vmm_client *host[MAX_HOSTS];
        int n;
        atomic_uint next;
};

/* A host_id as tally-vmm's certificate names it: 1..63 of A-Z a-z 0-9 . _ - */
static bool host_id_valid(const char *s, size_t n)
{
        if (n == 0 || n > 63)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-", s[i]) || !s[i])
                        return false;
        return true;
}

/* One entry's client: a unix socket path, or HOST_ID=https://ADDRESS:PORT
 * over mutual TLS with tls's files. Returns 0, or -errno with err filled. */
static int host_new(const char *entry, const struct vmm_hosts_tls *tls, struct vmm_client **ret, char *err,
                    size_t errlen)
{
        struct vmm_client_options opt = { .connect_timeout_ms = VMM_CONNECT_TIMEOUT_MS };
        const char *url = strstr(entry, "https://");
        int r;
        if (!url) {
                if ((r = vmm_client_new(entry, &opt, ret)) < 0)
                        snprintf(err, errlen, "could not make a client of tally-vmm at %s: %s", entry, strerror(-r));
                return r;
        }
        const char *eq = url > entry ? url - 1 : NULL;
        if (!eq || *eq != '=' || !host_id_valid(entry, (size_t)(eq - entry))) {
                snprintf(err, errlen, "vmm_sockets entry %s is not HOST_ID=https://ADDRESS:PORT (HOST_ID: 1..63 of "
                                      "A-Z a-z 0-9 . _ -, the name in the host's certificate)", entry);
                return -EINVAL;
        }
        if (!tls || !tls->cert || !*tls->cert || !tls->key || !*tls->key || !tls->ca || !*tls->ca) {
                snprintf(err, errlen, "vmm_sockets entry %s is https: vmm_tls_cert, vmm_tls_key and vmm_tls_ca are "
                                      "required", entry);
                return -EINVAL;
        }
        const char *files[][2] = { { "vmm_tls_cert", tls->cert }, { "vmm_tls_key", tls->key }, { "vmm_tls_ca", tls->ca } };
        for (size_t i = 0; i < 3; i++)
                if (access(files[i][1], R_OK) < 0) {
                        r = -errno;
                        snprintf(err, errlen, "could not read %s %s: %s", files[i][0], files[i][1], strerror(errno));
                        return r;
                }
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)(eq - entry), entry);
        opt.tls_cert = tls->cert;
        opt.tls_key = tls->key;
        opt.tls_ca = tls->ca;
        opt.tls_name = name;
        if ((r = vmm_client_new(url, &opt, ret)) < 0)
                snprintf(err, errlen, "vmm_sockets entry %s: %s", entry,
                         r == -EINVAL ? "not HOST_ID=https://ADDRESS:PORT" : strerror(-r));
        return r;
}

int vmm_hosts_new(const char *sockets, const struct vmm_hosts_tls *tls, struct vmm_hosts **ret, char *err,
                  size_t errlen)
{
        struct vmm_hosts *h = calloc(1, sizeof(*h));
        char *copy = strdup(sockets ? sockets : ""), *save = NULL;
        int r = 0;
        if (!h || !copy) {
                r = -ENOMEM;
                snprintf(err, errlen, "out of memory");
                goto fail;
        }
        for (char *t = strtok_r(copy, ",", &save); t && h->n < MAX_HOSTS; t = strtok_r(NULL, ",", &save)) {
                if (!*t)
                        continue;
                if ((r = host_new(t, tls, &h->host[h->n], err, errlen)) < 0)
                        goto fail;
                h->n++;
        }
        if (h->n == 0) {
                r = -EINVAL;
                snprintf(err, errlen, "vmm_sockets names no tally-vmm socket");
                goto fail;
        }
        free(copy);
        *ret = h;
        return 0;
fail:
        free(copy);
        vmm_hosts_free(h);
        return r;
}

void vmm_hosts_free(struct vmm_hosts *h)
{
        if (!h)
                return;
        for (int i = 0; i < h->n; i++)
                vmm_client_free(h->host[i]);
        free(h);
}

int vmm_hosts_count(const struct vmm_hosts *h)
{
        return h->n;
}

int vmm_hosts_next(struct vmm_hosts *h)
{
        return (int)(atomic_fetch_add(&h->next, 1) % (unsigned)h->n);
}

long vmm_hosts_call(struct vmm_hosts *h, int i, const char *method, const char *path, json_t *body, json_t **ret)
{
        json_t *empty = !body && strcmp(method, "POST") == 0 ? json_object() : NULL;
        char why[256] = "";
        json_t *j = NULL;
        long status = vmm_client_call(h->host[i], method, path, body ? body : empty, &j, why, sizeof(why));
        json_decref(empty);
        if (status < 0)
                log_error("could not reach tally-vmm", "socket=%s error=\"%s\"", vmm_client_address(h->host[i]), why);
        *ret = j;
        return status;
}

int vmm_hosts_error(long status, const json_t *j, struct api_error *err)
{
        const char *why = json_string_value(json_object_get(j, "error"));
        if (!why)
                why = "tally-vmm refused";
        switch (status) {
        case 400: return api_fail(err, 400, "invalid_field", NULL, "%s", why);
        case 403: return api_fail(err, 402, "limit_reached", NULL, "%s", why);
        case 404: return api_fail(err, 404, "not_found", "id", "no such sandbox");
        case 409: return api_fail(err, 409, "conflict", NULL, "%s", why);
        case 422: return api_fail(err, 422, "unprocessable", NULL, "%s", why);
        case 503: return api_fail(err, 503, "unavailable", NULL, "%s", why);
        case 507: return api_fail(err, 507, "insufficient_capacity", NULL, "%s", why);
        default:
                if (status < 0)
                        return api_fail(err, 502, "vmm_unavailable", NULL, "the sandbox host does not answer");
                return api_fail(err, 502, "vmm_error", NULL, "the sandbox host answered %ld: %s", status, why);
        }
}
