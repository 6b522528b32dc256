/* event.c — see event.h. Samples encode with one snprintf (ids are validated,
 * so nothing needs escaping); labels go through jansson, which escapes them. */
#include "event.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[EVENT_TYPE_COUNT] = {
        "sample", "created", "paused", "resumed", "forked", "stopped", "restarted",
};
static const char *const state_names[STATE_COUNT] = { "running", "paused", "stopped" };

/* Wall clock bounds a reading must fall in: 2020-01-01 .. 2200-01-01 UTC. */
#define WALL_MIN_NS INT64_C(1577836800000000000)
#define WALL_MAX_NS INT64_C(7258118400000000000)

const char *event_type_name(enum event_type t)
{
        return (unsigned)t < EVENT_TYPE_COUNT ? type_names[t] : "?";
}

const char *sandbox_state_name(enum sandbox_state s)
{
        return (unsigned)s < STATE_COUNT ? state_names[s] : "?";
}

static int parse_name(const char *const *names, int n, const char *s, int *ret)
{
        for (int i = 0; i < n; i++)
                if (strcmp(names[i], s) == 0) {
                        *ret = i;
                        return 0;
                }
        return -EINVAL;
}

int event_type_parse(const char *s, enum event_type *ret)
{
        int v, r = parse_name(type_names, EVENT_TYPE_COUNT, s, &v);
        if (r == 0)
                *ret = (enum event_type)v;
        return r;
}

int sandbox_state_parse(const char *s, enum sandbox_state *ret)
{
        int v, r = parse_name(state_names, STATE_COUNT, s, &v);
        if (r == 0)
                *ret = (enum sandbox_state)v;
        return r;
}

bool event_id_valid(const char *s)
{
        size_t n = 0;
        for (; s[n]; n++) {
                char c = s[n];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '-' || c == '.' || c == ':'))
                        return false;
        }
        return n >= 1 && n <= EVENT_ID_MAX;
}

int event_add_label(struct usage_event *ev, const char *key, const char *value)
{
        if (ev->nlabels >= EVENT_LABELS_MAX || strlen(key) > EVENT_LABEL_KEY_MAX ||
            strlen(value) > EVENT_LABEL_VALUE_MAX)
                return -E2BIG;
        if (!*key)
                return -EINVAL;
        struct event_label *l = realloc(ev->labels, (ev->nlabels + 1) * sizeof(*l));
        if (!l)
                return -ENOMEM;
        ev->labels = l;
        snprintf(l[ev->nlabels].key, sizeof(l->key), "%s", key);
        snprintf(l[ev->nlabels].value, sizeof(l->value), "%s", value);
        ev->nlabels++;
        return 0;
}

void event_clear(struct usage_event *ev)
{
        if (!ev)
                return;
        free(ev->labels);
        memset(ev, 0, sizeof(*ev));
}

static bool ids_valid(const struct usage_event *ev)
{
        return event_id_valid(ev->sandbox) && event_id_valid(ev->account) &&
               (ev->key[0] == '\0' || event_id_valid(ev->key)) &&
               (ev->host[0] == '\0' || event_id_valid(ev->host)) &&
               (ev->parent[0] == '\0' || event_id_valid(ev->parent));
}

/* A restarted event's reason: [a-z_]{1,31}. */
static bool reason_valid(const char *s)
{
        size_t n = 0;
        for (; s[n]; n++)
                if ((s[n] < 'a' || s[n] > 'z') && s[n] != '_')
                        return false;
        return n >= 1 && n <= EVENT_REASON_MAX;
}

int event_encode(const struct usage_event *ev, char *buf, size_t size)
{
        if ((unsigned)ev->type >= EVENT_TYPE_COUNT || (unsigned)ev->state >= STATE_COUNT ||
            !ids_valid(ev) || ev->cpu_ns > INT64_MAX || ev->epoch > INT64_MAX || ev->seq > INT64_MAX ||
            ev->mem_bytes > INT64_MAX || ev->mem_peak_bytes > INT64_MAX ||
            ev->mem_size_bytes > INT64_MAX || ev->disk_bytes > INT64_MAX || ev->disk_size_bytes > INT64_MAX ||
            ev->running_ns > INT64_MAX || ev->paused_ns > INT64_MAX || ev->net_rx_bytes > INT64_MAX ||
            ev->net_tx_bytes > INT64_MAX)
                return -EINVAL;
        int n = snprintf(buf, size,
                         "{\"v\":%d,\"type\":\"%s\",\"host\":\"%s\",\"sandbox\":\"%s\",\"account\":\"%s\","
                         "\"key\":\"%s\",\"epoch\":%" PRIu64 ",\"seq\":%" PRIu64 ",\"wall_ns\":%" PRId64
                         ",\"mono_ns\":%" PRId64 ",\"state\":\"%s\",\"cpu_ns\":%" PRIu64
                         ",\"mem_bytes\":%" PRIu64 ",\"mem_peak_bytes\":%" PRIu64
                         ",\"mem_size_bytes\":%" PRIu64 ",\"disk_bytes\":%" PRIu64 ",\"vcpus\":%" PRIu32
                         ",\"final\":%s",
                         EVENT_VERSION, type_names[ev->type], ev->host, ev->sandbox, ev->account, ev->key,
                         ev->epoch, ev->seq, ev->wall_ns, ev->mono_ns, state_names[ev->state], ev->cpu_ns,
                         ev->mem_bytes, ev->mem_peak_bytes, ev->mem_size_bytes, ev->disk_bytes, ev->vcpus,
                         ev->final ? "true" : "false");
        if (n < 0 || (size_t)n >= size)
                return -ENOBUFS;
        size_t len = (size_t)n;
        if (ev->held_known) {
                n = snprintf(buf + len, size - len, ",\"running_ns\":%" PRIu64 ",\"paused_ns\":%" PRIu64,
                             ev->running_ns, ev->paused_ns);
                if (n < 0 || (size_t)n >= size - len)
                        return -ENOBUFS;
                len += (size_t)n;
        }
        if (ev->net_known) {
                n = snprintf(buf + len, size - len, ",\"net_rx_bytes\":%" PRIu64 ",\"net_tx_bytes\":%" PRIu64,
                             ev->net_rx_bytes, ev->net_tx_bytes);
                if (n < 0 || (size_t)n >= size - len)
                        return -ENOBUFS;
                len += (size_t)n;
        }
        if (ev->type != EVENT_SAMPLE) {
                n = snprintf(buf + len, size - len,
                             ",\"parent\":\"%s\",\"backend\":\"%s\",\"disk_size_bytes\":%" PRIu64
                             ",\"fork_count\":%" PRIu32,
                             ev->parent, ev->backend, ev->disk_size_bytes, ev->fork_count);
                if (n < 0 || (size_t)n >= size - len)
                        return -ENOBUFS;
                len += (size_t)n;
                for (const char *p = ev->backend; *p; p++)
                        if (*p < 'a' || *p > 'z')
                                return -EINVAL;
        }
        if (ev->reason[0]) {
                if (!reason_valid(ev->reason))
                        return -EINVAL;
                n = snprintf(buf + len, size - len, ",\"reason\":\"%s\"", ev->reason);
                if (n < 0 || (size_t)n >= size - len)
                        return -ENOBUFS;
                len += (size_t)n;
        }
        if (ev->nlabels) {
                json_t *labels = json_object();
                for (size_t i = 0; i < ev->nlabels; i++)
                        json_object_set_new(labels, ev->labels[i].key, json_string(ev->labels[i].value));
                if (len + 10 > size) {
                        json_decref(labels);
                        return -ENOBUFS;
                }
                memcpy(buf + len, ",\"labels\":", 10);
                len += 10;
                size_t m = json_dumpb(labels, buf + len, size - len, JSON_COMPACT | JSON_SORT_KEYS);
                json_decref(labels);
                if (m == 0 || m >= size - len)
                        return -ENOBUFS;
                len += m;
        }
        if (len + 2 > size)
                return -ENOBUFS;
        buf[len++] = '}';
        buf[len] = '\0';
        return (int)len;
}

static int refuse(char *why, size_t whylen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(char *why, size_t whylen, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        if (why && whylen)
                vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

/* Reads an integer field; absent is allowed unless required. */
static int get_int(json_t *o, const char *name, bool required, int64_t min, int64_t max, int64_t *out,
                   char *why, size_t whylen)
{
        json_t *v = json_object_get(o, name);
        if (!v) {
                if (required)
                        return refuse(why, whylen, "missing field %s", name);
                return 0;
        }
        if (!json_is_integer(v))
                return refuse(why, whylen, "field %s is not an integer", name);
        json_int_t x = json_integer_value(v);
        if (x < min || x > max)
                return refuse(why, whylen, "field %s out of range: %lld", name, (long long)x);
        *out = x;
        return 0;
}

static int get_str(json_t *o, const char *name, bool required, char *out, size_t size, bool id,
                   char *why, size_t whylen)
{
        json_t *v = json_object_get(o, name);
        if (!v || (json_is_string(v) && json_string_length(v) == 0)) {
                if (required)
                        return refuse(why, whylen, "missing field %s", name);
                return 0;
        }
        if (!json_is_string(v))
                return refuse(why, whylen, "field %s is not a string", name);
        const char *s = json_string_value(v);
        if (json_string_length(v) >= size || (id && !event_id_valid(s)))
                return refuse(why, whylen, "field %s is not a valid id", name);
        memcpy(out, s, json_string_length(v) + 1);
        return 0;
}

int event_decode(const void *buf, size_t len, struct usage_event *ret, char *why, size_t whylen)
{
        json_error_t jerr;
        json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!o)
                return refuse(why, whylen, "invalid JSON: %s", jerr.text);
        struct usage_event ev = { 0 };
        int r = -EINVAL;
        int64_t v = 0;
        char name[16];

        if (!json_is_object(o)) {
                refuse(why, whylen, "message is not a JSON object");
                goto fail;
        }
        if ((r = get_int(o, "v", true, 0, INT32_MAX, &v, why, whylen)) < 0)
                goto fail;
        if (v != EVENT_VERSION) {
                r = refuse(why, whylen, "unknown version %lld", (long long)v);
                goto fail;
        }
        name[0] = '\0';
        if ((r = get_str(o, "type", true, name, sizeof(name), false, why, whylen)) < 0)
                goto fail;
        if (event_type_parse(name, &ev.type) < 0) {
                r = refuse(why, whylen, "unknown type \"%s\"", name);
                goto fail;
        }
        bool sample = ev.type == EVENT_SAMPLE, created = ev.type == EVENT_CREATED;
        bool restarted = ev.type == EVENT_RESTARTED;
        if ((r = get_str(o, "host", false, ev.host, sizeof(ev.host), true, why, whylen)) < 0 ||
            (r = get_str(o, "sandbox", true, ev.sandbox, sizeof(ev.sandbox), true, why, whylen)) < 0 ||
            (r = get_str(o, "account", true, ev.account, sizeof(ev.account), true, why, whylen)) < 0 ||
            (r = get_str(o, "key", sample || created, ev.key, sizeof(ev.key), true, why, whylen)) < 0 ||
            (r = get_str(o, "parent", false, ev.parent, sizeof(ev.parent), true, why, whylen)) < 0)
                goto fail;

        struct {
                const char *name;
                bool required;
                int64_t min, max;
                void *out;
                int width; /* 8: u64/i64, 4: u32 */
        } ints[] = {
                { "epoch", sample || restarted, restarted ? 1 : 0, INT64_MAX, &ev.epoch, 8 },
                { "seq", sample, 0, INT64_MAX, &ev.seq, 8 },
                { "wall_ns", true, WALL_MIN_NS, WALL_MAX_NS, &ev.wall_ns, 8 },
                { "mono_ns", false, 0, INT64_MAX, &ev.mono_ns, 8 },
                { "cpu_ns", sample || ev.type == EVENT_STOPPED, 0, INT64_MAX, &ev.cpu_ns, 8 },
                { "mem_bytes", false, 0, INT64_MAX, &ev.mem_bytes, 8 },
                { "mem_peak_bytes", false, 0, INT64_MAX, &ev.mem_peak_bytes, 8 },
                { "mem_size_bytes", sample || created, 0, INT64_MAX, &ev.mem_size_bytes, 8 },
                { "disk_bytes", false, 0, INT64_MAX, &ev.disk_bytes, 8 },
                { "disk_size_bytes", false, 0, INT64_MAX, &ev.disk_size_bytes, 8 },
                /* Lifecycle events other than created may leave it out (0); the
                 * encoder writes 0 then, which must decode too. */
                { "vcpus", sample || created, sample || created ? 1 : 0, EVENT_VCPUS_MAX, &ev.vcpus, 4 },
                { "fork_count", false, 0, 1000, &ev.fork_count, 4 },
                { "running_ns", false, 0, INT64_MAX, &ev.running_ns, 8 },
                { "paused_ns", false, 0, INT64_MAX, &ev.paused_ns, 8 },
                { "net_rx_bytes", false, 0, INT64_MAX, &ev.net_rx_bytes, 8 },
                { "net_tx_bytes", false, 0, INT64_MAX, &ev.net_tx_bytes, 8 },
        };
        for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
                v = 0;
                if ((r = get_int(o, ints[i].name, ints[i].required, ints[i].min, ints[i].max, &v, why,
                                 whylen)) < 0)
                        goto fail;
                if (ints[i].width == 8)
                        memcpy(ints[i].out, &v, 8);
                else
                        *(uint32_t *)ints[i].out = (uint32_t)v;
        }

        bool has_running = json_object_get(o, "running_ns") != NULL, has_paused = json_object_get(o, "paused_ns") != NULL;
        if (has_running != has_paused) {
                r = refuse(why, whylen, "running_ns and paused_ns come together");
                goto fail;
        }
        ev.held_known = has_running;
        bool has_rx = json_object_get(o, "net_rx_bytes") != NULL, has_tx = json_object_get(o, "net_tx_bytes") != NULL;
        if (has_rx != has_tx) {
                r = refuse(why, whylen, "net_rx_bytes and net_tx_bytes come together");
                goto fail;
        }
        ev.net_known = has_rx;

        name[0] = '\0';
        if ((r = get_str(o, "state", sample, name, sizeof(name), false, why, whylen)) < 0)
                goto fail;
        if (name[0] && sandbox_state_parse(name, &ev.state) < 0) {
                r = refuse(why, whylen, "unknown state \"%s\"", name);
                goto fail;
        }
        json_t *fin = json_object_get(o, "final");
        if (fin && !json_is_boolean(fin)) {
                r = refuse(why, whylen, "field final is not a boolean");
                goto fail;
        }
        ev.final = fin && json_is_true(fin);
        json_t *backend = json_object_get(o, "backend");
        if (backend && json_is_string(backend)) {
                if (json_string_length(backend) >= sizeof(ev.backend)) {
                        r = refuse(why, whylen, "field backend is too long");
                        goto fail;
                }
                strcpy(ev.backend, json_string_value(backend));
                /* What event_encode writes: lowercase letters ("process", "qemu"). */
                for (const char *p = ev.backend; *p; p++)
                        if (*p < 'a' || *p > 'z') {
                                r = refuse(why, whylen, "field backend is not lowercase letters");
                                goto fail;
                        }
        }

        char reason[EVENT_REASON_MAX + 2] = "";
        if ((r = get_str(o, "reason", restarted, reason, sizeof(reason), false, why, whylen)) < 0)
                goto fail;
        if (reason[0] && !reason_valid(reason)) {
                r = refuse(why, whylen, "field reason is not [a-z_]{1,%d}", EVENT_REASON_MAX);
                goto fail;
        }
        memcpy(ev.reason, reason, sizeof(ev.reason) - 1);

        json_t *labels = json_object_get(o, "labels");
        if (labels) {
                if (!json_is_object(labels)) {
                        r = refuse(why, whylen, "field labels is not an object");
                        goto fail;
                }
                const char *k;
                json_t *lv;
                json_object_foreach(labels, k, lv) {
                        if (!json_is_string(lv)) {
                                r = refuse(why, whylen, "label %s is not a string", k);
                                goto fail;
                        }
                        if ((r = event_add_label(&ev, k, json_string_value(lv))) < 0) {
                                r = refuse(why, whylen, "labels exceed %d entries or sizes %d/%d",
                                           EVENT_LABELS_MAX, EVENT_LABEL_KEY_MAX, EVENT_LABEL_VALUE_MAX);
                                goto fail;
                        }
                }
        }
        json_decref(o);
        *ret = ev;
        return 0;
fail:
        json_decref(o);
        event_clear(&ev);
        return r < 0 ? r : -EINVAL;
}
