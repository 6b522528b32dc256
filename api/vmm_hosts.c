/* vmm_hosts.c — see vmm_hosts.h: the list of hosts, calls within their
 * bounds and slots, placement, and what /healthz says (the watch and the
 * registry: vmm_watch.c). */
#include "vmm_hosts_private.h"

#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

bool vmm_hosts_id_valid(const char *s, size_t n)
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
int vmm_hosts_client_new(const char *entry, const struct vmm_hosts_tls *tls, struct vmm_client **ret, char *err,
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
        if (!eq || *eq != '=' || !vmm_hosts_id_valid(entry, (size_t)(eq - entry))) {
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
                if ((r = vmm_hosts_client_new(t, tls, &h->host[h->n], err, errlen)) < 0)
                        goto fail;
                const char *eq = strchr(t, '=');
                if (eq && (size_t)(eq - t) < sizeof(h->state[h->n].named))
                        memcpy(h->state[h->n].named, t, (size_t)(eq - t));
                h->n++;
        }
        h->limit = VMM_CALLS_PER_HOST_DEFAULT;
        pthread_mutex_init(&h->stop_lock, NULL);
        pthread_cond_init(&h->stop_cond, NULL);
        for (int i = 0; i < MAX_HOSTS; i++) {
                pthread_mutex_init(&h->state[i].lock, NULL);
                pthread_cond_init(&h->state[i].freed, NULL);
        }
        if (tls && ((tls->cert && !(h->tls_cert = strdup(tls->cert))) || (tls->key && !(h->tls_key = strdup(tls->key))) ||
                    (tls->ca && !(h->tls_ca = strdup(tls->ca))))) {
                r = -ENOMEM;
                snprintf(err, errlen, "out of memory");
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
        if (h->limit) { /* made whole: its locks exist */
                pthread_mutex_lock(&h->stop_lock);
                h->stopping = true;
                pthread_cond_broadcast(&h->stop_cond);
                pthread_mutex_unlock(&h->stop_lock);
                for (int i = 0; i < h->n; i++)
                        if (h->state[i].watching)
                                pthread_join(h->state[i].watch, NULL);
        }
        for (int i = 0; i < h->n; i++)
                vmm_client_free(h->host[i]);
        free(h->tls_cert);
        free(h->tls_key);
        free(h->tls_ca);
        free(h);
}

int vmm_hosts_count(const struct vmm_hosts *h)
{
        return h->n;
}

void vmm_hosts_discover(struct vmm_hosts *h, bool on)
{
        h->discover = on;
}

void vmm_hosts_set_limit(struct vmm_hosts *h, int calls_per_host)
{
        h->limit = calls_per_host > 0 ? calls_per_host : VMM_CALLS_PER_HOST_DEFAULT;
}

bool vmm_hosts_ready(struct vmm_hosts *h, int i)
{
        return !atomic_load(&h->state[i].down) && !vmm_hosts_retired(h, i);
}

bool vmm_hosts_retired(struct vmm_hosts *h, int i)
{
        struct host *s = &h->state[i];
        if (atomic_load(&s->duplicate) || atomic_load(&s->replaced))
                return true;
        pthread_mutex_lock(&s->lock);
        bool forgotten = s->from_registry && strcmp(s->registry, "forgotten") == 0;
        pthread_mutex_unlock(&s->lock);
        return forgotten;
}

/* Whether the host registry lets host i take a create: it is `ready` there,
 * or has no row (a draining host, or one whose heartbeat stopped, does not). */
static bool registry_ready(struct vmm_hosts *h, int i)
{
        pthread_mutex_lock(&h->state[i].lock);
        bool ok = !h->state[i].registry[0] || strcmp(h->state[i].registry, "ready") == 0;
        pthread_mutex_unlock(&h->state[i].lock);
        return ok;
}


/* Host i's fullness with want added, per mille of what it may promise (its
 * fullest resource), and whether want fits; unknown room: fits, scored last. */
/* Sizes as placement counts them: 0 to ROOM_MAX (a caller's body may say
 * any integer; the vmm refuses what no host has, but the score must not
 * overflow first). ROOM_MAX x 1000 x 2 fits int64_t. */
#define ROOM_MAX (INT64_C(1) << 40)
int64_t vmm_hosts_room_clamp(int64_t v)
{
        return v < 0 ? 0 : v > ROOM_MAX ? ROOM_MAX : v;
}

static int64_t place_score(struct vmm_hosts *h, int i, const struct vmm_want *want, bool *fits)
{
        const int64_t w[3] = { vmm_hosts_room_clamp(want->vcpus), vmm_hosts_room_clamp(want->memory_mib), vmm_hosts_room_clamp(want->disk_mib) };
        pthread_mutex_lock(&h->state[i].lock);
        struct room r = h->state[i].room;
        pthread_mutex_unlock(&h->state[i].lock);
        *fits = true;
        if (!r.known)
                return 1000;
        int64_t worst = 0;
        for (int k = 0; k < 3; k++) {
                int64_t after = r.promised[k] + w[k];
                if (after > r.cap[k])
                        *fits = false;
                int64_t pm = r.cap[k] > 0 ? after * 1000 / r.cap[k] : (after > 0 ? INT64_MAX / 2 : 0);
                worst = pm > worst ? pm : worst;
        }
        return worst;
}

int vmm_hosts_next(struct vmm_hosts *h, int skip, const struct vmm_want *want)
{
        unsigned start = atomic_fetch_add(&h->next, 1);
        int best = -1, least = -1;
        int64_t best_score = 0, least_score = 0;
        for (int k = 0; k < h->n; k++) {
                int i = (int)((start + (unsigned)k) % (unsigned)h->n);
                if (k == PLACE_SAMPLE && best >= 0)
                        break; /* the sample had room: the rest are not scored */
                if (i == skip || !vmm_hosts_ready(h, i) || !registry_ready(h, i))
                        continue;
                bool fits;
                int64_t s = place_score(h, i, want, &fits);
                if (fits && (best < 0 || s < best_score)) {
                        best = i;
                        best_score = s;
                }
                if (least < 0 || s < least_score) {
                        least = i;
                        least_score = s;
                }
        }
        return best >= 0 ? best : least;
}

void vmm_hosts_promise(struct vmm_hosts *h, int i, const struct vmm_want *want)
{
        pthread_mutex_lock(&h->state[i].lock);
        const int64_t w[3] = { want->vcpus, want->memory_mib, want->disk_mib };
        for (int k = 0; k < 3; k++)
                h->state[i].room.promised[k] = vmm_hosts_room_clamp(h->state[i].room.promised[k] + vmm_hosts_room_clamp(w[k]));
        pthread_mutex_unlock(&h->state[i].lock);
}


int vmm_hosts_find(struct vmm_hosts *h, const char *host_id)
{
        if (!host_id || !*host_id)
                return -1;
        for (int i = 0; i < h->n; i++) {
                pthread_mutex_lock(&h->state[i].lock);
                bool match = strcmp(h->state[i].host_id, host_id) == 0;
                pthread_mutex_unlock(&h->state[i].lock);
                if (match)
                        return i;
        }
        return -1;
}



struct timespec vmm_hosts_deadline_in(long ms)
{
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += ms % 1000 * 1000000;
        t.tv_sec += ms / 1000 + t.tv_nsec / 1000000000;
        t.tv_nsec %= 1000000000;
        return t;
}

/* Takes one of host i's slots, waiting at most SLOT_WAIT_MS. */
static bool slot_take(struct vmm_hosts *h, int i)
{
        struct host *s = &h->state[i];
        struct timespec until = vmm_hosts_deadline_in(SLOT_WAIT_MS);
        pthread_mutex_lock(&s->lock);
        int r = 0;
        while (s->in_flight >= h->limit && r != ETIMEDOUT)
                r = pthread_cond_timedwait(&s->freed, &s->lock, &until);
        bool ok = s->in_flight < h->limit;
        if (ok)
                s->in_flight++;
        pthread_mutex_unlock(&s->lock);
        return ok;
}

static void slot_give(struct vmm_hosts *h, int i)
{
        struct host *s = &h->state[i];
        pthread_mutex_lock(&s->lock);
        s->in_flight--;
        pthread_cond_signal(&s->freed);
        pthread_mutex_unlock(&s->lock);
}

long vmm_hosts_call(struct vmm_hosts *h, int i, const char *method, const char *path, json_t *body, int64_t timeout_ms,
                    json_t **ret)
{
        if (!slot_take(h, i)) {
                log_warn("tally-vmm busy: call refused", "socket=%s in_flight=%d", vmm_client_address(h->host[i]),
                         h->limit);
                *ret = NULL;
                return -EBUSY;
        }
        json_t *empty = !body && strcmp(method, "POST") == 0 ? json_object() : NULL;
        char why[256] = "";
        json_t *j = NULL;
        long status = vmm_client_call_within(h->host[i], timeout_ms, method, path, body ? body : empty, &j, why,
                                             sizeof(why));
        slot_give(h, i);
        json_decref(empty);
        if (status == -ENOTCONN)
                atomic_store(&h->state[i].down, true); /* the watch says when it is back */
        if (status < 0)
                log_error("could not reach tally-vmm", "socket=%s error=\"%s\"", vmm_client_address(h->host[i]), why);
        *ret = j;
        return status;
}


json_t *vmm_hosts_health(struct vmm_hosts *h, bool *ret_all_up)
{
        json_t *list = json_array();
        bool all = true;
        for (int i = 0; i < h->n; i++) {
                struct host *s = &h->state[i];
                pthread_mutex_lock(&s->lock);
                json_t *id = s->host_id[0] ? json_string(s->host_id) : json_null();
                int in_flight = s->in_flight;
                json_t *reg = s->registry[0] ? json_string(s->registry) : json_null();
                pthread_mutex_unlock(&s->lock);
                int64_t ok = atomic_load(&s->last_ok);
                json_t *last = json_null();
                if (ok) {
                        char buf[32];
                        time_t t = (time_t)(ok / 1000000000);
                        struct tm tm;
                        gmtime_r(&t, &tm);
                        strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
                        json_decref(last);
                        last = json_string(buf);
                }
                bool up = vmm_hosts_ready(h, i), retired = vmm_hosts_retired(h, i);
                all = all && (up || retired);
                json_array_append_new(list, json_pack("{s:i, s:o, s:b, s:o, s:i, s:o, s:b}", "index", i, "host", id,
                                                      "reachable", up, "last_ok", last, "calls_in_flight", in_flight,
                                                      "registry", reg, "retired", retired));
        }
        *ret_all_up = all;
        return list;
}

json_t *vmm_hosts_describe(struct vmm_hosts *h, int i)
{
        pthread_mutex_lock(&h->state[i].lock);
        json_t *id = h->state[i].host_id[0] ? json_string(h->state[i].host_id) : json_null();
        pthread_mutex_unlock(&h->state[i].lock);
        return json_pack("{s:i, s:o}", "index", i, "host", id);
}

int vmm_hosts_error(long status, const json_t *j, struct api_error *err)
{
        const char *why = json_string_value(json_object_get(j, "error"));
        if (!why)
                why = "tally-vmm refused";
        switch (status) {
        case -EBUSY:
                return api_fail(err, 503, "host_busy", NULL,
                                "the sandbox host has as many calls in flight as tally-api allows it; retry shortly");
        case -ETIMEDOUT:
                return api_fail(err, 504, "vmm_timeout", NULL, "the sandbox host did not answer in time");
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
