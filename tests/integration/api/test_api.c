/* Integration: tally-api over TCP (libcurl) in front of a real tally-vmm
 * (process backend, real cgroups, the development broker) and PostgreSQL.
 * Accounts, people and keys are made with tally-admin, as an operator would.
 *
 * Ground truth is independent of tally-api: the database read directly
 * (key_blocks, audit_log, api_keys) and tally-vmm's own socket (which
 * sandboxes exist). Everything the test makes is removed at exit. */
#include "apitest.h"
#include "support.h"
#include "vmmtest.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

char parent[64], acct_a[64], acct_b[64], email_a[128], email_b[128], email_c[128];
char *work, *state, *sock, *db_url, *pwfile;
pid_t vmm_pid = -1; /* host A's tally-vmm */
static pid_t api_pid = -1;
int port;
__thread const char *source_ip;
__thread long http_timeout_s = 60;
PGconn *db;
char *api_vmm_sockets;
struct key key_a, key_a2, key_b, key_rate;

/* ---- cleaning up ---- */

static void cleanup(void)
{
        test_stop_process(&api_pid, SIGKILL);
        test_stop_process(&vmm_pid, SIGKILL);
        if (*parent) {
                test_cgroup_remove(parent, 0);
                while (waitpid(-1, NULL, WNOHANG) > 0)
                        ;
        }
        if (db) {
                PQfinish(db);
                db = NULL;
        }
        if (db_url) {
                test_db_drop(db_url);
                db_url = NULL;
        }
}

static void on_signal(int sig)
{
        (void)sig;
        exit(1);
}

/* ---- HTTP to tally-api ---- */

size_t on_body(char *p, size_t size, size_t n, void *ud)
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
        size_t len = size * n;
        char line[1024];
        snprintf(line, sizeof(line), "%.*s", (int)(len < sizeof(line) - 1 ? len : sizeof(line) - 1), p);
        line[strcspn(line, "\r\n")] = '\0';
        if (strncasecmp(line, "Retry-After: ", 13) == 0)
                snprintf(r->retry_after, sizeof(r->retry_after), "%.31s", line + 13);
        if (strncasecmp(line, "Set-Cookie: ", 12) == 0)
                snprintf(r->cookie, sizeof(r->cookie), "%.255s", line + 12);
        if (strncasecmp(line, "Idempotent-Replayed: true", 25) == 0)
                r->replayed = true;
        return len;
}

/* One request. key (a secret) or s (a session) authenticates; csrf says
 * whether the session's CSRF header goes along. */
struct resp http_full(const char *method, const char *path, const char *key, const struct session *s, bool csrf,
                             const char *body, const char *idem)
{
        struct resp r = { 0 };
        CURL *c = curl_easy_init();
        char *url = NULL, h[512];
        if (asprintf(&url, "http://127.0.0.1:%d%s", port, path) < 0)
                url = NULL;
        struct curl_slist *hs = curl_slist_append(NULL, "Content-Type: application/json");
        if (key) {
                snprintf(h, sizeof(h), "Authorization: Bearer %s", key);
                hs = curl_slist_append(hs, h);
        }
        if (s) {
                snprintf(h, sizeof(h), "Cookie: tally_session=%s", s->token);
                hs = curl_slist_append(hs, h);
                if (csrf) {
                        snprintf(h, sizeof(h), "X-CSRF-Token: %s", s->csrf);
                        hs = curl_slist_append(hs, h);
                }
        }
        if (idem) {
                snprintf(h, sizeof(h), "Idempotency-Key: %s", idem);
                hs = curl_slist_append(hs, h);
        }
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, http_timeout_s);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        if (source_ip)
                curl_easy_setopt(c, CURLOPT_INTERFACE, source_ip);
        if (body)
                curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        int64_t t0 = test_now_ms();
        CURLcode cr = curl_easy_perform(c);
        r.ms = (long)(test_now_ms() - t0);
        if (cr == CURLE_OK)
                curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
        else
                fprintf(stderr, "curl %s %s: %s\n", method, path, curl_easy_strerror(cr));
        curl_slist_free_all(hs);
        curl_easy_cleanup(c);
        free(url);
        r.json = r.body ? json_loads(r.body, 0, NULL) : NULL;
        return r;
}

struct resp http(const char *method, const char *path, const char *key, const struct session *s,
                        const char *body)
{
        return http_full(method, path, key, s, true, body, NULL);
}

void resp_free(struct resp *r)
{
        free(r->body);
        json_decref(r->json);
        memset(r, 0, sizeof(*r));
}

const char *err_code(struct resp *r)
{
        return test_jstr(json_object_get(r->json, "error"), "code");
}

const char *err_field(struct resp *r)
{
        return test_jstr(json_object_get(r->json, "error"), "field");
}

/* ---- the database, read directly ---- */

long long sql_int(const char *sql, const char *p1)
{
        const char *params[] = { p1 };
        PGresult *res = PQexecParams(db, sql, p1 ? 1 : 0, NULL, params, NULL, NULL, 0);
        long long v = -1;
        if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
                v = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
        else
                fprintf(stderr, "query failed: %s: %s\n", sql, PQerrorMessage(db));
        PQclear(res);
        return v;
}

void sql_exec(const char *sql, const char *p1, const char *p2)
{
        const char *params[] = { p1, p2 };
        PGresult *res = PQexecParams(db, sql, p2 ? 2 : p1 ? 1 : 0, NULL, params, NULL, NULL, 0);
        CHECK(PQresultStatus(res) == PGRES_COMMAND_OK, "%s: %s", sql, PQerrorMessage(db));
        PQclear(res);
}

/* ---- set-up: database, tally-vmm, accounts with tally-admin, tally-api ---- */

int admin(char **out, ...)
{
        char *argv[32];
        int n = 0;
        argv[n++] = (char *)test_env("TALLY_ADMIN_BIN");
        argv[n++] = "--database-url";
        argv[n++] = db_url;
        va_list ap;
        va_start(ap, out);
        for (const char *a = va_arg(ap, const char *); a && n < 30; a = va_arg(ap, const char *))
                argv[n++] = (char *)a;
        va_end(ap);
        argv[n] = NULL;
        char *err = NULL;
        int rc = test_run(argv, out, &err);
        if (rc != 0)
                fprintf(stderr, "tally-admin %s %s: rc=%d %s\n", argv[3], argv[4], rc, err ? err : "");
        free(err);
        return rc;
}

void make_key(const char *account, const char *name, struct key *k)
{
        char *out = NULL;
        int rc = admin(&out, "key", "create", "--account", account, "--name", name, NULL);
        CHECK(rc == 0 && out, "tally-admin key create failed");
        char *id = out ? strstr(out, "id=") : NULL, *sec = out ? strstr(out, "key=") : NULL;
        if (id && sec) {
                sscanf(id, "id=%63s", k->id);
                sscanf(sec, "key=%127s", k->secret);
        }
        CHECK(strncmp(k->secret, "tk_", 3) == 0 && strlen(k->secret) >= 3 + 32, "key secret %s", k->secret);
        free(out);
}

static void setup_accounts(void)
{
        FILE *f = fopen(pwfile, "w");
        fputs("correct horse battery\n", f);
        fclose(f);
        CHECK(admin(NULL, "account", "create", acct_a, "--name", "A", NULL) == 0, "account A");
        CHECK(admin(NULL, "account", "create", acct_b, "--name", "B", NULL) == 0, "account B");
        CHECK(admin(NULL, "person", "create", "--account", acct_a, "--email", email_a, "--password-file", pwfile,
                    NULL) == 0, "person A");
        CHECK(admin(NULL, "person", "create", "--account", acct_b, "--email", email_b, "--password-file", pwfile,
                    NULL) == 0, "person B");
        CHECK(admin(NULL, "person", "create", "--account", acct_a, "--email", email_c, "--password-file", pwfile,
                    NULL) == 0, "person C");
        make_key(acct_a, "agent-a", &key_a);
        make_key(acct_a, "agent-a2", &key_a2);
        make_key(acct_b, "agent-b", &key_b);
        make_key(acct_a, "rate", &key_rate);
        /* Stored only as a hash: the secret appears nowhere in the database. */
        CHECK(sql_int("SELECT count(*) FROM api_keys WHERE key_hash = sha256(convert_to($1, 'UTF8'))", key_a.secret) ==
                      1, "api_keys.key_hash is not the SHA-256 of the key");
        CHECK(sql_int("SELECT count(*) FROM api_keys WHERE prefix = left($1, 11)", key_a.secret) == 1,
              "the key's visible prefix was not stored");
        CHECK(sql_int("SELECT count(*) FROM people WHERE password_hash LIKE '$y$%' AND email = $1", email_a) == 1,
              "the password is not stored as a yescrypt hash");
}

static void start_vmm(void)
{
        char log[1024];
        snprintf(log, sizeof(log), "%s/vmm.log", work);
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state, "--socket", sock,
                         "--kafka-brokers", (char *)test_env("TALLY_TEST_BROKERS"), "--cgroup-parent", parent,
                         "--host-id", "test-api-host", "--backend", "process", "--final-wait-ms", "500",
                         "--limits-database-url", db_url, NULL };
        vmm_pid = test_spawn(argv, NULL, log);
        struct stat st;
        int64_t until = test_now_ms() + 20000;
        while (stat(sock, &st) != 0 && test_now_ms() < until)
                test_sleep_ms(20);
        CHECK(stat(sock, &st) == 0, "tally-vmm's socket did not appear");
        test_sleep_ms(200);
}

/* 2 s: the contract's long exec outlasts it. The hostile suite, whose
 * floods keep every thread of a loaded machine busy for seconds, leaves
 * its connections 30 s. */
static const char *conn_timeout_s = "2";

static void start_api(void)
{
        char log[1024];
        snprintf(log, sizeof(log), "%s/api.log", work);
        char *argv[] = { (char *)test_env("TALLY_API_BIN"), "--database-url", db_url, "--port", "0",
                         "--vmm-sockets", api_vmm_sockets ? api_vmm_sockets : sock, "--cookie-secure=false", "--threads", "8",
                         "--body-max-bytes", "65536", "--rate-per-s", "20", "--rate-burst", "400",
                         "--signin-max-failures", "5", "--signin-window-s", "600",
                         "--connection-timeout-s", (char *)conn_timeout_s, NULL };
        api_pid = test_spawn(argv, NULL, log);
        int64_t until = test_now_ms() + 20000;
        while (test_now_ms() < until && !port) {
                char *l = test_read_file(log);
                char *p = l ? strstr(l, "msg=\"listening\"") : NULL;
                char *q = p ? strstr(p, " port=") : NULL;
                if (q)
                        port = atoi(q + 6);
                free(l);
                if (!port)
                        test_sleep_ms(50);
        }
        if (!port) {
                char *l = test_read_file(log);
                fprintf(stderr, "FAIL: tally-api did not start; its log:\n%s\n", l ? l : "");
                exit(1);
        }
}

struct session sign_in(const char *email, const char *password, long *ret_status)
{
        struct session s = { 0 };
        char body[512];
        snprintf(body, sizeof(body), "{\"email\":\"%s\",\"password\":\"%s\"}", email, password);
        struct resp r = http("POST", "/v1/sessions", NULL, NULL, body);
        *ret_status = r.status;
        if (r.status == 201) {
                sscanf(r.cookie, "tally_session=%127[^;]", s.token);
                snprintf(s.csrf, sizeof(s.csrf), "%s", test_jstr(r.json, "csrf_token"));
        }
        resp_free(&r);
        return s;
}

/* A sandbox of key k (its id into id). */
void create_sandbox(const struct key *k, char *id, size_t size)
{
        struct resp r = http("POST", "/v1/sandboxes", k->secret, NULL,
                             "{\"vcpus\":1,\"memory_mib\":64,\"timeout_s\":600,\"labels\":{\"suite\":\"api\"}}");
        CHECK(r.status == 201, "create: %ld %s", r.status, r.body ? r.body : "");
        snprintf(id, size, "%s", test_jstr(r.json, "id"));
        resp_free(&r);
}

/* ---- the cases ---- */

static struct session sess_a, sess_b;

static void test_health(void)
{
        struct resp r = http("GET", "/healthz", NULL, NULL, NULL);
        CHECK(r.status == 200, "healthz %ld", r.status);
        resp_free(&r);
        r = http("GET", "/metrics", NULL, NULL, NULL);
        CHECK(r.status == 200 && r.body && strstr(r.body, "tally_api_requests_total{method=\"GET\",route=\"/healthz\",status=\"200\"} 1") &&
                      strstr(r.body, "tally_api_db_pool_connections") &&
                      strstr(r.body, "tally_api_request_duration_seconds_bucket"),
              "metrics: %s", r.body ? r.body : "");
        resp_free(&r);
        r = http("GET", "/v1/nothing", NULL, NULL, NULL);
        CHECK(r.status == 404 && strcmp(err_code(&r), "not_found") == 0, "unknown route: %ld %s", r.status, r.body);
        resp_free(&r);
}

static void test_sessions(void)
{
        long st;
        struct session bad = sign_in(email_a, "wrong password", &st);
        (void)bad;
        CHECK(st == 401, "a wrong password got %ld", st);
        sess_a = sign_in(email_a, "correct horse battery", &st);
        CHECK(st == 201 && sess_a.token[0] && sess_a.csrf[0], "sign-in A: %ld", st);
        sess_b = sign_in(email_b, "correct horse battery", &st);
        CHECK(st == 201, "sign-in B: %ld", st);
        /* the cookie's attributes */
        struct resp r = http("POST", "/v1/sessions", NULL, NULL,
                             "{\"email\":\"nobody@example.invalid\",\"password\":\"x\",\"extra\":1}");
        CHECK(r.status == 400 && strcmp(err_field(&r), "extra") == 0, "unknown sign-in field: %ld %s", r.status, r.body);
        resp_free(&r);
        char body[256];
        snprintf(body, sizeof(body), "{\"email\":\"%s\",\"password\":\"correct horse battery\"}", email_c);
        r = http("POST", "/v1/sessions", NULL, NULL, body);
        CHECK(r.status == 201 && strstr(r.cookie, "HttpOnly") && strstr(r.cookie, "SameSite=Strict") &&
                      !strstr(r.cookie, "Secure"),
              "cookie: %s", r.cookie);
        struct session c = { 0 };
        sscanf(r.cookie, "tally_session=%127[^;]", c.token);
        snprintf(c.csrf, sizeof(c.csrf), "%s", test_jstr(r.json, "csrf_token"));
        resp_free(&r);
        /* the token is stored hashed */
        CHECK(sql_int("SELECT count(*) FROM sessions WHERE token_hash = sha256(convert_to($1, 'UTF8'))", c.token) == 1,
              "sessions.token_hash is not the SHA-256 of the cookie");
        r = http("GET", "/v1/sessions/current", NULL, &c, NULL);
        CHECK(r.status == 200 && strcmp(test_jstr(r.json, "account"), acct_a) == 0, "whoami: %ld %s", r.status, r.body);
        resp_free(&r);
        /* a write with a session but without (or with a wrong) CSRF token */
        r = http_full("POST", "/v1/keys", NULL, &c, false, "{\"name\":\"x\"}", NULL);
        CHECK(r.status == 403 && strcmp(err_code(&r), "csrf_required") == 0, "no CSRF: %ld %s", r.status, r.body);
        resp_free(&r);
        struct session wrong = c;
        snprintf(wrong.csrf, sizeof(wrong.csrf), "0000");
        r = http("POST", "/v1/keys", NULL, &wrong, "{\"name\":\"x\"}");
        CHECK(r.status == 403 && strcmp(err_code(&r), "csrf_required") == 0, "wrong CSRF: %ld %s", r.status, r.body);
        resp_free(&r);
        /* sign out: the session no longer works */
        r = http_full("DELETE", "/v1/sessions/current", NULL, &c, false, NULL, NULL);
        CHECK(r.status == 403, "sign-out without CSRF: %ld", r.status);
        resp_free(&r);
        r = http("DELETE", "/v1/sessions/current", NULL, &c, NULL);
        CHECK(r.status == 200, "sign-out: %ld %s", r.status, r.body);
        resp_free(&r);
        r = http("GET", "/v1/sessions/current", NULL, &c, NULL);
        CHECK(r.status == 401, "after sign-out: %ld", r.status);
        resp_free(&r);
}

/* Every method and shape of the key routes, for every API key (even the key's own). */
static void test_keys_person_only(void)
{
        const struct key *keys[] = { &key_a, &key_a2, &key_b };
        const char *methods[] = { "GET", "POST", "PUT", "DELETE", "PATCH" };
        for (size_t k = 0; k < 3; k++) {
                char paths[6][256];
                snprintf(paths[0], 256, "/v1/keys");
                snprintf(paths[1], 256, "/v1/keys/%s", keys[k]->id);
                snprintf(paths[2], 256, "/v1/keys/%s/limit", keys[k]->id);
                snprintf(paths[3], 256, "/v1/keys/%s/limit", key_a.id);
                snprintf(paths[4], 256, "/v1/keys/%s", key_b.id);
                snprintf(paths[5], 256, "/v1/keys/%s/limit/", keys[k]->id);
                for (size_t p = 0; p < 6; p++)
                        for (size_t m = 0; m < 5; m++) {
                                struct resp r = http(methods[m], paths[p], keys[k]->secret, NULL,
                                                     "{\"daily_limit_nanodollars\": 999999999999}");
                                CHECK(r.status == 403 && strcmp(err_code(&r), "person_required") == 0,
                                      "API key %s: %s %s got %ld %s", keys[k]->id, methods[m], paths[p], r.status,
                                      r.body ? r.body : "");
                                resp_free(&r);
                        }
        }
        CHECK(sql_int("SELECT count(*) FROM api_keys WHERE daily_limit_nanodollars IS NOT NULL OR revoked_at IS NOT NULL",
                      NULL) == 0,
              "an API key changed a key");
        /* the person may */
        char path[256];
        struct resp r = http("GET", "/v1/keys", NULL, &sess_a, NULL);
        CHECK(r.status == 200 && json_array_size(json_object_get(r.json, "keys")) == 3, "list keys: %ld %s", r.status,
              r.body);
        resp_free(&r);
        r = http("GET", "/v1/keys?limit=2", NULL, &sess_a, NULL);
        const char *cursor = test_jstr(r.json, "next_cursor");
        CHECK(r.status == 200 && json_array_size(json_object_get(r.json, "keys")) == 2 && *cursor, "page 1: %s", r.body);
        snprintf(path, sizeof(path), "/v1/keys?limit=2&cursor=%s", cursor);
        resp_free(&r);
        r = http("GET", path, NULL, &sess_a, NULL);
        CHECK(r.status == 200 && json_array_size(json_object_get(r.json, "keys")) == 1 &&
                      json_is_null(json_object_get(r.json, "next_cursor")),
              "page 2: %s", r.body);
        resp_free(&r);
        r = http("POST", "/v1/keys", NULL, &sess_a, "{\"name\":\"made-by-person\",\"policy\":\"alert_only\"}");
        char made[64] = "", secret[128] = "";
        snprintf(made, sizeof(made), "%s", test_jstr(r.json, "id"));
        snprintf(secret, sizeof(secret), "%s", test_jstr(r.json, "key"));
        CHECK(r.status == 201 && strncmp(secret, "tk_", 3) == 0 &&
                      strcmp(test_jstr(r.json, "limit_policy"), "alert_only") == 0,
              "person creates a key: %ld %s", r.status, r.body);
        resp_free(&r);
        /* shown once: reading it back never shows the secret */
        snprintf(path, sizeof(path), "/v1/keys/%s", made);
        r = http("GET", path, NULL, &sess_a, NULL);
        CHECK(r.status == 200 && !json_object_get(r.json, "key") && !strstr(r.body, secret), "key read back: %s", r.body);
        resp_free(&r);
        /* the new key works, then is revoked: 401 */
        r = http("GET", "/v1/sandboxes", secret, NULL, NULL);
        CHECK(r.status == 200, "new key lists sandboxes: %ld %s", r.status, r.body);
        resp_free(&r);
        r = http("DELETE", path, NULL, &sess_a, NULL);
        CHECK(r.status == 200 && !json_is_null(json_object_get(r.json, "revoked_at")), "revoke: %ld %s", r.status,
              r.body);
        resp_free(&r);
        r = http("GET", "/v1/sandboxes", secret, NULL, NULL);
        CHECK(r.status == 401 && strcmp(err_code(&r), "key_revoked") == 0, "revoked key: %ld %s", r.status, r.body);
        resp_free(&r);
        r = http("GET", "/v1/sandboxes", "tk_00000000000000000000000000000000", NULL, NULL);
        CHECK(r.status == 401, "unknown key: %ld", r.status);
        resp_free(&r);
        /* a person's limit change is audited: who, old, new */
        snprintf(path, sizeof(path), "/v1/keys/%s/limit", key_a2.id);
        r = http("PUT", path, NULL, &sess_a, "{\"daily_limit_nanodollars\": 5000000000, \"policy\": \"stop\"}");
        CHECK(r.status == 200 && json_integer_value(json_object_get(r.json, "daily_limit_nanodollars")) == 5000000000 &&
                      strcmp(test_jstr(r.json, "limit_policy"), "stop") == 0,
              "set limit: %ld %s", r.status, r.body);
        resp_free(&r);
        r = http("DELETE", path, NULL, &sess_a, NULL);
        CHECK(r.status == 200 && json_is_null(json_object_get(r.json, "daily_limit_nanodollars")), "remove limit: %s",
              r.body);
        resp_free(&r);
        CHECK(sql_int("SELECT count(*) FROM audit_log WHERE action = 'key.limit' AND object_id = $1 AND actor LIKE 'person:%' "
                      "AND old_value->>'daily_limit_nanodollars' IS NULL "
                      "AND new_value->>'daily_limit_nanodollars' = '5000000000'",
                      key_a2.id) == 1,
              "the limit change is not in audit_log with who, old and new");
        CHECK(sql_int("SELECT count(*) FROM audit_log WHERE action IN ('key.create', 'key.revoke') AND object_id = $1",
                      made) == 2,
              "key creation and revocation are not audited");
}

/* Internet is the account's decision: a key without the permission (every new
 * key) is refused a create or fork asking for it; only a person grants it. */
static void test_internet_permission(void)
{
        char path[256], id[64] = "";
        int before = vmm_count(acct_a);
        const char *asks[] = { "{\"network\":true}", "{\"network\":{\"internet\":true,\"allow\":[\"github.com\"]}}" };
        for (int i = 0; i < 2; i++) {
                struct resp r = http("POST", "/v1/sandboxes", key_a2.secret, NULL, asks[i]);
                CHECK(r.status == 403 && strcmp(err_code(&r), "internet_not_allowed") == 0 &&
                              strcmp(test_jstr(json_object_get(r.json, "error"), "field"), "network") == 0,
                      "create %s without the permission: %ld %s", asks[i], r.status, r.body ? r.body : "");
                resp_free(&r);
        }
        CHECK(vmm_count(acct_a) == before, "a refused create started a sandbox");
        /* loopback only needs no permission */
        struct resp r = http("POST", "/v1/sandboxes", key_a2.secret, NULL, "{\"network\":false,\"memory_mib\":64}");
        CHECK(r.status == 201, "create without internet: %ld %s", r.status, r.body ? r.body : "");
        resp_free(&r);
        /* the key cannot grant itself */
        snprintf(path, sizeof(path), "/v1/keys/%s/internet", key_a2.id);
        r = http("PUT", path, key_a2.secret, NULL, "{\"internet\":true}");
        CHECK(r.status == 403 && strcmp(err_code(&r), "person_required") == 0, "a key granting itself internet: %ld %s",
              r.status, r.body ? r.body : "");
        resp_free(&r);
        CHECK(sql_int("SELECT count(*) FROM api_keys WHERE internet", NULL) == 0, "a key was granted internet");
        /* a person grants it (audited), and the same create goes through */
        r = http("PUT", path, NULL, &sess_a, "{\"internet\":true}");
        CHECK(r.status == 200 && json_is_true(json_object_get(r.json, "internet")), "person grants internet: %ld %s",
              r.status, r.body ? r.body : "");
        resp_free(&r);
        CHECK(sql_int("SELECT count(*) FROM audit_log WHERE action = 'key.internet' AND object_id = $1 "
                      "AND actor LIKE 'person:%' AND old_value->>'internet' = 'false' AND new_value->>'internet' = 'true'",
                      key_a2.id) == 1,
              "the internet grant is not in audit_log with who, old and new");
        r = http("POST", "/v1/sandboxes", key_a2.secret, NULL,
                 "{\"memory_mib\":64,\"network\":{\"internet\":true,\"allow\":[\"github.com\",\"*.github.com\"]}}");
        json_t *net = json_object_get(r.json, "network");
        CHECK(r.status == 201 && json_is_true(json_object_get(net, "internet")) &&
                      json_array_size(json_object_get(net, "allow")) == 2 &&
                      json_is_integer(json_object_get(r.json, "net_rx_bytes")),
              "create with internet, permitted: %ld %s", r.status, r.body ? r.body : "");
        snprintf(id, sizeof(id), "%s", test_jstr(r.json, "id"));
        resp_free(&r);
        /* a bad allow-list is the vmm's 400, naming the field */
        r = http("POST", "/v1/sandboxes", key_a2.secret, NULL, "{\"network\":{\"internet\":true,\"allow\":[\"a.*.com\"]}}");
        CHECK(r.status == 400 && strstr(r.body ? r.body : "", "network.allow[0]"), "bad allow-list: %ld %s", r.status,
              r.body ? r.body : "");
        resp_free(&r);
        /* withdrawn: a fork of the sandbox with internet is refused, nothing is made */
        r = http("PUT", path, NULL, &sess_a, "{\"internet\":false}");
        CHECK(r.status == 200 && json_is_false(json_object_get(r.json, "internet")), "person withdraws internet: %ld %s",
              r.status, r.body ? r.body : "");
        resp_free(&r);
        before = vmm_count(acct_a);
        char fork[256];
        snprintf(fork, sizeof(fork), "/v1/sandboxes/%s/fork", id);
        r = http("POST", fork, key_a2.secret, NULL, "{\"count\":1}");
        CHECK(r.status == 403 && strcmp(err_code(&r), "internet_not_allowed") == 0,
              "fork of a sandbox with internet, permission withdrawn: %ld %s", r.status, r.body ? r.body : "");
        resp_free(&r);
        CHECK(vmm_count(acct_a) == before, "a refused fork started a sandbox");
        snprintf(fork, sizeof(fork), "/v1/sandboxes/%s", id);
        r = http("DELETE", fork, key_a2.secret, NULL, NULL);
        resp_free(&r);
}

/* A key at its limit: create and resume get 402; raising the limit above
 * today's spend lifts the block; raising it to no more than the spend does not. */
static void test_limit_block(void)
{
        char paused[64], path[256];
        create_sandbox(&key_a, paused, sizeof(paused));
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", paused);
        struct resp r = http("POST", path, key_a.secret, NULL, NULL);
        CHECK(r.status == 200 && strcmp(test_jstr(r.json, "state"), "paused") == 0, "pause: %ld %s", r.status, r.body);
        resp_free(&r);
        /* today's spend: 5,000 nano-dollars (cpu_rated = 5000 x 3600e9), at a limit of 4,000 */
        sql_exec("INSERT INTO spend_daily (key_id, day, account_id, cpu_rated) "
                 "VALUES ($1, (now() AT TIME ZONE 'UTC')::date, $2, 18000000000000000)",
                 key_a.id, acct_a);
        sql_exec("UPDATE api_keys SET daily_limit_nanodollars = 4000 WHERE id = $1", key_a.id, NULL);
        sql_exec("INSERT INTO key_blocks (key_id, day, account_id, policy) "
                 "VALUES ($1, (now() AT TIME ZONE 'UTC')::date, $2, 'pause')",
                 key_a.id, acct_a);
        r = http("POST", "/v1/sandboxes", key_a.secret, NULL, "{\"memory_mib\":64}");
        CHECK(r.status == 402 && strcmp(err_code(&r), "limit_reached") == 0 && r.body && strstr(r.body, "4000") &&
                      strstr(r.body, key_a.id),
              "create while blocked: %ld %s", r.status, r.body);
        resp_free(&r);
        /* a refusal for the limit is not kept under an Idempotency-Key: the retry after the raise runs */
        r = http_full("POST", "/v1/sandboxes", key_a.secret, NULL, false, "{\"memory_mib\":64}", "after-raise");
        CHECK(r.status == 402, "idempotent create while blocked: %ld %s", r.status, r.body);
        resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/resume", paused);
        r = http("POST", path, key_a.secret, NULL, NULL);
        CHECK(r.status == 402 && strstr(r.body, "4000"), "resume while blocked: %ld %s", r.status, r.body);
        resp_free(&r);
        /* a fork starts new sandboxes for the key: refused too */
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/fork", paused);
        r = http("POST", path, key_a.secret, NULL, "{\"count\":1}");
        CHECK(r.status == 402 && strcmp(err_code(&r), "limit_reached") == 0, "fork while blocked: %ld %s", r.status,
              r.body);
        resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/resume", paused);
        /* the person resuming is refused too: the limit is the key's */
        r = http("POST", path, NULL, &sess_a, NULL);
        CHECK(r.status == 402, "person resume while blocked: %ld %s", r.status, r.body);
        resp_free(&r);
        /* the other key of the account is not blocked */
        char other[64];
        create_sandbox(&key_a2, other, sizeof(other));
        /* raised, but to exactly today's spend: still blocked */
        char lpath[256];
        snprintf(lpath, sizeof(lpath), "/v1/keys/%s/limit", key_a.id);
        r = http("PUT", lpath, NULL, &sess_a, "{\"daily_limit_nanodollars\": 5000}");
        CHECK(r.status == 200 && json_is_false(json_object_get(r.json, "block_lifted")) &&
                      json_is_true(json_object_get(r.json, "blocked_today")) &&
                      json_integer_value(json_object_get(r.json, "spend_today_nanodollars")) == 5000,
              "limit = spend: %ld %s", r.status, r.body);
        resp_free(&r);
        CHECK(sql_int("SELECT count(*) FROM key_blocks WHERE key_id = $1", key_a.id) == 1,
              "a limit equal to today's spend lifted the block");
        /* above today's spend: lifted, at once */
        r = http("PUT", lpath, NULL, &sess_a, "{\"daily_limit_nanodollars\": 5001, \"policy\": \"pause\"}");
        CHECK(r.status == 200 && json_is_true(json_object_get(r.json, "block_lifted")) &&
                      json_is_false(json_object_get(r.json, "blocked_today")),
              "raise: %ld %s", r.status, r.body);
        resp_free(&r);
        CHECK(sql_int("SELECT count(*) FROM key_blocks WHERE key_id = $1", key_a.id) == 0, "the block was not lifted");
        CHECK(sql_int("SELECT count(*) FROM audit_log WHERE action = 'key.limit' AND object_id = $1", key_a.id) == 2,
              "limit changes not audited");
        /* the paused sandbox stayed paused until someone resumes it */
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", paused);
        r = http("GET", path, key_a.secret, NULL, NULL);
        CHECK(r.status == 200 && strcmp(test_jstr(r.json, "state"), "paused") == 0, "after the raise: %s", r.body);
        resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/resume", paused);
        r = http("POST", path, key_a.secret, NULL, NULL);
        CHECK(r.status == 200 && strcmp(test_jstr(r.json, "state"), "running") == 0, "resume after raise: %ld %s", r.status,
              r.body);
        resp_free(&r);
        r = http_full("POST", "/v1/sandboxes", key_a.secret, NULL, false, "{\"memory_mib\":64}", "after-raise");
        CHECK(r.status == 201 && !r.replayed, "create after raise, same Idempotency-Key: %ld %s", r.status, r.body);
        resp_free(&r);
        /* alert_only: the block lifts, and a block written the way the aggregator
         * writes it (the key's policy copied) is never stored */
        sql_exec("INSERT INTO key_blocks (key_id, day, account_id, policy) "
                 "VALUES ($1, (now() AT TIME ZONE 'UTC')::date, $2, 'pause') ON CONFLICT DO NOTHING",
                 key_a.id, acct_a);
        r = http("PUT", lpath, NULL, &sess_a, "{\"daily_limit_nanodollars\": 1000, \"policy\": \"alert_only\"}");
        CHECK(r.status == 200 && json_is_true(json_object_get(r.json, "block_lifted")) &&
                      strcmp(test_jstr(r.json, "limit_policy"), "alert_only") == 0,
              "alert_only under spend: %ld %s", r.status, r.body);
        resp_free(&r);
        sql_exec("INSERT INTO key_blocks (key_id, day, account_id, policy) "
                 "SELECT id, (now() AT TIME ZONE 'UTC')::date, account_id, limit_policy FROM api_keys "
                 "WHERE id = $1 AND account_id = $2 ON CONFLICT DO NOTHING",
                 key_a.id, acct_a);
        CHECK(sql_int("SELECT count(*) FROM key_blocks WHERE key_id = $1", key_a.id) == 0,
              "an alert_only key was blocked");
        r = http("POST", "/v1/sandboxes", key_a.secret, NULL, "{\"memory_mib\":64}");
        CHECK(r.status == 201, "create with alert_only over the limit: %ld %s", r.status, r.body);
        resp_free(&r);
        /* a person cannot create sandboxes: they are charged to a key */
        r = http("POST", "/v1/sandboxes", NULL, &sess_a, "{\"memory_mib\":64}");
        CHECK(r.status == 403 && strcmp(err_code(&r), "key_required") == 0, "person create: %ld %s", r.status, r.body);
        resp_free(&r);
}

/* Per-key caps: only a person sets them; a key's creates and forks past its cap
 * on sandboxes or memory are refused with 409 naming the cap, honest ones pass;
 * a disk the host cannot hold is the vmm's 507, passed through. */
static void test_key_caps(void)
{
        struct key capped = { 0 };
        make_key(acct_b, "capped", &capped);
        char path[320], ids[4][64] = { "" };
        snprintf(path, sizeof(path), "/v1/keys/%s/caps", capped.id);
        /* an API key cannot set caps, not even its own */
        struct resp r = http("PUT", path, capped.secret, NULL, "{\"max_sandboxes\":100,\"max_memory_mib\":null}");
        CHECK(r.status == 403 && strcmp(err_code(&r), "person_required") == 0, "a key set caps: %ld %s", r.status,
              r.body);
        resp_free(&r);
        r = http("PUT", path, NULL, &sess_b, "{\"max_sandboxes\":2,\"max_memory_mib\":1000}");
        CHECK(r.status == 200 && json_integer_value(json_object_get(r.json, "max_sandboxes")) == 2 &&
                      json_integer_value(json_object_get(r.json, "max_memory_mib")) == 1000,
              "the person sets caps: %ld %s", r.status, r.body);
        resp_free(&r);
        r = http("GET", path, NULL, &sess_b, NULL);
        CHECK(r.status == 200 && json_integer_value(json_object_get(r.json, "max_sandboxes")) == 2, "caps read: %s",
              r.body);
        resp_free(&r);
        /* the key itself shows them (the dashboard's key list reads them there) */
        snprintf(path, sizeof(path), "/v1/keys/%s", capped.id);
        r = http("GET", path, NULL, &sess_b, NULL);
        CHECK(r.status == 200 && json_integer_value(json_object_get(r.json, "max_sandboxes")) == 2 &&
                      json_integer_value(json_object_get(r.json, "max_memory_mib")) == 1000,
              "the key's caps in GET /v1/keys/{id}: %ld %s", r.status, r.body);
        resp_free(&r);
        snprintf(path, sizeof(path), "/v1/keys/%s/caps", capped.id);
        /* another account's person cannot */
        r = http("PUT", path, NULL, &sess_a, "{\"max_sandboxes\":100}");
        CHECK(r.status == 404, "account A's person set B's key's caps: %ld %s", r.status, r.body);
        resp_free(&r);
        const char *body =
                "{\"vcpus\":1,\"memory_mib\":300,\"disk_mib\":16,\"timeout_s\":600,\"labels\":{\"suite\":\"api\"}}";
        for (int i = 0; i < 2; i++) {
                r = http("POST", "/v1/sandboxes", capped.secret, NULL, body);
                CHECK(r.status == 201, "create %d within the caps: %ld %s", i + 1, r.status, r.body);
                snprintf(ids[i], sizeof(ids[i]), "%s", test_jstr(r.json, "id"));
                resp_free(&r);
        }
        r = http("POST", "/v1/sandboxes", capped.secret, NULL, body);
        CHECK(r.status == 409 && strcmp(err_code(&r), "cap_reached") == 0 &&
                      strcmp(err_field(&r), "max_sandboxes") == 0,
              "a third sandbox past max_sandboxes 2: %ld %s", r.status, r.body);
        resp_free(&r);
        char fork[256];
        snprintf(fork, sizeof(fork), "/v1/sandboxes/%s/fork", ids[0]);
        r = http("POST", fork, capped.secret, NULL, "{\"count\":1}");
        CHECK(r.status == 409 && strcmp(err_field(&r), "max_sandboxes") == 0, "a fork past max_sandboxes 2: %ld %s",
              r.status, r.body);
        resp_free(&r);
        /* room for sandboxes, not for memory: 600 MiB held + 300 > 1000 */
        r = http("PUT", path, NULL, &sess_b, "{\"max_sandboxes\":10,\"max_memory_mib\":800}");
        CHECK(r.status == 200, "caps raised: %ld %s", r.status, r.body);
        resp_free(&r);
        r = http("POST", "/v1/sandboxes", capped.secret, NULL, body);
        CHECK(r.status == 409 && strcmp(err_field(&r), "max_memory_mib") == 0 && strstr(r.body, "800 MiB"),
              "a sandbox past max_memory_mib 800: %ld %s", r.status, r.body);
        resp_free(&r);
        r = http("POST", fork, capped.secret, NULL, "{\"count\":1}");
        CHECK(r.status == 409 && strcmp(err_field(&r), "max_memory_mib") == 0, "a fork past max_memory_mib: %ld %s",
              r.status, r.body);
        resp_free(&r);
        /* an honest one fits: 600 + 128 <= 800 */
        r = http("POST", "/v1/sandboxes", capped.secret, NULL,
                 "{\"vcpus\":1,\"memory_mib\":128,\"disk_mib\":16,\"timeout_s\":600,\"labels\":{\"suite\":\"api\"}}");
        CHECK(r.status == 201, "an honest sandbox within the caps: %ld %s", r.status, r.body);
        snprintf(ids[2], sizeof(ids[2]), "%s", test_jstr(r.json, "id"));
        resp_free(&r);
        long long audited = sql_int("SELECT count(*) FROM audit_log WHERE action = 'key.caps' AND object_id = $1",
                                    capped.id);
        CHECK(audited == 2, "the caps' 2 changes were audited %lld times", audited);
        /* the host's capacity: a 1 TiB disk on a host with less free is the vmm's 507, passed through */
        r = http("POST", "/v1/sandboxes", capped.secret, NULL,
                 "{\"vcpus\":1,\"memory_mib\":16,\"disk_mib\":1048576,\"timeout_s\":600}");
        CHECK(r.status == 507 && strcmp(err_code(&r), "insufficient_capacity") == 0 && strstr(r.body, "disk"),
              "a 1 TiB disk: %ld %s", r.status, r.body);
        resp_free(&r);
        /* no caps: nothing counted */
        r = http("PUT", path, NULL, &sess_b, "{\"max_sandboxes\":null,\"max_memory_mib\":null}");
        CHECK(r.status == 200 && json_is_null(json_object_get(r.json, "max_sandboxes")), "caps removed: %s", r.body);
        resp_free(&r);
        for (int i = 0; i < 3; i++) {
                if (!*ids[i])
                        continue;
                snprintf(path, sizeof(path), "/v1/sandboxes/%s", ids[i]);
                r = http("DELETE", path, capped.secret, NULL, NULL);
                CHECK(r.status == 200, "delete %s: %ld %s", ids[i], r.status, r.body);
                resp_free(&r);
        }
}

/* The lifecycle through the API: exec, fork, timeout, list filters, delete. */
static void test_lifecycle(void)
{
        char id[64], path[256];
        create_sandbox(&key_a2, id, sizeof(id));
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", id);
        struct resp r = http("POST", path, key_a2.secret, NULL, "{\"command\":[\"/bin/sh\",\"-c\",\"echo hi; exit 3\"]}");
        CHECK(r.status == 200 && strcmp(test_jstr(r.json, "stdout"), "hi\n") == 0 &&
                      json_integer_value(json_object_get(r.json, "exit_code")) == 3,
              "exec: %ld %s", r.status, r.body);
        resp_free(&r);
        /* output holding a NUL byte comes through whole: the vmm writes it \u0000 */
        r = http("POST", path, key_a2.secret, NULL, "{\"command\":[\"printf\",\"a\\\\0b\"]}");
        json_t *nul = r.body ? json_loads(r.body, JSON_ALLOW_NUL, NULL) : NULL;
        json_t *nul_out = json_object_get(nul, "stdout");
        CHECK(r.status == 200 && json_string_length(nul_out) == 3 && memcmp(json_string_value(nul_out), "a\0b", 3) == 0,
              "exec with a NUL in its output: %ld %s", r.status, r.body);
        json_decref(nul);
        resp_free(&r);
        /* a command longer than the idle connection timeout (2 s here) still answers */
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", id);
        r = http("POST", path, key_a2.secret, NULL, "{\"command\":\"sleep 3; echo late\"}");
        CHECK(r.status == 200 && strcmp(test_jstr(r.json, "stdout"), "late\n") == 0, "long exec: %ld %s", r.status, r.body);
        resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/timeout", id);
        r = http("POST", path, key_a2.secret, NULL, "{\"timeout_s\": 900}");
        CHECK(r.status == 200, "timeout: %ld %s", r.status, r.body);
        resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/fork", id);
        r = http("POST", path, key_a2.secret, NULL, "{\"count\": 1}");
        CHECK(r.status == 201 && json_array_size(json_object_get(r.json, "sandboxes")) == 1, "fork: %ld %s", r.status,
              r.body);
        resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        r = http("GET", path, key_a2.secret, NULL, NULL);
        CHECK(r.status == 200 && json_is_integer(json_object_get(r.json, "cost_nanodollars")) &&
                      !json_object_get(r.json, "dir"),
              "get: %ld %s", r.status, r.body);
        resp_free(&r);
        r = http("GET", "/v1/sandboxes?state=paused", key_a2.secret, NULL, NULL);
        size_t i;
        json_t *sb;
        bool only_paused = r.status == 200;
        json_array_foreach(json_object_get(r.json, "sandboxes"), i, sb) only_paused &= strcmp(test_jstr(sb, "state"), "paused") == 0;
        CHECK(only_paused, "state filter: %s", r.body);
        resp_free(&r);
        r = http("GET", "/v1/sandboxes?label=suite=api&state=running&limit=1", key_a2.secret, NULL, NULL);
        CHECK(r.status == 200 && json_array_size(json_object_get(r.json, "sandboxes")) == 1 &&
                      json_is_string(json_object_get(r.json, "next_cursor")),
              "label filter with a page of 1: %s", r.body);
        resp_free(&r);
        /* a key lists what it created, a person the account's */
        r = http("GET", "/v1/sandboxes", key_a.secret, NULL, NULL);
        CHECK(r.status == 200 && r.body && !strstr(r.body, id) && !strstr(r.body, key_a2.id),
              "key A lists key A2's sandboxes: %s", r.body);
        resp_free(&r);
        r = http("GET", "/v1/sandboxes", NULL, &sess_a, NULL);
        CHECK(r.status == 200 && r.body && strstr(r.body, id) && strstr(r.body, key_a.id),
              "the person does not see the account's sandboxes: %s", r.body);
        /* host internals (folders, pids, cgroup paths) never reach the caller */
        CHECK(r.body && !strstr(r.body, "cgroup_") && !strstr(r.body, "\"dir\"") && !strstr(r.body, "\"pid\""),
              "a list shows the host's internals: %s", r.body);
        resp_free(&r);
        r = http("GET", "/v1/sandboxes?label=suite=nothing", key_a2.secret, NULL, NULL);
        CHECK(r.status == 200 && json_array_size(json_object_get(r.json, "sandboxes")) == 0, "label mismatch: %s", r.body);
        resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        r = http("DELETE", path, key_a2.secret, NULL, NULL);
        CHECK(r.status == 200 && strcmp(test_jstr(r.json, "state"), "stopped") == 0, "delete: %ld %s", r.status, r.body);
        resp_free(&r);
}

/* A cgroup memory file of the sandbox id, read by this test from the kernel: the
 * folder from tally-vmm's own socket (the API hides it), the file by the layout
 * the folder is on (v1 memory.usage_in_bytes / memory.max_usage_in_bytes, v2
 * memory.current / memory.peak). */
static uint64_t kernel_memory(const char *id, bool peak)
{
        int rc;
        char *err = NULL;
        json_t *sb = test_vmm_cli(sock, &rc, &err, "show", id, NULL);
        free(err);
        const char *dir = test_jstr(sb, "cgroup_memory");
        bool v1 = json_integer_value(json_object_get(sb, "cgroup_version")) == 1;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir,
                 v1 ? (peak ? "memory.max_usage_in_bytes" : "memory.usage_in_bytes") : (peak ? "memory.peak" : "memory.current"));
        char *t = test_read_file(path);
        CHECK(rc == 0 && *dir && t, "could not read %s (tally-vmm's show: rc=%d)", path, rc);
        uint64_t v = t ? strtoull(t, NULL, 10) : 0;
        free(t);
        json_decref(sb);
        return v;
}

/* Checks a sandbox object's measured memory against the kernel's files read
 * just before (m0, p0) and just after (m1, p1) the request that produced it. */
static void check_measured(const char *what, json_t *sb, uint64_t m0, uint64_t m1, uint64_t p0, uint64_t p1,
                           uint64_t touched)
{
        json_t *mj = json_object_get(sb, "mem_bytes"), *pj = json_object_get(sb, "mem_peak_bytes");
        uint64_t mem = (uint64_t)json_integer_value(mj), peak = (uint64_t)json_integer_value(pj);
        uint64_t lo = m0 < m1 ? m0 : m1, hi = m0 < m1 ? m1 : m0;
        CHECK(json_is_integer(mj) && lo <= mem && mem <= hi,
              "%s: mem_bytes %s, the cgroup's memory %" PRIu64 " before and %" PRIu64 " after", what,
              mj ? (json_is_integer(mj) ? "given" : "not an integer") : "missing", m0, m1);
        CHECK(!json_is_integer(mj) || mem >= touched, "%s: mem_bytes %" PRIu64 ", the sandbox holds %" PRIu64, what,
              mem, touched);
        /* the peak only grows: bracketed by the files in order */
        CHECK(json_is_integer(pj) && p0 <= peak && peak <= p1 && peak >= touched,
              "%s: mem_peak_bytes %" PRIu64 "%s, the cgroup's peak %" PRIu64 " before and %" PRIu64 " after, "
              "%" PRIu64 " touched", what, peak, pj ? "" : " (missing)", p0, p1, touched);
}

/* Measured memory: a sandbox holding 16 MiB (a file in its /dev/shm, charged
 * to its cgroup) shows mem_bytes and mem_peak_bytes on GET and in the list,
 * each bracketed by the kernel's files read just before and after. */
static void test_measured_memory(void)
{
        const uint64_t held = 16ull << 20;
        char id[64], path[256];
        create_sandbox(&key_a2, id, sizeof(id));
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", id);
        struct resp r = http("POST", path, key_a2.secret, NULL,
                             "{\"command\":[\"/bin/sh\",\"-c\",\"head -c 16777216 /dev/zero >/dev/shm/hold\"]}");
        CHECK(r.status == 200 && json_integer_value(json_object_get(r.json, "exit_code")) == 0, "exec: %ld %s",
              r.status, r.body);
        resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        uint64_t m0 = kernel_memory(id, false), p0 = kernel_memory(id, true);
        r = http("GET", path, key_a2.secret, NULL, NULL);
        uint64_t m1 = kernel_memory(id, false), p1 = kernel_memory(id, true);
        CHECK(r.status == 200, "get: %ld %s", r.status, r.body);
        check_measured("GET /v1/sandboxes/{id}", r.json, m0, m1, p0, p1, held);
        resp_free(&r);
        m0 = kernel_memory(id, false), p0 = kernel_memory(id, true);
        r = http("GET", "/v1/sandboxes?label=suite=api", key_a2.secret, NULL, NULL);
        m1 = kernel_memory(id, false), p1 = kernel_memory(id, true);
        size_t i;
        json_t *sb, *mine = NULL;
        json_array_foreach(json_object_get(r.json, "sandboxes"), i, sb) if (strcmp(test_jstr(sb, "id"), id) == 0) mine = sb;
        CHECK(r.status == 200 && mine, "list: %ld %s", r.status, r.body);
        if (mine)
                check_measured("GET /v1/sandboxes", mine, m0, m1, p0, p1, held);
        resp_free(&r);
        r = http("DELETE", path, key_a2.secret, NULL, NULL);
        CHECK(r.status == 200, "delete: %ld %s", r.status, r.body);
        resp_free(&r);
}

struct racer {
        pthread_t t;
        const char *body;
        long status;
        char id[64];
};

static void *race(void *arg)
{
        struct racer *x = arg;
        struct resp r = http_full("POST", "/v1/sandboxes", key_a2.secret, NULL, false, x->body, "race-key-1");
        x->status = r.status;
        snprintf(x->id, sizeof(x->id), "%s", test_jstr(r.json, "id"));
        resp_free(&r);
        return NULL;
}

long vmm_get(const char *s, const char *path, char **body)
{
        CURL *c = curl_easy_init();
        char url[512];
        snprintf(url, sizeof(url), "http://vmm%s", path);
        struct resp r = { 0 };
        curl_easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, s);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
        long status = 0;
        if (curl_easy_perform(c) == CURLE_OK)
                curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(c);
        if (body)
                *body = r.body;
        else
                free(r.body);
        return status;
}

/* Count account A's sandboxes as tally-vmm itself lists them. */
int vmm_count(const char *acct)
{
        char path[256], *body = NULL;
        snprintf(path, sizeof(path), "/v1/sandboxes?account=%s", acct);
        vmm_get(sock, path, &body);
        json_t *j = body ? json_loads(body, 0, NULL) : NULL;
        int n = 0;
        size_t i;
        json_t *sb;
        json_array_foreach(json_object_get(j, "sandboxes"), i, sb) n += strcmp(test_jstr(sb, "state"), "stopped") != 0;
        json_decref(j);
        free(body);
        return n;
}

static void test_idempotency(void)
{
        const char *body = "{\"memory_mib\":64,\"labels\":{\"suite\":\"idem\"}}";
        int before = vmm_count(acct_a);
        struct resp a = http_full("POST", "/v1/sandboxes", key_a2.secret, NULL, false, body, "idem-1");
        struct resp b = http_full("POST", "/v1/sandboxes", key_a2.secret, NULL, false, body, "idem-1");
        CHECK(a.status == 201 && b.status == 201 && b.replayed && a.body && b.body && strcmp(a.body, b.body) == 0,
              "replay: %ld %ld replayed=%d", a.status, b.status, b.replayed);
        CHECK(vmm_count(acct_a) == before + 1, "a retried create started %d sandboxes", vmm_count(acct_a) - before);
        resp_free(&a);
        resp_free(&b);
        /* same key and route, another body: 422 */
        a = http_full("POST", "/v1/sandboxes", key_a2.secret, NULL, false, "{\"memory_mib\":128}", "idem-1");
        CHECK(a.status == 422 && strcmp(err_code(&a), "idempotency_key_reused") == 0, "other body: %ld %s", a.status,
              a.body);
        resp_free(&a);
        /* another route is another scope: the key means a request of its own there */
        a = http_full("POST", "/v1/sandboxes/nope/pause", key_a2.secret, NULL, false, NULL, "idem-1");
        CHECK(a.status == 404 && !a.replayed, "other route: %ld %s", a.status, a.body);
        resp_free(&a);
        /* keys are per account: B may use the same Idempotency-Key for its own request */
        a = http_full("POST", "/v1/sandboxes", key_b.secret, NULL, false, body, "idem-1");
        CHECK(a.status == 201, "same Idempotency-Key in another account: %ld %s", a.status, a.body);
        resp_free(&a);
        /* 20 concurrent creates with one key: exactly one sandbox */
        before = vmm_count(acct_a);
        struct racer r[20];
        for (int i = 0; i < 20; i++) {
                r[i] = (struct racer){ .body = body };
                pthread_create(&r[i].t, NULL, race, &r[i]);
        }
        for (int i = 0; i < 20; i++)
                pthread_join(r[i].t, NULL);
        int created = 0, conflicts = 0;
        const char *id = NULL;
        for (int i = 0; i < 20; i++) {
                if (r[i].status == 201) {
                        created++;
                        if (!id)
                                id = r[i].id;
                        CHECK(strcmp(id, r[i].id) == 0, "two creates answered different sandboxes: %s %s", id, r[i].id);
                } else {
                        conflicts += r[i].status == 409;
                        CHECK(r[i].status == 409, "a concurrent retry got %ld", r[i].status);
                }
        }
        CHECK(vmm_count(acct_a) == before + 1, "20 concurrent creates with one key started %d sandboxes",
              vmm_count(acct_a) - before);
        fprintf(stderr, "20 concurrent creates: %d answered 201 (one sandbox), %d 409\n", created, conflicts);
}

/* Account A's key and person against B's ids: 404, exactly as a missing id. */
static void test_tenancy(void)
{
        char b_sbx[64];
        create_sandbox(&key_b, b_sbx, sizeof(b_sbx));
        const char *ids[] = { b_sbx, "sbx-does-not-exist" };
        const char *actions[][3] = {
                { "GET", "", NULL },          { "DELETE", "", NULL },
                { "POST", "/exec", "{\"command\":\"true\"}" },
                { "POST", "/pause", NULL },   { "POST", "/resume", NULL },
                { "POST", "/fork", "{\"count\":1}" },
                { "POST", "/timeout", "{\"timeout_s\":60}" },
        };
        for (int who = 0; who < 2; who++)
                for (size_t a = 0; a < sizeof(actions) / sizeof(actions[0]); a++) {
                        char bodies[2][512];
                        for (int i = 0; i < 2; i++) {
                                char path[256];
                                snprintf(path, sizeof(path), "/v1/sandboxes/%s%s", ids[i], actions[a][1]);
                                struct resp r = http(actions[a][0], path, who == 0 ? key_a.secret : NULL,
                                                     who == 1 ? &sess_a : NULL, actions[a][2]);
                                CHECK(r.status == 404, "%s %s as A's %s: %ld %s", actions[a][0], path,
                                      who ? "person" : "key", r.status, r.body);
                                /* same answer but for the id itself */
                                char *p = r.body ? strstr(r.body, ids[i]) : NULL;
                                snprintf(bodies[i], sizeof(bodies[i]), "%.*s", p ? (int)(p - r.body) : 0,
                                         r.body ? r.body : "");
                                resp_free(&r);
                        }
                        CHECK(strcmp(bodies[0], bodies[1]) == 0, "another account's sandbox answers differently: %s | %s",
                              bodies[0], bodies[1]);
                }
        /* B's sandbox still runs, untouched */
        char path[256];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", b_sbx);
        struct resp r = http("GET", path, key_b.secret, NULL, NULL);
        CHECK(r.status == 200 && strcmp(test_jstr(r.json, "state"), "running") == 0, "B's sandbox: %s", r.body);
        resp_free(&r);
        /* A's list never shows it */
        r = http("GET", "/v1/sandboxes", key_a.secret, NULL, NULL);
        CHECK(r.status == 200 && r.body && !strstr(r.body, b_sbx) && !strstr(r.body, acct_b), "A's list shows B's");
        resp_free(&r);
        /* keys: A's person against B's key id */
        const char *kactions[][3] = {
                { "GET", "", NULL },
                { "DELETE", "", NULL },
                { "PUT", "/limit", "{\"daily_limit_nanodollars\":1}" },
                { "DELETE", "/limit", NULL },
        };
        for (size_t a = 0; a < 4; a++) {
                char p1[256], p2[256];
                snprintf(p1, sizeof(p1), "/v1/keys/%s%s", key_b.id, kactions[a][1]);
                snprintf(p2, sizeof(p2), "/v1/keys/key_doesnotexist%s", kactions[a][1]);
                struct resp x = http(kactions[a][0], p1, NULL, &sess_a, kactions[a][2]);
                struct resp y = http(kactions[a][0], p2, NULL, &sess_a, kactions[a][2]);
                CHECK(x.status == 404 && y.status == 404 && strcmp(err_code(&x), err_code(&y)) == 0,
                      "%s %s as A's person: %ld %s", kactions[a][0], p1, x.status, x.body);
                resp_free(&x);
                resp_free(&y);
        }
        CHECK(sql_int("SELECT count(*) FROM api_keys WHERE id = $1 AND revoked_at IS NULL AND daily_limit_nanodollars IS NULL",
                      key_b.id) == 1,
              "A's person changed B's key");
}

static void test_bad_input(void)
{
        struct {
                const char *method, *path, *body;
                long status;
                const char *field;
        } cases[] = {
                { "POST", "/v1/sandboxes", "{\"vcpus\": ", 400, "body" },
                { "POST", "/v1/sandboxes", "[1,2]", 400, "body" },
                { "POST", "/v1/sandboxes", "{\"vcpus\":1,\"gpus\":2}", 400, "gpus" },
                { "POST", "/v1/sandboxes", "{\"vcpus\":\"2\"}", 400, "vcpus" },
                { "POST", "/v1/sandboxes", "{\"labels\":{\"a\":1}}", 400, "labels" },
                { "POST", "/v1/sandboxes", "{\"vcpus\":1,\"vcpus\":2}", 400, "body" },
                { "GET", "/v1/sandboxes/bad$id", NULL, 400, "id" },
                { "GET", "/v1/sandboxes?state=dead", NULL, 400, "state" },
                { "GET", "/v1/sandboxes?limit=0", NULL, 400, "limit" },
                { "GET", "/v1/sandboxes?limit=abc", NULL, 400, "limit" },
                { "POST", "/v1/sandboxes/x/fork", "{\"count\":11}", 400, "count" },
                { "POST", "/v1/sandboxes/x/timeout", "{\"timeout_s\":-1}", 400, "timeout_s" },
                { "POST", "/v1/sandboxes/x/exec", "{}", 400, "command" },
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
                struct resp r = http(cases[i].method, cases[i].path, key_a2.secret, NULL, cases[i].body);
                CHECK(r.status == cases[i].status && strcmp(err_field(&r), cases[i].field) == 0 &&
                              *test_jstr(json_object_get(r.json, "error"), "message"),
                      "%s %s %s: %ld %s", cases[i].method, cases[i].path, cases[i].body ? cases[i].body : "", r.status,
                      r.body);
                resp_free(&r);
        }
        struct {
                const char *body;
                const char *field;
        } limits[] = {
                { "{\"daily_limit_nanodollars\": -1}", "daily_limit_nanodollars" },
                { "{\"daily_limit_nanodollars\": 1000000000000000001}", "daily_limit_nanodollars" },
                { "{\"daily_limit_nanodollars\": \"5\"}", "daily_limit_nanodollars" },
                { "{\"daily_limit_nanodollars\": 1.5}", "daily_limit_nanodollars" },
                { "{\"daily_limit_nanodollars\": 5, \"policy\": \"freeze\"}", "policy" },
                { "{\"policy\": \"pause\"}", "daily_limit_nanodollars" },
                { "{\"daily_limit_nanodollars\": 5, \"by\": \"me\"}", "by" },
        };
        char path[256];
        snprintf(path, sizeof(path), "/v1/keys/%s/limit", key_rate.id);
        for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
                struct resp r = http("PUT", path, NULL, &sess_a, limits[i].body);
                CHECK(r.status == 400 && strcmp(err_field(&r), limits[i].field) == 0, "limit %s: %ld %s", limits[i].body,
                      r.status, r.body);
                resp_free(&r);
        }
        /* oversize body: 413 */
        size_t big = 70000;
        char *huge = malloc(big + 32);
        snprintf(huge, 32, "{\"labels\":{\"a\":\"");
        size_t off = strlen(huge);
        memset(huge + off, 'x', big);
        strcpy(huge + off + big, "\"}}");
        struct resp r = http("POST", "/v1/sandboxes", key_a2.secret, NULL, huge);
        CHECK(r.status == 413 && strcmp(err_code(&r), "body_too_large") == 0, "oversize: %ld %s", r.status, r.body);
        resp_free(&r);
        free(huge);
        /* a bad Idempotency-Key */
        r = http_full("POST", "/v1/sandboxes", key_a2.secret, NULL, false, "{}", "has space");
        CHECK(r.status == 400 && strcmp(err_field(&r), "Idempotency-Key") == 0, "bad Idempotency-Key: %ld %s", r.status,
              r.body);
        resp_free(&r);
        /* no credentials at all */
        r = http("GET", "/v1/sandboxes", NULL, NULL, NULL);
        CHECK(r.status == 401, "anonymous: %ld", r.status);
        resp_free(&r);
        r = http("PUT", "/v1/sandboxes", key_a2.secret, NULL, NULL);
        CHECK(r.status == 405, "wrong method: %ld", r.status);
        resp_free(&r);
}

static void test_rate_limit(void)
{
        /* burst 400 at 20/s: the 401st quick request is over the budget */
        long last = 0;
        char retry[32] = "";
        int n = 0;
        for (; n < 600 && last != 429; n++) {
                struct resp r = http("GET", "/v1/sandboxes?limit=0", key_rate.secret, NULL, NULL);
                last = r.status;
                snprintf(retry, sizeof(retry), "%s", r.retry_after);
                resp_free(&r);
        }
        CHECK(last == 429 && atoi(retry) >= 1, "no 429 with Retry-After after %d requests (last %ld, Retry-After %s)",
              n, last, retry);
        CHECK(n > 400, "429 after only %d requests, under the burst of 400", n);
        /* another key is not affected */
        struct resp r = http("GET", "/v1/sandboxes?limit=0", key_a2.secret, NULL, NULL);
        CHECK(r.status == 400, "another key: %ld", r.status);
        resp_free(&r);
}

static void test_signin_limit(void)
{
        long st;
        char ip[32], body[256];
        /* per email: 5 failures for C, each from another address, then the right password from a sixth */
        for (int i = 0; i < 5; i++) {
                snprintf(ip, sizeof(ip), "127.0.0.%d", 10 + i);
                source_ip = ip;
                sign_in(email_c, "wrong", &st);
                CHECK(st == 401, "failure %d: %ld", i, st);
        }
        source_ip = "127.0.0.20";
        snprintf(body, sizeof(body), "{\"email\":\"%s\",\"password\":\"correct horse battery\"}", email_c);
        struct resp r = http("POST", "/v1/sessions", NULL, NULL, body);
        CHECK(r.status == 429 && atoi(r.retry_after) >= 1, "right password after 5 failures: %ld %s", r.status, r.body);
        resp_free(&r);
        /* that address is not limited for another email */
        sign_in(email_b, "correct horse battery", &st);
        CHECK(st == 201, "another email from a fresh address: %ld", st);
        /* per address: 5 failures on 5 emails from one address, then a right password from it */
        source_ip = "127.0.0.30";
        for (int i = 0; i < 5; i++) {
                char e[64];
                snprintf(e, sizeof(e), "nobody-%d@example.com", i);
                sign_in(e, "wrong", &st);
                CHECK(st == 401, "unknown email %d: %ld", i, st);
        }
        sign_in(email_b, "correct horse battery", &st);
        CHECK(st == 429, "a right password from the limited address: %ld", st);
        source_ip = "127.0.0.31";
        sign_in(email_b, "correct horse battery", &st);
        CHECK(st == 201, "from another address: %ld", st);
        source_ip = NULL;
}

static void test_no_secrets_logged(void)
{
        char log[1024];
        snprintf(log, sizeof(log), "%s/api.log", work);
        char *l = test_read_file(log);
        CHECK(l && strstr(l, "msg=\"request\" method=GET route=/healthz"), "no access log line");
        CHECK(l && !strstr(l, key_a.secret) && !strstr(l, sess_a.token) && !strstr(l, sess_a.csrf) &&
                      !strstr(l, "correct horse"),
              "a secret is in tally-api's log");
        free(l);
}

static void test_read_routes(void)
{
        /* usage, spend, alerts, the OpenAPI document: the read handlers (api.h), answered
         * through this server's authentication */
        const char *paths[] = { "/v1/spend", "/v1/alerts", "/v1/usage?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z",
                                "/v1/openapi.json" };
        for (int i = 0; i < 4; i++) {
                struct resp r = http("GET", paths[i], key_a2.secret, NULL, NULL);
                CHECK(r.status == 200 && json_is_object(r.json), "%s: %ld %s", paths[i], r.status, r.body);
                resp_free(&r);
                if (i < 3) {
                        r = http("GET", paths[i], NULL, NULL, NULL);
                        CHECK(r.status == 401, "%s without credentials: %ld", paths[i], r.status);
                        resp_free(&r);
                }
        }
}

/* A sandbox's cost_nanodollars against a figure worked out by hand from the
 * ledger rows below and the plan's prices (plan itest-cost, account A's from
 * here on: this case runs last):
 *   cpu      25,000,000 n$ a vCPU-hour (3,600e9 CPU-ns), 40,000,000 from 2026-01-01T01:00Z
 *   memory    7,500,000 n$ a GiB-hour (2^30 x 3,600e9 byte-ns)
 *   storage  80,000,000 n$ a GB-month (1e9 x 2,592,000e9 byte-ns)
 * hour 00:00  cpu 1,800e9 ns = 1/2 vCPU-hour x 25e6            = 12,500,000
 *             mem 3 GiB-hours (3 x 2^30 x 3,600e9) x 7.5e6      = 22,500,000
 * hour 01:00  cpu 1e9 ns = 1/3,600 vCPU-hour x 40e6             =     11,111 1/9
 *             mem 2^30 x 1e9 byte-ns = 1/3,600 GiB-hour x 7.5e6  =      2,083 1/3
 *             storage 1e9 B for an hour = 3,600e18 byte-ns
 *                     = 1/720 GB-month x 80e6                    =    111,111 1/9
 * hour 02:00  cpu 84,999 ns x 40e6 / 3,600e9                     = 84,999/90,000
 *             mem 5,726,623,062 byte-ns x 7.5e6 / (2^30 x 3,600e9)
 *                 = 5,726,623,062 / D, D = 2^30 x 480,000 = 515,396,075,520,000;
 *                 1/90,000 = 5,726,623,061 1/3 / D, so the hour  = 17/18 + (2/3)/D
 * total 35,124,305 + 5/9 + 17/18 + (2/3)/D = 35,124,306.5 + about 1.3e-15:
 * just over the half, rounded once, half away from zero: 35,124,307.
 * (PostgreSQL's numeric quotients summed, as this route did before, lose the
 * 1.3e-15 and give 35,124,306.) */
static void test_sandbox_cost(void)
{
        char id[64], path[256];
        create_sandbox(&key_a2, id, sizeof(id));
        sql_exec("INSERT INTO price_plans (id, name) VALUES ('itest-cost', 'api test')", NULL, NULL);
        sql_exec("INSERT INTO plan_rates (plan_id, meter, effective_from, nanodollars_per_unit, unit) VALUES "
                 "('itest-cost', 'cpu', '2020-01-01T00:00:00Z', 25000000, 'vCPU-hour'),"
                 "('itest-cost', 'cpu', '2026-01-01T01:00:00Z', 40000000, 'vCPU-hour'),"
                 "('itest-cost', 'memory', '2020-01-01T00:00:00Z', 7500000, 'GiB-hour'),"
                 "('itest-cost', 'storage', '2020-01-01T00:00:00Z', 80000000, 'GB-month')",
                 NULL, NULL);
        sql_exec("UPDATE accounts SET plan_id = 'itest-cost' WHERE id = $1", acct_a, NULL);
        const char *rows[] = { id, acct_a, key_a2.id };
        PGresult *res = PQexecParams(
                db,
                "INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns, storage_byte_ns) "
                "VALUES ($1, '2026-01-01T00:00:00Z', $2, $3, 1800000000000, 3 * 1073741824::numeric * 3600000000000, 0),"
                "       ($1, '2026-01-01T01:00:00Z', $2, $3, 1000000000, 1073741824::numeric * 1000000000,"
                "        1000000000::numeric * 3600000000000),"
                "       ($1, '2026-01-01T02:00:00Z', $2, $3, 84999, 5726623062, 0)",
                3, NULL, rows, NULL, NULL, 0);
        CHECK(PQresultStatus(res) == PGRES_COMMAND_OK, "ledger rows: %s", PQerrorMessage(db));
        PQclear(res);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        struct resp r = http("GET", path, key_a2.secret, NULL, NULL);
        json_t *cost = json_object_get(r.json, "cost_nanodollars");
        CHECK(r.status == 200 && json_is_integer(cost) && json_integer_value(cost) == 35124307,
              "cost_nanodollars of %s: %ld %s (want 35124307)", id, r.status, r.body);
        resp_free(&r);
}

/* A key revoked behind this tally-api's back (another tally-api, SQL) is
 * refused within the 1 s its verification is remembered (docs/api.md). */
static void test_revoked_elsewhere(void)
{
        struct resp r = http("POST", "/v1/keys", NULL, &sess_a, "{\"name\":\"revoked-elsewhere\"}");
        char made[64] = "", secret[128] = "";
        snprintf(made, sizeof(made), "%s", test_jstr(r.json, "id"));
        snprintf(secret, sizeof(secret), "%s", test_jstr(r.json, "key"));
        CHECK(r.status == 201, "create a key: %ld %s", r.status, r.body);
        resp_free(&r);
        r = http("GET", "/v1/spend", secret, NULL, NULL);
        CHECK(r.status == 200, "the key works: %ld %s", r.status, r.body);
        resp_free(&r);
        sql_exec("UPDATE api_keys SET revoked_at = now() WHERE id = $1", made, NULL);
        usleep(1000 * 1000);
        r = http("GET", "/v1/spend", secret, NULL, NULL);
        CHECK(r.status == 401 && strcmp(err_code(&r), "key_revoked") == 0,
              "1 s after a revocation in the database: %ld %s", r.status, r.body);
        resp_free(&r);
}

/* tally-api stops cleanly on SIGTERM; its log's end when a case failed. */
static int finish(void)
{
        kill(api_pid, SIGTERM);
        int status = 0;
        waitpid(api_pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "tally-api exited with %d on SIGTERM", status);
        api_pid = -1;
        if (test_failures) {
                char log[1024];
                snprintf(log, sizeof(log), "%s/api.log", work);
                char *l = test_read_file(log);
                size_t n = l ? strlen(l) : 0;
                fprintf(stderr, "tally-api's log (end):\n%s\n", l ? l + (n > 6000 ? n - 6000 : 0) : "");
                free(l);
        }
        return test_result();
}

/* No argument: the API's contract. "hostile": hostile.c's attacks, on a
 * tally-api with small worker queues (set through its TALLY_ variables, so
 * that a tally-api without them still starts and shows what it does).
 * "hosts": hosts.c, two tally-vmm hosts of which one hangs. */
/* tally-admin's key commands, as an operator at a terminal (its own role,
 * tally_admin): key limit sets and audits what PUT /v1/keys/{id}/limit does,
 * key list shows it, spend --day shows the limit of that day, and each
 * command's --help needs no database. */
static void test_admin_keys(void)
{
        char *out = NULL;
        int rc = admin(&out, "key", "limit", key_a2.id, "--daily-limit-nanodollars", "7000", "--policy", "stop", "--json",
                       NULL);
        json_t *j = out ? json_loads(out, 0, NULL) : NULL;
        CHECK(rc == 0 && j && json_integer_value(json_object_get(j, "daily_limit_nanodollars")) == 7000 &&
                      strcmp(test_jstr(j, "limit_policy"), "stop") == 0 &&
                      json_is_false(json_object_get(j, "blocked_today")),
              "key limit: rc=%d %s", rc, out ? out : "");
        json_decref(j);
        free(out);
        CHECK(sql_int("SELECT count(*) FROM audit_log WHERE action = 'key.limit' AND actor = 'admin' "
                      "AND object_id = $1 AND new_value = '{\"daily_limit_nanodollars\": 7000, \"policy\": \"stop\"}'",
                      key_a2.id) == 1,
              "tally-admin's limit change is not in the audit log");
        CHECK(sql_int("SELECT daily_limit_nanodollars FROM api_keys WHERE id = $1", key_a2.id) == 7000,
              "the limit was not stored");
        /* what the key had two days ago: the audit log's last change before that day ended */
        sql_exec("INSERT INTO audit_log (account_id, actor, action, object_id, at, new_value) "
                 "VALUES ($2, 'admin', 'key.limit', $1, now() - interval '2 days', "
                 "        '{\"daily_limit_nanodollars\": 1000, \"policy\": \"pause\"}')",
                 key_a2.id, acct_a);
        out = NULL;
        rc = admin(&out, "key", "list", "--account", acct_a, "--json", NULL);
        j = out ? json_loads(out, 0, NULL) : NULL;
        bool listed = false;
        for (size_t i = 0; j && i < json_array_size(j); i++) {
                json_t *row = json_array_get(j, i);
                if (strcmp(test_jstr(row, "key"), key_a2.id) == 0)
                        listed = strcmp(test_jstr(row, "daily limit"), "$0.000007") == 0 &&
                                 strcmp(test_jstr(row, "policy"), "stop") == 0 &&
                                 strcmp(test_jstr(row, "account"), acct_a) == 0;
                CHECK(strcmp(test_jstr(row, "account"), acct_a) == 0, "key list --account listed %s",
                      test_jstr(row, "account"));
        }
        CHECK(rc == 0 && listed, "key list: rc=%d %s", rc, out ? out : "");
        json_decref(j);
        free(out);
        char day[16];
        time_t t = time(NULL) - 2 * 86400;
        strftime(day, sizeof(day), "%Y-%m-%d", gmtime(&t));
        out = NULL;
        rc = admin(&out, "spend", "--account", acct_a, "--day", day, "--json", NULL);
        CHECK(rc == 0 && out && strstr(out, "\"$0.000001 pause\""), "spend --day %s: rc=%d %s", day, rc, out ? out : "");
        free(out);
        out = NULL;
        rc = admin(&out, "spend", "--account", acct_a, "--json", NULL);
        CHECK(rc == 0 && out && strstr(out, "\"$0.000007 stop\""), "spend today: rc=%d %s", rc, out ? out : "");
        free(out);
        /* refusals: no such key, a negative limit, an unknown policy; nothing changes */
        CHECK(admin(NULL, "key", "limit", "key_nosuch", "--daily-limit-nanodollars", "5", NULL) != 0, "no such key");
        CHECK(admin(NULL, "key", "limit", key_a2.id, "--daily-limit-nanodollars", "-5", NULL) != 0, "negative limit");
        CHECK(admin(NULL, "key", "limit", key_a2.id, "--daily-limit-nanodollars", "5", "--policy", "maybe", NULL) != 0,
              "unknown policy");
        CHECK(sql_int("SELECT daily_limit_nanodollars FROM api_keys WHERE id = $1", key_a2.id) == 7000,
              "a refused change changed the limit");
        /* none: no limit */
        CHECK(admin(NULL, "key", "limit", key_a2.id, "--daily-limit-nanodollars", "none", NULL) == 0, "limit none");
        CHECK(sql_int("SELECT count(*) FROM api_keys WHERE id = $1 AND daily_limit_nanodollars IS NULL "
                      "AND limit_policy = 'stop'", key_a2.id) == 1,
              "limit none did not remove the limit (or changed the policy)");
        /* a command's --help: no database asked for */
        char *help[] = { (char *)test_env("TALLY_ADMIN_BIN"), "usage", "--help", NULL };
        out = NULL;
        char *err = NULL;
        rc = test_run(help, &out, &err);
        CHECK(rc == 0 && out && strstr(out, "usage [--account ID]") && !strstr(out, "close-month"),
              "usage --help: rc=%d %s %s", rc, out ? out : "", err ? err : "");
        free(out);
        free(err);
}

int main(int argc, char **argv)
{
        bool hostile = argc > 1 && strcmp(argv[1], "hostile") == 0;
        bool hosts = argc > 1 && strcmp(argv[1], "hosts") == 0;
        int pid = (int)getpid();
        snprintf(parent, sizeof(parent), "tally-test-api-%d", pid);
        snprintf(acct_a, sizeof(acct_a), "acct-api-a-%d", pid);
        snprintf(acct_b, sizeof(acct_b), "acct-api-b-%d", pid);
        snprintf(email_a, sizeof(email_a), "a-%d@example.com", pid);
        snprintf(email_b, sizeof(email_b), "b-%d@example.com", pid);
        snprintf(email_c, sizeof(email_c), "c-%d@example.com", pid);
        work = test_tmpdir("api");
        if (asprintf(&state, "%s/state", work) < 0 || asprintf(&sock, "%s/vmm.sock", work) < 0 ||
            asprintf(&pwfile, "%s/password", work) < 0)
                return 1;
        atexit(cleanup);
        signal(SIGTERM, on_signal);
        signal(SIGINT, on_signal);
        curl_global_init(CURL_GLOBAL_DEFAULT);
        db_url = test_db_create("api");
        char *migrate[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", db_url, NULL };
        char *merr = NULL;
        if (test_run(migrate, NULL, &merr) != 0) {
                fprintf(stderr, "FAIL: migrations: %s\n", merr ? merr : "");
                return 1;
        }
        free(merr);
        db = PQconnectdb(db_url);
        setup_accounts();
        if (hosts) { /* (hosts.c's placement: each tally-vmm may promise 4,096 MiB) */
                setenv("TALLY_CAPACITY_MEMORY_MIB", "4096", 1);
                hosts_tls_prepare();
        }
        start_vmm();
        if (hostile) {
                /* a key runs 4 sandbox requests at once (the default); its account may have 8 waiting */
                setenv("TALLY_QUEUE_PER_ACCOUNT", "8", 1);
                conn_timeout_s = "30";
                start_api();
                test_run_cases(hostile_cases, hostile_ncases);
                return finish();
        }
        if (hosts) {
                hosts_prepare();
                start_api();
                test_run_cases(hosts_cases, hosts_ncases);
                return finish();
        }
        start_api();
        const struct test_case cases[] = {
                { "health", test_health },
                { "sessions", test_sessions },
                { "keys_person_only", test_keys_person_only },
                { "limit_block", test_limit_block },
                { "internet_permission", test_internet_permission },
                { "lifecycle", test_lifecycle },
                { "measured_memory", test_measured_memory },
                { "key_caps", test_key_caps },
                { "idempotency", test_idempotency },
                { "tenancy", test_tenancy },
                { "bad_input", test_bad_input },
                { "rate_limit", test_rate_limit },
                { "signin_limit", test_signin_limit },
                { "read_routes", test_read_routes },
                { "no_secrets_logged", test_no_secrets_logged },
                { "revoked_elsewhere", test_revoked_elsewhere },
                { "admin_keys", test_admin_keys },
                { "sandbox_cost", test_sandbox_cost }, /* last: it changes account A's plan */
        };
        TEST_RUN_CASES(cases);
        return finish();
}
