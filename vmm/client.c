/* client.c — see client.h. libcurl over the daemon's unix socket; one easy
 * handle a call (a call is a command, a create, a list: a handle's set-up is
 * nothing beside it). */
#include "client.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct vmm_client {
        char *socket_path;
        struct vmm_client_options opt;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

/* libcurl's global set-up is not thread-safe: done once, before the first
 * client exists (clients are made at start, calls may come from any thread). */
static void curl_setup(void)
{
        curl_global_init(CURL_GLOBAL_DEFAULT);
}

int vmm_client_new(const char *socket_path, const struct vmm_client_options *opt, struct vmm_client **ret)
{
        if (!socket_path || !*socket_path)
                return -EINVAL;
        pthread_once(&curl_once, curl_setup);
        struct vmm_client *c = calloc(1, sizeof(*c));
        if (!c || !(c->socket_path = strdup(socket_path))) {
                free(c);
                return -ENOMEM;
        }
        if (opt)
                c->opt = *opt;
        *ret = c;
        return 0;
}

void vmm_client_free(struct vmm_client *c)
{
        if (!c)
                return;
        free(c->socket_path);
        free(c);
}

const char *vmm_client_address(const struct vmm_client *c)
{
        return c->socket_path;
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
        char url[512];
        if (!curl || !headers || (body && !text)) {
                snprintf(why, whylen, "out of memory");
                goto out;
        }
        snprintf(url, sizeof(url), "http://localhost%s", path);
        curl_easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH, c->socket_path);
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
