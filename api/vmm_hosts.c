/* vmm_hosts.c — see vmm_hosts.h. */
#include "vmm_hosts.h"

#include "client.h"
#include "log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HOSTS 64

/* A host that does not accept within this is down; an answer may take as long
 * as the command it runs (the vmm bounds exec's timeout). */
#define VMM_CONNECT_TIMEOUT_MS 5000

struct vmm_hosts {
        struct vmm_client *host[MAX_HOSTS];
        int n;
        atomic_uint next;
};

int vmm_hosts_new(const char *sockets, struct vmm_hosts **ret, char *err, size_t errlen)
{
        static const struct vmm_client_options opt = { .connect_timeout_ms = VMM_CONNECT_TIMEOUT_MS };
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
                if ((r = vmm_client_new(t, &opt, &h->host[h->n])) < 0) {
                        snprintf(err, errlen, "could not make a client of tally-vmm at %s: %s", t, strerror(-r));
                        goto fail;
                }
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
