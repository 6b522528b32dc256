/* sample_batch.c — see sample_batch.h; the layout is docs/events.md's
 * "Usage batches (format v2)". Every check here is event_decode's for a
 * sample (common/event.c), so a record and its v1 JSON mean the same. */
#include "sample_batch.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* event_decode's range for wall_ns (2020-01-01 .. 2200-01-01). */
#define WALL_MIN_NS INT64_C(1577836800000000000)
#define WALL_MAX_NS INT64_C(7258118400000000000)

#define FLAG_STATE  0x03
#define FLAG_FINAL  0x04
#define FLAG_HELD   0x08
#define FLAG_NET    0x10
#define FLAG_KNOWN  0x1f

/* [A-Za-z0-9_.:-], by byte. */
static const bool id_char[256] = {
        ['-'] = 1, ['.'] = 1, [':'] = 1, ['_'] = 1,
        ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1, ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1,
        ['A'] = 1, ['B'] = 1, ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1, ['I'] = 1, ['J'] = 1,
        ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1, ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1,
        ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1,
        ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1, ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1,
        ['k'] = 1, ['l'] = 1, ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1, ['s'] = 1, ['t'] = 1,
        ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1, ['y'] = 1, ['z'] = 1,
};

static bool id_ok(const uint8_t *s, size_t n)
{
        if (n == 0 || n > EVENT_ID_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!id_char[s[i]])
                        return false;
        return true;
}

/* ---- writing ---- */

static uint8_t *put_varint(uint8_t *p, uint64_t v)
{
        while (v >= 0x80) {
                *p++ = (uint8_t)(v | 0x80);
                v >>= 7;
        }
        *p++ = (uint8_t)v;
        return p;
}

static uint64_t zigzag(int64_t d)
{
        return ((uint64_t)d << 1) ^ (uint64_t)(d >> 63);
}

/* An id of at most EVENT_ID_MAX valid characters, or NULL. */
static uint8_t *put_id(uint8_t *p, const char *id)
{
        size_t n = strnlen(id, EVENT_ID_MAX + 1);
        if (!id_ok((const uint8_t *)id, n))
                return NULL;
        *p++ = (uint8_t)n;
        memcpy(p, id, n);
        return p + n;
}

int sample_batch_begin(uint8_t *buf, size_t size, const char *host, int64_t wall_base, int64_t mono_base)
{
        uint8_t tmp[SAMPLE_BATCH_HEADER_MAX], *p = tmp;
        size_t hn = strnlen(host, EVENT_ID_MAX + 1);
        if ((hn && !id_ok((const uint8_t *)host, hn)) || wall_base < 0 || mono_base < 0)
                return -EINVAL;
        *p++ = SAMPLE_BATCH_VERSION;
        *p++ = (uint8_t)hn;
        memcpy(p, host, hn);
        p = put_varint(p + hn, (uint64_t)wall_base);
        p = put_varint(p, (uint64_t)mono_base);
        size_t n = (size_t)(p - tmp);
        if (n > size)
                return -ENOBUFS;
        memcpy(buf, tmp, n);
        return (int)n;
}

int sample_batch_record(uint8_t *buf, size_t size, int64_t wall_base, int64_t mono_base,
                        const struct usage_event *ev)
{
        /* What event_decode would refuse of the v1 sample. */
        if (ev->type != EVENT_SAMPLE || (unsigned)ev->state >= STATE_COUNT || ev->wall_ns < WALL_MIN_NS ||
            ev->wall_ns > WALL_MAX_NS || ev->mono_ns < 0 || ev->vcpus < 1 || ev->vcpus > EVENT_VCPUS_MAX ||
            ((ev->epoch | ev->seq | ev->cpu_ns | ev->mem_bytes | ev->mem_peak_bytes | ev->mem_size_bytes |
              ev->disk_bytes | ev->running_ns | ev->paused_ns | ev->net_rx_bytes | ev->net_tx_bytes) >> 63))
                return -EINVAL;
        uint8_t body[SAMPLE_BATCH_RECORD_MAX], *p = body;
        *p++ = (uint8_t)(ev->state | (ev->final ? FLAG_FINAL : 0) | (ev->held_known ? FLAG_HELD : 0) |
                         (ev->net_known ? FLAG_NET : 0));
        if (!(p = put_id(p, ev->sandbox)) || !(p = put_id(p, ev->account)) || !(p = put_id(p, ev->key)))
                return -EINVAL;
        p = put_varint(p, ev->epoch);
        p = put_varint(p, ev->seq);
        /* Both in 0..2^63: their difference fits int64_t. */
        uint64_t dw = zigzag((int64_t)((uint64_t)ev->wall_ns - (uint64_t)wall_base));
        uint64_t dm = zigzag((int64_t)((uint64_t)ev->mono_ns - (uint64_t)mono_base));
        if ((dw | dm) >> 63)
                return -EINVAL; /* too far from the header's times for a varint: a batch of its own */
        p = put_varint(p, dw);
        p = put_varint(p, dm);
        p = put_varint(p, ev->cpu_ns);
        p = put_varint(p, ev->mem_bytes);
        p = put_varint(p, ev->mem_peak_bytes);
        p = put_varint(p, ev->mem_size_bytes);
        p = put_varint(p, ev->disk_bytes);
        p = put_varint(p, ev->vcpus);
        if (ev->held_known) {
                p = put_varint(p, ev->running_ns);
                p = put_varint(p, ev->paused_ns);
        }
        if (ev->net_known) {
                p = put_varint(p, ev->net_rx_bytes);
                p = put_varint(p, ev->net_tx_bytes);
        }
        size_t n = (size_t)(p - body);
        uint8_t len[2], *q = put_varint(len, n);
        size_t ln = (size_t)(q - len);
        if (ln + n > size)
                return -ENOBUFS;
        memcpy(buf, len, ln);
        memcpy(buf + ln, body, n);
        return (int)(ln + n);
}

/* ---- reading ---- */

static int refuse(char *why, size_t whylen, int r, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
static int refuse(char *why, size_t whylen, int r, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
        return r;
}

/* A varint in its shortest form, below 2^63. NULL when it is not. */
static const uint8_t *get_varint(const uint8_t *p, const uint8_t *end, uint64_t *v)
{
        uint64_t x = 0;
        for (int shift = 0; shift < 63; shift += 7) {
                if (p >= end)
                        return NULL;
                uint8_t b = *p++;
                x |= (uint64_t)(b & 0x7f) << shift;
                if (!(b & 0x80)) {
                        if (b == 0 && shift > 0)
                                return NULL; /* not the shortest form */
                        *v = x;
                        return p;
                }
        }
        return NULL; /* 2^63 or more */
}

static const uint8_t *get_id(const uint8_t *p, const uint8_t *end, char *out)
{
        if (p >= end)
                return NULL;
        size_t n = *p++;
        if ((size_t)(end - p) < n || !id_ok(p, n))
                return NULL;
        memcpy(out, p, n);
        out[n] = '\0';
        return p + n;
}

int sample_batch_open(struct sample_batch_reader *r, const void *buf, size_t len, char *why, size_t whylen)
{
        const uint8_t *p = buf, *end = p + len;
        uint64_t wall, mono;
        if (!sample_batch_is(buf, len))
                return refuse(why, whylen, -EINVAL, "not a usage batch (its first byte is not %d)",
                              SAMPLE_BATCH_VERSION);
        p++;
        if (p >= end || (size_t)(end - p - 1) < *p || (*p && !id_ok(p + 1, *p)))
                return refuse(why, whylen, -EINVAL, "usage batch: bad host");
        memcpy(r->host, p + 1, *p);
        r->host[*p] = '\0';
        p += 1 + *p;
        if (!(p = get_varint(p, end, &wall)) || !(p = get_varint(p, end, &mono)))
                return refuse(why, whylen, -EINVAL, "usage batch: bad header times");
        if (p == end)
                return refuse(why, whylen, -EINVAL, "usage batch without a sample");
        r->wall_base = (int64_t)wall;
        r->mono_base = (int64_t)mono;
        r->p = p;
        r->end = end;
        r->index = 0;
        return 0;
}

bool sample_batch_peek_sandbox(const void *buf, size_t len, size_t *at, char id[EVENT_ID_MAX + 1])
{
        const uint8_t *start = buf, *end = start + len, *p;
        if (*at == 0) {
                struct sample_batch_reader r;
                if (sample_batch_open(&r, buf, len, NULL, 0) < 0) {
                        *at = len;
                        return false;
                }
                *at = (size_t)(r.p - start);
        }
        while (*at < len) {
                uint64_t n;
                if (!(p = get_varint(start + *at, end, &n)) || n > (uint64_t)(end - p))
                        break;
                *at = (size_t)(p + n - start);
                if (n >= 2 && get_id(p + 1, p + n, id))
                        return true;
        }
        *at = len;
        return false;
}

/* base + a zigzag delta, in [min, max]; false when it falls outside. */
static bool add_delta(int64_t base, uint64_t z, int64_t min, int64_t max, int64_t *out)
{
        int64_t d = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
        int64_t v;
        if (__builtin_add_overflow(base, d, &v) || v < min || v > max)
                return false;
        *out = v;
        return true;
}

int sample_batch_next(struct sample_batch_reader *r, struct usage_event *ret, const uint8_t **rec, size_t *reclen,
                      char *why, size_t whylen)
{
        if (r->p >= r->end)
                return 0;
        size_t index = ++r->index;
        const uint8_t *start = r->p;
        uint64_t n;
        const uint8_t *p = get_varint(r->p, r->end, &n);
        if (!p || n > (uint64_t)(r->end - p)) {
                *rec = start;
                *reclen = (size_t)(r->end - start);
                r->p = r->end;
                return refuse(why, whylen, -EPROTO, "record %zu: its length runs past the batch's end", index);
        }
        const uint8_t *end = p + n;
        *rec = start;
        *reclen = (size_t)(end - start);
        r->p = end;

        struct usage_event ev = { .type = EVENT_SAMPLE };
        uint64_t v[15];
        if (p >= end)
                return refuse(why, whylen, -EINVAL, "record %zu: empty", index);
        uint8_t flags = *p++;
        if ((flags & ~FLAG_KNOWN) || (flags & FLAG_STATE) == 3)
                return refuse(why, whylen, -EINVAL, "record %zu: unknown flags 0x%02x", index, flags);
        if (!(p = get_id(p, end, ev.sandbox)))
                return refuse(why, whylen, -EINVAL, "record %zu: bad sandbox id", index);
        if (!(p = get_id(p, end, ev.account)))
                return refuse(why, whylen, -EINVAL, "record %zu (sandbox %s): bad account id", index, ev.sandbox);
        if (!(p = get_id(p, end, ev.key)))
                return refuse(why, whylen, -EINVAL, "record %zu (sandbox %s): bad key id", index, ev.sandbox);
        size_t nv = 10 + ((flags & FLAG_HELD) ? 2 : 0) + ((flags & FLAG_NET) ? 2 : 0);
        for (size_t i = 0; i < nv; i++)
                if (!(p = get_varint(p, end, &v[i])))
                        return refuse(why, whylen, -EINVAL, "record %zu (sandbox %s): bad integer %zu", index,
                                      ev.sandbox, i + 1);
        if (p != end)
                return refuse(why, whylen, -EINVAL, "record %zu (sandbox %s): %zu bytes after its fields", index,
                              ev.sandbox, (size_t)(end - p));
        if (!add_delta(r->wall_base, v[2], WALL_MIN_NS, WALL_MAX_NS, &ev.wall_ns))
                return refuse(why, whylen, -EINVAL, "record %zu (sandbox %s): wall_ns out of range", index,
                              ev.sandbox);
        if (!add_delta(r->mono_base, v[3], 0, INT64_MAX, &ev.mono_ns))
                return refuse(why, whylen, -EINVAL, "record %zu (sandbox %s): mono_ns out of range", index,
                              ev.sandbox);
        if (v[9] < 1 || v[9] > EVENT_VCPUS_MAX)
                return refuse(why, whylen, -EINVAL, "record %zu (sandbox %s): vcpus %llu out of 1..%d", index,
                              ev.sandbox, (unsigned long long)v[9], EVENT_VCPUS_MAX);
        memcpy(ev.host, r->host, sizeof(ev.host));
        ev.state = (enum sandbox_state)(flags & FLAG_STATE);
        ev.final = flags & FLAG_FINAL;
        ev.epoch = v[0];
        ev.seq = v[1];
        ev.cpu_ns = v[4];
        ev.mem_bytes = v[5];
        ev.mem_peak_bytes = v[6];
        ev.mem_size_bytes = v[7];
        ev.disk_bytes = v[8];
        ev.vcpus = (uint32_t)v[9];
        size_t k = 10;
        if (flags & FLAG_HELD) {
                ev.held_known = true;
                ev.running_ns = v[k++];
                ev.paused_ns = v[k++];
        }
        if (flags & FLAG_NET) {
                ev.net_known = true;
                ev.net_rx_bytes = v[k++];
                ev.net_tx_bytes = v[k++];
        }
        *ret = ev;
        return 1;
}
