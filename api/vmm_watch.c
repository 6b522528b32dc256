/* vmm_watch.c — what tally-api learns of its hosts, and when: each host's
 * watch thread (a probe of GET /v1/status every 2 s; the cancels of creates
 * that ended unanswered, sent once the host answers), and the host registry's
 * rows (vmm_hosts_set_states, from the janitor every 2 s). See vmm_hosts.h. */
#include "vmm_hosts_private.h"

#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The room a /v1/status answer gives, if it gives it. */
static struct room room_of(const json_t *status)
{
        static const char *const names[3] = { "vcpus", "memory_mib", "disk_mib" };
        const json_t *cap = json_object_get(status, "capacity"), *pr = json_object_get(status, "promised");
        struct room r = { .known = json_is_object(cap) && json_is_object(pr) };
        for (int k = 0; r.known && k < 3; k++) {
                const json_t *c = json_object_get(cap, names[k]), *p = json_object_get(pr, names[k]);
                r.known = json_is_integer(c) && json_is_integer(p);
                r.cap[k] = vmm_hosts_room_clamp(json_integer_value(c));
                r.promised[k] = vmm_hosts_room_clamp(json_integer_value(p));
        }
        return r;
}

static int64_t wall_ns(void)
{
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The index of the host named host_id by its vmm_sockets entry or its
 * registry row, -1 when none. */
static int known_as(struct vmm_hosts *h, const char *host_id)
{
        for (int i = 0; i < h->n; i++) {
                pthread_mutex_lock(&h->state[i].lock);
                bool match = strcmp(h->state[i].named, host_id) == 0 || strcmp(h->state[i].host_id, host_id) == 0;
                pthread_mutex_unlock(&h->state[i].lock);
                if (match && !atomic_load(&h->state[i].replaced))
                        return i;
        }
        return -1;
}

/* Whether a host before i is host_id already (two entries that reach one
 * host would list its sandboxes twice: the later one is taken as down).
 * Not inlined: gcc 12 at -O2 with ASan then reports a false overread of the
 * strcmp below, and -Werror stops the sanitizer build. */
__attribute__((noinline)) static bool reached_before(struct vmm_hosts *h, int i, const char *host_id)
{
        for (int k = 0; k < i; k++) {
                pthread_mutex_lock(&h->state[k].lock);
                bool match = strcmp(h->state[k].named, host_id) == 0 || strcmp(h->state[k].host_id, host_id) == 0;
                pthread_mutex_unlock(&h->state[k].lock);
                if (match && !atomic_load(&h->state[k].replaced))
                        return true;
        }
        return false;
}

/* Adds the registered host host_id at address (https://ADDRESS:PORT, its
 * certificate must name host_id) and starts its watch; only the janitor's
 * thread adds, and calls see it once h->n counts it. */
static void add_registered(struct vmm_hosts *h, const char *host_id, const char *address)
{
        static bool full_said;
        int i = h->n;
        if (i == MAX_HOSTS) {
                if (!full_said)
                        log_error("the host registry lists more hosts than tally-api can reach: the rest are left out",
                                  "max=%d host=%s", MAX_HOSTS, host_id);
                full_said = true;
                return;
        }
        char entry[600], err[300] = "";
        snprintf(entry, sizeof(entry), "%s=%s", host_id, address);
        const struct vmm_hosts_tls tls = { h->tls_cert, h->tls_key, h->tls_ca };
        struct host *s = &h->state[i];
        if (vmm_hosts_client_new(entry, &tls, &h->host[i], err, sizeof(err)) < 0) {
                if (!s->moved_said) /* (this slot's flag, until a host takes it) */
                        log_error("a registered host cannot be reached", "host=%s address=%s error=\"%s\"", host_id,
                                  address, err);
                s->moved_said = true;
                return;
        }
        s->moved_said = false;
        s->from_registry = true;
        snprintf(s->named, sizeof(s->named), "%s", host_id);
        snprintf(s->address, sizeof(s->address), "%s", address);
        atomic_store(&s->down, true); /* until its first probe answers */
        if (vmm_hosts_watch_one(h, i) < 0) {
                vmm_client_free(h->host[i]);
                h->host[i] = NULL;
                return;
        }
        atomic_store(&h->n, i + 1);
        log_info("host added from the registry", "host=%s address=%s index=%d", host_id, address, i);
}

void vmm_hosts_set_states(struct vmm_hosts *h, int n, const char *const *host_ids, const char *const *states,
                          const char *const *addresses)
{
        for (int k = 0; h->discover && k < n; k++) {
                const char *a = addresses[k];
                if (!a || strncmp(a, "https://", 8) != 0 || !vmm_hosts_id_valid(host_ids[k], strlen(host_ids[k])))
                        continue;
                int i = known_as(h, host_ids[k]);
                if (i < 0) {
                        add_registered(h, host_ids[k], a);
                } else if (h->state[i].from_registry && strcmp(h->state[i].address, a) != 0) {
                        if (atomic_load(&h->state[i].down)) {
                                /* moved, or a row that named a wrong address at first and
                                 * was forgotten and registered again */
                                log_warn("a registered host's address changed: it is reached at the new one", "host=%s "
                                         "address=%s new_address=%s", host_ids[k], h->state[i].address, a);
                                atomic_store(&h->state[i].replaced, true);
                                add_registered(h, host_ids[k], a);
                        } else if (!h->state[i].moved_said) {
                                log_warn("a registered host's address changed: it is reached at the old one while "
                                         "that answers", "host=%s address=%s new_address=%s", host_ids[k],
                                         h->state[i].address, a);
                                h->state[i].moved_said = true;
                        }
                }
        }
        for (int i = 0; i < h->n; i++) {
                struct host *s = &h->state[i];
                pthread_mutex_lock(&s->lock);
                const char *id = s->named[0] ? s->named : s->host_id;
                /* a host the registry added and then forgot takes no create */
                const char *state = s->from_registry ? "forgotten" : "";
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
                bool dup = st == 200 && id && reached_before(h, i, id);
                atomic_store(&s->duplicate, dup);
                if (dup) {
                        snprintf(why, sizeof(why), "host %s is reached through an earlier entry already", id);
                        st = -EEXIST;
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
                struct timespec until = vmm_hosts_deadline_in(PROBE_PERIOD_MS);
                pthread_mutex_lock(&h->stop_lock);
                if (!h->stopping)
                        pthread_cond_timedwait(&h->stop_cond, &h->stop_lock, &until);
        }
        pthread_mutex_unlock(&h->stop_lock);
        return NULL;
}

int vmm_hosts_watch_one(struct vmm_hosts *h, int i)
{
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
        return 0;
}

int vmm_hosts_watch(struct vmm_hosts *h)
{
        for (int i = 0; i < h->n; i++) {
                int r = vmm_hosts_watch_one(h, i);
                if (r < 0)
                        return r;
        }
        return 0;
}
