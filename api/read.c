/* read.c — helpers the read-side handlers share (read.h). */
#include "read.h"

#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int api_fail(struct api_error *err, int status, const char *code, const char *field, const char *fmt, ...)
{
        err->status = status;
        snprintf(err->code, sizeof(err->code), "%s", code);
        snprintf(err->field, sizeof(err->field), "%s", field ? field : "");
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof(err->message), fmt, ap);
        va_end(ap);
        return status >= 500 ? -EIO : -EINVAL;
}

static int digits(const char *s, int n, int *ret)
{
        int v = 0;
        for (int i = 0; i < n; i++) {
                if (!isdigit((unsigned char)s[i]))
                        return -EINVAL;
                v = v * 10 + (s[i] - '0');
        }
        *ret = v;
        return 0;
}

static bool leap(int y)
{
        return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

int read_time_parse(const char *s, int64_t *ret_us)
{
        static const int mdays[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
        int y, mo, d, h, mi, se, oh = 0, om = 0;
        if (!s || strlen(s) < 20)
                return -EINVAL;
        if (digits(s, 4, &y) || s[4] != '-' || digits(s + 5, 2, &mo) || s[7] != '-' || digits(s + 8, 2, &d) ||
            (s[10] != 'T' && s[10] != 't') || digits(s + 11, 2, &h) || s[13] != ':' || digits(s + 14, 2, &mi) ||
            s[16] != ':' || digits(s + 17, 2, &se))
                return -EINVAL;
        /* before 1970 nothing was metered, and PostgreSQL has no year 0 */
        if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] + (mo == 2 && leap(y)) || h > 23 || mi > 59 || se > 59)
                return -EINVAL;
        const char *p = s + 19;
        int64_t frac_us = 0;
        if (*p == '.') {
                p++;
                int n = 0;
                for (; isdigit((unsigned char)*p); p++, n++) {
                        if (n < 6)
                                frac_us = frac_us * 10 + (*p - '0');
                }
                if (n == 0 || n > 9)
                        return -EINVAL;
                for (; n < 6; n++)
                        frac_us *= 10;
        }
        int sign = 0;
        if ((*p == 'Z' || *p == 'z') && p[1] == '\0') {
                sign = 0;
        } else if ((*p == '+' || *p == '-') && strlen(p) == 6 && !digits(p + 1, 2, &oh) && p[3] == ':' &&
                   !digits(p + 4, 2, &om) && oh <= 23 && om <= 59) {
                sign = *p == '+' ? 1 : -1;
        } else {
                return -EINVAL;
        }
        struct tm tm = { .tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h, .tm_min = mi, .tm_sec = se };
        int64_t t = (int64_t)timegm(&tm) - (int64_t)sign * (oh * 3600 + om * 60);
        *ret_us = t * 1000000 + frac_us;
        return 0;
}

void read_time_format(char *buf, size_t size, int64_t us)
{
        int64_t sec = us >= 0 ? us / 1000000 : -((-us + 999999) / 1000000);
        int64_t frac = us - sec * 1000000;
        time_t t = (time_t)sec;
        struct tm tm;
        gmtime_r(&t, &tm);
        if (frac)
                snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                         tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long long)frac);
        else
                snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                         tm.tm_hour, tm.tm_min, tm.tm_sec);
}

int read_param_limit(api_param_fn get, void *ctx, int def, int max, int *ret, struct api_error *err)
{
        const char *s = get(ctx, "limit");
        if (!s) {
                *ret = def;
                return 0;
        }
        int v = 0;
        size_t n = strlen(s);
        if (n == 0 || n > 7 || digits(s, (int)n, &v) || v < 1 || v > max)
                return api_fail(err, 400, "invalid_field", "limit", "limit must be an integer from 1 to %d", max);
        *ret = v;
        return 0;
}

char *read_cursor_encode(json_t *array)
{
        char *j = json_dumps(array, JSON_COMPACT);
        if (!j)
                return NULL;
        size_t n = strlen(j);
        char *out = malloc(2 * n + 1);
        if (out) {
                for (size_t i = 0; i < n; i++)
                        snprintf(out + 2 * i, 3, "%02x", (unsigned char)j[i]);
        }
        free(j);
        return out;
}

static int hexval(char c)
{
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        return -1;
}

json_t *read_cursor_decode(const char *s)
{
        size_t n = strlen(s);
        if (n == 0 || n % 2 || n > 8192)
                return NULL;
        char *j = malloc(n / 2 + 1);
        if (!j)
                return NULL;
        for (size_t i = 0; i < n / 2; i++) {
                int hi = hexval(s[2 * i]), lo = hexval(s[2 * i + 1]);
                if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
                        free(j);
                        return NULL;
                }
                j[i] = (char)(hi << 4 | lo);
        }
        j[n / 2] = '\0';
        json_t *a = json_loads(j, 0, NULL);
        free(j);
        if (a && !json_is_array(a)) {
                json_decref(a);
                return NULL;
        }
        return a;
}

int read_json_body(json_t *o, struct api_body *ret, struct api_error *err)
{
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (!s) {
                api_fail(err, 500, "internal", "", "could not make the answer");
                return -ENOMEM;
        }
        ret->data = s;
        ret->len = strlen(s);
        ret->content_type = "application/json";
        return 0;
}

/* The statement's name on a connection: "tally_read_" and a hash of its text
 * and parameter types, so every shape of query is prepared once per connection. */
static void statement_name(const char *sql, int n, const Oid *types, char out[40])
{
        uint64_t h = UINT64_C(14695981039346656037);
        for (const char *p = sql; *p; p++)
                h = (h ^ (unsigned char)*p) * UINT64_C(1099511628211);
        for (int i = 0; types && i < n; i++)
                h = (h ^ (uint64_t)types[i]) * UINT64_C(1099511628211);
        snprintf(out, 40, "tally_read_%016llx", (unsigned long long)h);
}

static bool failed(const PGresult *res)
{
        return PQresultStatus(res) != PGRES_TUPLES_OK;
}

PGresult *read_query_typed(PGconn *db, const char *what, const char *sql, int n, const Oid *types,
                           const char *const *params, struct api_error *err)
{
        char name[40];
        statement_name(sql, n, types, name);
        PGresult *res = PQexecPrepared(db, name, n, params, NULL, NULL, 0);
        const char *state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
        if (failed(res) && state && !strcmp(state, "26000")) { /* invalid_sql_statement_name: not prepared yet */
                PQclear(res);
                /* Without types every parameter is sent as text (casts in the
                 * SQL say what it is), so a parameter a statement does not use
                 * is not an error. */
                Oid text[32];
                for (int i = 0; i < n && i < 32; i++)
                        text[i] = READ_TEXT;
                res = PQprepare(db, name, sql, n, types ? types : n ? text : NULL);
                if (PQresultStatus(res) == PGRES_COMMAND_OK) {
                        PQclear(res);
                        res = PQexecPrepared(db, name, n, params, NULL, NULL, 0);
                }
        }
        if (failed(res)) {
                log_error("could not query", "what=%s error=%s", what,
                          res ? PQresultErrorMessage(res) : PQerrorMessage(db));
                const char *code = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
                bool cancelled = code && strcmp(code, "57014") == 0; /* statement_timeout */
                PQclear(res);
                if (cancelled)
                        api_fail(err, 503, "query_timeout", "",
                                 "reading %s took longer than the server allows: ask for a shorter period or fewer groups",
                                 what);
                else
                        api_fail(err, 500, "internal", "", "could not read %s", what);
                return NULL;
        }
        return res;
}

PGresult *read_query(PGconn *db, const char *what, const char *sql, int n, const char *const *params,
                     struct api_error *err)
{
        return read_query_typed(db, what, sql, n, NULL, params, err);
}

int64_t read_int64(const PGresult *res, int row, int col)
{
        return strtoll(PQgetvalue(res, row, col), NULL, 10);
}
