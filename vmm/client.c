/* client.c — see client.h. libcurl over the daemon's unix socket, or over TCP
 * with mutual TLS; one easy handle a call (a call is a command, a create, a
 * list: a handle's set-up is nothing beside it).
 *
 * Over TLS it must trust nothing but the CA it is given, for nothing but the
 * daemon's name: the URL names the daemon (https://NAME:PORT) and
 * CURLOPT_CONNECT_TO sends the connection to its address, so libcurl's own
 * name check applies; no system CA store, no proxy from the environment. */
#include "client.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct vmm_client {
        char *address;                   /* as given */
        char *socket_path;               /* a unix socket, or NULL */
        char *base_url;                  /* "http://localhost", or "https://NAME:PORT" */
        struct curl_slist *connect_to;   /* TLS: "NAME:PORT:ADDRESS:PORT" */
        char *tls_cert, *tls_key, *tls_ca;
        struct vmm_client_options opt;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

/* libcurl's global set-up is not thread-safe: done once, before the first
 * client exists (clients are made at start, calls may come from any thread). */
static void curl_setup(void)
{
        curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* https://ADDRESS:PORT (ADDRESS a name, an IPv4 address or [IPv6]) into
 * c's URL and connect-to entry, for the certificate name `name` (NULL or
 * empty: ADDRESS). Returns 0, -EINVAL or -ENOMEM. */
static int tls_address(struct vmm_client *c, const char *address, const char *name)
{
        const char *hostport = address + strlen("https://"), *colon = strrchr(hostport, ':');
        if (!colon || colon == hostport || strchr(colon, '/') || strchr(hostport, '/') || strchr(hostport, '@'))
                return -EINVAL;
        char *end;
        long port = strtol(colon + 1, &end, 10);
        if (*end || port < 1 || port > 65535 || end == colon + 1)
                return -EINVAL;
        if (hostport[0] == '[' && colon[-1] != ']')
                return -EINVAL;
        int hl = (int)(colon - hostport);
        if (name && !*name)
                name = NULL;
        char *entry = NULL;
        if (name ? (asprintf(&c->base_url, "https://%s:%ld", name, port) < 0 ||
                    asprintf(&entry, "%s:%ld:%.*s:%ld", name, port, hl, hostport, port) < 0)
                 : asprintf(&c->base_url, "https://%.*s:%ld", hl, hostport, port) < 0) {
                free(entry);
                return -ENOMEM;
        }
        if (entry) {
                c->connect_to = curl_slist_append(NULL, entry);
                free(entry);
                if (!c->connect_to)
                        return -ENOMEM;
        }
        return 0;
}

int vmm_client_new(const char *address, const struct vmm_client_options *opt, struct vmm_client **ret)
{
        if (!address || !*address)
                return -EINVAL;
        pthread_once(&curl_once, curl_setup);
        struct vmm_client *c = calloc(1, sizeof(*c));
        int r = -ENOMEM;
        if (!c)
                return -ENOMEM;
        if (opt)
                c->opt = *opt;
        c->opt.tls_cert = c->opt.tls_key = c->opt.tls_ca = c->opt.tls_name = NULL; /* not kept: copied below */
        if (!(c->address = strdup(address)))
                goto fail;
        if (strncmp(address, "https://", 8) == 0) {
                if (!opt || !opt->tls_cert || !*opt->tls_cert || !opt->tls_key || !*opt->tls_key || !opt->tls_ca ||
                    !*opt->tls_ca) {
                        r = -EINVAL;
                        goto fail;
                }
                if ((r = tls_address(c, address, opt->tls_name)) < 0)
                        goto fail;
                r = -ENOMEM;
                if (!(c->tls_cert = strdup(opt->tls_cert)) || !(c->tls_key = strdup(opt->tls_key)) ||
                    !(c->tls_ca = strdup(opt->tls_ca)))
                        goto fail;
        } else if (!(c->socket_path = strdup(address)) || !(c->base_url = strdup("http://localhost"))) {
                goto fail;
        }
        *ret = c;
        return 0;
fail:
        vmm_client_free(c);
        return r;
}

void vmm_client_free(struct vmm_client *c)
{
        if (!c)
                return;
        free(c->address);
        free(c->socket_path);
        free(c->base_url);
        curl_slist_free_all(c->connect_to);
        free(c->tls_cert);
        free(c->tls_key);
        free(c->tls_ca);
        free(c);
}

const char *vmm_client_address(const struct vmm_client *c)
{
        return c->address;
}

struct answer {
        char *data;
        size_t len;
};

static size_t on_data(char *p, size_t size, size_t n, void *ud)
{
        struct answer *b = ud;
        size_t add = size * n;
        char *d = realloc(b->data, b->len + add + 1);
        if (!d)
                return 0;
        memcpy(d + b->len, p, add);
        b->len += add;
        d[b->len] = '\0';
        b->data = d;
        return add;
}

long vmm_client_call(struct vmm_client *c, const char *method, const char *path, const json_t *body, json_t **ret,
                     char *why, size_t whylen)
{
        return vmm_client_call_within(c, c->opt.timeout_ms, method, path, body, ret, why, whylen);
}

long vmm_client_call_within(struct vmm_client *c, int64_t timeout_ms, const char *method, const char *path,
                            const json_t *body, json_t **ret, char *why, size_t whylen)
{
        CURL *curl = curl_easy_init();
        char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
        struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
        long status = -ENOMEM;
        struct answer b = { 0 };
        char url[1024];
        if (!curl || !headers || (body && !text)) {
                snprintf(why, whylen, "out of memory");
                goto out;
        }
        snprintf(url, sizeof(url), "%s%s", c->base_url, path);
        if (c->socket_path) {
                curl_easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH, c->socket_path);
                curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http");
        } else {
                curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "https");
                curl_easy_setopt(curl, CURLOPT_PROXY, ""); /* never through an *_proxy of the environment */
                if (c->connect_to)
                        curl_easy_setopt(curl, CURLOPT_CONNECT_TO, c->connect_to);
                curl_easy_setopt(curl, CURLOPT_SSLCERT, c->tls_cert);
                curl_easy_setopt(curl, CURLOPT_SSLKEY, c->tls_key);
                curl_easy_setopt(curl, CURLOPT_CAINFO, c->tls_ca);
                curl_easy_setopt(curl, CURLOPT_CAPATH, NULL); /* the CA given, not the system's too */
                curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
                curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
                curl_easy_setopt(curl, CURLOPT_SSLVERSION, (long)CURL_SSLVERSION_TLSv1_2);
        }
        curl_easy_setopt(curl, CURLOPT_URL, url);
        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L); /* callers' threads: no SIGALRM for timeouts */
        if (c->opt.connect_timeout_ms > 0)
                curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, (long)c->opt.connect_timeout_ms);
        if (timeout_ms > 0)
                curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
        if (text)
                curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text);
        CURLcode cr = curl_easy_perform(curl);
        if (cr != CURLE_OK) {
                /* Nothing sent: the daemon cannot have acted on the request. */
                long sent = 0;
                curl_easy_getinfo(curl, CURLINFO_REQUEST_SIZE, &sent);
                snprintf(why, whylen, "%s", curl_easy_strerror(cr));
                status = sent == 0 ? -ENOTCONN : cr == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -EIO;
                goto out;
        }
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
        /* an exec's output may hold NUL bytes (\u0000 in the answer) */
        *ret = b.data ? json_loadb(b.data, b.len, JSON_ALLOW_NUL, NULL) : NULL;
out:
        free(b.data);
        free(text);
        curl_slist_free_all(headers);
        curl_easy_cleanup(curl);
        return status;
}
