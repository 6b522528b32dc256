/* sample_decode.c — see sample_decode.h. Every check below is event_decode's
 * for a sample (common/event.c); where this file is unsure it says false and
 * event_decode decides. */
#include "sample_decode.h"

#include <stdint.h>
#include <string.h>

/* event_decode's range for wall_ns (2020-01-01 .. 2200-01-01). */
#define WALL_MIN_NS INT64_C(1577836800000000000)
#define WALL_MAX_NS INT64_C(7258118400000000000)

enum field {
        F_V, F_TYPE, F_HOST, F_SANDBOX, F_ACCOUNT, F_KEY, F_PARENT, F_STATE, F_FINAL,
        F_EPOCH, F_SEQ, F_WALL, F_MONO, F_CPU, F_MEM, F_MEM_PEAK, F_MEM_SIZE, F_DISK, F_DISK_SIZE, F_VCPUS,
        F_FORKS, F_RUNNING, F_PAUSED, F_NET_RX, F_NET_TX, F_COUNT
};

static const char *const names[F_COUNT] = {
        [F_V] = "v", [F_TYPE] = "type", [F_HOST] = "host", [F_SANDBOX] = "sandbox", [F_ACCOUNT] = "account",
        [F_KEY] = "key", [F_PARENT] = "parent", [F_STATE] = "state", [F_FINAL] = "final", [F_EPOCH] = "epoch",
        [F_SEQ] = "seq", [F_WALL] = "wall_ns", [F_MONO] = "mono_ns", [F_CPU] = "cpu_ns", [F_MEM] = "mem_bytes",
        [F_MEM_PEAK] = "mem_peak_bytes", [F_MEM_SIZE] = "mem_size_bytes", [F_DISK] = "disk_bytes",
        [F_DISK_SIZE] = "disk_size_bytes", [F_VCPUS] = "vcpus", [F_FORKS] = "fork_count",
        [F_RUNNING] = "running_ns", [F_PAUSED] = "paused_ns", [F_NET_RX] = "net_rx_bytes",
        [F_NET_TX] = "net_tx_bytes",
};

/* strlen of each name, by the compiler */
#define L(s) (sizeof(s) - 1)
static const size_t lengths[F_COUNT] = {
        [F_V] = L("v"), [F_TYPE] = L("type"), [F_HOST] = L("host"), [F_SANDBOX] = L("sandbox"),
        [F_ACCOUNT] = L("account"), [F_KEY] = L("key"), [F_PARENT] = L("parent"), [F_STATE] = L("state"),
        [F_FINAL] = L("final"), [F_EPOCH] = L("epoch"), [F_SEQ] = L("seq"), [F_WALL] = L("wall_ns"),
        [F_MONO] = L("mono_ns"), [F_CPU] = L("cpu_ns"), [F_MEM] = L("mem_bytes"), [F_MEM_PEAK] = L("mem_peak_bytes"),
        [F_MEM_SIZE] = L("mem_size_bytes"), [F_DISK] = L("disk_bytes"), [F_DISK_SIZE] = L("disk_size_bytes"),
        [F_VCPUS] = L("vcpus"), [F_FORKS] = L("fork_count"), [F_RUNNING] = L("running_ns"),
        [F_PAUSED] = L("paused_ns"), [F_NET_RX] = L("net_rx_bytes"), [F_NET_TX] = L("net_tx_bytes"),
};
#undef L

static bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static const char *skip(const char *p, const char *end)
{
        while (p < end && space(*p))
                p++;
        return p;
}

/* A string of printable ASCII without escapes: [*s, *s + *n). */
static const char *string(const char *p, const char *end, const char **s, size_t *n)
{
        if (p >= end || *p != '"')
                return NULL;
        const char *q = ++p;
        while (q < end && *q != '"') {
                if (*q < 0x20 || *q > 0x7e || *q == '\\')
                        return NULL;
                q++;
        }
        if (q >= end)
                return NULL;
        *s = p;
        *n = (size_t)(q - p);
        return q + 1;
}

/* A JSON integer >= 0 that fits int64_t, and not the start of a real. */
static const char *integer(const char *p, const char *end, int64_t *v)
{
        if (p >= end || *p < '0' || *p > '9')
                return NULL;
        if (*p == '0' && p + 1 < end && p[1] >= '0' && p[1] <= '9')
                return NULL;
        uint64_t x = 0;
        int digits = 0;
        while (p < end && *p >= '0' && *p <= '9') {
                if (++digits > 19)
                        return NULL;
                x = x * 10 + (uint64_t)(*p++ - '0');
        }
        if (x > INT64_MAX || (p < end && (*p == '.' || *p == 'e' || *p == 'E')))
                return NULL;
        *v = (int64_t)x;
        return p;
}

static bool id_copy(char *out, size_t size, const char *s, size_t n)
{
        if (n == 0 || n >= size || n > EVENT_ID_MAX)
                return false;
        for (size_t i = 0; i < n; i++) {
                char c = s[i];
                if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                      c == '-' || c == '.' || c == ':'))
                        return false;
        }
        memcpy(out, s, n);
        out[n] = '\0';
        return true;
}

static bool is(const char *s, size_t n, const char *word) { return strlen(word) == n && memcmp(s, word, n) == 0; }

bool sample_decode_fast(const void *buf, size_t len, struct usage_event *ret)
{
        const char *p = buf, *end = p + len;
        struct usage_event ev = { 0 };
        int64_t ints[F_COUNT] = { 0 };
        uint32_t seen = 0, named = 0; /* fields given (not ""), fields named at all */
        p = skip(p, end);
        if (p >= end || *p++ != '{')
                return false;
        p = skip(p, end);
        if (p < end && *p == '}')
                return false; /* no fields: event_decode says which is missing */
        for (;;) {
                const char *k, *s;
                size_t kn, sn;
                if (!(p = string(p, end, &k, &kn)))
                        return false;
                int f = -1;
                for (int i = 0; i < F_COUNT && f < 0; i++)
                        if (lengths[i] == kn && memcmp(k, names[i], kn) == 0)
                                f = i;
                if (f < 0 || (named & (UINT32_C(1) << f)))
                        return false; /* unknown (labels, backend, ...) or repeated */
                named |= UINT32_C(1) << f;
                seen |= UINT32_C(1) << f;
                p = skip(p, end);
                if (p >= end || *p++ != ':')
                        return false;
                p = skip(p, end);
                switch (f) {
                case F_TYPE:
                case F_HOST:
                case F_SANDBOX:
                case F_ACCOUNT:
                case F_KEY:
                case F_PARENT:
                case F_STATE:
                        if (!(p = string(p, end, &s, &sn)))
                                return false;
                        if (sn == 0) { /* "" is absent to event_decode */
                                seen &= ~(UINT32_C(1) << f);
                                break;
                        }
                        if ((f == F_TYPE && !is(s, sn, "sample")) ||
                            (f == F_STATE && !is(s, sn, "running") && !is(s, sn, "paused") && !is(s, sn, "stopped")))
                                return false;
                        if (f == F_STATE)
                                ev.state = s[0] == 'r' ? STATE_RUNNING : s[0] == 'p' ? STATE_PAUSED : STATE_STOPPED;
                        if ((f == F_HOST && !id_copy(ev.host, sizeof(ev.host), s, sn)) ||
                            (f == F_SANDBOX && !id_copy(ev.sandbox, sizeof(ev.sandbox), s, sn)) ||
                            (f == F_ACCOUNT && !id_copy(ev.account, sizeof(ev.account), s, sn)) ||
                            (f == F_KEY && !id_copy(ev.key, sizeof(ev.key), s, sn)) ||
                            (f == F_PARENT && !id_copy(ev.parent, sizeof(ev.parent), s, sn)))
                                return false;
                        break;
                case F_FINAL:
                        if (end - p >= 4 && memcmp(p, "true", 4) == 0) {
                                ev.final = true;
                                p += 4;
                        } else if (end - p >= 5 && memcmp(p, "false", 5) == 0) {
                                p += 5;
                        } else {
                                return false;
                        }
                        break;
                default:
                        if (!(p = integer(p, end, &ints[f])))
                                return false;
                }
                p = skip(p, end);
                if (p >= end)
                        return false;
                if (*p == '}')
                        break;
                if (*p++ != ',')
                        return false;
                p = skip(p, end);
        }
        if (skip(p + 1, end) != end)
                return false; /* anything after the object */

        /* What event_decode requires of a sample, and its ranges. */
        static const int required[] = { F_V, F_TYPE, F_SANDBOX, F_ACCOUNT, F_KEY, F_EPOCH, F_SEQ, F_WALL,
                                        F_CPU, F_MEM_SIZE, F_VCPUS, F_STATE };
        for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++)
                if (!(seen & (UINT32_C(1) << required[i])))
                        return false;
        if (ints[F_V] != EVENT_VERSION || ints[F_WALL] < WALL_MIN_NS || ints[F_WALL] > WALL_MAX_NS ||
            ints[F_VCPUS] < 1 || ints[F_VCPUS] > EVENT_VCPUS_MAX || ints[F_FORKS] > 1000)
                return false;
        bool running = seen & (UINT32_C(1) << F_RUNNING), paused = seen & (UINT32_C(1) << F_PAUSED);
        if (running != paused)
                return false;
        bool rx = seen & (UINT32_C(1) << F_NET_RX), tx = seen & (UINT32_C(1) << F_NET_TX);
        if (rx != tx)
                return false;
        ev.net_known = rx;
        ev.net_rx_bytes = (uint64_t)ints[F_NET_RX];
        ev.net_tx_bytes = (uint64_t)ints[F_NET_TX];
        ev.type = EVENT_SAMPLE;
        ev.held_known = running;
        ev.epoch = (uint64_t)ints[F_EPOCH];
        ev.seq = (uint64_t)ints[F_SEQ];
        ev.wall_ns = ints[F_WALL];
        ev.mono_ns = ints[F_MONO];
        ev.cpu_ns = (uint64_t)ints[F_CPU];
        ev.mem_bytes = (uint64_t)ints[F_MEM];
        ev.mem_peak_bytes = (uint64_t)ints[F_MEM_PEAK];
        ev.mem_size_bytes = (uint64_t)ints[F_MEM_SIZE];
        ev.disk_bytes = (uint64_t)ints[F_DISK];
        ev.disk_size_bytes = (uint64_t)ints[F_DISK_SIZE];
        ev.vcpus = (uint32_t)ints[F_VCPUS];
        ev.fork_count = (uint32_t)ints[F_FORKS];
        ev.running_ns = (uint64_t)ints[F_RUNNING];
        ev.paused_ns = (uint64_t)ints[F_PAUSED];
        *ret = ev;
        return true;
}
