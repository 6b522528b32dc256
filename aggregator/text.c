/* text.c — see text.h. */
#include "text.h"

#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int grow(void **p, size_t *cap, size_t need, size_t size)
{
        if (need <= *cap)
                return 0;
        size_t n = *cap ? *cap * 2 : 1024;
        while (n < need)
                n *= 2;
        void *q = realloc(*p, n * size);
        if (!q)
                return -ENOMEM;
        *p = q;
        *cap = n;
        return 0;
}

/* Length of the valid UTF-8 character at s (RFC 3629: no overlong forms,
 * no surrogates, nothing above U+10FFFF), or 0. */
static size_t utf8_char(const unsigned char *s)
{
        if (s[0] < 0x80)
                return 1;
        size_t n;
        unsigned lo = 0x80, hi = 0xBF;
        if (s[0] >= 0xC2 && s[0] <= 0xDF)
                n = 2;
        else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
                n = 3;
                lo = s[0] == 0xE0 ? 0xA0 : 0x80;
                hi = s[0] == 0xED ? 0x9F : 0xBF;
        } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
                n = 4;
                lo = s[0] == 0xF0 ? 0x90 : 0x80;
                hi = s[0] == 0xF4 ? 0x8F : 0xBF;
        } else
                return 0;
        if (s[1] < lo || s[1] > hi)
                return 0;
        for (size_t i = 2; i < n; i++)
                if (s[i] < 0x80 || s[i] > 0xBF)
                        return 0;
        return n;
}

/* Room for n more bytes and a NUL. */
static int text_reserve(struct text *t, size_t n)
{
        if (t->cap - t->len > n)
                return 0;
        size_t cap = t->cap ? t->cap * 2 : 1 << 20;
        while (cap < t->len + n + 1)
                cap *= 2;
        char *b = realloc(t->buf, cap);
        if (!b)
                return -ENOMEM;
        t->buf = b;
        t->cap = cap;
        return 0;
}

int text_add(struct text *t, const char *fmt, ...)
{
        for (;;) {
                va_list ap;
                va_start(ap, fmt);
                int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->cap - t->len, fmt, ap);
                va_end(ap);
                if (n < 0)
                        return -EINVAL;
                if ((size_t)n < t->cap - t->len) {
                        t->len += (size_t)n;
                        return 0;
                }
                if (text_reserve(t, (size_t)n) < 0)
                        return -ENOMEM;
        }
}

int text_add_copy_field(struct text *t, const char *s, char end)
{
        if (!s)
                return text_add(t, "\\N%c", end);
        size_t n = strlen(s);
        if (text_reserve(t, 2 * n + 1) < 0) /* each byte escaped at most into two */
                return -ENOMEM;
        for (; *s; s++) {
                char e = *s == '\\' ? '\\' : *s == '\t' ? 't' : *s == '\n' ? 'n' : *s == '\r' ? 'r' : 0;
                if (e)
                        t->buf[t->len++] = '\\';
                t->buf[t->len++] = e ? e : *s;
        }
        t->buf[t->len++] = end;
        t->buf[t->len] = '\0';
        return 0;
}

void utf8_copy(char *dst, size_t size, const char *src)
{
        const unsigned char *s = (const unsigned char *)src;
        size_t o = 0;
        while (*s && size) {
                size_t n = utf8_char(s);
                if (n == 0) {
                        if (o + 1 >= size)
                                break;
                        dst[o++] = '?';
                        s++;
                        continue;
                }
                if (o + n >= size)
                        break;
                memcpy(dst + o, s, n);
                o += n;
                s += n;
        }
        if (size)
                dst[o] = '\0';
}

char *u128_str(u128 v, char *buf, size_t size)
{
        char tmp[48];
        size_t n = 0;
        do {
                tmp[n++] = (char)('0' + (int)(v % 10));
                v /= 10;
        } while (v);
        size_t i = 0;
        for (; i < n && i + 1 < size; i++)
                buf[i] = tmp[n - 1 - i];
        buf[i] = '\0';
        return buf;
}

/* Days since 1970-01-01 to a civil date (proleptic Gregorian): counted in
 * 400-year eras of 146,097 days from 0000-03-01, so that the leap day ends
 * each year of the count. */
static void civil_date(int64_t days, int64_t *y, int *m, int *d)
{
        int64_t z = days + 719468;
        int64_t era = (z >= 0 ? z : z - 146096) / 146097;
        int64_t doe = z - era * 146097;                                       /* [0, 146096] */
        int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;  /* [0, 399] */
        int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);                /* [0, 365], from March 1 */
        int64_t mp = (5 * doy + 2) / 153;                                     /* [0, 11], March = 0 */
        *d = (int)(doy - (153 * mp + 2) / 5 + 1);
        *m = (int)(mp < 10 ? mp + 3 : mp - 9);
        *y = yoe + era * 400 + (*m <= 2);
}

static char *digits(char *p, int64_t v, int width)
{
        for (int i = width - 1; i >= 0; i--, v /= 10)
                p[i] = (char)('0' + v % 10);
        return p + width;
}

void format_ts(char *buf, size_t size, int64_t ns)
{
        int64_t s = time_floor(ns, NS_PER_SEC) / NS_PER_SEC;
        int64_t frac = ns - s * NS_PER_SEC;
        int64_t days = time_floor(s, 86400) / 86400, sod = s - days * 86400, y;
        int m, d;
        civil_date(days, &y, &m, &d); /* (int64 ns span the years 1677..2262: always four digits) */
        if (size < sizeof("YYYY-MM-DD HH:MM:SS.uuuuuu+00")) {
                if (size)
                        buf[0] = '\0';
                return;
        }
        char *p = digits(buf, y, 4);
        *p++ = '-';
        p = digits(p, m, 2);
        *p++ = '-';
        p = digits(p, d, 2);
        *p++ = ' ';
        p = digits(p, sod / 3600, 2);
        *p++ = ':';
        p = digits(p, sod / 60 % 60, 2);
        *p++ = ':';
        p = digits(p, sod % 60, 2);
        *p++ = '.';
        p = digits(p, frac / NS_PER_US, 6);
        memcpy(p, "+00", 4);
}

int text_put(struct text *t, const char *s, char end)
{
        size_t n = strlen(s);
        if (text_reserve(t, n + 1) < 0)
                return -ENOMEM;
        memcpy(t->buf + t->len, s, n);
        t->len += n;
        t->buf[t->len++] = end;
        t->buf[t->len] = '\0';
        return 0;
}

int text_put_u64(struct text *t, uint64_t v, char end)
{
        char tmp[24];
        size_t n = 0;
        do {
                tmp[n++] = (char)('0' + v % 10);
                v /= 10;
        } while (v);
        if (text_reserve(t, n + 1) < 0)
                return -ENOMEM;
        while (n)
                t->buf[t->len++] = tmp[--n];
        t->buf[t->len++] = end;
        t->buf[t->len] = '\0';
        return 0;
}

int text_put_i64(struct text *t, int64_t v, char end)
{
        if (v < 0) {
                if (text_reserve(t, 1) < 0)
                        return -ENOMEM;
                t->buf[t->len++] = '-';
        }
        return text_put_u64(t, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v, end);
}
