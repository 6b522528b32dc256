/* admin_finance.c — tally-admin's billing views for a person at a terminal:
 *
 *   tally-admin invoice [--month YYYY-MM] [--account ID] [--json]
 *       a month's invoices (this month's by default) with their lines, the
 *       per-key breakdown, the free credit and the totals: a closed month's
 *       frozen rows, or an open month's preview as it would close now (and,
 *       this month, the end-of-month estimate);
 *   tally-admin usage --by sandbox|label:NAME [--account ID] [--from D] [--to D] [--json]
 *       usage and cost per sandbox, or per value of one of the sandboxes' labels.
 *
 * The invoice figures are sql/008's rows, the same tally-api gives a person
 * (api/invoices.c) and the finance views give SQL: closed_invoice_* and
 * invoice_preview_*(), never recomputed here. Usage per sandbox is rated as
 * finance.sandbox_daily rates it (usage between two rate changes at the rate
 * in force) over the whole range and rounded once per row. Money is integer
 * nano-dollars and cents as PostgreSQL rounded them: no floating point. Reads
 * only. */
#include "admin.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- invoice ---- */

/* The invoices of month $2 (its first day), of account $1 (NULL: every
 * account): closed ones, or the open month's previews. */
#define HEADS_SQL                                                                                                     \
        "SELECT c.account_id, 'closed', c.plan_id, c.total_nanodollars, c.total_cents, c.line_count,"                 \
        "       c.credit_running_ns, to_char(c.closed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"         \
        "  FROM closed_invoices c WHERE c.month = $2::date AND ($1::text IS NULL OR c.account_id = $1)"               \
        " UNION ALL "                                                                                                 \
        "SELECT p.account_id, 'preview', account_plan(p.account_id), sum(p.amount_nanodollars)::bigint,"              \
        "       sum(p.amount_cents)::bigint, count(*)::integer, sum(p.credit_running_ns)::bigint, NULL"               \
        "  FROM invoice_preview_lines($1) p WHERE p.month = $2::date GROUP BY p.account_id"                           \
        " ORDER BY 1"
enum { H_ACCOUNT, H_STATUS, H_PLAN, H_ND, H_CENTS, H_LINES, H_CREDIT_NS, H_CLOSED_AT };

/* One invoice's lines: account $1, month $2, status $3. */
#define LINES_SQL                                                                                                     \
        "SELECT l.line_no, l.kind, l.meter, to_char(l.for_month, 'YYYY-MM'), l.quantity::text, meter_unit(l.meter),"  \
        "       l.quantity_base::text, meter_base_unit(l.meter), l.amount_nanodollars, l.amount_cents"                \
        "  FROM closed_invoice_lines l WHERE $3 = 'closed' AND l.account_id = $1 AND l.month = $2::date"              \
        " UNION ALL "                                                                                                 \
        "SELECT p.line_no, p.kind, p.meter, to_char(p.for_month, 'YYYY-MM'), p.quantity::text, p.unit,"               \
        "       p.quantity_base::text, meter_base_unit(p.meter), p.amount_nanodollars, p.amount_cents"                \
        "  FROM invoice_preview_lines($1) p WHERE $3 = 'preview' AND p.month = $2::date"                              \
        " ORDER BY 1"
enum { L_NO, L_KIND, L_METER, L_FOR, L_QTY, L_UNIT, L_QBASE, L_BUNIT, L_ND, L_CENTS };

/* The same invoice per API key (usage and adjustments; the credit is the account's). */
#define KEYS_SQL                                                                                                      \
        "SELECT k.key_id, k.kind, k.meter, to_char(k.for_month, 'YYYY-MM'), k.quantity::text, meter_unit(k.meter),"   \
        "       k.amount_nanodollars, k.amount_cents"                                                                 \
        "  FROM closed_invoice_key_lines k WHERE $3 = 'closed' AND k.account_id = $1 AND k.month = $2::date"          \
        " UNION ALL "                                                                                                 \
        "SELECT k.key_id, k.kind, k.meter, to_char(k.for_month, 'YYYY-MM'), k.quantity::text, k.unit,"                \
        "       k.amount_nanodollars, k.amount_cents"                                                                 \
        "  FROM invoice_preview_key_lines($1) k WHERE $3 = 'preview' AND k.month = $2::date"                          \
        " ORDER BY 1, 2, 4, 3"
enum { K_KEY, K_KIND, K_METER, K_FOR, K_QTY, K_UNIT, K_ND, K_CENTS };

/* The current month's end-of-month estimate of account $1 (no rows: nothing used). */
#define ESTIMATE_SQL                                                                                                  \
        "SELECT sum(e.amount_nanodollars)::bigint, sum(e.amount_cents)::bigint"                                      \
        "  FROM invoice_projection_lines($1) e WHERE e.month = $2::date HAVING count(*) > 0"

/* The month asked (or this one), its bounds, whether it is closed, whether it is this month. */
#define MONTH_SQL                                                                                                     \
        "SELECT to_char(m, 'YYYY-MM'), m < first_open_month(), m = month_of(now()), m > month_of(now()),"             \
        "       to_char(month_start(m) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'),"                          \
        "       to_char(month_start((m + interval '1 month')::date) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')," \
        "       $2::text IS NULL OR EXISTS (SELECT 1 FROM accounts WHERE id = $2)"                                    \
        "  FROM (SELECT coalesce($1::date, month_of(now())) AS m) x"

struct month {
        char month[8], first_day[11], start[32], end[32];
        bool closed, current;
};

static int64_t num(PGresult *res, int row, int col)
{
        return PQgetisnull(res, row, col) ? 0 : strtoll(PQgetvalue(res, row, col), NULL, 10);
}

/* cents → "$12.34" / "-$1.71" into buf. */
static const char *cents_text(char *buf, size_t n, int64_t cents)
{
        uint64_t m = cents < 0 ? -(uint64_t)cents : (uint64_t)cents;
        snprintf(buf, n, "%s$%llu.%02llu", cents < 0 ? "-" : "", (unsigned long long)(m / 100),
                 (unsigned long long)(m % 100));
        return buf;
}

/* "YYYY-MM" with a real month: "YYYY-MM-01" into day. */
static bool month_valid(const char *s, char day[11])
{
        if (strlen(s) != 7 || s[4] != '-' || s[0] == '0')
                return false;
        for (int i = 0; i < 7; i++)
                if (i != 4 && (s[i] < '0' || s[i] > '9'))
                        return false;
        int m = (s[5] - '0') * 10 + (s[6] - '0');
        if (m < 1 || m > 12)
                return false;
        snprintf(day, 11, "%.7s-01", s);
        return true;
}

/* One invoice as JSON (the shape of GET /v1/invoices/{month}: money as integers). */
static json_t *invoice_json(const struct month *m, PGresult *heads, int i, PGresult *lines, PGresult *keys,
                            PGresult *est)
{
        json_t *ls = json_array(), *ks = json_array();
        int64_t credit_nd = 0, credit_cents = 0;
        const char *credit_hours = "0";
        for (int r = 0; lines && r < PQntuples(lines); r++) {
                json_array_append_new(
                        ls, json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I}", "line_no",
                                      atoi(PQgetvalue(lines, r, L_NO)), "kind", PQgetvalue(lines, r, L_KIND), "meter",
                                      PQgetvalue(lines, r, L_METER), "for_month", PQgetvalue(lines, r, L_FOR),
                                      "quantity", PQgetvalue(lines, r, L_QTY), "unit", PQgetvalue(lines, r, L_UNIT),
                                      "quantity_base", PQgetvalue(lines, r, L_QBASE), "base_unit",
                                      PQgetvalue(lines, r, L_BUNIT), "amount_nanodollars",
                                      (json_int_t)num(lines, r, L_ND), "amount_cents",
                                      (json_int_t)num(lines, r, L_CENTS)));
                if (!strcmp(PQgetvalue(lines, r, L_KIND), "credit")) {
                        credit_nd += num(lines, r, L_ND);
                        credit_cents += num(lines, r, L_CENTS);
                        credit_hours = PQgetvalue(lines, r, L_QTY);
                }
        }
        for (int r = 0; keys && r < PQntuples(keys); r++)
                json_array_append_new(
                        ks, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I}", "key", PQgetvalue(keys, r, K_KEY),
                                      "kind", PQgetvalue(keys, r, K_KIND), "meter", PQgetvalue(keys, r, K_METER),
                                      "for_month", PQgetvalue(keys, r, K_FOR), "quantity", PQgetvalue(keys, r, K_QTY),
                                      "unit", PQgetvalue(keys, r, K_UNIT), "amount_nanodollars",
                                      (json_int_t)num(keys, r, K_ND), "amount_cents",
                                      (json_int_t)num(keys, r, K_CENTS)));
        json_t *o = json_pack(
                "{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:i, s:{s:s, s:I, s:I, s:I}, s:o, s:o, s:o}", "account",
                heads ? PQgetvalue(heads, i, H_ACCOUNT) : "", "month", m->month, "status",
                heads ? PQgetvalue(heads, i, H_STATUS) : "preview", "period_start", m->start, "period_end", m->end,
                "currency", "USD", "plan", heads ? PQgetvalue(heads, i, H_PLAN) : "", "total_nanodollars",
                (json_int_t)(heads ? num(heads, i, H_ND) : 0), "total_cents",
                (json_int_t)(heads ? num(heads, i, H_CENTS) : 0), "line_count",
                heads ? atoi(PQgetvalue(heads, i, H_LINES)) : 0, "credit", "sandbox_hours", credit_hours,
                "running_ns", (json_int_t)(heads ? num(heads, i, H_CREDIT_NS) : 0), "amount_nanodollars",
                (json_int_t)credit_nd, "amount_cents", (json_int_t)credit_cents, "closed_at",
                heads && !PQgetisnull(heads, i, H_CLOSED_AT) ? json_string(PQgetvalue(heads, i, H_CLOSED_AT))
                                                             : json_null(),
                "lines", ls, "keys", ks);
        if (m->current)
                json_object_set_new(o, "estimate",
                                    est && PQntuples(est) == 1
                                            ? json_pack("{s:I, s:I}", "total_nanodollars", (json_int_t)num(est, 0, 0),
                                                        "total_cents", (json_int_t)num(est, 0, 1))
                                            : json_null());
        return o;
}

/* One invoice as text: its head, lines, per-key lines, credit and totals. */
static void invoice_text(json_t *inv)
{
        const char *status = json_string_value(json_object_get(inv, "status"));
        json_t *closed_at = json_object_get(inv, "closed_at");
        char a[32], b[32];
        printf("Invoice of %s for %s (%s to %s), plan %s: %s%s\n", json_string_value(json_object_get(inv, "account")),
               json_string_value(json_object_get(inv, "month")),
               json_string_value(json_object_get(inv, "period_start")),
               json_string_value(json_object_get(inv, "period_end")), json_string_value(json_object_get(inv, "plan")),
               strcmp(status, "closed") == 0 ? "closed at " : "preview (the month is open: as it would close now)",
               json_is_string(closed_at) ? json_string_value(closed_at) : "");
        json_t *ls = json_object_get(inv, "lines"), *ks = json_object_get(inv, "keys"), *x;
        size_t n = json_array_size(ls), k;
        const char **cells = calloc((n + json_array_size(ks)) * 8 + 1, sizeof(char *));
        char (*txt)[32] = calloc(n * 3 + json_array_size(ks) * 2 + 1, sizeof(*txt));
        if (!cells || !txt)
                abort();
        json_array_foreach(ls, k, x) {
                const char **row = cells + k * 8;
                snprintf(txt[k * 3], 32, "%lld", (long long)json_integer_value(json_object_get(x, "line_no")));
                snprintf(txt[k * 3 + 1], 32, "%lld",
                         (long long)json_integer_value(json_object_get(x, "amount_nanodollars")));
                cents_text(txt[k * 3 + 2], 32, json_integer_value(json_object_get(x, "amount_cents")));
                row[0] = txt[k * 3];
                row[1] = json_string_value(json_object_get(x, "kind"));
                row[2] = json_string_value(json_object_get(x, "meter"));
                row[3] = json_string_value(json_object_get(x, "for_month"));
                row[4] = json_string_value(json_object_get(x, "quantity"));
                row[5] = json_string_value(json_object_get(x, "unit"));
                row[6] = txt[k * 3 + 1];
                row[7] = txt[k * 3 + 2];
        }
        static const char *const line_heads[] = { ">line", "kind", "meter", "for", ">quantity", "unit",
                                                  ">nano-dollars", ">amount" };
        admin_table(8, line_heads, cells, (int)n);
        if (json_array_size(ks)) {
                printf("Per API key:\n");
                char (*kt)[32] = txt + n * 3;
                json_array_foreach(ks, k, x) {
                        const char **row = cells + k * 8;
                        snprintf(kt[k * 2], 32, "%lld",
                                 (long long)json_integer_value(json_object_get(x, "amount_nanodollars")));
                        cents_text(kt[k * 2 + 1], 32, json_integer_value(json_object_get(x, "amount_cents")));
                        row[0] = json_string_value(json_object_get(x, "key"));
                        row[1] = json_string_value(json_object_get(x, "kind"));
                        row[2] = json_string_value(json_object_get(x, "meter"));
                        row[3] = json_string_value(json_object_get(x, "for_month"));
                        row[4] = json_string_value(json_object_get(x, "quantity"));
                        row[5] = json_string_value(json_object_get(x, "unit"));
                        row[6] = kt[k * 2];
                        row[7] = kt[k * 2 + 1];
                }
                static const char *const key_heads[] = { "key",  "kind", "meter",         "for",
                                                         ">quantity", "unit", ">nano-dollars", ">amount" };
                admin_table(8, key_heads, cells, (int)json_array_size(ks));
        }
        free(cells);
        free(txt);
        json_t *cr = json_object_get(inv, "credit");
        printf("Free credit: %s sandbox-hours, %s (%lld nano-dollars)\n",
               json_string_value(json_object_get(cr, "sandbox_hours")),
               cents_text(a, sizeof(a), json_integer_value(json_object_get(cr, "amount_cents"))),
               (long long)json_integer_value(json_object_get(cr, "amount_nanodollars")));
        printf("Total: %s USD (%lld cents; %lld nano-dollars; %lld lines, each rounded once, half away from zero)\n",
               cents_text(b, sizeof(b), json_integer_value(json_object_get(inv, "total_cents"))),
               (long long)json_integer_value(json_object_get(inv, "total_cents")),
               (long long)json_integer_value(json_object_get(inv, "total_nanodollars")),
               (long long)json_integer_value(json_object_get(inv, "line_count")));
        json_t *est = json_object_get(inv, "estimate");
        if (json_is_object(est))
                printf("Estimate for the whole month at its rate so far: %s (%lld nano-dollars)\n",
                       cents_text(a, sizeof(a), json_integer_value(json_object_get(est, "total_cents"))),
                       (long long)json_integer_value(json_object_get(est, "total_nanodollars")));
}

/* The month: its bounds and state; checks the account. 0, or -errno (said). */
static int month_read(PGconn *db, const char *asked, const char *account, struct month *m)
{
        char day[11];
        if (asked && !month_valid(asked, day)) {
                fprintf(stderr, "tally-admin: --month is YYYY-MM, not %s\n", asked);
                return -EDOM; /* said: not the generic "incomplete command" */
        }
        const char *p[] = { asked ? day : NULL, account };
        PGresult *res = admin_query(db, "read the month", MONTH_SQL, 2, p);
        if (!res)
                return -EIO;
        int r = 0;
        if (strcmp(PQgetvalue(res, 0, 3), "t") == 0) {
                fprintf(stderr, "tally-admin: %s has not begun\n", PQgetvalue(res, 0, 0));
                r = -EDOM;
        } else if (strcmp(PQgetvalue(res, 0, 6), "t") != 0) {
                fprintf(stderr, "tally-admin: no account %s\n", account);
                r = -ENOENT;
        } else {
                snprintf(m->month, sizeof(m->month), "%s", PQgetvalue(res, 0, 0));
                snprintf(m->first_day, sizeof(m->first_day), "%s-01", m->month);
                m->closed = strcmp(PQgetvalue(res, 0, 1), "t") == 0;
                m->current = strcmp(PQgetvalue(res, 0, 2), "t") == 0;
                snprintf(m->start, sizeof(m->start), "%s", PQgetvalue(res, 0, 4));
                snprintf(m->end, sizeof(m->end), "%s", PQgetvalue(res, 0, 5));
        }
        PQclear(res);
        return r;
}

int admin_invoice(PGconn *db, int argc, char **argv)
{
        static const struct option opts[] = {
                { "month", required_argument, 0, 'm' },
                { "account", required_argument, 0, 'a' },
                { "json", no_argument, 0, 'j' },
                { 0, 0, 0, 0 },
        };
        const char *asked = NULL, *account = NULL;
        bool json = false;
        optind = 1;
        int c;
        while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                switch (c) {
                case 'm': asked = optarg; break;
                case 'a': account = optarg; break;
                case 'j': json = true; break;
                default: return -EINVAL;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "tally-admin: unexpected argument %s\n", argv[optind]);
                return -EINVAL;
        }
        struct month m = { 0 };
        int r = month_read(db, asked, account, &m);
        if (r < 0)
                return r;
        const char *hp[] = { account, m.first_day };
        PGresult *heads = admin_query(db, "read the invoices", HEADS_SQL, 2, hp);
        if (!heads)
                return -EIO;
        json_t *all = json_array();
        for (int i = 0; i < PQntuples(heads) && r == 0; i++) {
                const char *p[] = { PQgetvalue(heads, i, H_ACCOUNT), m.first_day, PQgetvalue(heads, i, H_STATUS) };
                PGresult *lines = admin_query(db, "read the invoice's lines", LINES_SQL, 3, p);
                PGresult *keys = lines ? admin_query(db, "read the invoice's lines per key", KEYS_SQL, 3, p) : NULL;
                PGresult *est = keys && m.current ? admin_query(db, "estimate the month", ESTIMATE_SQL, 2, p) : NULL;
                if (!lines || !keys || (m.current && !est))
                        r = -EIO;
                else
                        json_array_append_new(all, invoice_json(&m, heads, i, lines, keys, est));
                PQclear(est);
                PQclear(keys);
                PQclear(lines);
        }
        /* One account without usage in an open month: an empty preview (as GET
         * /v1/invoices/current gives); a closed month without its invoice has none. */
        if (r == 0 && account && PQntuples(heads) == 0 && !m.closed) {
                json_t *inv = invoice_json(&m, NULL, 0, NULL, NULL, NULL);
                json_object_set_new(inv, "account", json_string(account));
                const char *pp[] = { account };
                PGresult *plan = admin_query(db, "read the plan", "SELECT account_plan($1)", 1, pp);
                if (plan)
                        json_object_set_new(inv, "plan", json_string(PQgetvalue(plan, 0, 0)));
                PQclear(plan);
                json_array_append_new(all, inv);
        }
        PQclear(heads);
        if (r == 0 && json) {
                json_dumpf(all, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
                fputc('\n', stdout);
        } else if (r == 0) {
                size_t i;
                json_t *inv;
                json_array_foreach(all, i, inv) {
                        if (i)
                                printf("\n");
                        invoice_text(inv);
                }
                if (!json_array_size(all))
                        printf("No invoice for %s%s%s (%s).\n", m.month, account ? " of " : "", account ? account : "",
                               m.closed ? "the month is closed; nothing was billed in it" : "nothing used in it yet");
        }
        json_decref(all);
        return r;
}

/* ---- usage per sandbox or label ---- */

/* Usage of $1 (NULL: every account) over whole days [$2, $3) of each
 * account (its time zone, sql/017; NULL: from the 1st of this month, to
 * tomorrow) per sandbox, rated per rate period as
 * finance.sandbox_daily rates it: the exact Σ quantity x rate per meter. */
#define SANDBOX_USAGE_SQL                                                                                             \
        "WITH s AS ("                                                                                                 \
        " SELECT u.account_id, u.sandbox_id, min(u.key_id) AS key_id, rb.b[width_bucket(u.hour, rb.b)] AS seg,"       \
        "        sum(u.cpu_ns)::numeric AS cpu, sum(u.mem_byte_ns) AS mem, sum(u.storage_byte_ns) AS sto"              \
        "   FROM usage_hourly u CROSS JOIN rate_bounds rb"                                                            \
        "  WHERE ($1::text IS NULL OR u.account_id = $1)"                                                             \
        "    AND u.hour >= account_day_start(u.account_id, coalesce($2::date,"                                        \
        "                      date_trunc('month', account_day(u.account_id, now()))::date))"                          \
        "    AND u.hour < account_day_start(u.account_id, coalesce($3::date, account_day(u.account_id, now()) + 1))"   \
        "  GROUP BY 1, 2, 4),"                                                                                        \
        " r AS ("                                                                                                     \
        " SELECT s.account_id, s.sandbox_id, min(s.key_id) AS key_id, sum(s.cpu) AS cpu, sum(s.mem) AS mem,"          \
        "        sum(s.sto) AS sto, sum(s.cpu * coalesce(rc.rate, 0)) AS cr, sum(s.mem * coalesce(rm.rate, 0)) AS mr," \
        "        sum(s.sto * coalesce(rs.rate, 0)) AS sr"                                                             \
        "   FROM s LEFT JOIN accounts a ON a.id = s.account_id"                                                       \
        "   LEFT JOIN rate_periods rc ON rc.plan_id = coalesce(a.plan_id, 'default') AND rc.meter = 'cpu'"           \
        "                            AND s.seg >= rc.since AND s.seg < rc.until"                                      \
        "   LEFT JOIN rate_periods rm ON rm.plan_id = coalesce(a.plan_id, 'default') AND rm.meter = 'memory'"        \
        "                            AND s.seg >= rm.since AND s.seg < rm.until"                                      \
        "   LEFT JOIN rate_periods rs ON rs.plan_id = coalesce(a.plan_id, 'default') AND rs.meter = 'storage'"       \
        "                            AND s.seg >= rs.since AND s.seg < rs.until"                                      \
        "  GROUP BY 1, 2),"                                                                                           \
        " g AS (%s)"                                                                                                  \
        " SELECT %s,"                                                                                                 \
        "   to_char(round(g.cpu / 3600000000000::numeric, 3), 'FM999999999990.000'),"                                \
        "   to_char(round(g.mem / (1073741824::numeric * 3600000000000), 3), 'FM999999999990.000'),"                  \
        "   to_char(round(g.sto / (1000000000::numeric * 2592000000000000), 6), 'FM999999990.000000'),"               \
        "   " DOLLARS("c.nd") ", c.nd::text%s"                                                                        \
        "   FROM g CROSS JOIN LATERAL (SELECT tally_round_div("                                                       \
        "          g.cr * 1073741824 * (1000000000::numeric * 2592000000000000)"                                      \
        "          + g.mr * (1000000000::numeric * 2592000000000000) + g.sr * (1073741824::numeric * 3600000000000),"  \
        "          (1073741824::numeric * 3600000000000) * (1000000000::numeric * 2592000000000000)) AS nd) c"        \
        "  ORDER BY 1, 2 NULLS LAST"

int admin_usage_sandboxes(PGconn *db, const char *account, const char *from, const char *to, const char *by,
                          bool json)
{
        bool label = strncmp(by, "label:", 6) == 0;
        const char *name = label ? by + 6 : NULL;
        if (label && (!*name || strlen(name) > 63)) {
                fprintf(stderr, "tally-admin: --by label:NAME needs a label name of 1 to 63 bytes\n");
                return -EDOM;
        }
        char sql[8192];
        /* g: one row per sandbox with its key and labels ("k=v,..."), or per value
         * of the label (NULL: sandboxes without it) with the count of sandboxes. */
        if (label)
                snprintf(sql, sizeof(sql), SANDBOX_USAGE_SQL,
                         "SELECT r.account_id, sb.labels ->> $4::text AS grp, count(*) AS n, sum(r.cpu) AS cpu,"
                         " sum(r.mem) AS mem, sum(r.sto) AS sto, sum(r.cr) AS cr, sum(r.mr) AS mr, sum(r.sr) AS sr"
                         " FROM r LEFT JOIN sandboxes sb ON sb.id = r.sandbox_id GROUP BY 1, 2",
                         "g.account_id, g.grp, g.n::text", "");
        else
                snprintf(sql, sizeof(sql), SANDBOX_USAGE_SQL,
                         "SELECT r.*, r.sandbox_id AS grp, (SELECT string_agg(e.key || '=' || e.value, ',' ORDER BY e.key)"
                         " FROM jsonb_each_text(sb.labels) e) AS labels"
                         " FROM r LEFT JOIN sandboxes sb ON sb.id = r.sandbox_id",
                         "g.account_id, g.grp, g.key_id", ", g.labels");
        const char *p[] = { account, from, to, name };
        PGresult *res = admin_query(db, label ? "add up usage by label" : "add up usage by sandbox", sql, label ? 4 : 3,
                                    p);
        if (!res)
                return -EIO;
        const char *const sandbox_heads[] = { "account", "sandbox", "key", ">vCPU-hours", ">GiB-hours", ">GB-months",
                                              ">cost", ">nano-dollars", "labels" };
        const char *const label_heads[] = { "account", name ? name : "", ">sandboxes", ">vCPU-hours", ">GiB-hours",
                                            ">GB-months", ">cost", ">nano-dollars" };
        admin_print(res, label ? label_heads : sandbox_heads, json);
        PQclear(res);
        if (!json)
                printf("(whole days of each account, in its time zone, %s to %s, excluded; before the free credit; each row's cost rounded once, half "
                       "away from zero%s)\n",
                       from ? from : "from the 1st of this month", to ? to : "tomorrow",
                       label ? "; a sandbox without the label is under —" : "");
        return 0;
}
