/* Integration: the whole path through tally-api, every part a real process.
 *
 * A person signs in and creates a key; an agent creates a sandbox with it
 * through tally-api and burns CPU in it (tally-vmm, process backend, real
 * cgroups); tally-collector samples it, the broker carries it, the
 * aggregator rates it into PostgreSQL. Then GET /v1/usage and GET /v1/spend
 * must show, to the nano-dollar, the cost of the usage billed — worked out
 * by this test's own SQL from usage_hourly and the default plan's rates typed
 * here by hand ($0.025 per vCPU-hour, $0.0075 per GiB-hour, $0.08 per
 * GB-month: 25,000,000, 7,500,000 and 80,000,000 nano-dollars), never with
 * the system's own rate_at(): per (day, meter) row, the exact sum of usage x
 * rate divided once by the unit and rounded half up (docs/billing.md); the
 * day's spend, all meters summed exactly, then rounded once (spend_daily's
 * rule). The CPU billed must equal, to the ns, the sandbox's cgroup counter
 * read by the test from the kernel once its processes ended. */
#include "pipe.h"
#include "support.h"
#include "vmmtest.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct pipeline P;
static pid_t api_pid = -1;
static int port;

struct resp {
        long status;
        char *body;
        json_t *json;
        char cookie[256];
};

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
        struct resp *r = ud;
        size_t add = size * n, old = r->body ? strlen(r->body) : 0;
        char *b = realloc(r->body, old + add + 1);
        memcpy(b + old, p, add);
        b[old + add] = '\0';
        r->body = b;
        return add;
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
        struct resp *r = ud;
        if (size * n > 12 && strncasecmp(p, "Set-Cookie: ", 12) == 0)
                snprintf(r->cookie, sizeof(r->cookie), "%.*s", (int)(size * n - 12 < 255 ? size * n - 12 : 255),
                         p + 12);
        return size * n;
}

static struct resp http(const char *method, const char *path, const char *auth_header, const char *cookie,
                        const char *csrf, const char *body)
{
        struct resp r = { 0 };
        CURL *c = curl_easy_init();
        char url[1024], h[512];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
        struct curl_slist *hs = curl_slist_append(NULL, "Content-Type: application/json");
        if (auth_header) {
                snprintf(h, sizeof(h), "Authorization: Bearer %s", auth_header);
                hs = curl_slist_append(hs, h);
        }
        if (cookie) {
                snprintf(h, sizeof(h), "Cookie: tally_session=%s", cookie);
                hs = curl_slist_append(hs, h);
        }
        if (csrf) {
                snprintf(h, sizeof(h), "X-CSRF-Token: %s", csrf);
                hs = curl_slist_append(hs, h);
        }
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
        if (body)
                curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        if (curl_easy_perform(c) == CURLE_OK)
                curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
        curl_slist_free_all(hs);
        curl_easy_cleanup(c);
        r.json = r.body ? json_loads(r.body, 0, NULL) : NULL;
        return r;
}

static void resp_free(struct resp *r)
{
        free(r->body);
        json_decref(r->json);
}

static void start_api(void)
{
        char log[1024];
        snprintf(log, sizeof(log), "%s/api.log", P.dir);
        char *argv[] = { (char *)test_env("TALLY_API_BIN"), "--database-url", P.db_url, "--port", "0",
                         "--vmm-sockets", P.sock, "--cookie-secure=false", NULL };
        api_pid = test_spawn(argv, NULL, log);
        for (int i = 0; i < 400 && !port; i++) {
                char *l = test_read_file(log);
                char *q = l ? strstr(l, "msg=\"listening\"") : NULL;
                if (q && (q = strstr(q, " port=")))
                        port = atoi(q + 6);
                free(l);
                if (!port)
                        test_sleep_ms(50);
        }
        CHECK(port > 0, "tally-api did not start");
}

int main(void)
{
        pipe_start(&P, "apipath", 200, NULL);
        start_api();
        if (!port)
                return pipe_finish(&P);
        /* an operator makes the person */
        char pw[600];
        snprintf(pw, sizeof(pw), "%s/password", P.dir);
        FILE *f = fopen(pw, "w");
        fputs("a long enough password\n", f);
        fclose(f);
        char *admin[] = { (char *)test_env("TALLY_ADMIN_BIN"), "--database-url", P.db_url, "person", "create",
                          "--account", "acct_pipe", "--email", "owner@pipe.example", "--password-file", pw, NULL };
        CHECK(test_run(admin, NULL, NULL) == 0, "tally-admin person create failed");

        /* the person signs in and creates a key */
        struct resp r = http("POST", "/v1/sessions", NULL, NULL, NULL,
                             "{\"email\":\"owner@pipe.example\",\"password\":\"a long enough password\"}");
        char token[128] = "", csrf[128] = "", key[128] = "", key_id[64] = "";
        sscanf(r.cookie, "tally_session=%127[^;]", token);
        snprintf(csrf, sizeof(csrf), "%s", test_jstr(r.json, "csrf_token"));
        CHECK(r.status == 201 && *token, "sign-in: %ld %s", r.status, r.body);
        resp_free(&r);
        r = http("POST", "/v1/keys", NULL, token, csrf, "{\"name\":\"agent\"}");
        snprintf(key, sizeof(key), "%s", test_jstr(r.json, "key"));
        snprintf(key_id, sizeof(key_id), "%s", test_jstr(r.json, "id"));
        CHECK(r.status == 201 && *key, "key: %ld %s", r.status, r.body);
        resp_free(&r);

        /* the agent creates a sandbox, burns CPU in it, and stops it */
        r = http("POST", "/v1/sandboxes", key, NULL, NULL,
                 "{\"vcpus\":1,\"memory_mib\":128,\"command\":[\"sleep\",\"600\"]}");
        char id[80] = "";
        snprintf(id, sizeof(id), "%s", test_jstr(r.json, "id"));
        CHECK(r.status == 201 && *id, "create: %ld %s", r.status, r.body);
        resp_free(&r);
        char path[256];
        /* Its cgroup, from the vmm (tally-api does not say where it lives on
         * the host), held so the test reads its counter after the stop. */
        struct sb truth = { 0 };
        snprintf(truth.id, sizeof(truth.id), "%s", id);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        struct call vc;
        json_t *vj = pipe_api(&P, "GET", path, NULL, &vc);
        const char *cg = vj ? json_string_value(json_object_get(vj, "cgroup_cpu")) : NULL;
        CHECK(cg, "the vmm does not say where sandbox %s's cgroup is", id);
        snprintf(truth.cpu_dir, sizeof(truth.cpu_dir), "%s", cg ? cg : "");
        json_decref(vj);
        bool held = cg && pipe_hold(&truth) == 0;
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", id);
        r = http("POST", path, key, NULL, NULL,
                 "{\"command\":[\"sh\",\"-c\",\"i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; echo done\"]}");
        CHECK(r.status == 200 && strcmp(test_jstr(r.json, "stdout"), "done\n") == 0, "exec: %ld %s", r.status, r.body);
        resp_free(&r);
        test_sleep_ms(600);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        r = http("DELETE", path, key, NULL, NULL, NULL);
        CHECK(r.status == 200, "delete: %ld %s", r.status, r.body);
        resp_free(&r);
        bool have_truth = held && pipe_read_truth(&truth) == 0;
        pipe_wait_removed(&P, id, 15000);
        pipe_wait_caught_up(&P, 20000);

        /* what usage_hourly holds, worked out by this test */
        char sql[4096];
        snprintf(sql, sizeof(sql),
                 "SELECT sum(cpu_ns) FROM usage_hourly WHERE sandbox_id = '%s' AND key_id = '%s'", id, key_id);
        char *cpu = pipe_query(&P, sql);
        CHECK(have_truth && truth.truth_cpu_ns > 100000000, "the kernel's counter: %" PRIu64 " ns (read: %s)",
              truth.truth_cpu_ns, have_truth ? "yes" : "no");
        CHECK(cpu && strtoull(cpu, NULL, 10) == truth.truth_cpu_ns,
              "usage_hourly holds %s ns of CPU for the sandbox, the kernel's counter %" PRIu64 " ns", cpu ? cpu : "none",
              truth.truth_cpu_ns);
        free(cpu);
        /* per (UTC day, meter): exact sum of base usage x the hour's rate, divided once, rounded half up */
        snprintf(sql, sizeof(sql),
                 "WITH u AS (SELECT (hour AT TIME ZONE 'UTC')::date AS day, hour, cpu_ns::numeric AS cpu, mem_byte_ns AS mem,"
                 "                  storage_byte_ns AS st FROM usage_hourly WHERE sandbox_id = '%s'),"
                 " m AS (SELECT day, 'cpu' AS meter, sum(cpu * 25000000) AS x, 3600000000000::numeric AS b FROM u GROUP BY day"
                 "       UNION ALL SELECT day, 'memory', sum(mem * 7500000), 1073741824::numeric * 3600000000000 FROM u GROUP BY day"
                 "       UNION ALL SELECT day, 'storage', sum(st * 80000000), 1000000000::numeric * 2592000000000000 FROM u GROUP BY day)"
                 " SELECT sum(div(2 * x + b, 2 * b)) FROM m",
                 id);
        char *want_usage = pipe_query(&P, sql);
        /* today's spend of the key: every meter summed exactly over a common denominator, rounded once */
        snprintf(sql, sizeof(sql),
                 "WITH u AS (SELECT hour, cpu_ns::numeric AS cpu, mem_byte_ns AS mem, storage_byte_ns AS st FROM usage_hourly"
                 "           WHERE key_id = '%s' AND (hour AT TIME ZONE 'UTC')::date = (now() AT TIME ZONE 'UTC')::date),"
                 " l AS (SELECT 1073741824::numeric * 703125 * 3600000000000 AS d)"
                 " SELECT div(2 * sum(cpu * 25000000 * (l.d / 3600000000000)"
                 "                  + mem * 7500000 * (l.d / (1073741824::numeric * 3600000000000))"
                 "                  + st * 80000000 * (l.d / (1000000000::numeric * 2592000000000000)))"
                 "            + l.d, 2 * l.d) FROM u, l GROUP BY l.d",
                 key_id);
        char *want_spend = pipe_query(&P, sql);
        CHECK(want_usage && want_spend && strtoll(want_usage, NULL, 10) > 0, "the ledger's cost: usage %s spend %s",
              want_usage ? want_usage : "none", want_spend ? want_spend : "none");

        /* what the API says, as the agent sees it */
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        char from[32], to[32];
        strftime(from, sizeof(from), "%Y-%m-%dT00:00:00Z", &tm);
        time_t tomorrow = now + 86400;
        gmtime_r(&tomorrow, &tm);
        strftime(to, sizeof(to), "%Y-%m-%dT00:00:00Z", &tm);
        snprintf(path, sizeof(path), "/v1/usage?from=%s&to=%s&granularity=day&group_by=sandbox", from, to);
        r = http("GET", path, key, NULL, NULL, NULL);
        CHECK(r.status == 200, "usage: %ld %s", r.status, r.body);
        long long got_usage = 0;
        size_t i;
        json_t *row;
        json_array_foreach(json_object_get(r.json, "data"), i, row) {
                if (strcmp(test_jstr(json_object_get(row, "group"), "sandbox"), id) == 0)
                        got_usage += json_integer_value(json_object_get(row, "cost_nanodollars"));
        }
        CHECK(want_usage && got_usage == strtoll(want_usage, NULL, 10),
              "GET /v1/usage says %lld nano-dollars for the sandbox, usage_hourly holds %s", got_usage,
              want_usage ? want_usage : "none");
        resp_free(&r);
        r = http("GET", "/v1/spend", key, NULL, NULL, NULL);
        long long got_spend = -1;
        json_array_foreach(json_object_get(r.json, "data"), i, row) {
                if (strcmp(test_jstr(row, "key"), key_id) == 0)
                        got_spend = json_integer_value(json_object_get(row, "spend_nanodollars"));
        }
        CHECK(r.status == 200 && want_spend && got_spend == strtoll(want_spend, NULL, 10),
              "GET /v1/spend says %lld nano-dollars for the key, usage_hourly holds %s: %s", got_spend,
              want_spend ? want_spend : "none", r.body);
        resp_free(&r);
        fprintf(stderr, "whole path: the sandbox cost %s nano-dollars (usage), the key spent %s today\n",
                want_usage ? want_usage : "?", want_spend ? want_spend : "?");
        free(want_usage);
        free(want_spend);

        kill(api_pid, SIGTERM);
        waitpid(api_pid, NULL, 0);
        if (test_failures) {
                char log[1024];
                snprintf(log, sizeof(log), "%s/api.log", P.dir);
                char *l = test_read_file(log);
                size_t n = l ? strlen(l) : 0;
                fprintf(stderr, "tally-api's log (end):\n%s\n", l ? l + (n > 4000 ? n - 4000 : 0) : "");
                free(l);
        }
        return pipe_finish(&P);
}
