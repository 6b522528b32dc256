/* Integration: finance (invoices, credit, month close) through the real pipeline. Samples go to a
 * development broker, a real tally-aggregator bills them into a real
 * PostgreSQL, months are closed by the real tally-admin, and the invoices are
 * read back from the finance views. Every expected figure is worked by hand
 * in the comments and typed in here, never computed by tally's code.
 *
 * Months are relative to today (sample times are checked against the
 * aggregator's clock): m2 = two months ago, m1 = last month, cur = this month. */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#define GiB (UINT64_C(1) << 30)

static struct aggtest t;

static int64_t q_int(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int64_t q_int(const char *fmt, ...)
{
        char sql[4096];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sql, sizeof(sql), fmt, ap);
        va_end(ap);
        char *v = aggtest_query(&t, sql);
        int64_t x = v && *v ? strtoll(v, NULL, 10) : INT64_MIN;
        free(v);
        return x;
}

static char *q_text(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *q_text(const char *fmt, ...)
{
        char sql[4096];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sql, sizeof(sql), fmt, ap);
        va_end(ap);
        char *v = aggtest_query(&t, sql);
        return v ? v : strdup("");
}

/* A sandbox running `minutes` from start, a sample every `step` minutes, its
 * CPU counter growing cpu_s_per_step CPU-seconds a step; the last sample is its
 * final (stopped) one. */
static void run_sandbox(const char *account, const char *key, const char *id, int64_t start, int minutes, int step,
                        uint64_t cpu_s_per_step, uint64_t mem, uint32_t vcpus)
{
        int n = minutes / step;
        for (int s = 0; s <= n; s++) {
                uint64_t cpu = cpu_s_per_step * (uint64_t)s * NS_PER_SEC;
                struct usage_event ev = aggtest_sample(account, key, id, 1, (uint64_t)s + 1,
                                                       start + (int64_t)s * step * 60 * NS_PER_SEC,
                                                       s == n ? STATE_STOPPED : STATE_RUNNING, cpu, mem, 0, vcpus);
                ev.final = s == n;
                aggtest_produce(&t, &ev);
        }
}

static const char *admin_bin(void)
{
        static char path[1024];
        const char *all = test_env("TALLY_BINARIES");
        const char *p = strstr(all, "/tally-admin");
        CHECK(p != NULL, "tally-admin is not among TALLY_BINARIES");
        const char *b = p;
        while (b > all && b[-1] != ':')
                b--;
        snprintf(path, sizeof(path), "%.*s", (int)(p - b) + (int)strlen("/tally-admin"), b);
        return path;
}

/* Runs tally-admin with args; returns its exit status, *out and *err (malloc'd). */
static int admin(char **out, char **err, const char *a1, const char *a2, const char *a3, const char *a4)
{
        char *argv[] = { (char *)admin_bin(), "--database-url", t.db_url, (char *)a1, (char *)a2, (char *)a3,
                         (char *)a4, NULL };
        return test_run(argv, out, err);
}

/* The closed rows, every column as text, in a fixed order. */
static char *closed_rows(void)
{
        return q_text("SELECT md5(coalesce((SELECT string_agg(x::text, '|' ORDER BY x::text) FROM closed_invoices x), '')"
                      " || coalesce((SELECT string_agg(x::text, '|' ORDER BY x::text) FROM closed_invoice_lines x), '')"
                      " || coalesce((SELECT string_agg(x::text, '|' ORDER BY x::text) FROM closed_invoice_key_lines x), '')"
                      " || coalesce((SELECT string_agg(x::text, '|' ORDER BY x::text) FROM closed_months x), ''))");
}

/* Every invoice in finance.invoices (closed and preview) and every closed
 * invoice whose totals differ from the sum of its lines: must be 0. */
static void check_totals(const char *when)
{
        CHECK(q_int("SELECT count(*) FROM finance.invoices") > 0, "%s: no invoices", when);
        CHECK(q_int("SELECT count(*) FROM finance.invoices i CROSS JOIN LATERAL"
                    " (SELECT sum(l.amount_cents) AS c, sum(l.amount_nanodollars) AS n, count(*) AS k"
                    "    FROM finance.invoice_lines l WHERE l.account_id = i.account_id AND l.month = i.month"
                    "     AND l.status = i.status) s"
                    " WHERE (i.total_cents, i.total_nanodollars, i.line_count) IS DISTINCT FROM (s.c, s.n, s.k)") == 0,
              "%s: an invoice's totals differ from the sum of its lines", when);
        CHECK(q_int("SELECT count(*) FROM finance.invoice_projections i CROSS JOIN LATERAL"
                    " (SELECT sum(l.amount_cents) AS c, sum(l.amount_nanodollars) AS n"
                    "    FROM finance.invoice_projection_lines l WHERE l.account_id = i.account_id"
                    "     AND l.month = i.month) s"
                    " WHERE (i.total_cents, i.total_nanodollars) IS DISTINCT FROM (s.c, s.n)") == 0,
              "%s: a projection's totals differ from the sum of its lines", when);
}

/* One line's amount: account, month ('YYYY-MM-01'), status, kind, meter, for_month; cents or nano-dollars. */
static int64_t line(const char *what, const char *account, const char *month, const char *status, const char *kind,
                    const char *meter, const char *for_month)
{
        return q_int("SELECT sum(%s) FROM finance.invoice_lines WHERE account_id = '%s' AND month = '%s'"
                     " AND status = '%s' AND kind = '%s' AND meter = '%s' AND for_month = '%s'",
                     what, account, month, status, kind, meter, for_month);
}

/* A line of account tinycur's projection with the month's elapsed time taken at AT (Unix s). */
static int64_t projected(const char *what, long long at, const char *kind, const char *meter)
{
        return q_int("SELECT %s FROM invoice_projection_lines_at('tinycur', to_timestamp(%lld)) WHERE kind = '%s'"
                     " AND meter = '%s'",
                     what, at, kind, meter);
}

static int64_t total(const char *what, const char *account, const char *month, const char *status)
{
        return q_int("SELECT %s FROM finance.invoices WHERE account_id = '%s' AND month = '%s' AND status = '%s'", what,
                     account, month, status);
}

static void check_finance_role(void)
{
        /* the finance role reads every finance view... */
        char *views = q_text("SELECT string_agg(table_name, ' ' ORDER BY table_name) FROM information_schema.views"
                             " WHERE table_schema = 'finance'");
        int nviews = 0;
        char *list = strdup(views);
        aggtest_exec(&t, "SET ROLE finance");
        for (char *save = NULL, *v = strtok_r(list, " ", &save); v; v = strtok_r(NULL, " ", &save)) {
                char sql[256];
                snprintf(sql, sizeof(sql), "SELECT count(*) FROM finance.%s", v);
                PGresult *res = PQexec(t.db, sql);
                CHECK(PQresultStatus(res) == PGRES_TUPLES_OK, "finance role cannot read finance.%s: %s", v,
                      PQresultErrorMessage(res));
                PQclear(res);
                nviews++;
        }
        aggtest_exec(&t, "RESET ROLE");
        CHECK(nviews >= 13, "finance views: %d (%s)", nviews, views);
        free(list);
        free(views);

        /* ...and is refused on each other table, view and sequence */
        char *rels = q_text("SELECT string_agg(format('%%I.%%I', n.nspname, c.relname), ' ' ORDER BY c.relname)"
                            "  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S')");
        int refused = 0, total_rels = 0;
        list = strdup(rels);
        aggtest_exec(&t, "SET ROLE finance");
        for (char *save = NULL, *r = strtok_r(list, " ", &save); r; r = strtok_r(NULL, " ", &save)) {
                char sql[256];
                snprintf(sql, sizeof(sql), "SELECT 1 FROM %s LIMIT 1", r);
                PGresult *res = PQexec(t.db, sql);
                const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
                bool denied = PQresultStatus(res) == PGRES_FATAL_ERROR && state && !strcmp(state, "42501");
                CHECK(denied, "finance role was not refused on %s (%s)", r, PQresultErrorMessage(res));
                refused += denied;
                total_rels++;
                PQclear(res);
        }
        /* nor may it close a month or write anything (it may not even use the public
         * schema: the function named in full is refused) */
        PGresult *res = PQexec(t.db, "SELECT * FROM public.close_month('2020-01-01')");
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        CHECK(state && !strcmp(state, "42501"), "finance role may call close_month (%s)", PQresultErrorMessage(res));
        PQclear(res);
        aggtest_exec(&t, "RESET ROLE");
        CHECK(total_rels >= 30 && refused == total_rels, "finance role refused on %d of %d relations", refused,
              total_rels);
        /* checked by name too: the secrets and what the API writes */
        const char *must[] = { "public.api_keys", "public.people", "public.sessions", "public.usage_hourly",
                               "public.idempotency_keys", "public.audit_log", "public.closed_invoice_lines" };
        for (size_t i = 0; i < sizeof(must) / sizeof(*must); i++)
                CHECK(strstr(rels, must[i]) != NULL, "%s was not among the relations checked", must[i]);
        free(list);
        free(rels);
        CHECK(q_int("SELECT count(*) FROM pg_roles WHERE rolname = 'finance' AND NOT rolcanlogin") == 1,
              "finance is a NOLOGIN role");
}

static void check_immutable(void)
{
        const char *writes[] = {
                "UPDATE closed_invoice_lines SET amount_cents = amount_cents + 1",
                "DELETE FROM closed_invoice_lines",
                "TRUNCATE closed_invoice_lines",
                "UPDATE closed_invoices SET total_cents = 0",
                "DELETE FROM closed_invoices",
                "TRUNCATE closed_invoices CASCADE",
                "UPDATE closed_invoice_key_lines SET amount_cents = 0",
                "DELETE FROM closed_invoice_key_lines",
                "DELETE FROM closed_months",
        };
        for (size_t i = 0; i < sizeof(writes) / sizeof(*writes); i++) {
                PGresult *res = PQexec(t.db, writes[i]);
                bool refused = PQresultStatus(res) == PGRES_FATAL_ERROR &&
                               strstr(PQresultErrorMessage(res), "immutable") != NULL;
                CHECK(refused, "the owner's \"%s\" was not refused: %s %s", writes[i],
                      PQresStatus(PQresultStatus(res)), PQresultErrorMessage(res));
                PQclear(res);
        }
}


/* ---- the same rows over HTTP: a real tally-api, a person signed in ---- */

static int api_port;
static char cookie[256];

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
        char **b = ud;
        size_t add = size * n, old = *b ? strlen(*b) : 0;
        char *nb = realloc(*b, old + add + 1);
        memcpy(nb + old, p, add);
        nb[old + add] = '\0';
        *b = nb;
        return add;
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
        size_t len = size * n;
        if (len > 12 && strncasecmp(p, "Set-Cookie: ", 12) == 0)
                sscanf(p + 12, "tally_session=%255[^;\r\n]", cookie);
        return len;
}

/* GET (or POST with body) path; returns the status, *ret_body malloc'd. */
static long http(const char *method, const char *path, const char *accept, const char *body, const char *bearer,
                 char **ret_body)
{
        CURL *c = curl_easy_init();
        char url[512], h[512];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", api_port, path);
        struct curl_slist *hs = curl_slist_append(NULL, "Content-Type: application/json");
        if (accept) {
                snprintf(h, sizeof(h), "Accept: %s", accept);
                hs = curl_slist_append(hs, h);
        }
        if (bearer) {
                snprintf(h, sizeof(h), "Authorization: Bearer %s", bearer);
                hs = curl_slist_append(hs, h);
        } else if (cookie[0]) {
                snprintf(h, sizeof(h), "Cookie: tally_session=%s", cookie);
                hs = curl_slist_append(hs, h);
        }
        char *b = NULL;
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        if (body)
                curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        long status = 0;
        if (curl_easy_perform(c) == CURLE_OK)
                curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(hs);
        curl_easy_cleanup(c);
        *ret_body = b ? b : strdup("");
        return status;
}

static json_t *get_json(const char *path, long want)
{
        char *b = NULL;
        long st = http("GET", path, NULL, NULL, NULL, &b);
        CHECK(st == want, "GET %s: %ld, want %ld: %.300s", path, st, want, b);
        json_t *j = json_loads(b, 0, NULL);
        CHECK(j != NULL, "GET %s: not JSON: %.300s", path, b);
        free(b);
        return j;
}

static json_int_t jint(json_t *o, const char *k)
{
        json_t *v = json_object_get(o, k);
        return json_is_integer(v) ? json_integer_value(v) : INT64_MIN;
}

static const char *jstr(json_t *o, const char *k)
{
        json_t *v = json_object_get(o, k);
        return json_is_string(v) ? json_string_value(v) : "";
}

/* The line of an invoice's "lines" with this kind, meter and for_month, or NULL. */
static json_t *find_line(json_t *inv, const char *kind, const char *meter, const char *for_month)
{
        size_t i;
        json_t *l;
        json_array_foreach(json_object_get(inv, "lines"), i, l)
                if (!strcmp(jstr(l, "kind"), kind) && !strcmp(jstr(l, "meter"), meter) &&
                    !strcmp(jstr(l, "for_month"), for_month))
                        return l;
        return NULL;
}

static void check_api(const char *M1, const char *CUR)
{
        char *dir = t.dir, pw[1024], log[1024], *out = NULL, *err = NULL;
        snprintf(pw, sizeof(pw), "%s/pw", dir);
        FILE *f = fopen(pw, "w");
        fputs("correct horse battery\n", f);
        fclose(f);
        char *argv1[] = { (char *)admin_bin(), "--database-url", t.db_url, "person", "create", "--account", "tasks",
                          "--email", "fin-tasks@example.com", "--password-file", pw, NULL };
        CHECK(test_run(argv1, &out, &err) == 0, "person create: %s", err ? err : "");
        free(out);
        free(err);
        char *argv2[] = { (char *)admin_bin(), "--database-url", t.db_url, "key", "create", "--account", "tasks", NULL };
        CHECK(test_run(argv2, &out, &err) == 0, "key create: %s", err ? err : "");
        char secret[128] = "";
        char *k = out ? strstr(out, "key=") : NULL;
        if (k)
                sscanf(k, "key=%127s", secret);
        free(out);
        free(err);

        snprintf(log, sizeof(log), "%s/api.log", dir);
        char *argv[] = { (char *)test_env("TALLY_API_BIN"), "--database-url", t.db_url, "--port", "0",
                         "--cookie-secure=false", "--threads", "4", NULL };
        pid_t api = test_spawn(argv, NULL, log);
        for (int i = 0; i < 400 && !api_port; i++) {
                char *l = test_read_file(log);
                char *p = l ? strstr(l, "msg=\"listening\"") : NULL;
                char *q = p ? strstr(p, " port=") : NULL;
                if (q)
                        api_port = atoi(q + 6);
                free(l);
                if (!api_port)
                        time_sleep_ns(50 * NS_PER_MS);
        }
        CHECK(api_port > 0, "tally-api did not start");
        if (!api_port) {
                kill(api, SIGKILL);
                waitpid(api, NULL, 0);
                return;
        }
        char *b = NULL;
        long st = http("POST", "/v1/sessions", NULL, "{\"email\":\"fin-tasks@example.com\",\"password\":\"correct horse battery\"}",
                       NULL, &b);
        CHECK(st == 201 && cookie[0], "sign-in: %ld %.200s", st, b);
        free(b);

        /* the list: the account's invoices only, m1 closed at $15.37 */
        json_t *list = get_json("/v1/invoices", 200);
        size_t i;
        json_t *inv;
        int m1_seen = 0;
        json_array_foreach(json_object_get(list, "data"), i, inv)
                if (!strcmp(jstr(inv, "month"), M1)) {
                        m1_seen++;
                        CHECK(!strcmp(jstr(inv, "status"), "closed") && jint(inv, "total_cents") == 1537,
                              "GET /v1/invoices: m1 closed at 1537 cents");
                }
        CHECK(m1_seen == 1, "GET /v1/invoices: m1 listed once (%d)", m1_seen);
        CHECK(!strcmp(jstr(list, "account"), "tasks"), "GET /v1/invoices: the caller's account");
        json_decref(list);

        /* one month: its lines, from the closed rows */
        char path[128];
        snprintf(path, sizeof(path), "/v1/invoices/%s", M1);
        inv = get_json(path, 200);
        json_t *l = find_line(inv, "credit", "credit", M1);
        CHECK(l && jint(l, "amount_cents") == -171 && jint(l, "amount_nanodollars") == -1708333333,
              "GET %s: the credit line -171 cents", path);
        l = find_line(inv, "usage", "cpu", M1);
        CHECK(l && jint(l, "amount_cents") == 208 && !strcmp(jstr(l, "unit"), "vCPU-hour") &&
                      !strcmp(jstr(l, "quantity"), "83.333333333333"),
              "GET %s: the CPU line 208 cents, 83.333333333333 vCPU-hours", path);
        CHECK(jint(inv, "total_cents") == 1537 && jint(inv, "total_nanodollars") == 15375000000 &&
                      !strcmp(jstr(inv, "status"), "closed"),
              "GET %s: closed, 1537 cents", path);
        CHECK(json_array_size(json_object_get(inv, "keys")) == 3, "GET %s: the key kt's three meters", path);
        json_decref(inv);

        /* CSV of the same lines */
        st = http("GET", path, "text/csv", NULL, NULL, &b);
        const char *hdr = "month,status,line_no,kind,meter,for_month,quantity,unit,quantity_base,base_unit,"
                          "amount_nanodollars,amount_cents\r\n";
        CHECK(st == 200 && !strncmp(b, hdr, strlen(hdr)),
              "GET %s as CSV: %ld %.200s", path, st, b);
        char want[256];
        snprintf(want, sizeof(want), "%s,closed,4,credit,credit,%s,50.000000000000,sandbox-hour,180000000000000,"
                                     "running-ns,-1708333333,-171\r\n", M1, M1);
        CHECK(strstr(b, want) != NULL, "GET %s as CSV: no line %s in %s", path, want, b);
        int rows = 0;
        for (char *p = b; (p = strstr(p, "\r\n")); p += 2)
                rows++;
        CHECK(rows == 5, "GET %s as CSV: a header and 4 lines, not %d records", path, rows);
        /* the same CSV for a plain link (the dashboard's download): ?csv=true, no Accept */
        char qpath[160], *qb = NULL;
        snprintf(qpath, sizeof(qpath), "%s?csv=true", path);
        st = http("GET", qpath, NULL, NULL, NULL, &qb);
        CHECK(st == 200 && qb && b && !strcmp(qb, b), "GET %s: the CSV of Accept: text/csv, not %ld %.200s", qpath, st,
              qb ? qb : "");
        free(qb);
        snprintf(qpath, sizeof(qpath), "%s?csv=yes", path);
        st = http("GET", qpath, NULL, NULL, NULL, &qb);
        CHECK(st == 400 && qb && strstr(qb, "\"csv\""), "GET %s: 400 naming csv, not %ld %.200s", qpath, st,
              qb ? qb : "");
        free(qb);
        free(b);

        /* the whole list as CSV: every line of every invoice (m1's four; tasks has nothing else) */
        st = http("GET", "/v1/invoices", "text/csv", NULL, NULL, &b);
        rows = 0;
        for (char *p = b; (p = strstr(p, "\r\n")); p += 2)
                rows++;
        CHECK(st == 200 && rows == 5 && strstr(b, want), "GET /v1/invoices as CSV: %ld, %d records: %.300s", st, rows,
              b);
        free(b);

        /* the current month: a preview with its projection (tasks has no usage now) */
        inv = get_json("/v1/invoices/current", 200);
        CHECK(!strcmp(jstr(inv, "month"), CUR) && !strcmp(jstr(inv, "status"), "preview"),
              "GET /v1/invoices/current: this month's preview");
        CHECK(json_object_get(inv, "projection") != NULL, "GET /v1/invoices/current: a projection field");
        json_decref(inv);

        /* a person of carry: this month's preview (no credit left) and its estimate */
        char *argv3[] = { (char *)admin_bin(), "--database-url", t.db_url, "person", "create", "--account", "carry",
                          "--email", "fin-carry@example.com", "--password-file", pw, NULL };
        CHECK(test_run(argv3, &out, &err) == 0, "person create: %s", err ? err : "");
        free(out);
        free(err);
        cookie[0] = '\0';
        st = http("POST", "/v1/sessions", NULL, "{\"email\":\"fin-carry@example.com\",\"password\":\"correct horse battery\"}",
                  NULL, &b);
        CHECK(st == 201 && cookie[0], "sign-in as carry: %ld %.200s", st, b);
        free(b);
        inv = get_json("/v1/invoices/current", 200);
        json_t *proj = json_object_get(inv, "projection");
        CHECK(!strcmp(jstr(inv, "status"), "preview") && !strcmp(jstr(inv, "account"), "carry") &&
                      find_line(inv, "usage", "cpu", CUR) && !find_line(inv, "credit", "credit", CUR),
              "GET /v1/invoices/current as carry: the preview's lines, no credit");
        CHECK(json_is_object(proj) && !strcmp(jstr(proj, "status"), "estimate") &&
                      jint(proj, "total_nanodollars") >= jint(inv, "total_nanodollars") &&
                      json_array_size(json_object_get(proj, "lines")) == 3,
              "GET /v1/invoices/current as carry: an estimate of three lines, at least the preview");
        json_decref(inv);

        /* errors: a month without an invoice, a malformed month, an API key */
        json_decref(get_json("/v1/invoices/2020-01", 404));
        json_decref(get_json("/v1/invoices/2026-13", 400));
        st = http("GET", "/v1/invoices", NULL, NULL, secret, &b);
        CHECK(st == 403, "GET /v1/invoices with an API key: %ld, want 403", st);
        free(b);

        kill(api, SIGTERM);
        waitpid(api, NULL, 0);
}

/* ---- the same invoices and usage from a terminal: tally-admin (as tally_admin) ---- */

/* Runs tally-admin with the NULL-terminated args; its stdout parsed as JSON
 * when it exited 0 and printed JSON, else NULL. *ret_err: its stderr (malloc'd) when asked. */
static json_t *admin_json(char **ret_err, ...)
{
        char *argv[24];
        int n = 0;
        argv[n++] = (char *)admin_bin();
        argv[n++] = "--database-url";
        argv[n++] = t.db_url;
        va_list ap;
        va_start(ap, ret_err);
        for (const char *a = va_arg(ap, const char *); a && n < 22; a = va_arg(ap, const char *))
                argv[n++] = (char *)a;
        va_end(ap);
        argv[n] = NULL;
        char *out = NULL, *err = NULL;
        int rc = test_run(argv, &out, &err);
        json_t *j = rc == 0 && out ? json_loads(out, 0, NULL) : NULL;
        if (!j)
                fprintf(stderr, "tally-admin %s %s: exit %d, out %.300s, err %.300s\n", argv[3], n > 4 ? argv[4] : "",
                        rc, out ? out : "", err ? err : "");
        free(out);
        if (ret_err)
                *ret_err = err;
        else
                free(err);
        return j;
}

/* The only invoice of a tally-admin invoice --json answer for one account. */
static json_t *one_invoice(json_t *all, const char *what)
{
        CHECK(json_is_array(all) && json_array_size(all) == 1, "%s: one invoice, not %zu", what,
              json_is_array(all) ? json_array_size(all) : (size_t)0);
        return json_array_get(all, 0);
}

/* Before any close: the previews of m1 and m2, and usage per sandbox and label
 * (the figures worked by hand in main). */
static void check_admin_open(const char *M2, const char *M1, const char *M1d, const char *CURd)
{
        json_t *all = admin_json(NULL, "invoice", "--month", M1, "--account", "tasks", "--json", NULL);
        json_t *inv = one_invoice(all, "invoice tasks m1");
        CHECK(!strcmp(jstr(inv, "status"), "preview") && !strcmp(jstr(inv, "account"), "tasks") &&
                      !strcmp(jstr(inv, "month"), M1),
              "tally-admin invoice: tasks' m1 is a preview");
        CHECK(jint(inv, "total_cents") == 1537 && jint(inv, "total_nanodollars") == 15375000000 &&
                      jint(inv, "line_count") == 4,
              "tally-admin invoice: tasks m1 $15.37, 15,375,000,000 nano-dollars, 4 lines");
        json_t *l = find_line(inv, "usage", "cpu", M1);
        CHECK(l && jint(l, "amount_cents") == 208 && jint(l, "amount_nanodollars") == 2083333333 &&
                      !strcmp(jstr(l, "quantity"), "83.333333333333") && !strcmp(jstr(l, "unit"), "vCPU-hour"),
              "tally-admin invoice: the CPU line, 83.333333333333 vCPU-hours, 2,083,333,333 nano-dollars");
        l = find_line(inv, "usage", "memory", M1);
        CHECK(l && jint(l, "amount_cents") == 1500 && jint(l, "amount_nanodollars") == 15000000000,
              "tally-admin invoice: the memory line $15.00");
        l = find_line(inv, "credit", "credit", M1);
        CHECK(l && jint(l, "amount_cents") == -171 && jint(l, "amount_nanodollars") == -1708333333 &&
                      !strcmp(jstr(l, "quantity"), "50.000000000000"),
              "tally-admin invoice: the credit line, 50 sandbox-hours, -171 cents");
        json_t *cr = json_object_get(inv, "credit");
        CHECK(jint(cr, "amount_cents") == -171 && jint(cr, "amount_nanodollars") == -1708333333 &&
                      !strcmp(jstr(cr, "sandbox_hours"), "50.000000000000"),
              "tally-admin invoice: the credit, -$1.71 for 50 sandbox-hours");
        size_t i;
        json_t *k;
        int kt = 0;
        json_array_foreach(json_object_get(inv, "keys"), i, k)
                kt += !strcmp(jstr(k, "key"), "kt");
        CHECK(kt == 3 && json_array_size(json_object_get(inv, "keys")) == 3,
              "tally-admin invoice: the key kt's three meters");
        json_decref(all);

        /* the same as text */
        char *out = NULL, *err = NULL;
        char *argv[] = { (char *)admin_bin(), "--database-url", t.db_url, "invoice", "--month", (char *)M1,
                         "--account", "tasks", NULL };
        CHECK(test_run(argv, &out, &err) == 0 && out &&
                      strstr(out, "Total: $15.37 USD (1537 cents; 15375000000 nano-dollars; 4 lines") &&
                      strstr(out, "Free credit: 50.000000000000 sandbox-hours, -$1.71 (-1708333333 nano-dollars)") &&
                      strstr(out, "2083333333") && strstr(out, "preview"),
              "tally-admin invoice as text: %s %s", out ? out : "", err ? err : "");
        free(out);
        free(err);

        /* every account's m2: carry's covered by its credit (0), late's 8 cents */
        all = admin_json(NULL, "invoice", "--month", M2, "--json", NULL);
        CHECK(json_array_size(all) == 2 && !strcmp(jstr(json_array_get(all, 0), "account"), "carry") &&
                      !strcmp(jstr(json_array_get(all, 1), "account"), "late"),
              "tally-admin invoice --month m2: carry's and late's");
        inv = json_array_get(all, 0);
        CHECK(jint(inv, "total_cents") == 0 && jint(json_object_get(inv, "credit"), "amount_cents") == -120,
              "tally-admin invoice: carry m2 total 0, credit -$1.20");
        CHECK(jint(json_array_get(all, 1), "total_cents") == 8, "tally-admin invoice: late m2 8 cents");
        json_decref(all);

        /* refusals: a month not begun, not a month, no such account */
        err = NULL;
        all = admin_json(&err, "invoice", "--month", "2999-01", NULL);
        CHECK(!all && err && strstr(err, "has not begun"), "a month not begun: %s", err ? err : "");
        free(err);
        err = NULL;
        all = admin_json(&err, "invoice", "--month", "2026-13", NULL);
        CHECK(!all && err && strstr(err, "YYYY-MM"), "--month 2026-13: %s", err ? err : "");
        free(err);
        err = NULL;
        all = admin_json(&err, "invoice", "--account", "nosuch", NULL);
        CHECK(!all && err && strstr(err, "no account nosuch"), "no such account: %s", err ? err : "");
        free(err);

        /* usage per sandbox: rate-a, 10:00-14:00 across its plan's rate change at 12:00:
         * CPU 2 h x $0.025 + 2 h x $0.05 = $0.15, memory 4 h x 2 GiB x $0.0075 = $0.06: $0.21 */
        all = admin_json(NULL, "usage", "--by", "sandbox", "--account", "ratechg", "--from", M1d, "--to", CURd, "--json",
                         NULL);
        json_t *r = json_array_get(all, 0);
        CHECK(json_array_size(all) == 1 && !strcmp(jstr(r, "sandbox"), "rate-a") && !strcmp(jstr(r, "key"), "kr") &&
                      !strcmp(jstr(r, "vCPU-hours"), "4.000") && !strcmp(jstr(r, "GiB-hours"), "8.000") &&
                      !strcmp(jstr(r, "nano-dollars"), "210000000") && !strcmp(jstr(r, "cost"), "$0.210000"),
              "tally-admin usage --by sandbox: rate-a 4 vCPU-hours, 8 GiB-hours, $0.21");
        json_decref(all);
        /* per label: half-a (team=ml), 1.5 h of 1 busy vCPU and 2 GiB: $0.0375 + $0.0225 = $0.06
         * (usage before the free credit) */
        all = admin_json(NULL, "usage", "--by", "label:team", "--account", "half", "--from", M1d, "--to", CURd, "--json",
                         NULL);
        r = json_array_get(all, 0);
        CHECK(json_array_size(all) == 1 && !strcmp(jstr(r, "team"), "ml") && !strcmp(jstr(r, "sandboxes"), "1") &&
                      !strcmp(jstr(r, "vCPU-hours"), "1.500") && !strcmp(jstr(r, "GiB-hours"), "3.000") &&
                      !strcmp(jstr(r, "nano-dollars"), "60000000"),
              "tally-admin usage --by label:team: half's ml, 1.5 vCPU-hours, 3 GiB-hours, $0.06");
        json_decref(all);
        /* tasks' 1,000 sandboxes have no team: one row without a value, rounded once:
         * 2,083,333,333.33... + 15,000,000,000 = 17,083,333,333 nano-dollars */
        all = admin_json(NULL, "usage", "--by", "label:team", "--account", "tasks", "--from", M1d, "--to", CURd, "--json",
                         NULL);
        r = json_array_get(all, 0);
        CHECK(json_array_size(all) == 1 && json_is_null(json_object_get(r, "team")) &&
                      !strcmp(jstr(r, "sandboxes"), "1000") && !strcmp(jstr(r, "vCPU-hours"), "83.333") &&
                      !strcmp(jstr(r, "GiB-hours"), "2000.000") && !strcmp(jstr(r, "nano-dollars"), "17083333333"),
              "tally-admin usage --by label:team: tasks' unlabelled sandboxes, $17.083333333");
        json_decref(all);
}

/* After m2 and m1 closed: the frozen invoices, and this month's previews. */
static void check_admin_closed(const char *M2, const char *M1, const char *CUR, int cur_min)
{
        json_t *all = admin_json(NULL, "invoice", "--month", M1, "--account", "tasks", "--json", NULL);
        json_t *inv = one_invoice(all, "invoice tasks m1 closed");
        CHECK(!strcmp(jstr(inv, "status"), "closed") && json_is_string(json_object_get(inv, "closed_at")) &&
                      jint(inv, "total_cents") == 1537 && jint(inv, "total_nanodollars") == 15375000000,
              "tally-admin invoice: tasks m1 closed at $15.37");
        json_t *l = find_line(inv, "credit", "credit", M1);
        CHECK(l && jint(l, "amount_nanodollars") == -1708333333 && json_array_size(json_object_get(inv, "keys")) == 3,
              "tally-admin invoice: the closed credit line and the key kt's three meters");
        json_decref(all);
        all = admin_json(NULL, "invoice", "--month", M2, "--account", "carry", "--json", NULL);
        inv = one_invoice(all, "invoice carry m2 closed");
        CHECK(!strcmp(jstr(inv, "status"), "closed") && jint(inv, "total_cents") == 0 &&
                      jint(json_object_get(inv, "credit"), "amount_cents") == -120,
              "tally-admin invoice: carry m2 closed at 0, credit -$1.20");
        json_decref(all);

        /* this month (no --month): carry's usage billed in full, and its estimate */
        all = admin_json(NULL, "invoice", "--account", "carry", "--json", NULL);
        inv = one_invoice(all, "invoice carry this month");
        l = find_line(inv, "usage", "cpu", CUR);
        json_t *est = json_object_get(inv, "estimate");
        CHECK(!strcmp(jstr(inv, "month"), CUR) && !strcmp(jstr(inv, "status"), "preview") && l &&
                      jint(l, "amount_nanodollars") == ((int64_t)cur_min * 25000000 + 30) / 60 &&
                      !find_line(inv, "credit", "credit", CUR),
              "tally-admin invoice: carry this month, CPU %d min x $0.025/h, no credit", cur_min);
        CHECK(json_is_object(est) && jint(est, "total_nanodollars") >= jint(inv, "total_nanodollars"),
              "tally-admin invoice: this month's estimate, at least the preview");
        json_decref(all);
        /* late: m1's late sandbox as adjustments on this month's preview, 5 + 3 cents */
        all = admin_json(NULL, "invoice", "--account", "late", "--json", NULL);
        inv = one_invoice(all, "invoice late this month");
        l = find_line(inv, "adjustment", "cpu", M1);
        CHECK(l && jint(l, "amount_cents") == 5 && jint(inv, "total_cents") == 8,
              "tally-admin invoice: late's adjustments for m1 on this month's preview, 8 cents");
        json_decref(all);
        /* tasks used nothing this month: an empty preview */
        all = admin_json(NULL, "invoice", "--account", "tasks", "--json", NULL);
        inv = one_invoice(all, "invoice tasks this month");
        CHECK(!strcmp(jstr(inv, "status"), "preview") && jint(inv, "total_cents") == 0 &&
                      json_array_size(json_object_get(inv, "lines")) == 0,
              "tally-admin invoice: tasks this month, an empty preview");
        json_decref(all);
}

int main(void)
{
        aggtest_start(&t, "finance", 3);
        aggtest_exec(&t, "INSERT INTO accounts (id, name) VALUES ('tasks', 't'), ('carry', 'c'), ('half', 'h'),"
                         " ('late', 'l'), ('tiny', 'tn'), ('tinycur', 'tc');"
                         "UPDATE accounts SET free_sandbox_hours = 1 WHERE id = 'half';"
                         "UPDATE accounts SET free_sandbox_hours = 0 WHERE id = 'late'");

        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        int cy = tm.tm_year + 1900, cm = tm.tm_mon + 1;
        int y1 = cm == 1 ? cy - 1 : cy, mo1 = cm == 1 ? 12 : cm - 1;
        int y2 = mo1 == 1 ? y1 - 1 : y1, mo2 = mo1 == 1 ? 12 : mo1 - 1;
        char M2[32], M1[32], CUR[32], M2d[48], M1d[48], CURd[48];
        snprintf(M2, sizeof(M2), "%04d-%02d", y2, mo2);
        snprintf(M1, sizeof(M1), "%04d-%02d", y1, mo1);
        snprintf(CUR, sizeof(CUR), "%04d-%02d", cy, cm);
        snprintf(M2d, sizeof(M2d), "%s-01", M2);
        snprintf(M1d, sizeof(M1d), "%s-01", M1);
        snprintf(CURd, sizeof(CURd), "%s-01", CUR);
        int64_t m2 = aggtest_utc(y2, mo2, 1, 0, 0, 0), m1 = aggtest_utc(y1, mo1, 1, 0, 0, 0),
                cur = aggtest_utc(cy, cm, 1, 0, 0, 0);
        const int64_t H = 3600 * NS_PER_SEC;

        /* tasks, m1 — the seeds' month: 1,000 tasks, each 2 vCPU / 4 GiB running 30
         * minutes with 300 CPU-seconds (a sample every 5 minutes, 50 CPU-s each),
         * a task every 37 minutes, so tasks never overlap and many cross an hour. */
        for (int i = 0; i < 1000; i++) {
                char id[32];
                snprintf(id, sizeof(id), "task-%04d", i);
                run_sandbox("tasks", "kt", id, m1 + (int64_t)i * 37 * 60 * NS_PER_SEC, 30, 5, 50, 4 * GiB, 2);
        }
        /* carry: 1 vCPU busy, 2 GiB, 30 hours in m2 and 30 in m1; a bit this month. */
        run_sandbox("carry", "kc", "carry-a", m2 + 24 * H, 30 * 60, 60, 3600, 2 * GiB, 1);
        run_sandbox("carry", "kc", "carry-b", m1 + 24 * H, 30 * 60, 60, 3600, 2 * GiB, 1);
        int64_t elapsed_min = (int64_t)(now - cur / NS_PER_SEC) / 60;
        int cur_min = (int)(elapsed_min / 2 < 30 ? (elapsed_min / 2 < 2 ? 2 : elapsed_min / 2) : 30);
        run_sandbox("carry", "kc2", "carry-c", cur, cur_min, cur_min, (uint64_t)cur_min * 60, 2 * GiB, 1);
        /* tinycur (50 free hours): this month's first 2 minutes, 8 vCPUs, 16 GiB, 576 CPU-s: CPU
         * 0.16 vCPU-h x $0.025 = $0.004, memory 16 GiB x 2 min = 0.5333... GiB-h x $0.0075 = $0.004,
         * both covered whole by the credit (its projection, below). */
        run_sandbox("tinycur", "ktc", "tinycur-a", cur, 2, 1, 288, 16 * GiB, 8);
        /* half (1 free hour): 1 vCPU busy, 2 GiB, from 10:30 to 12:00 on m1's 5th day. */
        run_sandbox("half", "kh", "half-a", m1 + 4 * 24 * H + 10 * H + 30 * 60 * NS_PER_SEC, 90, 5, 300, 2 * GiB, 1);
        struct usage_event created = { .type = EVENT_CREATED, .wall_ns = m1 + 4 * 24 * H + 10 * H + 30 * 60 * NS_PER_SEC,
                                       .mem_size_bytes = 2 * GiB, .vcpus = 1 };
        strcpy(created.host, "host-1");
        strcpy(created.sandbox, "half-a");
        strcpy(created.account, "half");
        strcpy(created.key, "kh");
        strcpy(created.backend, "process");
        event_add_label(&created, "team", "ml");
        aggtest_produce(&t, &created);
        event_clear(&created);
        /* tiny (50 free hours, all but unused): 1 vCPU, 1 GiB, 32 minutes on m1's 7th day, 576 CPU-s. */
        run_sandbox("tiny", "ktn", "tiny-a", m1 + 6 * 24 * H + 10 * H, 32, 4, 72, 1 * GiB, 1);
        /* ratechg (plan p2, no free hours): its CPU rate doubles at 12:00 on m1's 10th day, in the
         * middle of the day; 1 vCPU busy, 2 GiB, 10:00-14:00 that day. */
        char sql[1024];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO price_plans (id, name) VALUES ('p2', 'p2');"
                 "INSERT INTO plan_rates (plan_id, meter, effective_from, nanodollars_per_unit, unit) VALUES"
                 " ('p2', 'cpu', '2020-01-01 00:00:00+00', 25000000, 'vCPU-hour'),"
                 " ('p2', 'cpu', '%s-10 12:00:00+00', 50000000, 'vCPU-hour'),"
                 " ('p2', 'memory', '2020-01-01 00:00:00+00', 7500000, 'GiB-hour'),"
                 " ('p2', 'storage', '2020-01-01 00:00:00+00', 80000000, 'GB-month');"
                 "INSERT INTO accounts (id, name, plan_id, free_sandbox_hours) VALUES ('ratechg', 'r', 'p2', 0)",
                 M1);
        aggtest_exec(&t, sql);
        run_sandbox("ratechg", "kr", "rate-a", m1 + 9 * 24 * H + 10 * H, 4 * 60, 5, 300, 2 * GiB, 1);
        /* late (no free hours): 2 vCPU busy, 4 GiB, one hour in m2. */
        run_sandbox("late", "kl", "late-a", m2 + 2 * 24 * H, 60, 5, 600, 4 * GiB, 2);
        aggtest_flush(&t);

        const char *extra[] = { "--batch-messages", "2000", NULL };
        pid_t agg = aggtest_spawn(&t, extra);
        CHECK(aggtest_wait_caught_up(&t, 120) == 0, "the aggregator did not consume the stream");

        /* The seeds' month, worked by hand:
         *   CPU:    1,000 x 300 s = 300,000 CPU-s = 83.333... vCPU-hours x $0.025 = $2.0833...
         *           -> 2,083,333,333 nano-dollars, 208 cents
         *   memory: 1,000 x 0.5 h x 4 GiB = 2,000 GiB-hours x $0.0075 = $15.00
         *   before credit: 208 + 1,500 = 1,708 cents = $17.08
         *   credit: 50 free sandbox hours = the first 100 tasks' running time (30 min each):
         *           100 x (300 s x $0.025 / 3,600 + 0.5 h x 4 GiB x $0.0075)
         *           = $0.208333... + $1.50 = $1.708333... -> -1,708,333,333 nano-dollars, -171 cents
         *   invoice: 208 + 1,500 - 171 = 1,537 cents; 2,083,333,333 + 15,000,000,000 - 1,708,333,333
         *           = 15,375,000,000 nano-dollars. */
        CHECK(line("amount_cents", "tasks", M1d, "preview", "usage", "cpu", M1d) == 208, "seeds: CPU $2.08");
        CHECK(line("amount_nanodollars", "tasks", M1d, "preview", "usage", "cpu", M1d) == 2083333333,
              "seeds: CPU 2,083,333,333 nano-dollars");
        CHECK(line("amount_cents", "tasks", M1d, "preview", "usage", "memory", M1d) == 1500, "seeds: memory $15.00");
        CHECK(q_int("SELECT sum(amount_cents) FROM finance.invoice_lines WHERE account_id = 'tasks' AND month = '%s'"
                    " AND kind = 'usage'", M1d) == 1708,
              "seeds: $17.08 before credit");
        CHECK(q_int("SELECT count(*) FROM finance.invoice_lines WHERE account_id = 'tasks' AND month = '%s'"
                    " AND kind = 'usage' AND meter = 'cpu' AND quantity = 83.333333333333 AND unit = 'vCPU-hour'"
                    " AND quantity_base = 300000000000000 AND base_unit = 'CPU-ns'", M1d) == 1,
              "seeds: 83.333333333333 vCPU-hours (300,000 CPU-s)");
        CHECK(q_int("SELECT count(*) FROM finance.invoice_lines WHERE account_id = 'tasks' AND month = '%s'"
                    " AND meter = 'memory' AND quantity = 2000 AND unit = 'GiB-hour'", M1d) == 1,
              "seeds: 2,000 GiB-hours");
        CHECK(line("amount_cents", "tasks", M1d, "preview", "credit", "credit", M1d) == -171, "seeds: credit -$1.71");
        CHECK(line("amount_nanodollars", "tasks", M1d, "preview", "credit", "credit", M1d) == -1708333333,
              "seeds: credit -1,708,333,333 nano-dollars");
        CHECK(q_int("SELECT count(*) FROM finance.invoice_lines WHERE account_id = 'tasks' AND kind = 'credit'"
                    " AND quantity = 50 AND unit = 'sandbox-hour'") == 1, "seeds: the credit is 50 sandbox-hours");
        CHECK(total("total_cents", "tasks", M1d, "preview") == 1537, "seeds: invoice $15.37 after credit");
        CHECK(total("total_nanodollars", "tasks", M1d, "preview") == 15375000000, "seeds: 15,375,000,000 nano-dollars");

        /* carry, m2: 30 h x (1 vCPU x $0.025 + 2 GiB x $0.0075) = $0.75 + $0.45 = $1.20, all
         * covered by 30 of its 50 free hours: total 0. */
        CHECK(line("amount_cents", "carry", M2d, "preview", "usage", "cpu", M2d) == 75, "carry m2: CPU $0.75");
        CHECK(line("amount_cents", "carry", M2d, "preview", "usage", "memory", M2d) == 45, "carry m2: memory $0.45");
        CHECK(line("amount_cents", "carry", M2d, "preview", "credit", "credit", M2d) == -120,
              "carry m2: credit -$1.20 (30 h)");
        CHECK(total("total_cents", "carry", M2d, "preview") == 0, "carry m2: total 0");
        /* carry, m1: the 20 free hours left cover 20 of 30 h: $1.20 - 20 x $0.04 = $0.40. */
        CHECK(line("amount_cents", "carry", M1d, "preview", "credit", "credit", M1d) == -80,
              "carry m1: credit -$0.80 (the 20 hours left)");
        CHECK(total("total_cents", "carry", M1d, "preview") == 40, "carry m1: total $0.40");
        CHECK(total("total_nanodollars", "carry", M1d, "preview") == 400000000, "carry m1: 400,000,000 nano-dollars");
        /* carry, this month: its credit ran out — no credit line, usage billed in full. */
        CHECK(q_int("SELECT count(*) FROM finance.invoice_lines WHERE account_id = 'carry' AND month = '%s'"
                    " AND kind = 'credit'", CURd) == 0, "carry: no credit once it ran out");
        CHECK(line("amount_nanodollars", "carry", CURd, "preview", "usage", "cpu", CURd) ==
                      ((int64_t)cur_min * 25000000 + 30) / 60,
              "carry this month: CPU %d min x $0.025/h billed in full", cur_min);
        CHECK(q_int("SELECT left_hours FROM finance.credit WHERE account_id = 'carry'") == 0, "carry: 0 hours left");

        /* half (1 free hour): 10:30-11:00 (30 min) and 11:00-12:00 (60 min), 1 vCPU busy, 2 GiB:
         *   CPU 1.5 h x $0.025 = $0.0375 -> 4 cents; memory 3 GiB-h x $0.0075 = $0.0225 -> 2 cents;
         *   credit: the first 30 min ($0.02) and half of the next hour ($0.02) = $0.04 -> -4 cents;
         *   total 2 cents; 37,500,000 + 22,500,000 - 40,000,000 = 20,000,000 nano-dollars. */
        CHECK(line("amount_nanodollars", "half", M1d, "preview", "credit", "credit", M1d) == -40000000,
              "half: the credit covers exactly one running hour, $0.04");
        CHECK(total("total_cents", "half", M1d, "preview") == 2, "half: total 2 cents");
        CHECK(total("total_nanodollars", "half", M1d, "preview") == 20000000, "half: 20,000,000 nano-dollars");

        /* tiny, covered whole by its credit:
         *   CPU 576 s = 0.16 vCPU-h x $0.025 = $0.004 = 4,000,000 nano-dollars -> 0 cents;
         *   memory 32 min x 1 GiB = 0.5333... GiB-h x $0.0075 = $0.004 -> 0 cents;
         *   the credit's own cost -$0.008 would round to -1 cent: held to the lines it
         *   covers, it is 0 cents and -8,000,000 nano-dollars, and the invoice is zero. */
        CHECK(line("amount_cents", "tiny", M1d, "preview", "usage", "cpu", M1d) == 0 &&
                      line("amount_nanodollars", "tiny", M1d, "preview", "usage", "cpu", M1d) == 4000000,
              "tiny: CPU $0.004, 0 cents");
        CHECK(line("amount_nanodollars", "tiny", M1d, "preview", "usage", "memory", M1d) == 4000000,
              "tiny: memory $0.004");
        CHECK(line("amount_cents", "tiny", M1d, "preview", "credit", "credit", M1d) == 0,
              "tiny: the credit line is 0 cents (not -1: it never exceeds the lines it covers)");
        CHECK(line("amount_nanodollars", "tiny", M1d, "preview", "credit", "credit", M1d) == -8000000,
              "tiny: the credit line is -8,000,000 nano-dollars");
        CHECK(total("total_cents", "tiny", M1d, "preview") == 0 && total("total_nanodollars", "tiny", M1d, "preview") == 0,
              "tiny: an invoice the credit covers whole is zero");

        /* ratechg: CPU 2 h x $0.025 + 2 h x $0.05 = $0.15; memory 4 h x 2 GiB x $0.0075 = $0.06. */
        CHECK(line("amount_nanodollars", "ratechg", M1d, "preview", "usage", "cpu", M1d) == 150000000,
              "ratechg: CPU rated by hour across a mid-day rate change, $0.15");
        CHECK(line("amount_cents", "ratechg", M1d, "preview", "usage", "memory", M1d) == 6, "ratechg: memory $0.06");
        CHECK(total("total_cents", "ratechg", M1d, "preview") == 21, "ratechg: total $0.21");
        CHECK(q_int("SELECT amount_nanodollars FROM finance.charges_daily WHERE account_id = 'ratechg'"
                    " AND meter = 'cpu'") == 150000000,
              "charges_daily: ratechg's day, CPU $0.15");
        CHECK(q_int("SELECT total_nanodollars FROM finance.sandbox_daily WHERE sandbox_id = 'rate-a'"
                    " AND cpu_nanodollars = 150000000 AND memory_nanodollars = 60000000 AND cpu_vcpu_hours = 4"
                    " AND memory_gib_hours = 8") == 210000000,
              "sandbox_daily: rate-a's day, $0.15 + $0.06");
        CHECK(q_int("SELECT amount_nanodollars FROM finance.usage_by_label WHERE account_id = 'half'"
                    " AND label_key = 'team' AND label_value = 'ml' AND meter = 'cpu' AND sandboxes = 1") == 37500000,
              "usage_by_label: half's team=ml sandbox, CPU $0.0375");
        CHECK(q_int("SELECT count(*) FROM finance.sandbox_daily WHERE sandbox_id = 'half-a'"
                    " AND labels->>'team' = 'ml'") == 1, "sandbox_daily: half-a's labels");
        CHECK(q_int("SELECT sum(amount_nanodollars) FROM finance.usage_by_label WHERE account_id = 'ratechg'"
                    " AND label_key = ''") == 210000000,
              "usage_by_label: ratechg's unlabelled sandbox, $0.21");
        /* late, m2: 1 h, 2 vCPU busy, 4 GiB: $0.05 + $0.03 = 8 cents, no free hours. */
        CHECK(total("total_cents", "late", M2d, "preview") == 8, "late m2: 8 cents");
        check_totals("before any close");
        check_admin_open(M2, M1, M1d, CURd);
        /* The usage lines agree with sql/006's live invoice_lines (rated by hour with rate_at), every month. */
        CHECK(q_int("SELECT count(*) FROM invoice_lines o FULL JOIN (SELECT account_id, month_start(month) AS month,"
                    " meter, amount_nanodollars, amount_cents FROM finance.invoice_lines WHERE kind = 'usage') n"
                    " USING (account_id, month, meter)"
                    " WHERE (o.amount_nanodollars, o.amount_cents) IS DISTINCT FROM (n.amount_nanodollars, n.amount_cents)")
                      == 0,
              "usage lines differ from sql/006's invoice_lines");

        /* Closing: this month has not ended — refused; m2 closes; twice is a no-op. */
        char *out = NULL, *err = NULL;
        CHECK(admin(&out, &err, "close-month", CUR, NULL, NULL) != 0 && err && strstr(err, "has not ended"),
              "closing the current month was not refused: %s", err ? err : "");
        free(out);
        free(err);
        CHECK(q_int("SELECT count(*) FROM closed_months") == 0, "a refused close closed nothing");
        CHECK(admin(&out, &err, "close-month", M2, NULL, NULL) == 0 && out && strstr(out, "status=\"closed\""),
              "close-month %s: %s %s", M2, out ? out : "", err ? err : "");
        free(out);
        free(err);
        CHECK(q_int("SELECT count(*) FROM finance.invoices WHERE month = '%s' AND status = 'closed'", M2d) == 2,
              "m2: two closed invoices (carry, late)");
        CHECK(q_int("SELECT count(*) FROM finance.invoices WHERE month = '%s' AND status = 'preview'", M2d) == 0,
              "m2: no preview once closed");
        CHECK(total("total_cents", "carry", M2d, "closed") == 0 && total("total_cents", "late", M2d, "closed") == 8,
              "m2 closed with the preview's totals");
        char *closed_m2 = closed_rows();
        CHECK(admin(&out, &err, "close-month", M2, NULL, NULL) == 0 && out && strstr(out, "already closed"),
              "closing m2 again: %s %s", out ? out : "", err ? err : "");
        free(out);
        free(err);
        char *again = closed_rows();
        CHECK(!strcmp(closed_m2, again), "closing twice changed closed rows");
        free(again);
        /* close-due with a grace that has not passed for m1 does nothing */
        char grace[32];
        snprintf(grace, sizeof(grace), "%lld", (long long)((now - cur / NS_PER_SEC) / 3600 + 2));
        CHECK(admin(&out, &err, "--close-grace-hours", grace, "close-due", NULL) == 0 && out &&
                      strstr(out, "nothing due"),
              "close-due within the grace: %s %s", out ? out : "", err ? err : "");
        free(out);
        free(err);
        CHECK(q_int("SELECT count(*) FROM closed_months WHERE month = '%s'", M1d) == 0, "m1 closed within its grace");
        check_immutable();

        /* A late sandbox for m2 after its close: an adjustment on late's next open
         * invoice (m1), naming m2: 1 h x (2 vCPU x $0.025 + 4 GiB x $0.0075) = 5 + 3 cents. */
        run_sandbox("late", "kl", "late-b", m2 + 9 * 24 * H, 60, 5, 600, 4 * GiB, 2);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the aggregator did not bill the late sandbox");
        CHECK(q_int("SELECT count(*) FROM usage_hourly WHERE sandbox_id = 'late-b'") >= 1, "late-b billed");
        again = closed_rows();
        CHECK(!strcmp(closed_m2, again), "late usage changed closed rows");
        free(again);
        CHECK(line("amount_cents", "late", M1d, "preview", "adjustment", "cpu", M2d) == 5,
              "late: CPU adjustment of 5 cents for m2 on m1's invoice");
        CHECK(line("amount_cents", "late", M1d, "preview", "adjustment", "memory", M2d) == 3,
              "late: memory adjustment of 3 cents for m2 on m1's invoice");
        CHECK(total("total_cents", "late", M1d, "preview") == 8, "late m1: the adjustments only, 8 cents");
        CHECK(total("total_cents", "late", M2d, "closed") == 8, "late m2 stays 8 cents");
        check_totals("after a late sample");

        /* close-due with no grace closes m1, adjustments and all. */
        CHECK(admin(&out, &err, "--close-grace-hours", "0", "close-due", NULL) == 0 && out &&
                      strstr(out, "status=\"closed\"") && strstr(out, M1),
              "close-due: %s %s", out ? out : "", err ? err : "");
        free(out);
        free(err);
        CHECK(total("total_cents", "late", M1d, "closed") == 8, "late m1 closed with its adjustments");
        CHECK(line("amount_cents", "late", M1d, "closed", "adjustment", "cpu", M2d) == 5, "late m1: closed adjustment");
        CHECK(total("total_cents", "tasks", M1d, "closed") == 1537, "tasks m1 closed: $15.37");
        CHECK(total("total_cents", "carry", M1d, "closed") == 40, "carry m1 closed: $0.40");
        CHECK(total("total_cents", "half", M1d, "closed") == 2, "half m1 closed: 2 cents");
        CHECK(total("total_cents", "ratechg", M1d, "closed") == 21, "ratechg m1 closed: $0.21");
        CHECK(q_int("SELECT count(*) FROM late_usage WHERE billed_in IS NULL") == 0, "no late usage pending");
        {
                PGresult *res = PQexec(t.db, "UPDATE late_usage SET cpu_ns = 0 WHERE billed_in IS NOT NULL");
                CHECK(PQresultStatus(res) == PGRES_FATAL_ERROR && strstr(PQresultErrorMessage(res), "immutable"),
                      "billed late usage could be changed: %s", PQresultErrorMessage(res));
                PQclear(res);
        }
        char *closed_m1 = closed_rows();

        /* Another late sandbox, for m1 now: an adjustment on this month's preview. */
        run_sandbox("late", "kl", "late-c", m1 + 3 * 24 * H, 60, 5, 600, 4 * GiB, 2);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the aggregator did not bill the second late sandbox");
        again = closed_rows();
        CHECK(!strcmp(closed_m1, again), "late usage for m1 changed closed rows");
        free(again);
        CHECK(line("amount_cents", "late", CURd, "preview", "adjustment", "cpu", M1d) == 5 &&
                      line("amount_cents", "late", CURd, "preview", "adjustment", "memory", M1d) == 3,
              "late: m1's late usage is an adjustment on this month's preview");
        check_totals("after the second close");
        check_admin_closed(M2, M1, CUR, cur_min);

        /* The projection: status estimate, over this month's length (typed in from
         * the calendar: days x 86,400 s), and never below the preview. */
        static const int mdays[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
        int days = mdays[cm - 1] + (cm == 2 && cy % 4 == 0 && (cy % 100 != 0 || cy % 400 == 0));
        CHECK(q_int("SELECT month_s FROM finance.invoice_projections WHERE account_id = 'carry'") == days * 86400,
              "projection over %d days", days);
        CHECK(q_int("SELECT count(*) FROM finance.invoice_projections p JOIN finance.invoices i USING (account_id, month)"
                    " WHERE i.status = 'preview' AND p.status = 'estimate' AND p.total_nanodollars >= i.total_nanodollars"
                    " AND p.account_id = 'carry'") == 1,
              "carry: an estimate at least the preview");

        /* tinycur's projection holds its credit line as an invoice does. At 80 % of the month
         * each line is its preview line x 1.25: CPU 5,000,000 nano-dollars -> 0.5 ¢ -> 1 ¢,
         * memory the same, the credit -10,000,000 -> -1.0 ¢ -> -1 ¢ rounded alone: held to the
         * lines it covers whole, it is -2 ¢ and the estimate is zero, not +1 ¢. */
        int64_t at = cur / NS_PER_SEC + (int64_t)days * 86400 * 4 / 5;
        CHECK(projected("amount_nanodollars", (long long)at, "usage", "cpu") == 5000000 &&
                      projected("amount_cents", (long long)at, "usage", "cpu") == 1 &&
                      projected("amount_nanodollars", (long long)at, "usage", "memory") == 5000000 &&
                      projected("amount_cents", (long long)at, "usage", "memory") == 1,
              "tinycur at 80 %% of the month: CPU and memory each projected at $0.005, 1 cent");
        CHECK(projected("amount_nanodollars", (long long)at, "credit", "credit") == -10000000 &&
                      projected("amount_cents", (long long)at, "credit", "credit") == -2,
              "tinycur at 80 %% of the month: the credit projected at -$0.01 exact, held to -2 cents (got %lld)",
              (long long)projected("amount_cents", (long long)at, "credit", "credit"));
        CHECK(q_int("SELECT sum(amount_cents) FROM invoice_projection_lines_at('tinycur', to_timestamp(%lld))",
                    (long long)at) == 0,
              "tinycur at 80 %% of the month: a month the credit covers whole is projected at zero");
        /* ... and now, whatever share of the month has passed: zero in the finance view. */
        CHECK(q_int("SELECT total_cents FROM finance.invoice_projections WHERE account_id = 'tinycur'") == 0 &&
                      q_int("SELECT total_nanodollars FROM finance.invoice_projections WHERE account_id = 'tinycur'") == 0,
              "tinycur: the current month's estimate is zero (credit covers it whole)");

        check_finance_role();
        check_api(M1, CUR);
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        free(closed_m2);
        free(closed_m1);
        aggtest_stop(&t);
        return test_result();
}
