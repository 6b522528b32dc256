/* usage.c — GET /v1/usage: usage and its cost per period, grouped, rated as
 * docs/billing.md says, in JSON pages or one CSV answer (docs/api-usage.md).
 *
 * Every row is computed in PostgreSQL numeric from usage_hourly's integer base
 * units: each hour is rated with the rate in force at that hour for the
 * account's plan, the row's exact sum is divided once and rounded once, half
 * away from zero, with integer division (div), never through a rounded
 * quotient. The query is always scoped to the caller's account, and to the
 * caller's key when the caller is an API key. Nothing here writes. */
#include "api.h"
#include "csv.h"
#include "read.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GROUP_MAX     4
#define LABEL_NAME_MAX 63
#define CSV_ROWS_MAX  100000
#define RANGE_MAX_US  (INT64_C(366) * 86400 * 1000000)

enum dim { DIM_KEY, DIM_SANDBOX, DIM_LABEL };

struct usage_query {
        int64_t from_us, to_us;
        char from[40], to[40];
        const char *granularity; /* "hour", "day", "month" (static) */
        int ndims;
        enum dim dims[GROUP_MAX];
        char names[GROUP_MAX][LABEL_NAME_MAX + 8]; /* as asked: "key", "sandbox", "label:NAME" */
        char meters[64];                            /* a text[] literal: {cpu,memory} */
        char fingerprint[512];                      /* binds a cursor to the query it came from */
        int limit;                                  /* rows wanted (CSV: the cap) */
        json_t *cursor;                             /* decoded: ["u1", fingerprint, period, meter, g1...] */
        bool utc_days;                              /* the account's days are UTC days (its zone is UTC) */
};

static int parse_time(api_param_fn get, void *ctx, const char *name, int64_t *us, char *text, size_t size,
                      struct api_error *err)
{
        const char *s = get(ctx, name);
        if (!s || !*s)
                return api_fail(err, 400, "invalid_field", name, "%s is required (an RFC 3339 time)", name);
        /* A date alone is that UTC day's midnight. */
        char day[32];
        if (strlen(s) == 10 && snprintf(day, sizeof(day), "%sT00:00:00Z", s) < (int)sizeof(day))
                s = day;
        if (read_time_parse(s, us) < 0)
                return api_fail(err, 400, "invalid_field", name,
                                "%s must be an RFC 3339 time such as 2026-11-01T00:00:00Z, or a date such as "
                                "2026-11-01 (its midnight, UTC; encode + as %%2B)",
                                name);
        if (*us % (INT64_C(3600) * 1000000) != 0)
                return api_fail(err, 400, "invalid_field", name, "%s must fall on a whole UTC hour", name);
        read_time_format(text, size, *us);
        return 0;
}

static int parse_group_by(struct usage_query *q, const char *s, struct api_error *err)
{
        if (!s || !*s)
                return 0;
        const char *p = s;
        for (;;) {
                const char *e = strchr(p, ',');
                size_t n = e ? (size_t)(e - p) : strlen(p);
                if (q->ndims == GROUP_MAX)
                        return api_fail(err, 400, "invalid_field", "group_by", "group_by takes at most %d dimensions",
                                        GROUP_MAX);
                enum dim d;
                if (n == 3 && !memcmp(p, "key", 3)) {
                        d = DIM_KEY;
                } else if (n == 7 && !memcmp(p, "sandbox", 7)) {
                        d = DIM_SANDBOX;
                } else if (n > 6 && !memcmp(p, "label:", 6) && n - 6 <= LABEL_NAME_MAX) {
                        d = DIM_LABEL;
                        for (size_t i = 6; i < n; i++) {
                                if ((unsigned char)p[i] < 0x21 || (unsigned char)p[i] > 0x7e)
                                        return api_fail(err, 400, "invalid_field", "group_by",
                                                        "a label name in group_by is printable ASCII without spaces");
                        }
                } else {
                        return api_fail(err, 400, "invalid_field", "group_by",
                                        "group_by is a comma-separated list of key, sandbox and label:NAME "
                                        "(NAME 1 to %d characters)",
                                        LABEL_NAME_MAX);
                }
                snprintf(q->names[q->ndims], sizeof(q->names[0]), "%.*s", (int)n, p);
                for (int i = 0; i < q->ndims; i++) {
                        if (!strcmp(q->names[i], q->names[q->ndims]))
                                return api_fail(err, 400, "invalid_field", "group_by", "group_by names %s twice",
                                                q->names[i]);
                }
                q->dims[q->ndims++] = d;
                if (!e)
                        return 0;
                p = e + 1;
        }
}

static int parse_meters(struct usage_query *q, const char *s, struct api_error *err)
{
        static const char *const all[] = { "cpu", "memory", "storage" };
        bool want[3] = { false, false, false };
        if (!s || !*s) {
                want[0] = want[1] = want[2] = true;
        } else {
                const char *p = s;
                for (;;) {
                        const char *e = strchr(p, ',');
                        size_t n = e ? (size_t)(e - p) : strlen(p);
                        int found = -1;
                        for (int i = 0; i < 3; i++) {
                                if (strlen(all[i]) == n && !memcmp(p, all[i], n))
                                        found = i;
                        }
                        if (found < 0)
                                return api_fail(err, 400, "invalid_field", "meter",
                                                "meter is one or more of cpu, memory, storage");
                        want[found] = true;
                        if (!e)
                                break;
                        p = e + 1;
                }
        }
        size_t len = 0;
        q->meters[len++] = '{';
        for (int i = 0; i < 3; i++) {
                if (want[i])
                        len += (size_t)snprintf(q->meters + len, sizeof(q->meters) - len, "%s%s",
                                                len > 1 ? "," : "", all[i]);
        }
        snprintf(q->meters + len, sizeof(q->meters) - len, "}");
        return 0;
}

static int parse_query(struct usage_query *q, api_param_fn get, void *ctx, bool csv, struct api_error *err)
{
        int r;
        if ((r = parse_time(get, ctx, "from", &q->from_us, q->from, sizeof(q->from), err)) < 0 ||
            (r = parse_time(get, ctx, "to", &q->to_us, q->to, sizeof(q->to), err)) < 0)
                return r;
        if (q->to_us <= q->from_us)
                return api_fail(err, 400, "invalid_field", "to", "to must be after from");
        if (q->to_us - q->from_us > RANGE_MAX_US)
                return api_fail(err, 400, "invalid_field", "to", "from and to may be at most 366 days apart");
        const char *g = get(ctx, "granularity");
        if (!g || !strcmp(g, "day"))
                q->granularity = "day";
        else if (!strcmp(g, "hour"))
                q->granularity = "hour";
        else if (!strcmp(g, "month"))
                q->granularity = "month";
        else
                return api_fail(err, 400, "invalid_field", "granularity", "granularity is hour, day or month");
        if ((r = parse_group_by(q, get(ctx, "group_by"), err)) < 0 || (r = parse_meters(q, get(ctx, "meter"), err)) < 0)
                return r;
        int n = snprintf(q->fingerprint, sizeof(q->fingerprint), "%s|%s|%s|%s|", q->from, q->to, q->granularity,
                         q->meters);
        for (int i = 0; i < q->ndims && n > 0 && (size_t)n < sizeof(q->fingerprint); i++)
                n += snprintf(q->fingerprint + n, sizeof(q->fingerprint) - (size_t)n, "%s,", q->names[i]);

        const char *cur = get(ctx, "cursor");
        if (csv) {
                if (cur)
                        return api_fail(err, 400, "invalid_field", "cursor",
                                        "a CSV answer holds every row: narrow from and to instead of paging");
                if (get(ctx, "limit"))
                        return api_fail(err, 400, "invalid_field", "limit",
                                        "a CSV answer holds every row: narrow from and to instead of paging");
                q->limit = CSV_ROWS_MAX;
                return 0;
        }
        if ((r = read_param_limit(get, ctx, READ_PAGE_DEFAULT, READ_PAGE_MAX, &q->limit, err)) < 0)
                return r;
        if (cur) {
                json_t *a = read_cursor_decode(cur);
                bool ok = a && json_array_size(a) == (size_t)(4 + q->ndims) &&
                          json_is_string(json_array_get(a, 0)) &&
                          !strcmp(json_string_value(json_array_get(a, 0)), "u1");
                for (size_t i = 1; ok && i < json_array_size(a); i++)
                        ok = json_is_string(json_array_get(a, i));
                if (!ok) {
                        json_decref(a);
                        return api_fail(err, 400, "invalid_field", "cursor", "cursor is not one this API gave");
                }
                if (strcmp(json_string_value(json_array_get(a, 1)), q->fingerprint) != 0) {
                        json_decref(a);
                        return api_fail(err, 400, "invalid_field", "cursor",
                                        "cursor belongs to a query with other from, to, granularity, group_by "
                                        "or meter");
                }
                q->cursor = a;
        }
        return 0;
}

/* SQL text appended piece by piece; the pieces are fixed text and $n
 * placeholders, never values. */
struct sqlbuf {
        char s[8192];
        size_t n;
};

static void add(struct sqlbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(struct sqlbuf *b, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        int r = vsnprintf(b->s + b->n, sizeof(b->s) - b->n, fmt, ap);
        va_end(ap);
        if (r > 0)
                b->n = b->n + (size_t)r < sizeof(b->s) ? b->n + (size_t)r : sizeof(b->s) - 1;
}

/* Parameters: $1 account, $2 key (NULL: the whole account), $3 from, $4 to,
 * $5 granularity, $6 meters, $7 cursor period (NULL: first page), $8 cursor
 * meter, $9 row limit, then per dimension i (0-based) $(10+2i) its cursor key
 * and $(11+2i) its label name (NULL unless a label).
 *
 * Each dimension's value is carried as a sort key that is never NULL ('0' for
 * no value, '1' || value otherwise) in the C collation, so rows order and
 * compare with the cursor the same way whatever the values and the locale. */
static void add_dims(const struct usage_query *q, struct sqlbuf *b)
{
        for (int i = 0; i < q->ndims; i++) {
                switch (q->dims[i]) {
                case DIM_KEY:
                        add(b, ", ('1' || u.key_id) COLLATE \"C\" AS g%d", i);
                        break;
                case DIM_SANDBOX:
                        add(b, ", ('1' || u.sandbox_id) COLLATE \"C\" AS g%d", i);
                        break;
                case DIM_LABEL:
                        add(b, ", coalesce('1' || (s.labels ->> $%d::text), '0') COLLATE \"C\" AS g%d", 11 + 2 * i, i);
                        break;
                }
        }
}

/* Whole UTC days by day or month, grouped by nothing finer than the key,
 * read the per-key daily rollup (sql/005, sql/007), whose rated sums are the same exact Σ quantity x rate per hour,
 * when the rollup's days are UTC days (the account's time zone is UTC: its rows are the account's days, sql/017);
 * anything else reads usage_hourly and rates each hour here. */
static bool whole_days(const struct usage_query *q)
{
        const int64_t day_us = INT64_C(86400) * 1000000;
        return q->utc_days && strcmp(q->granularity, "hour") != 0 && q->from_us % day_us == 0 &&
               q->to_us % day_us == 0;
}

static void build_sql(const struct usage_query *q, struct sqlbuf *b)
{
        bool labels = false, per_sandbox = false;
        for (int i = 0; i < q->ndims; i++) {
                labels |= q->dims[i] == DIM_LABEL;
                per_sandbox |= q->dims[i] != DIM_KEY;
        }
        /* The daily rollup is per key (sql/007): a dimension that needs the
         * sandbox reads usage_hourly. */
        if (whole_days(q) && !per_sandbox) {
                add(b, "WITH h AS (SELECT date_trunc($5, u.day::timestamp) AT TIME ZONE 'UTC' AS period");
                add_dims(q, b);
                add(b, ", sum(u.cpu_ns) AS cpu, sum(u.mem_byte_ns) AS mem, sum(u.storage_byte_ns) AS st,"
                       " sum(u.cpu_rated) AS cr, sum(u.memory_rated) AS mr, sum(u.storage_rated) AS sr FROM %s u",
                    "usage_key_daily");
                if (labels)
                        add(b, " LEFT JOIN sandboxes s ON s.id = u.sandbox_id AND s.account_id = $1");
                add(b, " WHERE u.account_id = $1 AND ($2::text IS NULL OR u.key_id = $2::text)"
                       " AND u.day >= ($3::timestamptz AT TIME ZONE 'UTC')::date"
                       " AND u.day < ($4::timestamptz AT TIME ZONE 'UTC')::date"
                       " AND ($7::timestamptz IS NULL OR u.day >= ($7::timestamptz AT TIME ZONE 'UTC')::date)"
                       " GROUP BY 1");
                for (int i = 0; i < q->ndims; i++)
                        add(b, ", g%d", i);
                add(b, "), x AS (SELECT h.period");
                for (int i = 0; i < q->ndims; i++)
                        add(b, ", h.g%d", i);
                add(b, ", m.meter COLLATE \"C\" AS meter, m.q, m.rated FROM h CROSS JOIN LATERAL"
                       " (VALUES ('cpu', h.cpu, h.cr), ('memory', h.mem, h.mr), ('storage', h.st, h.sr))"
                       " AS m(meter, q, rated) WHERE m.meter = ANY ($6::text[])),");
        } else {
                add(b, "WITH p AS MATERIALIZED (SELECT account_plan($1) AS plan),"
                       " h AS (SELECT date_trunc($5, u.hour, 'UTC') AS period, u.hour");
                add_dims(q, b);
                add(b, ", sum(u.cpu_ns)::numeric AS cpu, sum(u.mem_byte_ns) AS mem, sum(u.storage_byte_ns) AS st"
                       " FROM usage_hourly u");
                if (labels)
                        add(b, " LEFT JOIN sandboxes s ON s.id = u.sandbox_id AND s.account_id = $1");
                add(b, " WHERE u.account_id = $1 AND ($2::text IS NULL OR u.key_id = $2::text)"
                       " AND u.hour >= $3::timestamptz AND u.hour < $4::timestamptz"
                       " AND ($7::timestamptz IS NULL OR u.hour >= $7::timestamptz)"
                       " GROUP BY 1, 2");
                for (int i = 0; i < q->ndims; i++)
                        add(b, ", g%d", i);
                add(b, "), r AS (SELECT hh.hour, m.meter, coalesce(rate_at(p.plan, m.meter, hh.hour), 0) AS rate"
                       " FROM (SELECT DISTINCT hour FROM h) hh CROSS JOIN p CROSS JOIN unnest($6::text[]) AS m(meter)),"
                       " x AS (SELECT h.period");
                for (int i = 0; i < q->ndims; i++)
                        add(b, ", h.g%d", i);
                add(b, ", m.meter COLLATE \"C\" AS meter, m.q, m.q * r.rate AS rated FROM h"
                       " CROSS JOIN LATERAL (VALUES ('cpu', h.cpu), ('memory', h.mem), ('storage', h.st)) AS m(meter, q)"
                       " JOIN r ON r.hour = h.hour AND r.meter = m.meter),");
        }
        add(b, " y AS (SELECT period");
        for (int i = 0; i < q->ndims; i++)
                add(b, ", g%d", i);
        add(b, ", meter, sum(q) AS q, sum(rated) AS rated, meter_unit_base(meter) AS base FROM x GROUP BY period");
        for (int i = 0; i < q->ndims; i++)
                add(b, ", g%d", i);
        add(b, ", meter HAVING $7::timestamptz IS NULL OR (period");
        for (int i = 0; i < q->ndims; i++)
                add(b, ", g%d", i);
        add(b, ", meter) > ($7::timestamptz");
        for (int i = 0; i < q->ndims; i++)
                add(b, ", $%d::text COLLATE \"C\"", 10 + 2 * i);
        add(b, ", $8::text COLLATE \"C\")");
        add(b, " ORDER BY period");
        for (int i = 0; i < q->ndims; i++)
                add(b, ", g%d", i);
        add(b, ", meter LIMIT $9::int)"
               /* Column 0: the period's start in Unix seconds (C makes its
                * bounds and the cursor's text from it), 1: meter, 2: quantity
                * in billing units to 9 decimals, 3: quantity in base units,
                * 4: cost in nano-dollars, 5: in cents, 6...: the dimensions'
                * sort keys. Formatting is left to C: to_char and interval
                * arithmetic per row cost the database more than the sums. */
               " SELECT extract(epoch FROM period)::bigint, meter,"
               " (div(2 * q * 1000000000 + base, 2 * base) * 0.000000001)::text,"
               " q::text,"
               " div(2 * rated + base, 2 * base)::text,"
               " div(2 * rated + base * 10000000, 2 * base * 10000000)::text");
        for (int i = 0; i < q->ndims; i++)
                add(b, ", g%d", i);
        add(b, " FROM y ORDER BY period");
        for (int i = 0; i < q->ndims; i++)
                add(b, ", g%d", i);
        add(b, ", meter");
}

enum { COL_PERIOD, COL_METER, COL_QUANTITY, COL_BASE, COL_COST, COL_CENTS, COL_DIMS };

/* A row's bounds: its period [start, start + one granularity) clipped to the
 * query's [from, to), as RFC 3339 text. */
static void row_bounds(const struct usage_query *q, const PGresult *res, int row, char start[40], char end[40],
                       char period[40])
{
        int64_t p = read_int64(res, row, COL_PERIOD) * 1000000, next;
        if (!strcmp(q->granularity, "hour")) {
                next = p + INT64_C(3600) * 1000000;
        } else if (!strcmp(q->granularity, "day")) {
                next = p + INT64_C(86400) * 1000000;
        } else {
                time_t t = (time_t)(p / 1000000);
                struct tm tm;
                gmtime_r(&t, &tm);
                tm.tm_mon++; /* timegm carries into the next year */
                next = (int64_t)timegm(&tm) * 1000000;
        }
        if (period)
                read_time_format(period, 40, p);
        read_time_format(start, 40, p > q->from_us ? p : q->from_us);
        read_time_format(end, 40, next < q->to_us ? next : q->to_us);
}

/* A JSON string (quoted, escaped as RFC 8259 says) onto f. The database's
 * text is valid UTF-8, so bytes from 0x20 up pass as they are. */
static void json_put(FILE *f, const char *s)
{
        /* the bytes to escape: '"', '\\' and the controls 0x01-0x1f */
        static const char special[] = "\"\\\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f"
                                      "\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f";
        fputc('"', f);
        for (;;) {
                size_t n = strcspn(s, special);
                fwrite(s, 1, n, f);
                s += n;
                if (!*s)
                        break;
                unsigned char c = (unsigned char)*s++;
                if (c == '"' || c == '\\')
                        fprintf(f, "\\%c", c);
                else
                        fprintf(f, "\\u%04x", c);
        }
        fputc('"', f);
}

static const char *unit_of(const char *meter)
{
        return !strcmp(meter, "cpu") ? "vCPU-hour" : !strcmp(meter, "memory") ? "GiB-hour" : "GB-month";
}

static const char *base_unit_of(const char *meter)
{
        return !strcmp(meter, "cpu") ? "cpu-ns" : "byte-ns";
}

/* A dimension's value from its sort key: NULL when there is none. */
static const char *dim_value(const char *key)
{
        return key[0] == '1' ? key + 1 : NULL;
}

static int render_csv(const struct usage_query *q, PGresult *res, int rows, struct api_body *ret,
                      struct api_error *err)
{
        struct csv c = { 0 };
        csv_field(&c, "period_start");
        csv_field(&c, "period_end");
        for (int i = 0; i < q->ndims; i++)
                csv_field(&c, q->names[i]);
        static const char *const tail[] = { "meter", "unit", "quantity", "quantity_base", "base_unit",
                                            "cost_nanodollars", "cost_cents" };
        for (size_t i = 0; i < sizeof(tail) / sizeof(tail[0]); i++)
                csv_field(&c, tail[i]);
        csv_end_record(&c);
        for (int r = 0; r < rows; r++) {
                const char *meter = PQgetvalue(res, r, COL_METER);
                char start[40], end[40];
                row_bounds(q, res, r, start, end, NULL);
                csv_field(&c, start);
                csv_field(&c, end);
                for (int i = 0; i < q->ndims; i++)
                        csv_field(&c, dim_value(PQgetvalue(res, r, COL_DIMS + i)));
                csv_field(&c, meter);
                csv_field(&c, unit_of(meter));
                csv_field(&c, PQgetvalue(res, r, COL_QUANTITY));
                csv_field(&c, PQgetvalue(res, r, COL_BASE));
                csv_field(&c, base_unit_of(meter));
                csv_field(&c, PQgetvalue(res, r, COL_COST));
                csv_field(&c, PQgetvalue(res, r, COL_CENTS));
                csv_end_record(&c);
        }
        size_t len;
        char *text = csv_take(&c, &len);
        if (!text) {
                api_fail(err, 500, "internal", "", "could not make the answer");
                return -ENOMEM;
        }
        ret->data = text;
        ret->len = len;
        ret->content_type = "text/csv; charset=utf-8";
        return 0;
}

/* The JSON page, written straight out (a page of 1,000 rows through jansson's
 * objects cost more than the query): the same document, keys in this order,
 * as docs/api-usage.md shows. */
static int render_json(const struct usage_query *q, PGresult *res, int rows, bool more, struct api_body *ret,
                       struct api_error *err)
{
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f)
                return api_fail(err, 500, "internal", "", "could not make the answer");
        __fsetlocking(f, FSETLOCKING_BYCALLER); /* one thread writes it: no lock per call */
        fputs("{\"from\":", f);
        json_put(f, q->from);
        fputs(",\"to\":", f);
        json_put(f, q->to);
        fputs(",\"granularity\":", f);
        json_put(f, q->granularity);
        fputs(",\"group_by\":[", f);
        for (int i = 0; i < q->ndims; i++) {
                if (i)
                        fputc(',', f);
                json_put(f, q->names[i]);
        }
        fputs("],\"data\":[", f);
        char last_period[40] = "";
        for (int r = 0; r < rows; r++) {
                const char *meter = PQgetvalue(res, r, COL_METER);
                char start[40], end[40];
                row_bounds(q, res, r, start, end, r == rows - 1 ? last_period : NULL);
                fputs(r ? ",{\"period_start\":" : "{\"period_start\":", f);
                json_put(f, start);
                fputs(",\"period_end\":", f);
                json_put(f, end);
                fputs(",\"group\":{", f);
                for (int i = 0; i < q->ndims; i++) {
                        const char *v = dim_value(PQgetvalue(res, r, COL_DIMS + i));
                        if (i)
                                fputc(',', f);
                        json_put(f, q->names[i]);
                        fputc(':', f);
                        if (v)
                                json_put(f, v);
                        else
                                fputs("null", f);
                }
                fputs("},\"meter\":", f);
                json_put(f, meter);
                fputs(",\"unit\":", f);
                json_put(f, unit_of(meter));
                fputs(",\"quantity\":", f);
                json_put(f, PQgetvalue(res, r, COL_QUANTITY));
                fputs(",\"quantity_base\":", f);
                json_put(f, PQgetvalue(res, r, COL_BASE));
                fputs(",\"base_unit\":", f);
                json_put(f, base_unit_of(meter));
                fprintf(f, ",\"cost_nanodollars\":%lld,\"cost_cents\":%lld}", (long long)read_int64(res, r, COL_COST),
                        (long long)read_int64(res, r, COL_CENTS));
        }
        fputs("],\"next_cursor\":", f);
        char *c = NULL;
        if (more && rows > 0) {
                int last = rows - 1;
                json_t *a = json_pack("[s, s, s, s]", "u1", q->fingerprint, last_period, PQgetvalue(res, last, COL_METER));
                for (int i = 0; i < q->ndims; i++)
                        json_array_append_new(a, json_string(PQgetvalue(res, last, COL_DIMS + i)));
                c = read_cursor_encode(a);
                json_decref(a);
        }
        if (c)
                json_put(f, c);
        else
                fputs("null", f);
        free(c);
        fputc('}', f);
        if (fclose(f) != 0 || !buf) {
                free(buf);
                return api_fail(err, 500, "internal", "", "could not make the answer");
        }
        ret->data = buf;
        ret->len = len;
        ret->content_type = "application/json";
        return 0;
}

int api_usage(PGconn *db, const struct api_caller *c, api_param_fn get, void *ctx, bool csv, struct api_body *ret,
              struct api_error *err)
{
        /* CSV is asked for by the server (Accept: text/csv) or by csv=true. */
        const char *cp = get(ctx, "csv");
        if (cp && strcmp(cp, "true") != 0 && strcmp(cp, "false") != 0)
                return api_fail(err, 400, "invalid_field", "csv", "csv is true or false");
        csv = csv || (cp && !strcmp(cp, "true"));
        struct usage_query q = { 0 };
        int r = parse_query(&q, get, ctx, csv, err);
        if (r < 0)
                return r;
        q.utc_days = true;
        if (whole_days(&q)) {
                const char *zp[] = { c->account };
                PGresult *zr = read_query(db, "usage zone", "SELECT account_zone($1::text) = 'UTC'", 1, zp, err);
                if (!zr) {
                        json_decref(q.cursor);
                        return -EIO;
                }
                q.utc_days = PQntuples(zr) == 1 && PQgetvalue(zr, 0, 0)[0] == 't';
                PQclear(zr);
        }
        struct sqlbuf b = { .n = 0 };
        build_sql(&q, &b);

        char limit[16];
        snprintf(limit, sizeof(limit), "%d", q.limit + 1);
        const char *params[10 + 2 * GROUP_MAX] = { 0 };
        params[0] = c->account;
        params[1] = c->key[0] ? c->key : NULL;
        params[2] = q.from;
        params[3] = q.to;
        params[4] = q.granularity;
        params[5] = q.meters;
        params[6] = q.cursor ? json_string_value(json_array_get(q.cursor, 2)) : NULL;
        params[7] = q.cursor ? json_string_value(json_array_get(q.cursor, 3)) : NULL;
        params[8] = limit;
        for (int i = 0; i < q.ndims; i++) {
                params[9 + 2 * i] = q.cursor ? json_string_value(json_array_get(q.cursor, 4 + (size_t)i)) : NULL;
                params[10 + 2 * i] = q.dims[i] == DIM_LABEL ? q.names[i] + 6 : NULL;
        }
        /* Typed, so that from, to and the cursor's period are parsed once, not
         * once per row compared (a generic plan keeps their casts per row). */
        Oid types[10 + 2 * GROUP_MAX] = { READ_TEXT, READ_TEXT, READ_TIMESTAMPTZ, READ_TIMESTAMPTZ, READ_TEXT,
                                          READ_TEXT_ARRAY, READ_TIMESTAMPTZ, READ_TEXT, READ_INT4 };
        for (int i = 9; i < 9 + 2 * q.ndims; i++)
                types[i] = READ_TEXT;
        PGresult *res = read_query_typed(db, "usage", b.s, 9 + 2 * q.ndims, types, params, err);
        if (!res) {
                json_decref(q.cursor);
                return -EIO;
        }
        int rows = PQntuples(res);
        bool more = rows > q.limit;
        if (more)
                rows = q.limit;
        if (csv && more)
                r = api_fail(err, 422, "too_many_rows", "to",
                             "more than %d rows: narrow from and to, or use JSON pages", CSV_ROWS_MAX);
        else if (csv)
                r = render_csv(&q, res, rows, ret, err);
        else
                r = render_json(&q, res, rows, more, ret, err);
        PQclear(res);
        json_decref(q.cursor);
        return r;
}
