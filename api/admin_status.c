/* admin_status.c — tally-admin's terminal views for a person at a shell:
 *
 *   tally-admin status [URL...]                 the pipeline's health from the ledger:
 *                                               consumer groups, hosts (last sample,
 *                                               lag, metering gaps), dead letters; each
 *                                               URL (a /healthz or /metrics) is probed
 *   tally-admin spend [--account ID] [--day D]  spend per key on a UTC day against its limit
 *   tally-admin usage [--account ID] [--from D] [--to D] [--by key|meter|day]
 *                                               usage and cost over whole UTC days
 *                                               (--by sandbox and label:NAME, and
 *                                               `invoice`: admin_finance.c)
 *
 * Tables fit the terminal (the widest text column is cut with "…"); a query
 * that takes more than a second shows what it waits for and for how long.
 * Money and quantities are computed and rounded by PostgreSQL (numeric) and
 * printed as its text: no floating point. admin.c hands these commands here. */
#include "admin.h"
#include "server.h"
#include "timeutil.h"

#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

/* ---- running a query with a progress line ---- */

/* Runs sql; after a second, says on stderr what it waits for (one updating
 * line on a terminal, one line otherwise). Returns the result or NULL (said). */
static PGresult *query(PGconn *db, const char *what, const char *sql, int n, const char *const *params)
{
        if (!PQsendQueryParams(db, sql, n, NULL, params, NULL, NULL, 0)) {
                fprintf(stderr, "tally-admin: could not %s: %s", what, PQerrorMessage(db));
                return NULL;
        }
        bool tty = isatty(STDERR_FILENO), said = false;
        int64_t t0 = time_mono_ms();
        static const char spin[] = "|/-\\";
        int turn = 0;
        while (PQisBusy(db)) {
                struct pollfd p = { .fd = PQsocket(db), .events = POLLIN };
                poll(&p, 1, 100);
                if (!PQconsumeInput(db))
                        break;
                int64_t ms = time_mono_ms() - t0;
                if (ms >= 1000 && tty) {
                        fprintf(stderr, "\r%c %s… %lld.%lld s ", spin[turn++ % 4], what, (long long)(ms / 1000),
                                (long long)(ms % 1000 / 100));
                        said = true;
                } else if (ms >= 1000 && !said) {
                        fprintf(stderr, "tally-admin: %s (more than a second)…\n", what);
                        said = true;
                }
        }
        if (said && tty)
                fprintf(stderr, "\r%*s\r", 60, "");
        PGresult *res = PQgetResult(db), *extra;
        while ((extra = PQgetResult(db)))
                PQclear(extra);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                fprintf(stderr, "tally-admin: could not %s: %s", what, PQerrorMessage(db));
                PQclear(res);
                return NULL;
        }
        return res;
}

/* ---- tables that fit the terminal ---- */

#define MAX_COLS 12

struct table {
        int ncols;
        const char *head[MAX_COLS];
        bool right[MAX_COLS];
        char **cells; /* rows × ncols, malloc'd strings */
        int nrows, cap;
};

static void table_add(struct table *t, const char *const *row)
{
        if (t->nrows == t->cap) {
                t->cap = t->cap ? t->cap * 2 : 16;
                t->cells = realloc(t->cells, sizeof(char *) * (size_t)t->cap * (size_t)t->ncols);
                if (!t->cells)
                        abort();
        }
        for (int c = 0; c < t->ncols; c++)
                t->cells[t->nrows * t->ncols + c] = strdup(row[c] ? row[c] : "");
        t->nrows++;
}

/* Display width: UTF-8 code points (every character here is one column). */
static int width(const char *s)
{
        int w = 0;
        for (; *s; s++)
                w += ((unsigned char)*s & 0xC0) != 0x80;
        return w;
}

static int term_columns(void)
{
        struct winsize ws;
        if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 20)
                return ws.ws_col;
        const char *c = getenv("COLUMNS");
        return c && atoi(c) > 20 ? atoi(c) : 100;
}

/* Prints s in w columns (cut with "…" when longer), padded on its side. */
static void cell(const char *s, int w, bool right)
{
        int sw = width(s);
        if (sw > w) {
                int keep = w - 1, cols = 0;
                const char *p = s;
                while (*p && cols < keep) {
                        p++;
                        while (((unsigned char)*p & 0xC0) == 0x80)
                                p++;
                        cols++;
                }
                printf("%.*s…", (int)(p - s), s);
                return;
        }
        if (right)
                printf("%*s%s", w - sw, "", s);
        else
                printf("%s%*s", s, w - sw, "");
}

static void table_print(struct table *t)
{
        int w[MAX_COLS];
        for (int c = 0; c < t->ncols; c++) {
                w[c] = width(t->head[c]);
                for (int r = 0; r < t->nrows; r++) {
                        int cw = width(t->cells[r * t->ncols + c]);
                        if (cw > w[c])
                                w[c] = cw;
                }
        }
        /* Too wide: cut the widest text (left-aligned) column until it fits, none below 4
         * columns; figures (right-aligned) are never cut. */
        int cols = term_columns();
        for (;;) {
                int total = 0, widest = -1;
                for (int c = 0; c < t->ncols; c++) {
                        total += w[c] + (c ? 2 : 0);
                        if (!t->right[c] && w[c] > 4 && (widest < 0 || w[c] > w[widest]))
                                widest = c;
                }
                if (total <= cols || widest < 0)
                        break;
                int over = total - cols;
                w[widest] = w[widest] - over >= 4 ? w[widest] - over : 4;
        }
        for (int c = 0; c < t->ncols; c++) {
                if (c)
                        printf("  ");
                cell(t->head[c], w[c], t->right[c]);
        }
        printf("\n");
        for (int c = 0; c < t->ncols; c++) {
                if (c)
                        printf("  ");
                for (int i = 0; i < w[c]; i++)
                        printf("─");
        }
        printf("\n");
        for (int r = 0; r < t->nrows; r++) {
                for (int c = 0; c < t->ncols; c++) {
                        if (c)
                                printf("  ");
                        cell(t->cells[r * t->ncols + c], w[c], t->right[c]);
                }
                printf("\n");
        }
        if (!t->nrows)
                printf("(none)\n");
}

static void table_free(struct table *t)
{
        for (int i = 0; i < t->nrows * t->ncols; i++)
                free(t->cells[i]);
        free(t->cells);
}

/* --json: every view prints its rows as one JSON array of objects, keyed by
 * the column heads, values as the table shows them (null for none). */
static bool as_json;

static void print_json(PGresult *res, const char *const *heads)
{
        json_t *rows = json_array();
        for (int r = 0; r < PQntuples(res); r++) {
                json_t *o = json_object();
                for (int c = 0; c < PQnfields(res) && c < MAX_COLS; c++) {
                        const char *h = heads[c] + (heads[c][0] == '>');
                        json_object_set_new(o, h, PQgetisnull(res, r, c) ? json_null() : json_string(PQgetvalue(res, r, c)));
                }
                json_array_append_new(rows, o);
        }
        json_dumpf(rows, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        fputc('\n', stdout);
        json_decref(rows);
}

/* Prints every row of res as a table; heads name the columns, a leading '>'
 * right-aligns one. */
static void print_result(PGresult *res, const char *const *heads)
{
        if (as_json) {
                print_json(res, heads);
                return;
        }
        struct table t = { .ncols = PQnfields(res) };
        if (t.ncols > MAX_COLS)
                t.ncols = MAX_COLS;
        for (int c = 0; c < t.ncols; c++) {
                t.right[c] = heads[c][0] == '>';
                t.head[c] = heads[c] + t.right[c];
        }
        const char *row[MAX_COLS];
        for (int r = 0; r < PQntuples(res); r++) {
                for (int c = 0; c < t.ncols; c++)
                        row[c] = PQgetisnull(res, r, c) ? "—" : PQgetvalue(res, r, c);
                table_add(&t, row);
        }
        table_print(&t);
        table_free(&t);
}

/* ---- SQL pieces: money as dollars text, rounded once by PostgreSQL ---- */

/* (DOLLARS: admin.h) */
/* The exact Σ rated of a row → nano-dollars, rounded once (as spend_daily does). */
#define RATED_ND(cpu, mem, sto) \
        "round(" cpu " / 3600000000000::numeric + " mem " / (1073741824::numeric * 3600000000000) + " sto \
        " / (1000000000::numeric * 2592000000000000))"

/* ---- status ---- */

struct probe_body {
        char buf[4096];
        size_t len;
};

static size_t probe_write(char *p, size_t size, size_t n, void *u)
{
        struct probe_body *b = u;
        size_t k = size * n, room = sizeof(b->buf) - 1 - b->len;
        memcpy(b->buf + b->len, p, k < room ? k : room);
        b->len += k < room ? k : room;
        b->buf[b->len] = '\0';
        return k;
}

static int status(PGconn *db, int argc, char **argv)
{
        PGresult *res = query(db, "read the clock", "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS')",
                              0, NULL);
        if (!res)
                return -EIO;
        printf("tally status at %s UTC\n\n", PQgetvalue(res, 0, 0));
        PQclear(res);

        printf("Aggregators (consumer groups; a commit at least every few seconds while sandboxes run)\n");
        static const char *const groups[] = { "group", "topic", ">partitions", ">next offsets", ">last commit",
                                              "state" };
        res = query(db, "read consumer_offsets",
                    "SELECT group_id, topic, count(*), sum(next_offset), "
                    "       floor(extract(epoch FROM now() - max(updated_at)))::bigint || ' s ago', "
                    "       CASE WHEN now() - max(updated_at) < interval '30 seconds' THEN 'up' "
                    "            WHEN EXISTS (SELECT 1 FROM sandboxes WHERE state = 'running') THEN 'DOWN? no commit' "
                    "            ELSE 'idle' END "
                    "  FROM consumer_offsets GROUP BY group_id, topic ORDER BY 1, 2",
                    0, NULL);
        if (!res)
                return -EIO;
        print_result(res, groups);
        PQclear(res);

        printf("\nHosts (collectors: the last sample the aggregator committed, by its own clock; registry: "
               "tally-admin host list)\n");
        static const char *const hosts[] = { "host", ">running", ">last sample", ">lag", "metering", "registry",
                                             ">heartbeat" };
        res = query(db, "read hosts",
                    "SELECT x.host, coalesce(s.running, 0), "
                    "       coalesce(floor(extract(epoch FROM now() - h.last_sample_at))::bigint || ' s ago', 'never'), "
                    "       coalesce(to_char(h.last_sample_at - h.last_sample_wall, 'FMSS.MS\"s\"'), '—'), "
                    "       CASE WHEN g.host IS NOT NULL THEN 'GAP: silent ' || floor(extract(epoch FROM g.silent_for))::bigint || ' s' "
                    "            ELSE 'ok' END, "
                    "       coalesce(upper(nullif(r.effective_state, 'ready')), r.effective_state, 'unregistered'), "
                    "       floor(extract(epoch FROM r.heartbeat_age))::bigint || ' s ago' "
                    "  FROM (SELECT host FROM hosts UNION SELECT host_id FROM host_registry "
                    "        UNION SELECT host FROM sandboxes WHERE state = 'running' AND host <> '') x "
                    "  LEFT JOIN hosts h ON h.host = x.host "
                    "  LEFT JOIN (SELECT host, count(*) AS running FROM sandboxes WHERE state = 'running' "
                    "             AND host <> '' GROUP BY host) s ON s.host = x.host "
                    "  LEFT JOIN metering_gaps g ON g.host = x.host "
                    "  LEFT JOIN host_states r ON r.host_id = x.host "
                    " ORDER BY 1",
                    0, NULL);
        if (!res)
                return -EIO;
        print_result(res, hosts);
        PQclear(res);

        printf("\nDead letters (messages set aside: docs/billing.md)\n");
        static const char *const dead[] = { ">total", ">last 24 h", "newest", "reason" };
        res = query(db, "read dead_letters",
                    "SELECT count(*), count(*) FILTER (WHERE created_at > now() - interval '24 hours'), "
                    "       coalesce(floor(extract(epoch FROM now() - max(created_at)))::bigint || ' s ago', '—'), "
                    "       (SELECT reason FROM dead_letters ORDER BY id DESC LIMIT 1) FROM dead_letters",
                    0, NULL);
        if (!res)
                return -EIO;
        print_result(res, dead);
        PQclear(res);

        if (argc > 1) {
                printf("\nEndpoints\n");
                struct table t = { .ncols = 3, .head = { "url", "state", "answer" }, .right = { false, false, true } };
                for (int i = 1; i < argc; i++) {
                        CURL *c = curl_easy_init();
                        struct probe_body b = { .len = 0 };
                        char answer[64] = "";
                        const char *state = "DOWN";
                        if (c) {
                                curl_easy_setopt(c, CURLOPT_URL, argv[i]);
                                curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 2000L);
                                curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, probe_write);
                                curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
                                curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
                                int64_t t0 = time_mono_ms();
                                CURLcode rc = curl_easy_perform(c);
                                long code = 0;
                                curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
                                if (rc == CURLE_OK) {
                                        state = code == 200 ? "up" : "UNHEALTHY";
                                        snprintf(answer, sizeof(answer), "HTTP %ld in %lld ms", code,
                                                 (long long)(time_mono_ms() - t0));
                                } else {
                                        snprintf(answer, sizeof(answer), "%s", curl_easy_strerror(rc));
                                }
                                curl_easy_cleanup(c);
                        }
                        const char *row[] = { argv[i], state, answer };
                        table_add(&t, row);
                }
                table_print(&t);
                table_free(&t);
        }
        return 0;
}

/* ---- spend and usage ---- */

struct view_args {
        const char *account, *day, *from, *to, *by;
};

static int view_parse(int argc, char **argv, struct view_args *a)
{
        static const struct option opts[] = {
                { "account", required_argument, 0, 'a' }, { "day", required_argument, 0, 'd' },
                { "from", required_argument, 0, 'f' },    { "to", required_argument, 0, 't' },
                { "by", required_argument, 0, 'b' },      { "json", no_argument, 0, 'j' },
                { 0, 0, 0, 0 },
        };
        optind = 1;
        int c;
        while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                switch (c) {
                case 'a': a->account = optarg; break;
                case 'd': a->day = optarg; break;
                case 'f': a->from = optarg; break;
                case 't': a->to = optarg; break;
                case 'b': a->by = optarg; break;
                case 'j': as_json = true; break;
                default: return -EINVAL;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "tally-admin: unexpected argument %s\n", argv[optind]);
                return -EINVAL;
        }
        return 0;
}

static int spend(PGconn *db, const struct view_args *a)
{
        const char *p[] = { a->account, a->day };
        /* The limit of the day asked: the last 'key.create' or 'key.limit' of the
         * audit log before that day's end (a key made without the log, by SQL,
         * shows its limit of now). */
        PGresult *res = query(
                db, "read the day's spend",
                "SELECT k.account_id, k.id, k.name, " DOLLARS("coalesce(s.nanodollars, 0)") ", "
                "       coalesce(" DOLLARS("l.lim") " || ' ' || l.pol, 'none'), "
                "       CASE WHEN l.lim > 0 THEN floor(coalesce(s.nanodollars, 0) * 100 / l.lim)::text || '%' END, "
                "       CASE WHEN b.key_id IS NOT NULL THEN 'BLOCKED' WHEN k.revoked_at IS NOT NULL THEN 'revoked' "
                "            ELSE 'ok' END "
                "  FROM api_keys k "
                "  CROSS JOIN LATERAL (SELECT coalesce($2::date, account_day(k.account_id, now())) AS day) d "
                "  LEFT JOIN LATERAL (SELECT (a.new_value ->> 'daily_limit_nanodollars')::bigint AS lim, "
                "                            coalesce(a.new_value ->> 'policy', a.new_value ->> 'limit_policy') AS pol "
                "                       FROM audit_log a "
                "                      WHERE a.account_id = k.account_id AND a.object_id = k.id "
                "                        AND a.action IN ('key.create', 'key.limit') "
                "                        AND a.at < account_day_start(k.account_id, d.day + 1) "
                "                      ORDER BY a.at DESC, a.id DESC LIMIT 1) h ON true "
                "  CROSS JOIN LATERAL (SELECT CASE WHEN h.pol IS NULL THEN k.daily_limit_nanodollars ELSE h.lim END AS lim, "
                "                             coalesce(h.pol, k.limit_policy) AS pol) l "
                "  LEFT JOIN spend_daily s ON s.key_id = k.id AND s.day = d.day "
                "  LEFT JOIN key_blocks b ON b.key_id = k.id AND b.day = d.day "
                " WHERE ($1::text IS NULL OR k.account_id = $1) "
                "   AND (k.revoked_at IS NULL OR s.nanodollars > 0) "
                " ORDER BY k.account_id, k.id",
                2, p);
        if (!res)
                return -EIO;
        const char *const heads[] = { "account", "key", "name", ">spend", ">daily limit", ">used", "state" };
        if (!as_json)
                printf("Spend on the day %s (each account's day, in its time zone) against the limit of that day (spend_daily: the figure limits are enforced on)\n",
                       a->day ? a->day : "today");
        print_result(res, heads);
        PQclear(res);
        return 0;
}

static int usage(PGconn *db, const struct view_args *a)
{
        const char *by = a->by ? a->by : "key";
        const char *p[] = { a->account, a->from, a->to };
        /* Whole days of each account (its zone) from usage_key_daily (the same figures GET /v1/usage gives by day). */
        static const char range[] =
                "  FROM usage_key_daily u JOIN api_keys k ON k.id = u.key_id "
                " WHERE ($1::text IS NULL OR u.account_id = $1) "
                "   AND u.day >= coalesce($2::date, date_trunc('month', account_day(u.account_id, now()))::date) "
                "   AND u.day < coalesce($3::date, account_day(u.account_id, now()) + 1) ";
        char sql[4096];
        PGresult *res;
        if (strcmp(by, "meter") == 0) {
                snprintf(sql, sizeof(sql),
                         "SELECT u.account_id, m.meter, m.qty, m.unit, " DOLLARS("m.nd") " FROM ("
                         " SELECT u.account_id, "
                         "  sum(u.cpu_ns) AS cpu, sum(u.mem_byte_ns) AS mem, sum(u.storage_byte_ns) AS sto, "
                         "  sum(u.cpu_rated) AS cr, sum(u.memory_rated) AS mr, sum(u.storage_rated) AS sr %s"
                         " GROUP BY u.account_id) u, LATERAL (VALUES "
                         "  (1, 'cpu', to_char(round(u.cpu / 3600000000000::numeric, 3), 'FM999999999990.000'), 'vCPU-hour', round(u.cr / 3600000000000::numeric)), "
                         "  (2, 'memory', to_char(round(u.mem / (1073741824::numeric * 3600000000000), 3), 'FM999999999990.000'), 'GiB-hour', round(u.mr / (1073741824::numeric * 3600000000000))), "
                         "  (3, 'storage', to_char(round(u.sto / (1000000000::numeric * 2592000000000000), 6), 'FM999999990.000000'), 'GB-month', round(u.sr / (1000000000::numeric * 2592000000000000))) "
                         " ) AS m(o, meter, qty, unit, nd) ORDER BY 1, m.o",
                         range);
                const char *const heads[] = { "account", "meter", ">quantity", "unit", ">cost" };
                if (!(res = query(db, "add up usage by meter", sql, 3, p)))
                        return -EIO;
                print_result(res, heads);
        } else if (strcmp(by, "key") == 0 || strcmp(by, "day") == 0) {
                bool day = strcmp(by, "day") == 0;
                snprintf(sql, sizeof(sql),
                         "SELECT u.account_id, %s, "
                         " to_char(round(sum(u.cpu_ns) / 3600000000000::numeric, 3), 'FM999999999990.000'), "
                         " to_char(round(sum(u.mem_byte_ns) / (1073741824::numeric * 3600000000000), 3), 'FM999999999990.000'), "
                         " " DOLLARS(RATED_ND("sum(u.cpu_rated)", "sum(u.memory_rated)", "sum(u.storage_rated)")) " %s"
                         " GROUP BY 1, 2 ORDER BY 1, 2",
                         day ? "to_char(u.day, 'YYYY-MM-DD')" : "k.id || ' (' || k.name || ')'", range);
                const char *const heads[] = { "account", day ? "day" : "key", ">vCPU-hours", ">GiB-hours", ">cost" };
                if (!(res = query(db, "add up usage", sql, 3, p)))
                        return -EIO;
                print_result(res, heads);
        } else if (strcmp(by, "sandbox") == 0 || strncmp(by, "label:", 6) == 0) {
                return admin_usage_sandboxes(db, a->account, a->from, a->to, by, as_json);
        } else {
                fprintf(stderr, "tally-admin: --by is key, meter, day, sandbox or label:NAME\n");
                return -EINVAL;
        }
        PQclear(res);
        if (!as_json)
                printf("(whole UTC days %s to %s, excluded; each row rounded once, half away from zero)\n",
                       a->from ? a->from : "from the 1st of this month", a->to ? a->to : "tomorrow");
        return 0;
}

/* tally-admin key list: every key (of one account), its limit and today's state. */
static int key_list(PGconn *db, const struct view_args *a)
{
        const char *p[] = { a->account };
        PGresult *res = query(
                db, "list the keys",
                "SELECT k.account_id, k.id, k.name, k.prefix || '…', "
                "       coalesce(" DOLLARS("k.daily_limit_nanodollars") ", 'none'), k.limit_policy, "
                "       CASE WHEN k.internet THEN 'yes' ELSE 'no' END, "
                "       CASE WHEN k.revoked_at IS NOT NULL THEN 'revoked' WHEN b.key_id IS NOT NULL THEN 'BLOCKED' "
                "            ELSE 'ok' END, "
                "       to_char(k.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') "
                "  FROM api_keys k "
                "  LEFT JOIN key_blocks b ON b.key_id = k.id AND b.day = account_day(k.account_id, now()) "
                " WHERE ($1::text IS NULL OR k.account_id = $1) "
                " ORDER BY k.account_id, k.id",
                1, p);
        if (!res)
                return -EIO;
        const char *const heads[] = { "account", "key",   "name",  "secret starts", ">daily limit",
                                      "policy",  "internet", "today", "created" };
        print_result(res, heads);
        PQclear(res);
        return 0;
}

/* Runs status, spend, usage, key list or invoice; -ENOSYS when argv is none of them. */
int admin_view(PGconn *db, int argc, char **argv)
{
        if (argc < 1)
                return -ENOSYS;
        if (strcmp(argv[0], "invoice") == 0)
                return admin_invoice(db, argc, argv);
        if (strcmp(argv[0], "status") == 0) {
                for (int i = 1; i < argc; i++)
                        if (argv[i][0] == '-') {
                                fprintf(stderr, "tally-admin: status takes URLs to probe, not %s\n", argv[i]);
                                return -EINVAL;
                        }
                return status(db, argc, argv);
        }
        bool keys = argc >= 2 && strcmp(argv[0], "key") == 0 && strcmp(argv[1], "list") == 0;
        if (strcmp(argv[0], "spend") != 0 && strcmp(argv[0], "usage") != 0 && !keys)
                return -ENOSYS;
        struct view_args a = { 0 };
        int r = view_parse(argc - keys, argv + keys, &a);
        if (r < 0)
                return r;
        if (keys)
                return key_list(db, &a);
        return argv[0][0] == 's' ? spend(db, &a) : usage(db, &a);
}

/* ---- for the other views (admin.h) ---- */

PGresult *admin_query(PGconn *db, const char *what, const char *sql, int n, const char *const *params)
{
        return query(db, what, sql, n, params);
}

void admin_print(PGresult *res, const char *const *heads, bool json)
{
        as_json = json;
        print_result(res, heads);
}

void admin_table(int ncols, const char *const *heads, const char *const *cells, int nrows)
{
        struct table t = { .ncols = ncols < MAX_COLS ? ncols : MAX_COLS };
        for (int c = 0; c < t.ncols; c++) {
                t.right[c] = heads[c][0] == '>';
                t.head[c] = heads[c] + t.right[c];
        }
        const char *row[MAX_COLS];
        for (int r = 0; r < nrows; r++) {
                for (int c = 0; c < t.ncols; c++)
                        row[c] = cells[r * ncols + c] ? cells[r * ncols + c] : "—";
                table_add(&t, row);
        }
        table_print(&t);
        table_free(&t);
}
