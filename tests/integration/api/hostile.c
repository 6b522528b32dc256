/* The hostile-tenant suite (meson test api-hostile): each way one tenant of
 * tally-api tried to hurt the others, run as the attack itself against a
 * real tally-api, tally-vmm (process backend) and PostgreSQL (test_api.c
 * starts them; tally-api with queue_per_account 8 and the default 4
 * sandbox requests at once per key). Each case fails on a tally-api without
 * the defence it names. Expected figures come from the settings and from the
 * database read directly, never from tally-api's own answers. */
#include "apitest.h"
#include "support.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SIGNIN_MAX 5 /* --signin-max-failures of test_api.c's start_api */

static int cmp_long(const void *a, const void *b)
{
        long x = *(const long *)a, y = *(const long *)b;
        return (x > y) - (x < y);
}

/* ---- 1. one key's long execs freeze nobody else ---- */

struct execer {
        pthread_t t;
        const char *path;
        long status;
        char retry_after[32];
};

static void *exec_sleep(void *arg)
{
        struct execer *x = arg;
        http_timeout_s = 60;
        struct resp r = http("POST", x->path, key_a.secret, NULL, "{\"command\":\"sleep 4\",\"timeout_ms\":30000}");
        x->status = r.status;
        snprintf(x->retry_after, sizeof(x->retry_after), "%s", r.retry_after);
        resp_free(&r);
        return NULL;
}

#define FLOOD 24 /* execs at once: three times tally-api's 8 HTTP threads */

/* FLOOD concurrent execs of `sleep 4` by one key, over 3 of its sandboxes
 * (its cap: 4 at once; its account may have 8 waiting): while they run,
 * /healthz and another account's /v1/spend and /v1/sandboxes answer at once;
 * the 12 over the queue get 429 with Retry-After, the 12 others run. */
static void test_exec_flood(void)
{
        char id[3][64], path[3][256];
        for (int i = 0; i < 3; i++) {
                create_sandbox(&key_a, id[i], sizeof(id[i]));
                snprintf(path[i], sizeof(path[i]), "/v1/sandboxes/%s/exec", id[i]);
        }
        struct execer x[FLOOD];
        for (int i = 0; i < FLOOD; i++) {
                x[i] = (struct execer){ .path = path[i % 3] };
                pthread_create(&x[i].t, NULL, exec_sleep, &x[i]);
        }
        test_sleep_ms(1500);
        const char *reads[][2] = { { "/healthz", NULL }, { "/v1/spend", key_b.secret }, { "/v1/sandboxes", key_b.secret } };
        long ms[30];
        int n = 0, bad = 0;
        http_timeout_s = 5;
        for (int round = 0; round < 10; round++)
                for (int k = 0; k < 3; k++) {
                        struct resp r = http("GET", reads[k][0], reads[k][1], NULL, NULL);
                        ms[n++] = r.status ? r.ms : 5000;
                        if (r.status != 200) {
                                bad++;
                                fprintf(stderr, "during the flood: GET %s answered %ld after %ld ms\n", reads[k][0],
                                        r.status, r.ms);
                        }
                        resp_free(&r);
                }
        http_timeout_s = 60;
        qsort(ms, (size_t)n, sizeof(long), cmp_long);
        fprintf(stderr, "reads during one key's %d execs: median %ld ms, max %ld ms\n", FLOOD, ms[n / 2], ms[n - 1]);
        /* 100 ms on an idle machine; 2 s is the bound a machine at load 20 still meets */
        CHECK(bad == 0 && ms[n - 1] < 2000, "while one key ran %d execs: %d reads failed, the slowest took %ld ms",
              FLOOD, bad, ms[n - 1]);
        int ok = 0, refused = 0;
        for (int i = 0; i < FLOOD; i++) {
                pthread_join(x[i].t, NULL);
                ok += x[i].status == 200;
                if (x[i].status == 429 && atoi(x[i].retry_after) >= 1)
                        refused++;
        }
        fprintf(stderr, "%d execs by one key: %d ran, %d refused with 429\n", FLOOD, ok, refused);
        CHECK(ok + refused == FLOOD && refused >= 1 && ok >= 4,
              "%d execs by one key (4 at once, 8 waiting): %d answered 200, %d 429 with Retry-After", FLOOD, ok,
              refused);
}

/* ---- 2. a locked email stays locked, whatever others send ---- */

struct flooder {
        pthread_t t;
        int id, n;
        long statuses[600];
};

/* Sign-ins for made-up emails from one address, on one connection. */
static void *signin_flood(void *arg)
{
        struct flooder *f = arg;
        CURL *c = curl_easy_init();
        char url[256], body[256], ip[32];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/sessions", port);
        snprintf(ip, sizeof(ip), "127.0.0.%d", 50 + f->id);
        struct curl_slist *hs = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        curl_easy_setopt(c, CURLOPT_INTERFACE, ip);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        for (int i = 0; i < f->n; i++) {
                struct resp r = { 0 };
                curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
                snprintf(body, sizeof(body), "{\"email\":\"made-up-%d-%d@example.invalid\",\"password\":\"x\"}", f->id, i);
                curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
                long st = 0;
                if (curl_easy_perform(c) == CURLE_OK)
                        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &st);
                free(r.body);
                if (i < 600)
                        f->statuses[i] = st;
        }
        curl_slist_free_all(hs);
        curl_easy_cleanup(c);
        return NULL;
}

/* C's email locked by 5 wrong passwords (from 5 addresses); then 4
 * addresses send 16,000 sign-ins for made-up emails (each address is
 * limited after its first 5: the rest answer 429 at once, and each such
 * attempt still counted a new email). C's right password still gets 429. */
static void test_signin_evict(void)
{
        long st;
        char ip[32];
        for (int i = 0; i < SIGNIN_MAX; i++) {
                snprintf(ip, sizeof(ip), "127.0.0.%d", 10 + i);
                source_ip = ip;
                sign_in(email_c, "wrong", &st);
                CHECK(st == 401, "failure %d: %ld", i, st);
        }
        source_ip = NULL;
        struct flooder f[4];
        int64_t t0 = test_now_ms();
        for (int i = 0; i < 4; i++) {
                f[i] = (struct flooder){ .id = i, .n = 4000 };
                pthread_create(&f[i].t, NULL, signin_flood, &f[i]);
        }
        for (int i = 0; i < 4; i++)
                pthread_join(f[i].t, NULL);
        fprintf(stderr, "16,000 sign-ins for made-up emails from 4 addresses in %lld ms\n",
                (long long)(test_now_ms() - t0));
        for (int i = 0; i < 4; i++) {
                int checked = 0;
                for (int k = 0; k < 600; k++)
                        checked += f[i].statuses[k] == 401;
                CHECK(checked <= SIGNIN_MAX && f[i].statuses[599] == 429,
                      "address %d: %d of its first 600 attempts checked (limit %d), the 600th answered %ld", i,
                      checked, SIGNIN_MAX, f[i].statuses[599]);
        }
        source_ip = "127.0.0.40";
        sign_in(email_c, "correct horse battery", &st);
        source_ip = NULL;
        CHECK(st == 429, "the locked email signed in (%ld) after a flood of other emails", st);
}

/* ---- 3. concurrent wrong passwords: no more than the limit reach the hash ---- */

struct guesser {
        pthread_t t;
        const char *email;
        char ip[32];
        long status;
};

static void *guess(void *arg)
{
        struct guesser *g = arg;
        source_ip = g->ip;
        sign_in(g->email, "wrong guess", &g->status);
        return NULL;
}

/* 20 concurrent wrong passwords for one email, each from its own address:
 * exactly SIGNIN_MAX are checked (401), the other 15 refused (429). */
static void test_signin_race(void)
{
        char email[128];
        snprintf(email, sizeof(email), "d-%d@example.com", (int)getpid());
        CHECK(admin(NULL, "person", "create", "--account", acct_a, "--email", email, "--password-file", pwfile, NULL) ==
                      0,
              "person D");
        struct guesser g[20];
        for (int i = 0; i < 20; i++) {
                g[i] = (struct guesser){ .email = email };
                snprintf(g[i].ip, sizeof(g[i].ip), "127.0.1.%d", 10 + i);
                pthread_create(&g[i].t, NULL, guess, &g[i]);
        }
        int checked = 0, refused = 0;
        for (int i = 0; i < 20; i++) {
                pthread_join(g[i].t, NULL);
                checked += g[i].status == 401;
                refused += g[i].status == 429;
        }
        fprintf(stderr, "20 concurrent wrong passwords: %d checked against the hash, %d refused\n", checked, refused);
        CHECK(checked == SIGNIN_MAX && refused == 20 - SIGNIN_MAX,
              "20 concurrent wrong passwords (limit %d): %d checked, %d refused", SIGNIN_MAX, checked, refused);
}

/* ---- 4. a new key's secret is never at rest ---- */

static struct session person_a(void)
{
        long st;
        source_ip = "127.0.2.1";
        struct session s = sign_in(email_a, "correct horse battery", &st);
        source_ip = NULL;
        CHECK(st == 201, "sign-in A: %ld", st);
        return s;
}

/* POST /v1/keys with an Idempotency-Key: the secret is in the first answer
 * only; idempotency_keys never holds it; a replay names the key and says the
 * secret was shown once. */
static void test_idem_secret(void)
{
        struct session s = person_a();
        struct resp a = http_full("POST", "/v1/keys", NULL, &s, true, "{\"name\":\"idem-secret\"}", "key-once");
        char id[64], secret[128];
        snprintf(id, sizeof(id), "%s", test_jstr(a.json, "id"));
        snprintf(secret, sizeof(secret), "%s", test_jstr(a.json, "key"));
        CHECK(a.status == 201 && strncmp(secret, "tk_", 3) == 0, "create a key: %ld %s", a.status, a.body);
        resp_free(&a);
        CHECK(sql_int("SELECT count(*) FROM idempotency_keys WHERE strpos(coalesce(body, ''), $1) > 0", secret) == 0,
              "idempotency_keys holds the key's secret in clear");
        struct resp b = http_full("POST", "/v1/keys", NULL, &s, true, "{\"name\":\"idem-secret\"}", "key-once");
        CHECK(b.status == 201 && b.replayed && b.body && !strstr(b.body, secret) &&
                      strcmp(test_jstr(b.json, "id"), id) == 0 &&
                      json_is_true(json_object_get(b.json, "secret_shown_once")),
              "replay of a key's creation: %ld replayed=%d %s", b.status, b.replayed, b.body);
        resp_free(&b);
}

/* ---- 5. an Idempotency-Key is the key's own ---- */

/* Key A2 sends key A's Idempotency-Key with the same body: it gets a
 * sandbox of its own, not A's answer. */
static void test_idem_scope(void)
{
        const char *body = "{\"memory_mib\":64,\"labels\":{\"suite\":\"hostile\"}}";
        struct resp a = http_full("POST", "/v1/sandboxes", key_a.secret, NULL, false, body, "shared-scheme-1");
        struct resp b = http_full("POST", "/v1/sandboxes", key_a2.secret, NULL, false, body, "shared-scheme-1");
        CHECK(a.status == 201 && b.status == 201, "creates: %ld %ld", a.status, b.status);
        CHECK(!b.replayed && strcmp(test_jstr(a.json, "id"), test_jstr(b.json, "id")) != 0 &&
                      strcmp(test_jstr(b.json, "key"), key_a2.id) == 0,
              "key A2 got key A's answer: replayed=%d %s", b.replayed, b.body);
        resp_free(&a);
        resp_free(&b);
}

/* ---- 6. a blocked key spends nowhere ---- */

/* Key A2 is blocked today. On key A's running sandbox it cannot fork or
 * exec; on its own paused sandbox it cannot extend the lease. */
static void test_caller_block(void)
{
        char sib[64], own[64], path[256];
        create_sandbox(&key_a, sib, sizeof(sib));
        create_sandbox(&key_a2, own, sizeof(own));
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", own);
        struct resp r = http("POST", path, key_a2.secret, NULL, NULL);
        CHECK(r.status == 200, "pause: %ld %s", r.status, r.body);
        resp_free(&r);
        sql_exec("INSERT INTO key_blocks (key_id, day, account_id, policy) "
                 "VALUES ($1, (now() AT TIME ZONE 'UTC')::date, $2, 'pause')",
                 key_a2.id, acct_a);
        int before = vmm_count(acct_a);
        const char *attempts[][3] = {
                { sib, "/fork", "{\"count\":1}" },
                { sib, "/exec", "{\"command\":\"true\"}" },
                { own, "/timeout", "{\"timeout_s\":3600}" },
        };
        for (size_t i = 0; i < 3; i++) {
                snprintf(path, sizeof(path), "/v1/sandboxes/%s%s", attempts[i][0], attempts[i][1]);
                r = http("POST", path, key_a2.secret, NULL, attempts[i][2]);
                CHECK(r.status == 402 && strcmp(err_code(&r), "limit_reached") == 0, "blocked key: POST %s: %ld %s",
                      path, r.status, r.body);
                resp_free(&r);
        }
        CHECK(vmm_count(acct_a) == before, "a blocked key forked: %d sandboxes more", vmm_count(acct_a) - before);
        /* stopping spends nothing: still allowed */
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", own);
        r = http("DELETE", path, key_a2.secret, NULL, NULL);
        CHECK(r.status == 200, "a blocked key stops its sandbox: %ld %s", r.status, r.body);
        resp_free(&r);
        sql_exec("DELETE FROM key_blocks WHERE key_id = $1", key_a2.id, NULL);
}

/* ---- 7. no formula reaches a spreadsheet ---- */

/* Two sandboxes labelled with formulas, an hour of usage each: the usage
 * CSV grouped by that label writes them as text ('=..., '+...). */
static void test_csv_formulas(void)
{
        const char *labels[] = { "{\"team\": \"=HYPERLINK(\\\"http://evil.example\\\",\\\"x\\\")\"}",
                                 "{\"team\": \"+cmd|' /C calc'!A0\"}" };
        for (int i = 0; i < 2; i++) {
                char sid[64];
                snprintf(sid, sizeof(sid), "sbx-csv-%d-%d", (int)getpid(), i);
                const char *p[] = { sid, acct_a, key_a.id, labels[i] };
                PGresult *res = PQexecParams(
                        db,
                        "WITH s AS (INSERT INTO sandboxes (id, account_id, key_id, vcpus, mem_size_bytes, labels, state) "
                        "           VALUES ($1, $2, $3, 1, 1073741824, $4::jsonb, 'stopped')) "
                        "INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns) "
                        "VALUES ($1, '2026-01-01T00:00:00Z', $2, $3, 3600000000000, 0)",
                        4, NULL, p, NULL, NULL, 0);
                CHECK(PQresultStatus(res) == PGRES_COMMAND_OK, "ledger rows: %s", PQerrorMessage(db));
                PQclear(res);
        }
        CURL *c = curl_easy_init();
        char url[512], auth[256];
        snprintf(url, sizeof(url),
                 "http://127.0.0.1:%d/v1/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z&group_by=label:team",
                 port);
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", key_a.secret);
        struct curl_slist *hs = curl_slist_append(curl_slist_append(NULL, auth), "Accept: text/csv");
        struct resp r = { 0 }, heads = { 0 };
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &heads);
        curl_easy_perform(c);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
        curl_slist_free_all(hs);
        curl_easy_cleanup(c);
        /* offered as a download with a name, not shown as a page */
        CHECK(heads.body && strstr(heads.body, "Content-Disposition: attachment; filename=\"tally-usage.csv\"\r\n"),
              "usage CSV without its Content-Disposition: %s", heads.body ? heads.body : "");
        resp_free(&heads);
        int records = 0;
        for (const char *p = r.body ? r.body : ""; (p = strstr(p, "\r\n")); p += 2)
                records++;
        /* a header, and for each sandbox's label a row per meter (cpu, memory, storage) */
        CHECK(r.status == 200 && records == 1 + 2 * 3, "usage CSV: %ld, %d records (want 7): %s", r.status, records,
              r.body ? r.body : "");
        const char *b = r.body ? r.body : "";
        CHECK(strstr(b, "\"'=HYPERLINK(") && strstr(b, "\"'+cmd|"), "the formulas are not neutralised: %s", b);
        /* no cell (after a comma, a line start, or an opening quote) starts a formula */
        bool live = false;
        for (const char *p = b; *p; p++) {
                bool cell_start = p == b || p[-1] == ',' || p[-1] == '\n' || (p[-1] == '"' && (p - 1 == b || p[-2] == ',' || p[-2] == '\n'));
                if (cell_start && (*p == '=' || *p == '+' || *p == '@'))
                        live = true;
        }
        CHECK(!live, "a CSV cell starts a formula: %s", b);
        resp_free(&r);
}

/* ---- 8. every error is tally's JSON; no query is ignored or cut ---- */

static void test_errors(void)
{
        struct {
                const char *method, *path;
                long status;
                const char *code;
        } cases[] = {
                { "GET", "/v1/usage?from=0000-01-01T00:00:00Z&to=0000-01-02T00:00:00Z", 400, "invalid_field" },
                { "GET", "/v1/spend?bogus=1", 400, "unknown_parameter" },
                { "GET", "/v1/sandboxes?limit=10&colour=red", 400, "unknown_parameter" },
                { "GET", "/v1/sandboxes?state=running%00paused", 400, "invalid_field" },
                { "GET", "/v1/sandboxes?label=suite%3D%ff", 400, "invalid_field" },
                { "POST", "/v1/sandboxes?vcpus=64", 400, "unknown_parameter" },
                { "PUT", "/v1/sandboxes", 405, "method_not_allowed" },
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct resp r = http(cases[i].method, cases[i].path, key_a2.secret, NULL,
                                     strcmp(cases[i].method, "GET") ? "{}" : NULL);
                CHECK(r.status == cases[i].status && strcmp(err_code(&r), cases[i].code) == 0,
                      "%s %s: %ld %s (want %ld %s)", cases[i].method, cases[i].path, r.status, r.body ? r.body : "",
                      cases[i].status, cases[i].code);
                resp_free(&r);
        }
        /* a URL of 10,000 bytes: 414; 20,000 bytes of headers: 431 — both tally's JSON */
        char *path = malloc(10100);
        snprintf(path, 10100, "/v1/spend?cursor=");
        memset(path + strlen(path), 'a', 10000);
        path[10000] = '\0';
        struct resp r = http("GET", path, key_a2.secret, NULL, NULL);
        CHECK(r.status == 414 && strcmp(err_code(&r), "uri_too_long") == 0, "a 10,000-byte URL: %ld %s", r.status,
              r.body ? r.body : "");
        resp_free(&r);
        free(path);
        CURL *c = curl_easy_init();
        char url[256];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d/healthz", port);
        struct curl_slist *hs = NULL;
        char *h = malloc(2100);
        for (int i = 0; i < 10; i++) {
                snprintf(h, 2100, "X-Pad-%d: ", i);
                memset(h + strlen(h), 'p', 2000);
                h[2000] = '\0';
                hs = curl_slist_append(hs, h);
        }
        free(h);
        r = (struct resp){ 0 };
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
        curl_easy_perform(c);
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
        curl_slist_free_all(hs);
        curl_easy_cleanup(c);
        r.json = r.body ? json_loads(r.body, 0, NULL) : NULL;
        CHECK(r.status == 431 && strcmp(err_code(&r), "headers_too_large") == 0, "20,000 bytes of headers: %ld %s",
              r.status, r.body ? r.body : "");
        resp_free(&r);
}

const struct test_case hostile_cases[] = {
        { "exec_flood", test_exec_flood },       { "signin_evict", test_signin_evict },
        { "signin_race", test_signin_race },     { "idem_secret", test_idem_secret },
        { "idem_scope", test_idem_scope },       { "caller_block", test_caller_block },
        { "csv_formulas", test_csv_formulas },   { "errors", test_errors },
};
const size_t hostile_ncases = sizeof(hostile_cases) / sizeof(hostile_cases[0]);
