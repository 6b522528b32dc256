/* invoices.c — GET /v1/invoices, /v1/invoices/{YYYY-MM}, /v1/invoices/current:
 * a person's view of the account's monthly invoices (docs/finance.md, "The
 * same rows over HTTP"; docs/billing.md, "Invoices"). The rows are sql/008's:
 * closed invoices from the closed_* tables (never recomputed), open months as
 * previews (invoice_preview_lines), and the current month's projection
 * (invoice_projection_lines), each marked by its status. JSON, or CSV of the
 * lines with Accept: text/csv or csv=true. Every query is scoped to the
 * caller's account in SQL; nothing here writes. */
#include "invoices.h"

#include "api.h"
#include "csv.h"
#include "read.h"
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lines of the account: closed and preview (and, when $3, the current month's
 * projection), optionally of one month ($2, its first day). */
#define LINES_SQL                                                                                                     \
        "SELECT to_char(l.month, 'YYYY-MM'), 'closed', l.line_no, l.kind, l.meter, to_char(l.for_month, 'YYYY-MM'),"  \
        "       l.quantity::text, meter_unit(l.meter), l.quantity_base::text, meter_base_unit(l.meter),"              \
        "       l.amount_nanodollars, l.amount_cents"                                                                 \
        "  FROM closed_invoice_lines l WHERE l.account_id = $1 AND ($2::date IS NULL OR l.month = $2::date)"          \
        " UNION ALL "                                                                                                 \
        "SELECT to_char(p.month, 'YYYY-MM'), 'preview', p.line_no, p.kind, p.meter, to_char(p.for_month, 'YYYY-MM'),"  \
        "       p.quantity::text, p.unit, p.quantity_base::text, meter_base_unit(p.meter),"                           \
        "       p.amount_nanodollars, p.amount_cents"                                                                 \
        "  FROM invoice_preview_lines($1) p WHERE $2::date IS NULL OR p.month = $2::date"                             \
        " UNION ALL "                                                                                                 \
        "SELECT to_char(e.month, 'YYYY-MM'), 'estimate', e.line_no, e.kind, e.meter, to_char(e.for_month, 'YYYY-MM'),"  \
        "       e.quantity::text, e.unit, e.quantity_base::text, meter_base_unit(e.meter),"                           \
        "       e.amount_nanodollars, e.amount_cents"                                                                 \
        "  FROM invoice_projection_lines($1) e WHERE $3::boolean AND ($2::date IS NULL OR e.month = $2::date)"        \
        " ORDER BY 1 DESC, 2, 3"

/* The per-key breakdown of one month. */
#define KEYS_SQL                                                                                                      \
        "SELECT k.key_id, k.kind, k.meter, to_char(k.for_month, 'YYYY-MM'), k.quantity::text, meter_unit(k.meter),"   \
        "       k.amount_nanodollars, k.amount_cents"                                                                 \
        "  FROM closed_invoice_key_lines k WHERE k.account_id = $1 AND k.month = $2::date"                            \
        " UNION ALL "                                                                                                 \
        "SELECT k.key_id, k.kind, k.meter, to_char(k.for_month, 'YYYY-MM'), k.quantity::text, k.unit,"                \
        "       k.amount_nanodollars, k.amount_cents"                                                                 \
        "  FROM invoice_preview_key_lines($1) k WHERE k.month = $2::date"                                             \
        " ORDER BY 1, 2, 4, 3"

/* Invoice heads: closed ones, then the open months' previews. */
#define HEADS_SQL                                                                                                     \
        "SELECT to_char(c.month, 'YYYY-MM'), 'closed', c.total_nanodollars, c.total_cents, c.line_count,"             \
        "       to_char(c.closed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"                             \
        "  FROM closed_invoices c WHERE c.account_id = $1 AND ($2::date IS NULL OR c.month = $2::date)"               \
        " UNION ALL "                                                                                                 \
        "SELECT to_char(p.month, 'YYYY-MM'), 'preview', sum(p.amount_nanodollars)::bigint,"                           \
        "       sum(p.amount_cents)::bigint, count(*)::integer, NULL"                                                 \
        "  FROM invoice_preview_lines($1) p WHERE $2::date IS NULL OR p.month = $2::date GROUP BY p.month"            \
        " UNION ALL "                                                                                                 \
        "SELECT to_char(e.month, 'YYYY-MM'), 'estimate', sum(e.amount_nanodollars)::bigint,"                          \
        "       sum(e.amount_cents)::bigint, count(*)::integer, NULL"                                                 \
        "  FROM invoice_projection_lines($1) e WHERE $3::boolean AND ($2::date IS NULL OR e.month = $2::date)"        \
        " GROUP BY e.month"                                                                                           \
        " ORDER BY 1 DESC, 2"

#define CURRENT_MONTH_SQL "SELECT to_char(month_of(now()), 'YYYY-MM')"

enum { L_MONTH, L_STATUS, L_NO, L_KIND, L_METER, L_FOR, L_QTY, L_UNIT, L_QBASE, L_BUNIT, L_ND, L_CENTS };

/* "2026-11" -> "2026-11-01" into day (11 bytes). */
static bool month_parse(const char *s, char day[11])
{
        if (!s || strlen(s) != 7 || s[4] != '-')
                return false;
        for (int i = 0; i < 7; i++)
                if (i != 4 && (s[i] < '0' || s[i] > '9'))
                        return false;
        int m = (s[5] - '0') * 10 + (s[6] - '0');
        if (m < 1 || m > 12 || s[0] == '0')
                return false;
        snprintf(day, 11, "%.7s-01", s);
        return true;
}

/* The period of "YYYY-MM" as RFC 3339 instants. */
static void month_period(const char *month, char start[32], char end[32])
{
        int y = atoi(month), m = atoi(month + 5);
        snprintf(start, 32, "%04d-%02d-01T00:00:00Z", y, m);
        if (++m > 12) {
                m = 1;
                y++;
        }
        snprintf(end, 32, "%04d-%02d-01T00:00:00Z", y, m);
}

static json_t *line_json(PGresult *res, int i)
{
        json_t *o = json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I}", "line_no",
                              atoi(PQgetvalue(res, i, L_NO)), "kind", PQgetvalue(res, i, L_KIND), "meter",
                              PQgetvalue(res, i, L_METER), "for_month", PQgetvalue(res, i, L_FOR), "quantity",
                              PQgetvalue(res, i, L_QTY), "unit", PQgetvalue(res, i, L_UNIT), "quantity_base",
                              PQgetvalue(res, i, L_QBASE), "base_unit", PQgetvalue(res, i, L_BUNIT),
                              "amount_nanodollars", (json_int_t)read_int64(res, i, L_ND), "amount_cents",
                              (json_int_t)read_int64(res, i, L_CENTS));
        return o;
}

static int lines_csv(PGresult *res, struct api_body *ret, struct api_error *err)
{
        static const char *const head[] = { "month",         "status",    "line_no",           "kind",
                                            "meter",         "for_month", "quantity",          "unit",
                                            "quantity_base", "base_unit", "amount_nanodollars", "amount_cents" };
        struct csv c = { 0 };
        for (size_t i = 0; i < sizeof(head) / sizeof(*head); i++)
                csv_field(&c, head[i]);
        csv_end_record(&c);
        for (int i = 0; i < PQntuples(res); i++) {
                for (int f = 0; f <= L_CENTS; f++)
                        csv_field(&c, PQgetvalue(res, i, f));
                csv_end_record(&c);
        }
        size_t len;
        char *text = csv_take(&c, &len);
        if (!text)
                return api_fail(err, 500, "internal", "", "could not make the answer");
        ret->data = text;
        ret->len = len;
        ret->content_type = "text/csv; charset=utf-8";
        return 0;
}

/* One invoice head (row i of HEADS_SQL) as JSON, with its lines of `status`
 * from the lines result (ordered by month desc, status, line). */
static json_t *invoice_json(PGresult *heads, int i, PGresult *lines)
{
        const char *month = PQgetvalue(heads, i, 0), *status = PQgetvalue(heads, i, 1);
        char start[32], end[32];
        month_period(month, start, end);
        json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:i, s:o}", "month", month, "status", status,
                              "period_start", start, "period_end", end, "currency", "USD", "total_nanodollars",
                              (json_int_t)read_int64(heads, i, 2), "total_cents", (json_int_t)read_int64(heads, i, 3),
                              "line_count", atoi(PQgetvalue(heads, i, 4)), "closed_at",
                              PQgetisnull(heads, i, 5) ? json_null() : json_string(PQgetvalue(heads, i, 5)));
        if (lines) {
                json_t *a = json_array();
                for (int k = 0; k < PQntuples(lines); k++)
                        if (!strcmp(PQgetvalue(lines, k, L_MONTH), month) &&
                            !strcmp(PQgetvalue(lines, k, L_STATUS), status))
                                json_array_append_new(a, line_json(lines, k));
                json_object_set_new(o, "lines", a);
        }
        return o;
}

static json_t *keys_json(PGresult *res)
{
        json_t *a = json_array();
        for (int i = 0; i < PQntuples(res); i++)
                json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I}", "key",
                                                   PQgetvalue(res, i, 0), "kind", PQgetvalue(res, i, 1), "meter",
                                                   PQgetvalue(res, i, 2), "for_month", PQgetvalue(res, i, 3),
                                                   "quantity", PQgetvalue(res, i, 4), "unit", PQgetvalue(res, i, 5),
                                                   "amount_nanodollars", (json_int_t)read_int64(res, i, 6),
                                                   "amount_cents", (json_int_t)read_int64(res, i, 7)));
        return a;
}

/* CSV is asked for by Accept: text/csv or by csv=true (a plain link, as the
 * dashboard's download, cannot set a header). 0 or 1; a negative errno when
 * csv is neither true nor false (err says why). */
static int wants_csv(struct api_req *r, struct api_error *err)
{
        const char *accept = req_header(r, "Accept");
        const char *cp = req_param(r, "csv");
        if (cp && strcmp(cp, "true") != 0 && strcmp(cp, "false") != 0)
                return api_fail(err, 400, "invalid_field", "csv", "csv is true or false");
        return (accept && strstr(accept, "text/csv")) || (cp && !strcmp(cp, "true"));
}

/* GET /v1/invoices: every invoice of the account, newest first (no lines);
 * CSV: every line of them. */
int h_invoices_list(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        PGconn *db = req_db(r);
        const char *p[] = { r->caller.account, NULL, "false" };
        struct api_body b = { 0 };
        int rc, csv = wants_csv(r, err);
        if (csv < 0)
                return csv;
        if (csv) {
                PGresult *lines = read_query(db, "invoice lines", LINES_SQL, 3, p, err);
                if (!lines)
                        return -EIO;
                rc = lines_csv(lines, &b, err);
                PQclear(lines);
                return rc < 0 ? rc : reply_body(out, &b, "tally-invoices.csv");
        }
        PGresult *heads = read_query(db, "invoices", HEADS_SQL, 3, p, err);
        if (!heads)
                return -EIO;
        json_t *data = json_array();
        for (int i = 0; i < PQntuples(heads); i++)
                json_array_append_new(data, invoice_json(heads, i, NULL));
        PQclear(heads);
        rc = read_json_body(json_pack("{s:s, s:o}", "account", r->caller.account, "data", data), &b, err);
        return rc < 0 ? rc : reply_body(out, &b, NULL);
}

/* One month's invoice with its lines and key breakdown; the current month
 * also carries its projection. */
static int invoice_month(struct api_req *r, const char *month, bool current, struct api_reply *out,
                         struct api_error *err)
{
        char day[11];
        if (!month_parse(month, day))
                return api_fail(err, 400, "invalid_field", "month", "the month is YYYY-MM (or current)");
        int csv = wants_csv(r, err);
        if (csv < 0)
                return csv;
        char name[48];
        snprintf(name, sizeof(name), "tally-invoice-%.7s%s.csv", day, current ? "-preview" : "");
        PGconn *db = req_db(r);
        const char *p[] = { r->caller.account, day, current ? "true" : "false" };
        struct api_body b = { 0 };
        int rc;
        PGresult *lines = read_query(db, "invoice lines", LINES_SQL, 3, p, err);
        if (!lines)
                return -EIO;
        if (csv) {
                rc = lines_csv(lines, &b, err);
                PQclear(lines);
                return rc < 0 ? rc : reply_body(out, &b, name);
        }
        PGresult *heads = read_query(db, "invoices", HEADS_SQL, 3, p, err);
        if (!heads) {
                PQclear(lines);
                return -EIO;
        }
        const char *kp[] = { r->caller.account, day };
        PGresult *keys = read_query(db, "invoice key lines", KEYS_SQL, 2, kp, err);
        if (!keys) {
                PQclear(heads);
                PQclear(lines);
                return -EIO;
        }
        json_t *inv = NULL, *projection = json_null();
        for (int i = 0; i < PQntuples(heads); i++) {
                if (!strcmp(PQgetvalue(heads, i, 1), "estimate")) {
                        json_decref(projection);
                        projection = invoice_json(heads, i, lines);
                } else if (!inv) {
                        inv = invoice_json(heads, i, lines);
                }
        }
        if (!inv && current) {
                /* nothing used yet this month: an empty preview */
                char start[32], end[32];
                month_period(month, start, end);
                inv = json_pack("{s:s, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:n, s:[]}", "month", month, "status",
                                "preview", "period_start", start, "period_end", end, "currency", "USD",
                                "total_nanodollars", 0, "total_cents", 0, "line_count", 0, "closed_at", "lines");
        }
        if (inv) {
                json_object_set_new(inv, "account", json_string(r->caller.account));
                json_object_set_new(inv, "keys", keys_json(keys));
                if (current)
                        json_object_set_new(inv, "projection", projection);
                else
                        json_decref(projection);
        } else {
                json_decref(projection);
        }
        PQclear(keys);
        PQclear(heads);
        PQclear(lines);
        if (!inv)
                return api_fail(err, 404, "not_found", "month", "no invoice for %s", month);
        rc = read_json_body(inv, &b, err);
        return rc < 0 ? rc : reply_body(out, &b, name);
}

/* GET /v1/invoices/{YYYY-MM} */
int h_invoice_get(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        return invoice_month(r, r->id, false, out, err);
}

/* GET /v1/invoices/current: this month's preview and its end-of-month projection. */
int h_invoice_current(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        struct api_error ignored;
        PGresult *res = read_query(req_db(r), "the current month", CURRENT_MONTH_SQL, 0, NULL, &ignored);
        if (!res)
                return api_fail(err, 500, "internal", NULL, "could not read the current month");
        char month[8];
        snprintf(month, sizeof(month), "%s", PQgetvalue(res, 0, 0));
        PQclear(res);
        return invoice_month(r, month, true, out, err);
}
