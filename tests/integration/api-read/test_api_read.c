/* test_api_read.c — GET /v1/usage, /v1/spend, /v1/alerts and the OpenAPI
 * document, through api.h's handlers on a real PostgreSQL (migrated with
 * tally-migrate) holding ledger rows this test writes. Every expected figure
 * is worked out by hand in the comments beside it, from docs/billing.md's
 * units and the default plan ($0.025 per vCPU-hour, $0.0075 per GiB-hour). */
#include "api.h"
#include "support.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static PGconn *db;

static void sql(const char *q)
{
        PGresult *r = PQexec(db, q);
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
                fprintf(stderr, "FAIL: setup SQL: %s\n%s\n", PQerrorMessage(db), q);
                exit(1);
        }
        PQclear(r);
}

/* Query parameters from "a=1&b=2" (no URL decoding: the tests write values raw). */
struct params {
        int n;
        char *name[16], *value[16];
        char *buf;
};

static const char *get_param(void *ctx, const char *name)
{
        struct params *p = ctx;
        for (int i = 0; i < p->n; i++) {
                if (!strcmp(p->name[i], name))
                        return p->value[i];
        }
        return NULL;
}

static void params_parse(struct params *p, const char *qs)
{
        memset(p, 0, sizeof(*p));
        p->buf = strdup(qs);
        char *save = NULL;
        for (char *t = strtok_r(p->buf, "&", &save); t && p->n < 16; t = strtok_r(NULL, "&", &save)) {
                char *eq = strchr(t, '=');
                p->name[p->n] = t;
                p->value[p->n] = eq ? (*eq = '\0', eq + 1) : t + strlen(t);
                p->n++;
        }
}

enum what { USAGE, USAGE_CSV, SPEND, ALERTS };

static struct api_caller person(const char *account)
{
        struct api_caller c = { 0 };
        snprintf(c.account, sizeof(c.account), "%s", account);
        snprintf(c.person, sizeof(c.person), "%s-owner", account);
        return c;
}

static struct api_caller key(const char *account, const char *k)
{
        struct api_caller c = { 0 };
        snprintf(c.account, sizeof(c.account), "%s", account);
        snprintf(c.key, sizeof(c.key), "%s", k);
        return c;
}

/* Calls a handler; returns its return value, *body (malloc'd text) and *err. */
static int call(enum what w, const struct api_caller *c, const char *qs, char **body, struct api_error *err)
{
        struct params p;
        params_parse(&p, qs);
        struct api_body b = { 0 };
        memset(err, 0, sizeof(*err));
        int r = w == USAGE    ? api_usage(db, c, get_param, &p, false, &b, err)
                : w == USAGE_CSV ? api_usage(db, c, get_param, &p, true, &b, err)
                : w == SPEND  ? api_spend(db, c, get_param, &p, &b, err)
                              : api_alerts(db, c, get_param, &p, &b, err);
        free(p.buf);
        *body = r == 0 ? b.data : NULL;
        if (r == 0) {
                CHECK(strlen(b.data) == b.len, "body length %zu, strlen %zu", b.len, strlen(b.data));
                CHECK(!strcmp(b.content_type, w == USAGE_CSV ? "text/csv; charset=utf-8" : "application/json"),
                      "content type %s", b.content_type);
        }
        return r;
}

/* Calls a JSON handler expecting success; returns the parsed body (never NULL). */
static json_t *ok(enum what w, const struct api_caller *c, const char *qs)
{
        char *body;
        struct api_error err;
        int r = call(w, c, qs, &body, &err);
        CHECK(r == 0, "%s: %d %s %s (field %s)", qs, err.status, err.code, err.message, err.field);
        if (r != 0)
                return json_pack("{s:[], s:n}", "data", "next_cursor");
        json_t *j = json_loads(body, 0, NULL);
        CHECK(j != NULL, "not JSON: %s", body);
        free(body);
        return j ? j : json_pack("{s:[], s:n}", "data", "next_cursor");
}

static const char *str(json_t *o, const char *k)
{
        json_t *v = json_object_get(o, k);
        return json_is_string(v) ? json_string_value(v) : json_is_null(v) ? "(null)" : "(missing)";
}

static long long num(json_t *o, const char *k)
{
        json_t *v = json_object_get(o, k);
        return json_is_integer(v) ? (long long)json_integer_value(v) : -999999;
}

/* Checks one usage row: meter, quantity, quantity_base, nano-dollars, cents. */
static void check_row(json_t *row, const char *what, const char *meter, const char *quantity, const char *base,
                      long long nd, long long cents)
{
        CHECK(row != NULL, "%s: no row", what);
        if (!row)
                return;
        CHECK(!strcmp(str(row, "meter"), meter), "%s: meter %s, want %s", what, str(row, "meter"), meter);
        CHECK(!strcmp(str(row, "quantity"), quantity), "%s %s: quantity %s, want %s", what, meter,
              str(row, "quantity"), quantity);
        CHECK(!strcmp(str(row, "quantity_base"), base), "%s %s: quantity_base %s, want %s", what, meter,
              str(row, "quantity_base"), base);
        CHECK(num(row, "cost_nanodollars") == nd, "%s %s: cost_nanodollars %lld, want %lld", what, meter,
              num(row, "cost_nanodollars"), nd);
        CHECK(num(row, "cost_cents") == cents, "%s %s: cost_cents %lld, want %lld", what, meter,
              num(row, "cost_cents"), cents);
}

static json_t *data(json_t *page)
{
        return json_object_get(page, "data");
}

/* ---- the ledger this test reads ---- */

#define MONTH "from=2025-11-01T00:00:00Z&to=2025-12-01T00:00:00Z"

static void load(void)
{
        sql("INSERT INTO accounts (id, name) VALUES ('ar-a', 'A'), ('ar-b', 'B')");
        sql("INSERT INTO price_plans (id, name) VALUES ('ar-plan', 'a rate change mid-month')");
        /* The CPU rate doubles at 2025-11-15 00:00 UTC on ar-plan: $0.02 then $0.04 a vCPU-hour. */
        sql("INSERT INTO plan_rates VALUES ('ar-plan', 'cpu', '2020-01-01 00:00+00', 20000000, 'vCPU-hour'),"
            " ('ar-plan', 'cpu', '2025-11-15 00:00+00', 40000000, 'vCPU-hour'),"
            " ('ar-plan', 'memory', '2020-01-01 00:00+00', 7500000, 'GiB-hour'),"
            " ('ar-plan', 'storage', '2020-01-01 00:00+00', 80000000, 'GB-month')");
        sql("INSERT INTO accounts (id, name, plan_id) VALUES ('ar-c', 'C', 'ar-plan')");
        sql("INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars, limit_policy, revoked_at)"
            " SELECT id, acct, sha256(id::bytea), lim, 'pause', rev FROM (VALUES"
            "  ('ar-ka1', 'ar-a', 100000000::bigint, NULL::timestamptz),"
            "  ('ar-ka2', 'ar-a', NULL, NULL), ('ar-ka3', 'ar-a', NULL, now()),"
            "  ('ar-kb1', 'ar-b', 1000000, NULL), ('ar-kc1', 'ar-c', NULL, NULL)) AS v(id, acct, lim, rev)");
        /* The product page's month: 1,000 tasks, each a 2 vCPU / 4 GiB sandbox of key ar-ka1 running
         * 30 minutes with 300 CPU-seconds, task i in hour i mod 720 of November 2025. Labels: agent=alpha
         * for i mod 10 in 0..2 (300 tasks), agent=beta for 3..4 (200), none for the other 500. */
        sql("INSERT INTO sandboxes (id, account_id, key_id, vcpus, mem_size_bytes, labels, state)"
            " SELECT 'ar-t-' || i, 'ar-a', 'ar-ka1', 2, 4294967296,"
            "        CASE WHEN i % 10 < 3 THEN '{\"agent\": \"alpha\"}'::jsonb"
            "             WHEN i % 10 < 5 THEN '{\"agent\": \"beta\", \"team\": \"x\"}' ELSE '{}' END, 'stopped'"
            "   FROM generate_series(0, 999) AS i");
        sql("INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns)"
            " SELECT 'ar-t-' || i, '2025-11-01 00:00+00'::timestamptz + (i % 720) * interval '1 hour',"
            "        'ar-a', 'ar-ka1', 300000000000, 4294967296::numeric * 1800000000000"
            "   FROM generate_series(0, 999) AS i");
        /* Key ar-ka2: one sandbox, 1 vCPU-hour at 2025-11-03 05:00, a label needing CSV quotes, and
         * 1 GB held paused for 30 days' worth of byte-ns (1 GB-month, $0.08). */
        sql("INSERT INTO sandboxes (id, account_id, key_id, vcpus, mem_size_bytes, labels, state)"
            " VALUES ('ar-k2-0', 'ar-a', 'ar-ka2', 1, 0, '{\"agent\": \"we,ird \\\"q\\\"\"}', 'paused')");
        sql("INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns, storage_byte_ns)"
            " VALUES ('ar-k2-0', '2025-11-03 05:00+00', 'ar-a', 'ar-ka2', 3600000000000, 2592000000000000000000000)");
        /* Account B: a sandbox whose usage A must never see, with a label A's sandboxes have. */
        sql("INSERT INTO sandboxes (id, account_id, key_id, vcpus, mem_size_bytes, labels, state)"
            " VALUES ('ar-b-0', 'ar-b', 'ar-kb1', 1, 0, '{\"agent\": \"alpha\"}', 'running')");
        sql("INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns)"
            " VALUES ('ar-b-0', '2025-11-01 00:00+00', 'ar-b', 'ar-kb1', 7200000000000)");
        /* Account D (not in accounts: the default plan): one hour of memory whose exact cost is
         * 1,000,000,000,000.49999999999999806 nano-dollars: with D = 2^30 x 3.6e12 / 7.5e6 =
         * 515,396,075,520,000 byte-ns per nano-dollar it holds 10^12 x D + D/2 - 1 byte-ns. Rounded
         * once it is 10^12; PostgreSQL's numeric quotient of that size keeps 4 decimals (.5000),
         * so round(a / b) would make it 10^12 + 1. */
        sql("INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, mem_byte_ns) VALUES"
            " ('ar-d-0', '2025-11-02 00:00+00', 'ar-d', 'ar-kd1', 515396075520257698037759999)");
        /* Account C (ar-plan): 1 vCPU-hour at 2025-11-14 23:00 ($0.02) and at 2025-11-15 00:00 ($0.04). */
        sql("INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns) VALUES"
            " ('ar-c-0', '2025-11-14 23:00+00', 'ar-c', 'ar-kc1', 3600000000000),"
            " ('ar-c-0', '2025-11-15 00:00+00', 'ar-c', 'ar-kc1', 3600000000000)");
}

/* ---- usage ---- */

static void test_usage_month(void)
{
        struct api_caller ka1 = key("ar-a", "ar-ka1");
        json_t *p = ok(USAGE, &ka1, MONTH "&granularity=month");
        json_t *d = data(p);
        CHECK(json_array_size(d) == 3, "month rows %zu, want 3 (one per meter)", json_array_size(d));
        /* CPU: 1,000 x 300 CPU-s = 300,000 s = 83.333... vCPU-hours; x $0.025 = $2.08333... ->
         * 2,083,333,333 nano-dollars (.33 rounds down), 208 cents. */
        check_row(json_array_get(d, 0), "month", "cpu", "83.333333333", "300000000000000", 2083333333, 208);
        /* Memory: 1,000 x 4 GiB x 0.5 h = 2,000 GiB-hours; x $0.0075 = $15.00. In base units a task is
         * 4,294,967,296 B x 1,800,000,000,000 ns = 7,730,941,132,800,000,000,000 byte-ns; 1,000 tasks
         * 7,730,941,132,800,000,000,000,000. */
        check_row(json_array_get(d, 1), "month", "memory", "2000.000000000", "7730941132800000000000000", 15000000000,
                  1500);
        check_row(json_array_get(d, 2), "month", "storage", "0.000000000", "0", 0, 0);
        json_t *r0 = json_array_get(d, 0);
        CHECK(!strcmp(str(r0, "period_start"), "2025-11-01T00:00:00Z") &&
                      !strcmp(str(r0, "period_end"), "2025-12-01T00:00:00Z"),
              "month period %s..%s", str(r0, "period_start"), str(r0, "period_end"));
        CHECK(!strcmp(str(r0, "unit"), "vCPU-hour") && !strcmp(str(r0, "base_unit"), "cpu-ns"), "units %s %s",
              str(r0, "unit"), str(r0, "base_unit"));
        CHECK(json_is_null(json_object_get(p, "next_cursor")), "a single page has no next_cursor");
        json_decref(p);

        /* The same instants written with an offset (as the server hands it over, URL-decoded):
         * 02:00+02:00 is 00:00Z. */
        p = ok(USAGE, &ka1, "from=2025-11-01T02:00:00+02:00&to=2025-12-01T00:00:00z&granularity=month&meter=cpu");
        d = data(p);
        CHECK(json_array_size(d) == 1, "meter=cpu rows %zu, want 1", json_array_size(d));
        check_row(json_array_get(d, 0), "month with offset", "cpu", "83.333333333", "300000000000000", 2083333333,
                  208);
        json_decref(p);
        /* ... and as dates alone: each its midnight, UTC */
        p = ok(USAGE, &ka1, "from=2025-11-01&to=2025-12-01&granularity=month&meter=cpu");
        d = data(p);
        CHECK(json_array_size(d) == 1, "dates: meter=cpu rows %zu, want 1", json_array_size(d));
        check_row(json_array_get(d, 0), "month by dates", "cpu", "83.333333333", "300000000000000", 2083333333, 208);
        CHECK(!strcmp(str(json_array_get(d, 0), "period_start"), "2025-11-01T00:00:00Z"), "dates: period_start %s",
              str(json_array_get(d, 0), "period_start"));
        json_decref(p);

        /* The whole account as its person: ar-ka2's 1 vCPU-hour more, rated in the same row:
         * 84.333... vCPU-h x $0.025 = $2.108333... -> 2,108,333,333 nd, 211 cents; storage 1 GB-month, $0.08. */
        struct api_caller pa = person("ar-a");
        p = ok(USAGE, &pa, MONTH "&granularity=month");
        d = data(p);
        check_row(json_array_get(d, 0), "person month", "cpu", "84.333333333", "303600000000000", 2108333333, 211);
        check_row(json_array_get(d, 2), "person month", "storage", "1.000000000", "2592000000000000000000000",
                  80000000, 8);
        json_decref(p);

        /* An API key sees only the sandboxes it created: ar-ka2 its one vCPU-hour. */
        struct api_caller ka2 = key("ar-a", "ar-ka2");
        p = ok(USAGE, &ka2, MONTH "&granularity=month&meter=cpu");
        check_row(json_array_get(data(p), 0), "ar-ka2", "cpu", "1.000000000", "3600000000000", 25000000, 3);
        CHECK(json_array_size(data(p)) == 1, "ar-ka2 rows %zu", json_array_size(data(p)));
        json_decref(p);
        /* A key of account A asking with account B's... nothing: B's person sees B's 2 vCPU-hours only. */
        struct api_caller pb = person("ar-b");
        p = ok(USAGE, &pb, MONTH "&granularity=month&meter=cpu&group_by=label:agent");
        d = data(p);
        CHECK(json_array_size(d) == 1, "B rows %zu, want 1", json_array_size(d));
        check_row(json_array_get(d, 0), "B", "cpu", "2.000000000", "7200000000000", 50000000, 5);
        json_decref(p);
        /* A key id of account B presented with account A (a forged caller) sees nothing of either. */
        struct api_caller forged = key("ar-a", "ar-kb1");
        p = ok(USAGE, &forged, MONTH "&granularity=month");
        CHECK(json_array_size(data(p)) == 0, "a key of B under account A sees %zu rows", json_array_size(data(p)));
        json_decref(p);
        struct api_caller nobody = person("ar-nobody");
        p = ok(USAGE, &nobody, MONTH);
        CHECK(json_array_size(data(p)) == 0, "an account with no usage sees %zu rows", json_array_size(data(p)));
        json_decref(p);
}

static void test_usage_groups(void)
{
        struct api_caller ka1 = key("ar-a", "ar-ka1");
        json_t *p = ok(USAGE, &ka1, MONTH "&granularity=month&group_by=label:agent&meter=cpu,memory");
        json_t *d = data(p);
        CHECK(json_array_size(d) == 6, "label rows %zu, want 6", json_array_size(d));
        /* No label (500 tasks) first, then alpha (300), then beta (200), cpu before memory.
         * none: 150,000 CPU-s = 41.666... vCPU-h, $1.0416666... -> 1,041,666,667 nd, 104 cents;
         *       1,000 GiB-h, $7.50.
         * alpha: 90,000 CPU-s = 25 vCPU-h, $0.625 -> 62.5 cents rounds half away from zero to 63;
         *       600 GiB-h, $4.50.
         * beta: 60,000 CPU-s = 16.666... vCPU-h, $0.41666... -> 416,666,667 nd, 42 cents; 400 GiB-h, $3. */
        check_row(json_array_get(d, 0), "no label", "cpu", "41.666666667", "150000000000000", 1041666667, 104);
        check_row(json_array_get(d, 1), "no label", "memory", "1000.000000000", "3865470566400000000000000",
                  7500000000, 750);
        check_row(json_array_get(d, 2), "alpha", "cpu", "25.000000000", "90000000000000", 625000000, 63);
        check_row(json_array_get(d, 3), "alpha", "memory", "600.000000000", "2319282339840000000000000", 4500000000,
                  450);
        check_row(json_array_get(d, 4), "beta", "cpu", "16.666666667", "60000000000000", 416666667, 42);
        check_row(json_array_get(d, 5), "beta", "memory", "400.000000000", "1546188226560000000000000", 3000000000,
                  300);
        json_t *g0 = json_object_get(json_array_get(d, 0), "group");
        json_t *g2 = json_object_get(json_array_get(d, 2), "group");
        CHECK(json_is_null(json_object_get(g0, "label:agent")), "the unlabelled group is null");
        CHECK(!strcmp(str(g2, "label:agent"), "alpha"), "group %s", str(g2, "label:agent"));
        json_decref(p);

        /* Two dimensions at once, as the account's person: key then label. ar-ka1's three label
         * groups, then ar-ka2's one sandbox (agent "we,ird \"q\""): 4 rows of CPU. */
        struct api_caller pa = person("ar-a");
        p = ok(USAGE, &pa, MONTH "&granularity=month&group_by=key,label:agent&meter=cpu");
        d = data(p);
        CHECK(json_array_size(d) == 4, "key,label rows %zu, want 4", json_array_size(d));
        json_t *g3 = json_object_get(json_array_get(d, 3), "group");
        CHECK(!strcmp(str(g3, "key"), "ar-ka2") && !strcmp(str(g3, "label:agent"), "we,ird \"q\""),
              "last group %s %s", str(g3, "key"), str(g3, "label:agent"));
        check_row(json_array_get(d, 3), "ar-ka2 group", "cpu", "1.000000000", "3600000000000", 25000000, 3);
        json_decref(p);

        /* By day: task i is in hour i mod 720, so days 0..10 hold 48 tasks, day 11 40, days 12..29 24.
         * Day 1: 48 x 300 CPU-s = 4 vCPU-h = $0.10; 96 GiB-h = $0.72. Day 12: 24 tasks, $0.05, $0.36. */
        p = ok(USAGE, &ka1, MONTH "&granularity=day&limit=1000");
        d = data(p);
        CHECK(json_array_size(d) == 90, "day rows %zu, want 90", json_array_size(d));
        check_row(json_array_get(d, 0), "day 1", "cpu", "4.000000000", "14400000000000", 100000000, 10);
        check_row(json_array_get(d, 1), "day 1", "memory", "96.000000000", "371085174374400000000000", 720000000, 72);
        check_row(json_array_get(d, 33), "day 12", "cpu", "3.333333333", "12000000000000", 83333333, 8);
        check_row(json_array_get(d, 36), "day 13", "cpu", "2.000000000", "7200000000000", 50000000, 5);
        CHECK(!strcmp(str(json_array_get(d, 3), "period_start"), "2025-11-02T00:00:00Z") &&
                      !strcmp(str(json_array_get(d, 3), "period_end"), "2025-11-03T00:00:00Z"),
              "day 2 is %s..%s", str(json_array_get(d, 3), "period_start"), str(json_array_get(d, 3), "period_end"));
        json_decref(p);

        /* A range that starts and ends inside periods: the rows' bounds are clipped to it.
         * 2025-11-01T12:00 .. 2025-11-02T06:00 by day holds hours 12..29: tasks 12..29 (and 732..749):
         * day 1 hours 12..23 = 24 tasks (4,2 vCPU-h? no: 24 x 300 s = 2 vCPU-h), day 2 hours 0..5 = 12 tasks, 1 vCPU-h. */
        p = ok(USAGE, &ka1, "from=2025-11-01T12:00:00Z&to=2025-11-02T06:00:00Z&granularity=day&meter=cpu");
        d = data(p);
        CHECK(json_array_size(d) == 2, "clipped rows %zu", json_array_size(d));
        CHECK(!strcmp(str(json_array_get(d, 0), "period_start"), "2025-11-01T12:00:00Z") &&
                      !strcmp(str(json_array_get(d, 1), "period_end"), "2025-11-02T06:00:00Z"),
              "clipped bounds %s %s", str(json_array_get(d, 0), "period_start"),
              str(json_array_get(d, 1), "period_end"));
        check_row(json_array_get(d, 0), "clipped day 1", "cpu", "2.000000000", "7200000000000", 50000000, 5);
        check_row(json_array_get(d, 1), "clipped day 2", "cpu", "1.000000000", "3600000000000", 25000000, 3);
        json_decref(p);

        struct api_caller pd = person("ar-d");
        p = ok(USAGE, &pd, MONTH "&granularity=month&meter=memory");
        check_row(json_array_get(data(p), 0), "D month", "memory", "133333.333333400", "515396075520257698037759999",
                  1000000000000LL, 100000);
        json_decref(p);

        /* The rate in force per hour: account C's 1 vCPU-hour at $0.02 then 1 at $0.04 (ar-plan). */
        struct api_caller pc = person("ar-c");
        p = ok(USAGE, &pc, MONTH "&granularity=month&meter=cpu");
        check_row(json_array_get(data(p), 0), "C month", "cpu", "2.000000000", "7200000000000", 60000000, 6);
        json_decref(p);
        p = ok(USAGE, &pc, MONTH "&granularity=day&meter=cpu");
        check_row(json_array_get(data(p), 0), "C day 14", "cpu", "1.000000000", "3600000000000", 20000000, 2);
        check_row(json_array_get(data(p), 1), "C day 15", "cpu", "1.000000000", "3600000000000", 40000000, 4);
        json_decref(p);
}

/* Pages through qs with limit n; returns every row (an array) and the number of pages. */
static json_t *all_pages(enum what w, const struct api_caller *c, const char *qs, int n, int *ret_pages)
{
        json_t *rows = json_array();
        char q[2048];
        char *cursor = NULL;
        int pages = 0;
        for (;;) {
                snprintf(q, sizeof(q), "%s&limit=%d%s%s", qs, n, cursor ? "&cursor=" : "", cursor ? cursor : "");
                free(cursor);
                cursor = NULL;
                json_t *p = ok(w, c, q);
                pages++;
                json_t *d = data(p);
                CHECK(json_array_size(d) <= (size_t)n, "page of %zu rows, limit %d", json_array_size(d), n);
                json_array_extend(rows, d);
                json_t *next = json_object_get(p, "next_cursor");
                if (json_is_string(next))
                        cursor = strdup(json_string_value(next));
                json_decref(p);
                if (!cursor || pages > 2000)
                        break;
        }
        *ret_pages = pages;
        return rows;
}

static void test_usage_pages(void)
{
        struct api_caller pa = person("ar-a");
        /* 90 rows (30 days x 3 meters) in pages of 7: 13 pages, the same rows in the same order. */
        const char *qs = MONTH "&granularity=day";
        json_t *whole = ok(USAGE, &pa, MONTH "&granularity=day&limit=1000");
        int pages;
        json_t *paged = all_pages(USAGE, &pa, qs, 7, &pages);
        CHECK(pages == 13, "90 rows in pages of 7: %d pages, want 13", pages);
        CHECK(json_equal(data(whole), paged), "paged rows differ from the whole (%zu vs %zu)",
              json_array_size(paged), json_array_size(data(whole)));
        json_decref(paged);
        json_decref(whole);

        /* 1,001 sandboxes of A (by sandbox and label, a null among the values) in pages of 250:
         * every sandbox exactly once. */
        paged = all_pages(USAGE, &pa, MONTH "&granularity=month&group_by=label:agent,sandbox&meter=cpu", 250, &pages);
        CHECK(pages == 5, "1,001 rows in pages of 250: %d pages", pages);
        CHECK(json_array_size(paged) == 1001, "%zu rows, want 1001", json_array_size(paged));
        char *seen = calloc(1001, 1);
        long long cpu = 0;
        size_t i;
        json_t *row;
        json_array_foreach(paged, i, row)
        {
                const char *sb = str(json_object_get(row, "group"), "sandbox");
                int k = !strcmp(sb, "ar-k2-0") ? 1000 : !strncmp(sb, "ar-t-", 5) ? atoi(sb + 5) : -1;
                CHECK(k >= 0 && k <= 1000 && !seen[k], "sandbox %s unknown or repeated", sb);
                if (k >= 0 && k <= 1000)
                        seen[k] = 1;
                cpu += atoll(str(row, "quantity_base"));
        }
        CHECK(cpu == 303600000000000LL, "paged CPU %lld ns, want 303,600 CPU-s", cpu);
        free(seen);
        json_decref(paged);
}

static void test_usage_csv(void)
{
        struct api_caller pa = person("ar-a");
        char *body;
        struct api_error err;
        int r = call(USAGE_CSV, &pa, MONTH "&granularity=month&group_by=key,label:agent&meter=cpu", &body, &err);
        CHECK(r == 0, "CSV: %s", err.message);
        const char *want =
                "period_start,period_end,key,label:agent,meter,unit,quantity,quantity_base,base_unit,cost_nanodollars,"
                "cost_cents\r\n"
                "2025-11-01T00:00:00Z,2025-12-01T00:00:00Z,ar-ka1,,cpu,vCPU-hour,41.666666667,150000000000000,cpu-ns,"
                "1041666667,104\r\n"
                "2025-11-01T00:00:00Z,2025-12-01T00:00:00Z,ar-ka1,alpha,cpu,vCPU-hour,25.000000000,90000000000000,"
                "cpu-ns,625000000,63\r\n"
                "2025-11-01T00:00:00Z,2025-12-01T00:00:00Z,ar-ka1,beta,cpu,vCPU-hour,16.666666667,60000000000000,"
                "cpu-ns,416666667,42\r\n"
                "2025-11-01T00:00:00Z,2025-12-01T00:00:00Z,ar-ka2,\"we,ird \"\"q\"\"\",cpu,vCPU-hour,1.000000000,"
                "3600000000000,cpu-ns,25000000,3\r\n";
        CHECK(r == 0 && !strcmp(body, want), "CSV is\n%s\nwant\n%s", body ? body : "", want);
        free(body);
        /* csv=true selects it as the Accept header does. */
        struct params cp;
        params_parse(&cp, MONTH "&granularity=month&group_by=key,label:agent&meter=cpu&csv=true");
        struct api_body b = { 0 };
        r = api_usage(db, &pa, get_param, &cp, false, &b, &err);
        CHECK(r == 0 && !strcmp(b.data, want) && !strcmp(b.content_type, "text/csv; charset=utf-8"),
              "csv=true: %s", r == 0 ? b.data : err.message);
        free(b.data);
        free(cp.buf);
        /* An empty answer is the header alone. */
        r = call(USAGE_CSV, &pa, "from=2024-01-01T00:00:00Z&to=2024-01-02T00:00:00Z&meter=cpu", &body, &err);
        CHECK(r == 0 && !strcmp(body, "period_start,period_end,meter,unit,quantity,quantity_base,base_unit,"
                                      "cost_nanodollars,cost_cents\r\n"),
              "empty CSV: %s", body ? body : err.message);
        free(body);
}

/* Each bad input gets a 400 naming its field. */
static void bad(enum what w, const char *qs, const char *field)
{
        struct api_caller pa = person("ar-a");
        char *body;
        struct api_error err;
        int r = call(w, &pa, qs, &body, &err);
        CHECK(r < 0 && err.status == 400 && !strcmp(err.field, field) && !strcmp(err.code, "invalid_field") &&
                      err.message[0],
              "%s: got %d status %d field '%s' (%s), want 400 naming %s", qs, r, err.status, err.field, err.message,
              field);
        if (r == 0)
                free(body);
}

static void test_bad_input(void)
{
        bad(USAGE, "to=2025-12-01T00:00:00Z", "from");
        bad(USAGE, "from=2025-11-1&to=2025-12-01T00:00:00Z", "from");
        bad(USAGE, "from=2025-02-29&to=2025-12-01T00:00:00Z", "from");
        bad(USAGE, "from=2025-11-01Z&to=2025-12-01T00:00:00Z", "from");
        bad(USAGE, "from=2025-11-01 00:00:00Z&to=2025-12-01T00:00:00Z", "from");
        bad(USAGE, "from=2025-11-01T00:00:00&to=2025-12-01T00:00:00Z", "from");
        bad(USAGE, "from=2025-02-29T00:00:00Z&to=2025-12-01T00:00:00Z", "from");
        bad(USAGE, "from=2025-11-01T24:00:00Z&to=2025-12-01T00:00:00Z", "from");
        bad(USAGE, "from=2025-11-01T00:30:00Z&to=2025-12-01T00:00:00Z", "from");
        bad(USAGE, "from=2025-11-01T00:00:00Z", "to");
        bad(USAGE, "from=2025-11-01T00:00:00Z&to=2025-11-01T00:00:00 02:00", "to");
        bad(USAGE, "from=2025-12-01T00:00:00Z&to=2025-11-01T00:00:00Z", "to");
        bad(USAGE, "from=2025-11-01T00:00:00Z&to=2025-11-01T00:00:00Z", "to");
        bad(USAGE, "from=2025-01-01T00:00:00Z&to=2026-01-02T01:00:00Z", "to"); /* 366 days and an hour */
        bad(USAGE, MONTH "&granularity=week", "granularity");
        bad(USAGE, MONTH "&group_by=host", "group_by");
        bad(USAGE, MONTH "&group_by=key,key", "group_by");
        bad(USAGE, MONTH "&group_by=label:", "group_by");
        bad(USAGE, MONTH "&group_by=key,sandbox,label:a,label:b,label:c", "group_by");
        bad(USAGE, MONTH "&meter=gpu", "meter");
        bad(USAGE, MONTH "&meter=cpu,", "meter");
        bad(USAGE, MONTH "&limit=0", "limit");
        bad(USAGE, MONTH "&limit=1001", "limit");
        bad(USAGE, MONTH "&limit=ten", "limit");
        bad(USAGE, MONTH "&cursor=zz", "cursor");
        bad(USAGE, MONTH "&cursor=5b5d", "cursor"); /* "[]" */
        bad(USAGE_CSV, MONTH "&limit=10", "limit");
        bad(USAGE_CSV, MONTH "&cursor=5b5d", "cursor");
        bad(USAGE, MONTH "&csv=yes", "csv");
        bad(SPEND, "limit=0", "limit");
        bad(SPEND, "cursor=00", "cursor");
        bad(ALERTS, "state=sent", "state");
        bad(ALERTS, "key=a b", "key");
        bad(ALERTS, "limit=-1", "limit");
        bad(ALERTS, "cursor=5b226131222c2d315d", "cursor"); /* ["a1",-1] */
        /* 366 days exactly is allowed. */
        struct api_caller pa = person("ar-a");
        json_decref(ok(USAGE, &pa, "from=2025-01-01T00:00:00Z&to=2026-01-02T00:00:00Z&granularity=month"));

        /* A cursor from one query is refused by another. */
        json_t *p = ok(USAGE, &pa, MONTH "&granularity=day&limit=2");
        const char *cur = str(p, "next_cursor");
        char q[1024];
        snprintf(q, sizeof(q), MONTH "&granularity=hour&cursor=%s", cur);
        bad(USAGE, q, "cursor");
        snprintf(q, sizeof(q), MONTH "&granularity=day&group_by=key&cursor=%s", cur);
        bad(USAGE, q, "cursor");
        json_decref(p);
}

/* ---- spend ---- */

static void fmt_us(char *buf, size_t size, int64_t us)
{
        time_t t = (time_t)(us / 1000000);
        struct tm tm;
        gmtime_r(&t, &tm);
        snprintf(buf, size, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                 tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(us % 1000000));
}

static void test_spend(void)
{
        /* Today: ar-ka1 spent 3 vCPU-hours ($0.075 = 75,000,000 nd) of its $0.10 limit; ar-kb1 2 vCPU-hours
         * ($0.05) over its $0.001 limit, blocked. Burn: ar-ka1 used 1 vCPU-hour of CPU in the current UTC
         * hour and 2 in the previous one. ar-ka3 is revoked with no spend today: not listed. */
        sql("INSERT INTO spend_daily (key_id, day, account_id, cpu_rated) VALUES"
            " ('ar-ka1', (now() AT TIME ZONE 'UTC')::date, 'ar-a', 3 * 3600000000000::numeric * 25000000),"
            " ('ar-kb1', (now() AT TIME ZONE 'UTC')::date, 'ar-b', 2 * 3600000000000::numeric * 25000000)");
        sql("INSERT INTO key_blocks (key_id, day, account_id, policy)"
            " VALUES ('ar-kb1', (now() AT TIME ZONE 'UTC')::date, 'ar-b', 'pause')");
        sql("INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns) VALUES"
            " ('ar-burn-0', date_trunc('hour', now(), 'UTC'), 'ar-a', 'ar-ka1', 3600000000000),"
            " ('ar-burn-0', date_trunc('hour', now(), 'UTC') - interval '1 hour', 'ar-a', 'ar-ka1', 7200000000000),"
            " ('ar-burn-0', date_trunc('hour', now(), 'UTC') - interval '2 hours', 'ar-a', 'ar-ka1', 7200000000000)");
        struct api_caller pa = person("ar-a");
        json_t *p = ok(SPEND, &pa, "");
        json_t *d = data(p);
        CHECK(json_array_size(d) == 2, "A's spend lists %zu keys, want ar-ka1 and ar-ka2", json_array_size(d));
        json_t *k1 = json_array_get(d, 0), *k2 = json_array_get(d, 1);
        CHECK(!strcmp(str(k1, "key"), "ar-ka1") && !strcmp(str(k2, "key"), "ar-ka2"), "keys %s %s", str(k1, "key"),
              str(k2, "key"));
        CHECK(num(k1, "spend_nanodollars") == 75000000 && num(k1, "spend_cents") == 8,
              "ar-ka1 spend %lld nd %lld cents, want 75,000,000 and 8 (7.5 rounds away)",
              num(k1, "spend_nanodollars"), num(k1, "spend_cents"));
        CHECK(num(k1, "limit_nanodollars") == 100000000 && num(k1, "remaining_nanodollars") == 25000000,
              "ar-ka1 limit %lld remaining %lld", num(k1, "limit_nanodollars"), num(k1, "remaining_nanodollars"));
        CHECK(json_is_false(json_object_get(k1, "blocked")) && json_is_false(json_object_get(k1, "limit_reached")),
              "ar-ka1 is not blocked");

        /* The projection (docs/billing.md, "Burn rate and the projection") reads the key's points: a
         * reference of 60,000,000 nd 7 minutes ago and the last change, 75,000,000 nd, 30 s ago: 15,000,000
         * nd in 390 s. Burn by hand: 15e6 x 3.6e9 / 390e6 us = 138,461,538.46... -> 138,461,538 nd/h.
         * The limit's 25,000,000 nd left take 25e6 x 390e6 / 15e6 = 650,000,000 us: last change + 650 s,
         * whenever the answer is read (as_of does not move it). */
        sql("UPDATE spend_rate_points SET a_at = now() - interval '7 minutes', a_nanodollars = 60000000,"
            " b_at = now() - interval '2 minutes', b_nanodollars = 70000000,"
            " last_at = now() - interval '30 seconds', last_nanodollars = 75000000 WHERE key_id = 'ar-ka1'");
        PGresult *pts = PQexec(db, "SELECT (extract(epoch FROM a_at) * 1000000)::bigint,"
                                   " (extract(epoch FROM last_at) * 1000000)::bigint FROM spend_rate_points"
                                   " WHERE key_id = 'ar-ka1'");
        CHECK(PQresultStatus(pts) == PGRES_TUPLES_OK && PQntuples(pts) == 1, "ar-ka1's points: %s",
              PQerrorMessage(db));
        int64_t ref_us = PQntuples(pts) == 1 ? strtoll(PQgetvalue(pts, 0, 0), NULL, 10) : 0;
        int64_t last_us = PQntuples(pts) == 1 ? strtoll(PQgetvalue(pts, 0, 1), NULL, 10) : 0;
        PQclear(pts);
        json_decref(p);
        p = ok(SPEND, &pa, "");
        d = data(p);
        k1 = json_array_get(d, 0);
        k2 = json_array_get(d, 1);
        CHECK(num(k1, "burn_rate_nanodollars_per_hour") == 138461538, "ar-ka1 burn %lld nd/h, want 138,461,538",
              num(k1, "burn_rate_nanodollars_per_hour"));
        char want[64];
        fmt_us(want, sizeof(want), ref_us);
        CHECK(!strcmp(str(k1, "burn_window_start"), want), "burn_window_start %s, want %s",
              str(k1, "burn_window_start"), want);
        fmt_us(want, sizeof(want), last_us + 650000000);
        CHECK(!strcmp(str(k1, "reaches_limit_at"), want), "reaches_limit_at %s, want %s", str(k1, "reaches_limit_at"),
              want);
        CHECK(json_is_null(json_object_get(p, "burn_window_start")), "the answer's burn_window_start is not null");
        /* Spend that has not changed for rate_window (5 minutes) burns nothing. */
        sql("UPDATE spend_rate_points SET a_at = now() - interval '17 minutes', b_at = now() - interval '12 minutes',"
            " last_at = now() - interval '10 minutes' WHERE key_id = 'ar-ka1'");
        json_t *stale = ok(SPEND, &pa, "");
        json_t *s1 = json_array_get(data(stale), 0);
        CHECK(num(s1, "burn_rate_nanodollars_per_hour") == 0 && json_is_null(json_object_get(s1, "reaches_limit_at")),
              "ar-ka1 with no spend change for 10 minutes: burn %lld nd/h", num(s1, "burn_rate_nanodollars_per_hour"));
        json_decref(stale);
        CHECK(num(k2, "spend_nanodollars") == 0 && json_is_null(json_object_get(k2, "limit_nanodollars")) &&
                      json_is_null(json_object_get(k2, "reaches_limit_at")) &&
                      num(k2, "burn_rate_nanodollars_per_hour") == 0,
              "ar-ka2: no spend, no limit, no burn");
        json_decref(p);

        /* Pages of one key. */
        int pages;
        json_t *paged = all_pages(SPEND, &pa, "x=1", 1, &pages);
        CHECK(pages == 2 && json_array_size(paged) == 2, "spend pages %d rows %zu", pages, json_array_size(paged));
        json_decref(paged);

        /* A key sees only itself; B only its own, over its limit and blocked. */
        struct api_caller ka2 = key("ar-a", "ar-ka2");
        p = ok(SPEND, &ka2, "");
        CHECK(json_array_size(data(p)) == 1 && !strcmp(str(json_array_get(data(p), 0), "key"), "ar-ka2"),
              "ar-ka2 sees %zu keys", json_array_size(data(p)));
        json_decref(p);
        struct api_caller pb = person("ar-b");
        p = ok(SPEND, &pb, "");
        json_t *b1 = json_array_get(data(p), 0);
        CHECK(json_array_size(data(p)) == 1 && !strcmp(str(b1, "key"), "ar-kb1"), "B sees %zu keys",
              json_array_size(data(p)));
        CHECK(num(b1, "spend_nanodollars") == 50000000 && num(b1, "remaining_nanodollars") == 0 &&
                      json_is_true(json_object_get(b1, "limit_reached")) &&
                      json_is_true(json_object_get(b1, "blocked")) &&
                      json_is_null(json_object_get(b1, "reaches_limit_at")),
              "ar-kb1 over its limit: spend %lld remaining %lld", num(b1, "spend_nanodollars"),
              num(b1, "remaining_nanodollars"));
        json_decref(p);
        /* An account with no key still learns the day and the clock. */
        struct api_caller nobody = person("ar-nobody");
        p = ok(SPEND, &nobody, "");
        CHECK(json_array_size(data(p)) == 0 && json_is_string(json_object_get(p, "day")) &&
                      json_is_string(json_object_get(p, "as_of")),
              "no keys: %zu rows, day %s", json_array_size(data(p)), str(p, "day"));
        json_decref(p);
}

/* ---- alerts ---- */

static void test_alerts(void)
{
        sql("INSERT INTO alerts (key_id, day, threshold_pct, account_id, spend_nanodollars, limit_nanodollars,"
            " delivered_at) VALUES"
            " ('ar-ka1', '2025-11-01', 50, 'ar-a', 50000000, 100000000, now()),"
            " ('ar-ka1', '2025-11-01', 80, 'ar-a', 80000000, 100000000, NULL),"
            " ('ar-kb1', '2025-11-01', 50, 'ar-b', 500000, 1000000, NULL),"
            " ('ar-ka1', '2025-11-02', 50, 'ar-a', 60000000, 100000000, NULL),"
            " ('ar-ka2', '2025-11-02', 100, 'ar-a', 100000000, 100000000, '2025-11-02 10:00+00'),"
            " ('ar-ka1', '2025-11-02', 80, 'ar-a', 90000000, 100000000, NULL),"
            " ('ar-ka1', '2025-11-02', 100, 'ar-a', 100000000, 100000000, NULL)");
        struct api_caller pa = person("ar-a");
        json_t *p = ok(ALERTS, &pa, "");
        json_t *d = data(p);
        CHECK(json_array_size(d) == 6, "A has %zu alerts, want 6", json_array_size(d));
        /* Newest first: the last inserted (ar-ka1 100 % on 2025-11-02) leads. */
        json_t *a0 = json_array_get(d, 0);
        CHECK(!strcmp(str(a0, "key"), "ar-ka1") && num(a0, "threshold_pct") == 100 &&
                      !strcmp(str(a0, "day"), "2025-11-02") && !strcmp(str(a0, "state"), "no_destination") &&
                      json_is_null(json_object_get(a0, "delivered_at")) && num(a0, "spend_nanodollars") == 100000000,
              "first alert %s %lld %s %s", str(a0, "key"), num(a0, "threshold_pct"), str(a0, "day"), str(a0, "state"));
        json_decref(p);
        int pages;
        json_t *paged = all_pages(ALERTS, &pa, "x=1", 4, &pages);
        CHECK(pages == 2 && json_array_size(paged) == 6, "alert pages %d rows %zu", pages, json_array_size(paged));
        long long last = 1LL << 62;
        size_t i;
        json_t *row;
        json_array_foreach(paged, i, row)
        {
                CHECK(num(row, "id") < last, "alert ids not strictly descending across pages");
                last = num(row, "id");
        }
        json_decref(paged);
        p = ok(ALERTS, &pa, "state=delivered");
        CHECK(json_array_size(data(p)) == 2, "delivered alerts %zu, want 2", json_array_size(data(p)));
        json_decref(p);
        /* No destination was set: nothing will send the other four, and they say so. */
        p = ok(ALERTS, &pa, "state=no_destination");
        CHECK(json_array_size(data(p)) == 4, "alerts with no destination %zu, want 4", json_array_size(data(p)));
        json_decref(p);
        p = ok(ALERTS, &pa, "state=pending");
        CHECK(json_array_size(data(p)) == 0, "pending alerts %zu, want 0 (none has a delivery)", json_array_size(data(p)));
        json_decref(p);
        p = ok(ALERTS, &pa, "key=ar-ka2");
        CHECK(json_array_size(data(p)) == 1, "ar-ka2's alerts for the person: %zu", json_array_size(data(p)));
        json_decref(p);
        struct api_caller ka2 = key("ar-a", "ar-ka2");
        p = ok(ALERTS, &ka2, "");
        a0 = json_array_get(data(p), 0);
        CHECK(json_array_size(data(p)) == 1 && !strcmp(str(a0, "state"), "delivered") &&
                      !strcmp(str(a0, "delivered_at"), "2025-11-02T10:00:00.000000Z"),
              "ar-ka2 sees %zu alerts, delivered_at %s", json_array_size(data(p)), str(a0, "delivered_at"));
        json_decref(p);
        /* A key asking for another key's alerts sees none. */
        p = ok(ALERTS, &ka2, "key=ar-ka1");
        CHECK(json_array_size(data(p)) == 0, "ar-ka2 sees ar-ka1's alerts");
        json_decref(p);
        struct api_caller pb = person("ar-b");
        p = ok(ALERTS, &pb, "");
        CHECK(json_array_size(data(p)) == 1 && !strcmp(str(json_array_get(data(p), 0), "key"), "ar-kb1"),
              "B sees %zu alerts", json_array_size(data(p)));
        json_decref(p);
}

/* ---- the daily rollups (sql/005) follow every write to usage_hourly ---- */

/* The same rows through the rollups (whole days) and through usage_hourly (a
 * from that is not midnight: October's last hour holds nothing). */
static void same_both_ways(const struct api_caller *c, const char *rest)
{
        char q1[512], q2[512];
        snprintf(q1, sizeof(q1), MONTH "&limit=1000&%s", rest);
        snprintf(q2, sizeof(q2), "from=2025-10-31T23:00:00Z&to=2025-12-01T00:00:00Z&limit=1000&%s", rest);
        json_t *a = ok(USAGE, c, q1), *b = ok(USAGE, c, q2);
        CHECK(json_array_size(data(a)) > 0 && json_equal(data(a), data(b)),
              "%s: %zu rows from the rollups, %zu from the hours, or they differ", rest, json_array_size(data(a)),
              json_array_size(data(b)));
        json_decref(a);
        json_decref(b);
}

static void test_rollups(void)
{
        struct api_caller pa = person("ar-a"), ka1 = key("ar-a", "ar-ka1"), pc = person("ar-c");
        /* As the aggregator writes: one statement adding to an existing hour of ar-t-0 (1 vCPU-hour)
         * and making a new hour for ar-t-1 (1 vCPU-hour more). ar-ka1's month: 300,000 + 7,200 CPU-s
         * = 85.333... vCPU-h; x $0.025 = $2.1333... -> 2,133,333,333 nd, 213 cents. */
        sql("INSERT INTO usage_hourly AS u (sandbox_id, hour, account_id, key_id, cpu_ns) VALUES"
            " ('ar-t-0', '2025-11-01 00:00+00', 'ar-a', 'ar-ka1', 3600000000000),"
            " ('ar-t-1', '2025-11-20 00:00+00', 'ar-a', 'ar-ka1', 3600000000000)"
            " ON CONFLICT (sandbox_id, hour) DO UPDATE SET cpu_ns = u.cpu_ns + EXCLUDED.cpu_ns");
        json_t *p = ok(USAGE, &ka1, MONTH "&granularity=month&meter=cpu");
        check_row(json_array_get(data(p), 0), "after upsert", "cpu", "85.333333333", "307200000000000", 2133333333,
                  213);
        json_decref(p);
        same_both_ways(&pa, "granularity=month");
        same_both_ways(&pa, "granularity=day");
        same_both_ways(&pa, "granularity=day&group_by=key");
        same_both_ways(&pa, "granularity=month&group_by=sandbox,label:agent&meter=cpu");
        same_both_ways(&ka1, "granularity=month&group_by=label:team,key");
        same_both_ways(&pc, "granularity=day");
        /* A deleted hour leaves them too: 85.333... - 1 = 84.333... vCPU-h, $2.108333... */
        sql("DELETE FROM usage_hourly WHERE sandbox_id = 'ar-t-1' AND hour = '2025-11-20 00:00+00'");
        p = ok(USAGE, &ka1, MONTH "&granularity=month&meter=cpu");
        check_row(json_array_get(data(p), 0), "after delete", "cpu", "84.333333333", "303600000000000", 2108333333,
                  211);
        json_decref(p);
        same_both_ways(&pa, "granularity=day&group_by=sandbox");

        /* An hour its plan has no rate for counts as nothing (as in spend_daily) and does not spoil
         * the day's later hours: ar-late rates memory only from 2025-11-05 01:00. Two statements,
         * 00:00 then 01:00, each 1 vCPU-hour and 4 GiB-hours: CPU 2 vCPU-h, $0.05; memory 8 GiB-h
         * of which 4 are rated, 4 x $0.0075 = $0.03. */
        sql("INSERT INTO price_plans (id, name) VALUES ('ar-late', 'memory rated late')");
        sql("INSERT INTO plan_rates VALUES ('ar-late', 'cpu', '2020-01-01 00:00+00', 25000000, 'vCPU-hour'),"
            " ('ar-late', 'memory', '2025-11-05 01:00+00', 7500000, 'GiB-hour')");
        sql("INSERT INTO accounts (id, name, plan_id) VALUES ('ar-e', 'E', 'ar-late')");
        sql("INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns) VALUES"
            " ('ar-e-0', '2025-11-05 00:00+00', 'ar-e', 'ar-ke1', 3600000000000, 4294967296::numeric * 3600000000000)");
        sql("INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns) VALUES"
            " ('ar-e-0', '2025-11-05 01:00+00', 'ar-e', 'ar-ke1', 3600000000000, 4294967296::numeric * 3600000000000)");
        struct api_caller pe = person("ar-e");
        p = ok(USAGE, &pe, MONTH "&granularity=month&meter=cpu,memory");
        check_row(json_array_get(data(p), 0), "E", "cpu", "2.000000000", "7200000000000", 50000000, 5);
        check_row(json_array_get(data(p), 1), "E", "memory", "8.000000000", "30923764531200000000000", 30000000, 3);
        json_decref(p);
        same_both_ways(&pe, "granularity=day&group_by=sandbox");
}

/* ---- the OpenAPI document ---- */

/* A query past the statement timeout (tally-api sets statement_timeout_ms on its pool) is a 503
 * with code query_timeout, not a 500: the usage query waits on a lock another session holds. */
static void test_query_timeout(const char *url)
{
        PGconn *other = PQconnectdb(url);
        CHECK(PQstatus(other) == CONNECTION_OK, "connect: %s", PQerrorMessage(other));
        PQclear(PQexec(other, "BEGIN; LOCK TABLE usage_hourly IN ACCESS EXCLUSIVE MODE"));
        PQclear(PQexec(db, "SET statement_timeout = 300"));
        struct api_caller pa = person("ar-a");
        char *body = NULL;
        struct api_error err;
        int r = call(USAGE, &pa, MONTH "&granularity=day&group_by=sandbox", &body, &err);
        CHECK(r != 0 && err.status == 503 && !strcmp(err.code, "query_timeout"),
              "a usage query past statement_timeout: %d, status %d code %s", r, err.status, err.code);
        free(body);
        PQclear(PQexec(db, "SET statement_timeout = 0"));
        PQclear(PQexec(other, "ROLLBACK"));
        PQfinish(other);
}

static void test_openapi(void)
{
        json_error_t e;
        json_t *doc = json_loads(api_openapi_json(), 0, &e);
        CHECK(doc != NULL, "the OpenAPI document is not JSON: %s at line %d", e.text, e.line);
        if (!doc)
                return;
        CHECK(!strcmp(str(doc, "openapi"), "3.1.0"), "openapi %s", str(doc, "openapi"));
        /* Every read route (usage, spend, alerts, CSV, OpenAPI) as the server's table names them. */
        static const char *const routes[][2] = {
                { "/healthz", "get" },
                { "/metrics", "get" },
                { "/v1/openapi.json", "get" },
                { "/v1/sessions", "post" },
                { "/v1/sessions/current", "get" },
                { "/v1/sessions/current", "delete" },
                { "/v1/keys", "get" },
                { "/v1/keys", "post" },
                { "/v1/keys/{id}", "get" },
                { "/v1/keys/{id}", "delete" },
                { "/v1/keys/{id}/limit", "put" },
                { "/v1/keys/{id}/limit", "delete" },
                { "/v1/sandboxes", "get" },
                { "/v1/sandboxes", "post" },
                { "/v1/sandboxes/{id}", "get" },
                { "/v1/sandboxes/{id}", "delete" },
                { "/v1/sandboxes/{id}/exec", "post" },
                { "/v1/sandboxes/{id}/pause", "post" },
                { "/v1/sandboxes/{id}/resume", "post" },
                { "/v1/sandboxes/{id}/fork", "post" },
                { "/v1/sandboxes/{id}/timeout", "post" },
                { "/v1/usage", "get" },
                { "/v1/spend", "get" },
                { "/v1/alerts", "get" },
        };
        json_t *paths = json_object_get(doc, "paths");
        size_t nops = 0;
        const char *path;
        json_t *item;
        json_object_foreach(paths, path, item) nops += json_object_size(item);
        /* Later issues add routes (invoices, alert destinations, the dashboard): api-openapi checks
         * the whole document against the server's route table; here, the read routes are all present. */
        CHECK(nops >= sizeof(routes) / sizeof(routes[0]), "%zu operations, want at least %zu", nops,
              sizeof(routes) / sizeof(routes[0]));
        for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
                json_t *o = json_object_get(json_object_get(paths, routes[i][0]), routes[i][1]);
                CHECK(json_is_object(o) && json_is_object(json_object_get(o, "responses")), "no %s %s", routes[i][1],
                      routes[i][0]);
        }
        json_decref(doc);
}

int main(void)
{
        char *url = test_db_create("apiread");
        char *out = NULL, *err = NULL;
        char *margv[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", url, "apply", NULL };
        if (test_run(margv, &out, &err) != 0) {
                fprintf(stderr, "FAIL: tally-migrate: %s\n", err ? err : "");
                return 1;
        }
        free(out);
        free(err);
        db = PQconnectdb(url);
        if (PQstatus(db) != CONNECTION_OK) {
                fprintf(stderr, "FAIL: connect: %s\n", PQerrorMessage(db));
                return 1;
        }
        load();
        test_usage_month();
        test_usage_groups();
        test_usage_pages();
        test_usage_csv();
        test_bad_input();
        test_spend();
        test_alerts();
        test_openapi();
        test_query_timeout(url);
        test_rollups();
        PQfinish(db);
        test_db_drop(url);
        return test_result();
}
