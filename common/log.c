/* log.c — see log.h. One fprintf per event, so lines from threads never interleave.
 *
 * Values never break a line's key=value structure: every string a field's
 * format substitutes (%s, %m) is escaped here — a label key, an error from a
 * library or a path may hold quotes, spaces, '=', newlines or control bytes,
 * and must not inject fields or lines. */
#include "log.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static const char *log_component = "tally";
static enum log_level log_min = LOG_LEVEL_INFO;
static FILE *log_stream; /* NULL: stderr */
static const char *const level_names[] = { "debug", "info", "warn", "error" };

void log_set_component(const char *component) { log_component = component; }
void log_set_level(enum log_level level) { log_min = level; }
enum log_level log_get_level(void) { return log_min; }
void log_set_stream(FILE *stream) { log_stream = stream; }

int log_level_parse(const char *s, enum log_level *ret)
{
        for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++)
                if (strcmp(s, level_names[i]) == 0) {
                        *ret = (enum log_level)i;
                        return 0;
                }
        return -EINVAL;
}

/* An output buffer that truncates silently and stays NUL-terminated. */
struct out {
        char *buf;
        size_t size, len;
};

static void put(struct out *o, char c)
{
        if (o->len + 1 < o->size)
                o->buf[o->len++] = c;
        o->buf[o->len < o->size ? o->len : o->size - 1] = '\0';
}

static void puts_raw(struct out *o, const char *s, size_t n)
{
        for (size_t i = 0; i < n; i++)
                put(o, s[i]);
}

/* The escaped body of a quoted value (without the quotes): \" \\ \n \r \t and
 * \xNN for every other control byte and DEL. Bytes >= 0x80 (UTF-8) pass. An
 * escape is written whole or not at all. */
static void put_escaped(struct out *o, const char *s, size_t n)
{
        static const char hex[] = "0123456789abcdef";
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)s[i];
                char esc[5];
                size_t k = 0;
                if (c == '"' || c == '\\') {
                        esc[k++] = '\\';
                        esc[k++] = (char)c;
                } else if (c == '\n' || c == '\r' || c == '\t') {
                        esc[k++] = '\\';
                        esc[k++] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
                } else if (c < 0x20 || c == 0x7f) {
                        esc[k++] = '\\';
                        esc[k++] = 'x';
                        esc[k++] = hex[c >> 4];
                        esc[k++] = hex[c & 15];
                } else {
                        esc[k++] = (char)c;
                }
                if (o->len + k + 1 >= o->size)
                        return;
                puts_raw(o, esc, k);
        }
}

static bool bare_safe(unsigned char c)
{
        return c > 0x20 && c != 0x7f && c != '"' && c != '=' && c != '\\';
}

/* True if s[0..n) is already one quoted value as log_quote writes it. */
static bool already_quoted(const char *s, size_t n)
{
        if (n < 2 || s[0] != '"' || s[n - 1] != '"')
                return false;
        for (size_t i = 1; i + 1 < n; i++) {
                unsigned char c = (unsigned char)s[i];
                if (c < 0x20 || c == 0x7f || c == '"')
                        return false;
                if (c == '\\') {
                        if (i + 2 >= n)
                                return false; /* the escape would take the closing quote */
                        i++;
                }
        }
        return true;
}

/* A substituted string: inside the format's quotes, escaped; bare, as is when
 * every byte is safe there, else quoted and escaped (or kept if it already is
 * one well-formed quoted value, e.g. from log_quote). */
static void put_value(struct out *o, const char *s, size_t n, bool quoted)
{
        if (quoted) {
                put_escaped(o, s, n);
                return;
        }
        bool safe = n > 0;
        for (size_t i = 0; i < n && safe; i++)
                safe = bare_safe((unsigned char)s[i]);
        if (safe || already_quoted(s, n)) {
                puts_raw(o, s, n);
                return;
        }
        put(o, '"');
        put_escaped(o, s, n);
        put(o, '"');
}

const char *log_quote(char *out, size_t size, const char *s)
{
        if (size < 3)
                return "";
        struct out o = { out, size - 1, 0 }; /* room for the closing quote */
        put(&o, '"');
        put_escaped(&o, s, strlen(s));
        out[o.len++] = '"';
        out[o.len] = '\0';
        return out;
}

/* vsnprintf for a fields format, escaping each string it substitutes. Every
 * conversion but %s and %m is handed to snprintf one at a time with the
 * argument of its type. */
int log_format_fields(char *buf, size_t size, const char *fmt, va_list ap)
{
        struct out o = { buf, size, 0 };
        if (size == 0)
                return 0;
        buf[0] = '\0';
        bool in_quotes = false;
        int saved = errno;
        for (const char *p = fmt; *p;) {
                if (*p != '%') {
                        if (*p == '"')
                                in_quotes = !in_quotes;
                        put(&o, *p++);
                        continue;
                }
                const char *start = p++;
                if (*p == '%') {
                        put(&o, '%');
                        p++;
                        continue;
                }
                int width = -1, prec = -1;
                while (*p && strchr("-+ #0", *p))
                        p++;
                if (*p == '*') {
                        width = va_arg(ap, int);
                        p++;
                } else {
                        while (*p >= '0' && *p <= '9')
                                p++;
                }
                if (*p == '.') {
                        p++;
                        if (*p == '*') {
                                prec = va_arg(ap, int);
                                p++;
                        } else {
                                prec = 0;
                                while (*p >= '0' && *p <= '9')
                                        prec = prec * 10 + (*p++ - '0');
                        }
                }
                int lng = 0; /* 1 l, 2 ll, 3 z, 4 j, 5 t, 6 L, -1 h, -2 hh */
                if (p[0] == 'h' && p[1] == 'h')
                        lng = -2, p += 2;
                else if (*p == 'h')
                        lng = -1, p++;
                else if (p[0] == 'l' && p[1] == 'l')
                        lng = 2, p += 2;
                else if (*p == 'l')
                        lng = 1, p++;
                else if (*p == 'z')
                        lng = 3, p++;
                else if (*p == 'j')
                        lng = 4, p++;
                else if (*p == 't')
                        lng = 5, p++;
                else if (*p == 'L')
                        lng = 6, p++;
                char conv = *p;
                if (!conv)
                        break;
                p++;
                if (conv == 's' || conv == 'm') {
                        const char *s = conv == 's' ? va_arg(ap, const char *) : strerror(saved);
                        if (!s)
                                s = "(null)";
                        size_t n = strlen(s);
                        if (prec >= 0 && (size_t)prec < n)
                                n = (size_t)prec;
                        put_value(&o, s, n, in_quotes);
                        continue;
                }
                /* One conversion, formatted by snprintf with its own argument; a '*' already
                 * consumed is written back as the number it took. */
                char one[64], text[128];
                size_t k = 0;
                bool after_dot = false;
                for (const char *q = start; q < p && k + 12 < sizeof(one); q++) {
                        if (*q == '.')
                                after_dot = true;
                        if (*q == '*')
                                k += (size_t)snprintf(one + k, sizeof(one) - k, "%d", after_dot ? prec : width);
                        else
                                one[k++] = *q;
                }
                one[k] = '\0';
                int n = 0;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
                switch (conv) {
                case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': case 'c':
                        if (lng == 2)
                                n = snprintf(text, sizeof(text), one, va_arg(ap, long long));
                        else if (lng == 1)
                                n = snprintf(text, sizeof(text), one, va_arg(ap, long));
                        else if (lng == 3)
                                n = snprintf(text, sizeof(text), one, va_arg(ap, size_t));
                        else if (lng == 4)
                                n = snprintf(text, sizeof(text), one, va_arg(ap, intmax_t));
                        else if (lng == 5)
                                n = snprintf(text, sizeof(text), one, va_arg(ap, ptrdiff_t));
                        else
                                n = snprintf(text, sizeof(text), one, va_arg(ap, int));
                        break;
                case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': case 'a': case 'A':
                        if (lng == 6)
                                n = snprintf(text, sizeof(text), one, va_arg(ap, long double));
                        else
                                n = snprintf(text, sizeof(text), one, va_arg(ap, double));
                        break;
                case 'p':
                        n = snprintf(text, sizeof(text), one, va_arg(ap, void *));
                        break;
                default:
                        n = snprintf(text, sizeof(text), "%%%c", conv); /* unknown: shown, no argument taken */
                        break;
                }
#pragma GCC diagnostic pop
                if (n > 0)
                        puts_raw(&o, text, (size_t)n < sizeof(text) ? (size_t)n : sizeof(text) - 1);
        }
        errno = saved;
        return (int)o.len;
}

void log_eventv(enum log_level level, const char *msg, const char *fields, va_list ap)
{
        if (level < log_min)
                return;
        int saved = errno; /* fields may use %m */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        char when[32];
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
        char qmsg[512];
        log_quote(qmsg, sizeof(qmsg), msg);
        char rest[1024] = "";
        if (fields) {
                errno = saved;
                rest[0] = ' ';
                log_format_fields(rest + 1, sizeof(rest) - 1, fields, ap);
        }
        fprintf(log_stream ? log_stream : stderr, "ts=%s.%03ldZ level=%s component=%s msg=%s%s\n", when,
                ts.tv_nsec / 1000000, level_names[level], log_component, qmsg, rest);
        errno = saved;
}

void log_event(enum log_level level, const char *msg, const char *fields, ...)
{
        va_list ap;
        va_start(ap, fields);
        log_eventv(level, msg, fields, ap);
        va_end(ap);
}
