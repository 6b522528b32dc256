/* vmm_hosts.c — see vmm_hosts.h. */
#include "vmm_hosts.h"

#include "client.h"
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

#define MAX_HOSTS 64

/* A host that does not accept within this is down; every call has its own
 * total bound besides (vmm_hosts.h). */
#define VMM_CONNECT_TIMEOUT_MS 5000
/* The watch: GET /v1/status on each host this often, answered within this. */
#define PROBE_PERIOD_MS  2000
#define PROBE_TIMEOUT_MS 1500
/* A call waits this long for one of its host's slots, then is refused. */
#define SLOT_WAIT_MS 500
/* Placement scores this many ready hosts in turn (all of them when fewer). */
#define PLACE_SAMPLE 3
/* Cancels of creates that ended unanswered, kept per host until it answers. */
#define CANCELS_MAX 64

/* A host's room as its last probe said (MiB): what it may promise and what
 * it has; known once a probe carried them. */
struct room {
        int64_t cap[3], promised[3];
        bool known;
};

/* What tally-api knows of one host: its calls in flight (at most limit: a
 * hung host holds at most that many of the API's threads) and what the
 * watch saw last. */
struct host {
        pthread_mutex_t lock;
        pthread_cond_t freed;
        int in_flight;
        atomic_bool down;      /* the last probe or connect failed */
        atomic_llong last_ok;  /* wall ns of the last answered probe; 0: none yet */
        char host_id[128];     /* its /v1/status "host", "" until one answered; under lock */
        char named[64];        /* the HOST_ID of an https entry (its certificate's name), "" for a socket */
        struct room room;      /* under lock */
        /* the host registry's state of it (host_states; "" when the registry
         * has no row of it, as when hosts do not register), under lock */
        char registry[16];
        /* request ids of creates whose call ended with no answer: the watch
         * sends each a POST /v1/creates/cancel once the host answers */
        char cancels[CANCELS_MAX][65];
        int ncancels;          /* under lock */
        pthread_t watch;
        bool watching;
};

struct vmm_hosts {
        struct vmm_client *host[MAX_HOSTS];
        struct host state[MAX_HOSTS];
        int n;
        int limit; /* calls in flight per host */
        atomic_uint next;
        pthread_mutex_t stop_lock;
        pthread_cond_t stop_cond;
        bool stopping;
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
        free(h);
}

int vmm_hosts_count(const struct vmm_hosts *h)
{
        return h->n;
}

void vmm_hosts_set_limit(struct vmm_hosts *h, int calls_per_host)
{
        h->limit = calls_per_host > 0 ? calls_per_host : VMM_CALLS_PER_HOST_DEFAULT;
}

bool vmm_hosts_ready(struct vmm_hosts *h, int i)
{
        return !atomic_load(&h->state[i].down);
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

void vmm_hosts_set_states(struct vmm_hosts *h, int n, const char *const *host_ids, const char *const *states)
{
        for (int i = 0; i < h->n; i++) {
                struct host *s = &h->state[i];
                pthread_mutex_lock(&s->lock);
                const char *id = s->named[0] ? s->named : s->host_id, *state = "";
                for (int k = 0; k < n && *id; k++)
                        if (strcmp(host_ids[k], id) == 0)
                                state = states[k];
                if (strcmp(s->registry, state) != 0) {
                        log_info("host state in the registry", "host=%s state=%s was=%s", *id ? id : "(unknown)",
                                 *state ? state : "(none)", s->registry[0] ? s->registry : "(none)");
                        snprintf(s->registry, sizeof(s->registry), "%s", state);
                }
                pthread_mutex_unlock(&s->lock);
        }
}

/* Host i's fullness with want added, per mille of what it may promise (its
 * fullest resource), and whether want fits; unknown room: fits, scored last. */
/* Sizes as placement counts them: 0 to ROOM_MAX (a caller's body may say
 * any integer; the vmm refuses what no host has, but the score must not
 * overflow first). ROOM_MAX x 1000 x 2 fits int64_t. */
#define ROOM_MAX (INT64_C(1) << 40)
static int64_t room_clamp(int64_t v)
{
        return v < 0 ? 0 : v > ROOM_MAX ? ROOM_MAX : v;
}

static int64_t place_score(struct vmm_hosts *h, int i, const struct vmm_want *want, bool *fits)
{
        const int64_t w[3] = { room_clamp(want->vcpus), room_clamp(want->memory_mib), room_clamp(want->disk_mib) };
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
                h->state[i].room.promised[k] = room_clamp(h->state[i].room.promised[k] + room_clamp(w[k]));
        pthread_mutex_unlock(&h->state[i].lock);
}

/* The room a /v1/status answer gives, if it gives it. */
static struct room room_of(const json_t *status)
{
        static const char *const names[3] = { "vcpus", "memory_mib", "disk_mib" };
        const json_t *cap = json_object_get(status, "capacity"), *pr = json_object_get(status, "promised");
        struct room r = { .known = json_is_object(cap) && json_is_object(pr) };
        for (int k = 0; r.known && k < 3; k++) {
                const json_t *c = json_object_get(cap, names[k]), *p = json_object_get(pr, names[k]);
                r.known = json_is_integer(c) && json_is_integer(p);
                r.cap[k] = room_clamp(json_integer_value(c));
                r.promised[k] = room_clamp(json_integer_value(p));
        }
        return r;
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

static int64_t wall_ns(void)
{
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* CLOCK_REALTIME ms from now, for pthread_cond_timedwait. */
static struct timespec deadline_in(long ms)
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
        struct timespec until = deadline_in(SLOT_WAIT_MS);
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

void vmm_hosts_cancel_create(struct vmm_hosts *h, int i, const char *request_id)
{
        struct host *s = &h->state[i];
        pthread_mutex_lock(&s->lock);
        if (s->ncancels == CANCELS_MAX) {
                log_error("too many creates to cancel on one host: the oldest is dropped", "socket=%s request_id=%s",
                          vmm_client_address(h->host[i]), s->cancels[0]);
                memmove(s->cancels[0], s->cancels[1], sizeof(s->cancels[0]) * (CANCELS_MAX - 1));
                s->ncancels--;
        }
        snprintf(s->cancels[s->ncancels++], sizeof(s->cancels[0]), "%s", request_id);
        pthread_mutex_unlock(&s->lock);
        log_warn("a create ended with no answer: it is cancelled on its host", "socket=%s request_id=%s",
                 vmm_client_address(h->host[i]), request_id);
}

/* Sends host i's pending cancels (its probe just answered); each stays until
 * the host answers it. */
static void send_cancels(struct vmm_hosts *h, int i)
{
        struct host *s = &h->state[i];
        for (;;) {
                char rid[65];
                pthread_mutex_lock(&s->lock);
                bool any = s->ncancels > 0;
                if (any)
                        snprintf(rid, sizeof(rid), "%s", s->cancels[0]);
                pthread_mutex_unlock(&s->lock);
                if (!any)
                        return;
                char why[256] = "";
                json_t *j = NULL, *body = json_pack("{s:s}", "request_id", rid);
                long st = vmm_client_call_within(h->host[i], PROBE_TIMEOUT_MS, "POST", "/v1/creates/cancel", body, &j,
                                                 why, sizeof(why));
                json_decref(body);
                if (st == 200 || st == 400)
                        log_info("create cancelled on its host", "socket=%s request_id=%s status=%ld stopped=%s",
                                 vmm_client_address(h->host[i]), rid, st,
                                 json_is_string(json_object_get(j, "stopped"))
                                         ? json_string_value(json_object_get(j, "stopped"))
                                         : "none");
                json_decref(j);
                if (st != 200 && st != 400)
                        return; /* the next probe tries again */
                pthread_mutex_lock(&s->lock);
                for (int k = 0; k < s->ncancels; k++)
                        if (strcmp(s->cancels[k], rid) == 0) {
                                memmove(s->cancels[k], s->cancels[k + 1], sizeof(s->cancels[0]) * (s->ncancels - k - 1));
                                s->ncancels--;
                                break;
                        }
                pthread_mutex_unlock(&s->lock);
        }
}

struct watch_arg {
        struct vmm_hosts *h;
        int i;
};

/* One host's watch: a probe every PROBE_PERIOD_MS, outside the call slots
 * (it is one connection more than the calls, never fewer answers). */
static void *watch_main(void *arg)
{
        struct vmm_hosts *h = ((struct watch_arg *)arg)->h;
        int i = ((struct watch_arg *)arg)->i;
        free(arg);
        struct host *s = &h->state[i];
        pthread_mutex_lock(&h->stop_lock);
        while (!h->stopping) {
                pthread_mutex_unlock(&h->stop_lock);
                char why[256] = "";
                json_t *j = NULL;
                long st = vmm_client_call_within(h->host[i], PROBE_TIMEOUT_MS, "GET", "/v1/status", NULL, &j, why,
                                                 sizeof(why));
                const char *id = json_string_value(json_object_get(j, "host"));
                bool was_down = atomic_load(&s->down);
                if (st == 200 && s->named[0] && (!id || strcmp(id, s->named) != 0)) {
                        /* sandboxes are routed by host id: a host answers for
                         * the one its certificate names, never another's */
                        snprintf(why, sizeof(why), "it says it is host %s, its certificate names %s", id ? id : "(none)",
                                 s->named);
                        st = -EPERM;
                }
                if (st == 200) {
                        pthread_mutex_lock(&s->lock);
                        if (id)
                                snprintf(s->host_id, sizeof(s->host_id), "%s", id);
                        s->room = room_of(j);
                        pthread_mutex_unlock(&s->lock);
                        atomic_store(&s->last_ok, wall_ns());
                        atomic_store(&s->down, false);
                        if (was_down)
                                log_info("tally-vmm answers again", "socket=%s host=%s", vmm_client_address(h->host[i]),
                                         id ? id : "");
                        send_cancels(h, i);
                } else {
                        atomic_store(&s->down, true);
                        if (!was_down)
                                log_warn("tally-vmm down", "socket=%s status=%ld error=\"%s\"",
                                         vmm_client_address(h->host[i]), st, why);
                }
                json_decref(j);
                struct timespec until = deadline_in(PROBE_PERIOD_MS);
                pthread_mutex_lock(&h->stop_lock);
                if (!h->stopping)
                        pthread_cond_timedwait(&h->stop_cond, &h->stop_lock, &until);
        }
        pthread_mutex_unlock(&h->stop_lock);
        return NULL;
}

int vmm_hosts_watch(struct vmm_hosts *h)
{
        for (int i = 0; i < h->n; i++) {
                struct watch_arg *a = malloc(sizeof(*a));
                if (!a)
                        return -ENOMEM;
                a->h = h;
                a->i = i;
                int r = pthread_create(&h->state[i].watch, NULL, watch_main, a);
                if (r != 0) {
                        free(a);
                        return -r;
                }
                h->state[i].watching = true;
        }
        return 0;
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
                bool up = vmm_hosts_ready(h, i);
                all = all && up;
                json_array_append_new(list, json_pack("{s:i, s:o, s:b, s:o, s:i, s:o}", "index", i, "host", id,
                                                      "reachable", up, "last_ok", last, "calls_in_flight", in_flight,
                                                      "registry", reg));
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
