/* csv.c — RFC 4180 writer (csv.h), safe to open in a spreadsheet. */
#include "csv.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static void put(struct csv *c, const char *s, size_t n)
{
        if (c->failed)
                return;
        if (c->len + n + 1 > c->cap) {
                size_t cap = c->cap ? c->cap : 4096;
                while (c->len + n + 1 > cap)
                        cap *= 2;
                char *b = realloc(c->buf, cap);
                if (!b) {
                        c->failed = true;
                        return;
                }
                c->buf = b;
                c->cap = cap;
        }
        memcpy(c->buf + c->len, s, n);
        c->len += n;
        c->buf[c->len] = '\0';
}

/* Whether s is a plain decimal number ("-12", "0.000000278"): a spreadsheet
 * reads it as a number, never as a formula, so it is written as it is. */
static bool plain_number(const char *s)
{
        const char *p = s + (*s == '-');
        if (!isdigit((unsigned char)*p))
                return false;
        while (isdigit((unsigned char)*p))
                p++;
        if (*p == '.' && isdigit((unsigned char)p[1]))
                for (p++; isdigit((unsigned char)*p);)
                        p++;
        return *p == '\0';
}

/* A cell a spreadsheet would run as a formula: it starts with = + - @, a tab
 * or a CR (OWASP's CSV injection rule), and is not a plain number. */
bool csv_formula(const char *s)
{
        return s && *s && strchr("=+-@\t\r", *s) && !plain_number(s);
}

void csv_field(struct csv *c, const char *s)
{
        if (c->field_open)
                put(c, ",", 1);
        c->field_open = true;
        if (!s)
                return;
        bool formula = csv_formula(s);
        if (!formula && !strpbrk(s, ",\"\r\n")) {
                put(c, s, strlen(s));
                return;
        }
        put(c, "\"", 1);
        if (formula)
                put(c, "'", 1); /* a leading quote: the spreadsheet shows the text and runs nothing */
        for (const char *p = s; *p; p++) {
                if (*p == '"')
                        put(c, "\"\"", 2);
                else
                        put(c, p, 1);
        }
        put(c, "\"", 1);
}

void csv_end_record(struct csv *c)
{
        put(c, "\r\n", 2);
        c->field_open = false;
}

char *csv_take(struct csv *c, size_t *len)
{
        if (!c->buf)
                put(c, "", 0);
        if (c->failed) {
                csv_free(c);
                return NULL;
        }
        char *b = c->buf;
        *len = c->len;
        memset(c, 0, sizeof(*c));
        return b;
}

void csv_free(struct csv *c)
{
        free(c->buf);
        memset(c, 0, sizeof(*c));
}
