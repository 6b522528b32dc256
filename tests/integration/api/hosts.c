/* hosts.c — tally-api in front of two real tally-vmm (process backend, each
 * with its own --host-id, state folder, socket and cgroup parent, reached
 * over TCP with mutual TLS on loopback, certificates from scripts/ca). Cases:
 * placement by room, draining a host through the host registry, a create
 * abandoned by its client, a create its host does not answer in time, and
 * one host that hangs: host B is SIGSTOPped, as a hung host looks, and 20 requests
 * routed to it wait. What must hold (issue 30): /healthz and a GET of a
 * sandbox on host A still answer fast (p99 measured and printed), /healthz
 * says degraded naming B, creates all land on A, the list answers with A's
 * sandboxes and names B as not answering, a missing id is 404, and the
 * requests stuck on B are bounded (503 host_busy past vmm_calls_per_host,
 * 504 past the read bound). B is thawed at the end; every process and
 * cgroup it made is removed, also when a check failed. */
#include "apitest.h"
#include "support.h"
#include "vmmtest.h"

#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define HOST_A "test-api-host" /* test_api.c's start_vmm */
#define HOST_B "test-api-host-b"
#define CALLS_PER_HOST 4 /* small, so that 20 requests on B pass it */
#define STUCK 20
#define P99_BOUND_MS 1000
#define CREATE_BOUND_S 6 /* tally-api's vmm_create_timeout_s here */

static char parent_b[64], *state_b, *sock_b;
static struct key key_b2, key_b3; /* account B's: a key runs 4 requests at once, its account 8 */
static pid_t vmm_b = -1;
static bool b_stopped, a_stopped, parents_frozen;

static void hosts_cleanup(void)
{
        if (vmm_pid > 0 && a_stopped)
                kill(vmm_pid, SIGCONT);
        if (vmm_b > 0 && b_stopped)
                kill(vmm_b, SIGCONT);
        if (parents_frozen) {
                test_cgroup_freeze(parent, 1, false);
                test_cgroup_freeze(parent, 2, false);
                test_cgroup_freeze(parent_b, 1, false);
                test_cgroup_freeze(parent_b, 2, false);
        }
        test_stop_process(&vmm_b, SIGKILL);
        if (*parent_b)
                test_cgroup_remove(parent_b, 0);
}

static char tls_dir[600];
static int port_a, port_b;

static void set_path(const char *var, const char *name, const char *ext)
{
        char path[700];
        snprintf(path, sizeof(path), "%s/%s.%s", tls_dir, name, ext);
        setenv(var, path, 1);
}

void hosts_tls_prepare(void)
{
        /* tally-api reaches both hosts over TCP with mutual TLS on loopback, as
         * in production: a CA, a certificate per host named by its host id,
         * and tally-api's; host A's settings by environment (test_api.c
         * starts it), host B's on its command line. */
        snprintf(tls_dir, sizeof(tls_dir), "%s/tls", work);
        test_ca("init", tls_dir, NULL);
        test_ca("issue", tls_dir, HOST_A);
        test_ca("issue", tls_dir, HOST_B);
        test_ca("issue", tls_dir, "tally-api");
        port_a = test_free_port();
        do
                port_b = test_free_port();
        while (port_b == port_a);
        char listen[64];
        snprintf(listen, sizeof(listen), "127.0.0.1:%d", port_a);
        setenv("TALLY_TLS_LISTEN", listen, 1);
        set_path("TALLY_TLS_CERT", HOST_A, "crt");
        set_path("TALLY_TLS_KEY", HOST_A, "key");
        set_path("TALLY_TLS_CLIENT_CA", "ca", "crt");
        set_path("TALLY_VMM_TLS_CERT", "tally-api", "crt");
        set_path("TALLY_VMM_TLS_KEY", "tally-api", "key");
        set_path("TALLY_VMM_TLS_CA", "ca", "crt");
}

void hosts_prepare(void)
{
        snprintf(parent_b, sizeof(parent_b), "tally-test-api-b-%d", (int)getpid());
        if (asprintf(&state_b, "%s/state-b", work) < 0 || asprintf(&sock_b, "%s/vmm-b.sock", work) < 0 ||
            asprintf(&api_vmm_sockets, "%s=https://127.0.0.1:%d", HOST_A, port_a) < 0)
                exit(1);
        char listen_b[64], cert_b[700], tlskey_b[700], ca[700];
        snprintf(listen_b, sizeof(listen_b), "127.0.0.1:%d", port_b);
        snprintf(cert_b, sizeof(cert_b), "%s/%s.crt", tls_dir, HOST_B);
        snprintf(tlskey_b, sizeof(tlskey_b), "%s/%s.key", tls_dir, HOST_B);
        snprintf(ca, sizeof(ca), "%s/ca.crt", tls_dir);
        atexit(hosts_cleanup); /* runs before test_api.c's cleanup: B goes first */
        char log[1024];
        snprintf(log, sizeof(log), "%s/vmm-b.log", work);
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state_b, "--socket", sock_b,
                         "--kafka-brokers", (char *)test_env("TALLY_TEST_BROKERS"), "--cgroup-parent", parent_b,
                         "--host-id", HOST_B, "--backend", "process", "--final-wait-ms", "500",
                         "--limits-database-url", db_url, "--host-registry-database-url", db_url, "--tls-listen",
                         listen_b, "--tls-cert", cert_b, "--tls-key", tlskey_b, "--tls-client-ca", ca, NULL };
        vmm_b = test_spawn(argv, NULL, log);
        struct stat st;
        int64_t until = test_now_ms() + 20000;
        while (stat(sock_b, &st) != 0 && test_now_ms() < until)
                test_sleep_ms(20);
        CHECK(stat(sock_b, &st) == 0, "host B's tally-vmm socket did not appear");
        test_sleep_ms(200);
        make_key(acct_b, "agent-b2", &key_b2);
        make_key(acct_b, "agent-b3", &key_b3);
        char n[16];
        snprintf(n, sizeof(n), "%d", CALLS_PER_HOST);
        setenv("TALLY_VMM_CALLS_PER_HOST", n, 1);
        snprintf(n, sizeof(n), "%d", CREATE_BOUND_S);
        setenv("TALLY_VMM_CREATE_TIMEOUT_S", n, 1);
}

/* ---- helpers ---- */

/* The entry of /healthz's hosts for host_id, NULL when none (borrowed from j). */
static json_t *health_host(json_t *j, const char *host_id)
{
        size_t i;
        json_t *h;
        json_array_foreach(json_object_get(j, "hosts"), i, h) {
                if (strcmp(test_jstr(h, "host"), host_id) == 0)
                        return h;
        }
        return NULL;
}

/* Waits up to ms for /healthz to say status (and both hosts known). */
static bool wait_health(const char *status, int ms)
{
        int64_t until = test_now_ms() + ms;
        do {
                struct resp r = http("GET", "/healthz", NULL, NULL, NULL);
                bool ok = r.status == 200 && strcmp(test_jstr(r.json, "status"), status) == 0 &&
                          health_host(r.json, HOST_A) && health_host(r.json, HOST_B);
                resp_free(&r);
                if (ok)
                        return true;
                test_sleep_ms(100);
        } while (test_now_ms() < until);
        return false;
}

/* Whether tally-vmm at s has sandbox id (asked on its own socket). */
static bool on_host(const char *s, const char *id)
{
        char path[300];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        return vmm_get(s, path, NULL) == 200;
}

/* The memory (MiB) tally-vmm at s has promised and may promise, from its /v1/status; -1 if unread. */
static int64_t promised_mib(const char *s, int64_t *cap)
{
        char *body = NULL;
        int64_t p = -1;
        *cap = -1;
        if (vmm_get(s, "/v1/status", &body) == 200) {
                json_t *j = json_loads(body, 0, NULL);
                p = json_integer_value(json_object_get(json_object_get(j, "promised"), "memory_mib"));
                *cap = json_integer_value(json_object_get(json_object_get(j, "capacity"), "memory_mib"));
                json_decref(j);
        }
        free(body);
        return p;
}

/* The ledger's row for a sandbox, as the aggregator writes it from the
 * created event (no aggregator runs here). */
static void ledger_row(const char *id, const char *account, const struct key *k, const char *host)
{
        const char *p[] = { id, account, k->id, host };
        PGresult *res = PQexecParams(db,
                                     "INSERT INTO sandboxes (id, account_id, key_id, host, vcpus, mem_size_bytes, state, "
                                     "created_at) VALUES ($1, $2, $3, $4, 1, 67108864, 'running', now())",
                                     4, NULL, p, NULL, NULL, 0);
        CHECK(PQresultStatus(res) == PGRES_COMMAND_OK, "ledger row for %s: %s", id, PQerrorMessage(db));
        PQclear(res);
}

static int cmp_long(const void *a, const void *b)
{
        long x = *(const long *)a, y = *(const long *)b;
        return (x > y) - (x < y);
}

static long p99(long *ms, int n)
{
        qsort(ms, (size_t)n, sizeof(long), cmp_long);
        int i = (n * 99 + 99) / 100 - 1;
        return n ? ms[i < 0 ? 0 : i] : -1;
}

/* ---- the case ---- */

struct stuck {
        char path[512];
        const char *secret;
        struct resp r;
};

static void *stuck_main(void *arg)
{
        struct stuck *s = arg;
        http_timeout_s = 60;
        s->r = http("GET", s->path, s->secret, NULL, NULL);
        return NULL;
}

static void test_one_host_hangs(void)
{
        CHECK(wait_health("ok", 10000), "/healthz did not say ok with both hosts named (host_id from /v1/status)");

        /* Creates go to the hosts in turn: key A's on each, and key B's on each. */
        char a_ids[4][64], b_ids[2][64];
        for (int i = 0; i < 4; i++)
                create_sandbox(&key_a, a_ids[i], sizeof(a_ids[i]));
        for (int i = 0; i < 2; i++)
                create_sandbox(&key_b, b_ids[i], sizeof(b_ids[i]));
        const char *a_on_a = NULL, *a_on_a_unfolded = NULL, *b_on_b = NULL;
        int a_on_b = 0;
        for (int i = 0; i < 4; i++) {
                if (on_host(sock, a_ids[i])) {
                        if (!a_on_a)
                                a_on_a = a_ids[i];
                        else if (!a_on_a_unfolded)
                                a_on_a_unfolded = a_ids[i];
                } else {
                        CHECK(on_host(sock_b, a_ids[i]), "sandbox %s is on neither host", a_ids[i]);
                        a_on_b++;
                }
        }
        for (int i = 0; i < 2; i++)
                if (on_host(sock_b, b_ids[i]))
                        b_on_b = b_ids[i];
        CHECK(a_on_a && a_on_a_unfolded && a_on_b == 2 && b_on_b,
              "the creates were not spread over both hosts (A's on B: %d)", a_on_b);
        if (!a_on_a || !a_on_a_unfolded || !b_on_b)
                return;
        /* One of A's sandboxes and B's sandbox folded into the ledger; the other of A's not yet. */
        ledger_row(a_on_a, acct_a, &key_a, HOST_A);
        ledger_row(b_on_b, acct_b, &key_b, HOST_B);

        struct resp r = http("GET", "/v1/sandboxes", key_a.secret, NULL, NULL);
        CHECK(r.status == 200 && json_array_size(json_object_get(r.json, "sandboxes")) == 4,
              "list before the hang: %ld %s", r.status, r.body ? r.body : "");
        resp_free(&r);

        /* Host B hangs; 20 requests routed to it (the ledger says so) wait on it. */
        CHECK(kill(vmm_b, SIGSTOP) == 0, "SIGSTOP host B");
        b_stopped = true;
        int64_t stopped_at = test_now_ms();
        struct stuck stuck[STUCK];
        pthread_t th[STUCK];
        for (int i = 0; i < STUCK; i++) {
                snprintf(stuck[i].path, sizeof(stuck[i].path), "/v1/sandboxes/%s", b_on_b);
                stuck[i].secret = i % 3 == 0 ? key_b.secret : i % 3 == 1 ? key_b2.secret : key_b3.secret;
                pthread_create(&th[i], NULL, stuck_main, &stuck[i]);
        }
        test_sleep_ms(300);

        /* Meanwhile /healthz and host A's sandboxes answer fast. */
        enum { N = 60 };
        long health_ms[N], get_ms[N], fall_ms[N];
        int nh = 0, ng = 0, nf = 0;
        for (int i = 0; i < N; i++) {
                r = http("GET", "/healthz", NULL, NULL, NULL);
                CHECK(r.status == 200, "healthz during the hang: %ld %s", r.status, r.body ? r.body : "");
                health_ms[nh++] = r.status ? r.ms : 60000;
                resp_free(&r);
                char path[512];
                snprintf(path, sizeof(path), "/v1/sandboxes/%s", a_on_a);
                r = http("GET", path, key_a.secret, NULL, NULL);
                CHECK(r.status == 200, "GET of a sandbox on host A during the hang: %ld %s", r.status,
                      r.body ? r.body : "");
                get_ms[ng++] = r.status ? r.ms : 60000;
                resp_free(&r);
                test_sleep_ms(50);
        }
        /* Once B is known down, a sandbox the ledger does not know yet is found on A alone. */
        CHECK(wait_health("degraded", 8000), "/healthz did not say degraded with host B stopped");
        for (int i = 0; i < N / 2; i++) {
                char path[512];
                snprintf(path, sizeof(path), "/v1/sandboxes/%s", a_on_a_unfolded);
                r = http("GET", path, key_a.secret, NULL, NULL);
                CHECK(r.status == 200, "GET of an unfolded sandbox on host A during the hang: %ld %s", r.status,
                      r.body ? r.body : "");
                fall_ms[nf++] = r.status ? r.ms : 60000;
                resp_free(&r);
        }
        long hp = p99(health_ms, nh), gp = p99(get_ms, ng), fp = p99(fall_ms, nf);
        fprintf(stderr, "host B stopped, %d requests on it: p99 /healthz %ld ms, GET on A (ledger) %ld ms, "
                        "GET on A (not in the ledger) %ld ms (max %ld, %ld, %ld)\n",
                STUCK, hp, gp, fp, health_ms[nh - 1], get_ms[ng - 1], fall_ms[nf - 1]);
        CHECK(hp <= P99_BOUND_MS, "/healthz p99 %ld ms with host B hung", hp);
        CHECK(gp <= P99_BOUND_MS, "GET on host A p99 %ld ms with host B hung", gp);
        CHECK(fp <= P99_BOUND_MS, "GET on host A (ledger not folded) p99 %ld ms with host B hung", fp);

        r = http("GET", "/healthz", NULL, NULL, NULL);
        json_t *hb = health_host(r.json, HOST_B), *ha = health_host(r.json, HOST_A);
        CHECK(r.status == 200 && strcmp(test_jstr(r.json, "status"), "degraded") == 0 && hb &&
                      json_is_false(json_object_get(hb, "reachable")) && ha &&
                      json_is_true(json_object_get(ha, "reachable")) && json_is_string(json_object_get(ha, "last_ok")),
              "healthz: %s", r.body ? r.body : "");
        resp_free(&r);

        /* Creates all land on A. */
        for (int i = 0; i < 4; i++) {
                char id[64];
                r = http("POST", "/v1/sandboxes", key_a.secret, NULL,
                         "{\"vcpus\":1,\"memory_mib\":64,\"timeout_s\":600}");
                CHECK(r.status == 201, "create with host B down: %ld %s", r.status, r.body ? r.body : "");
                snprintf(id, sizeof(id), "%s", test_jstr(r.json, "id"));
                CHECK(r.status != 201 || on_host(sock, id), "create %s did not land on host A", id);
                resp_free(&r);
        }

        /* The list answers with A's sandboxes and names B. */
        r = http("GET", "/v1/sandboxes", key_a.secret, NULL, NULL);
        json_t *missing = json_object_get(r.json, "hosts_not_answering");
        CHECK(r.status == 200 && json_array_size(json_object_get(r.json, "sandboxes")) == 6 &&
                      json_array_size(missing) == 1 &&
                      strcmp(test_jstr(json_array_get(missing, 0), "host"), HOST_B) == 0,
              "list with host B down: %ld %s", r.status, r.body ? r.body : "");
        CHECK(r.ms <= P99_BOUND_MS, "list with host B down took %ld ms", r.ms);
        resp_free(&r);

        /* A missing id is 404, not 502. */
        r = http("GET", "/v1/sandboxes/no-such-sandbox", key_a.secret, NULL, NULL);
        CHECK(r.status == 404 && strcmp(err_code(&r), "not_found") == 0, "missing id with host B down: %ld %s",
              r.status, r.body ? r.body : "");
        CHECK(r.ms <= P99_BOUND_MS, "missing id took %ld ms", r.ms);
        resp_free(&r);

        /* What waited on B ended, bounded: past the host's slots 503 host_busy
         * with Retry-After; the rest 502 vmm_unavailable when the TLS
         * handshake did not finish within the 5 s connect bound (a frozen host
         * accepts the TCP connection, never the handshake), or 504 at the read
         * bound (10 s) when it hung after the request was sent. */
        int busy = 0, timed_out = 0;
        long slowest = 0;
        for (int i = 0; i < STUCK; i++) {
                pthread_join(th[i], NULL);
                struct resp *s = &stuck[i].r;
                if (s->status == 503 && strcmp(err_code(s), "host_busy") == 0 && s->retry_after[0])
                        busy++;
                else if ((s->status == 504 && strcmp(err_code(s), "vmm_timeout") == 0) ||
                         (s->status == 502 && strcmp(err_code(s), "vmm_unavailable") == 0))
                        timed_out++;
                else
                        CHECK(false, "request on stopped host B: %ld %s", s->status, s->body ? s->body : "");
                if (s->ms > slowest)
                        slowest = s->ms;
                resp_free(s);
        }
        fprintf(stderr,
                "requests on host B: %d host_busy, %d vmm_timeout or vmm_unavailable, slowest %ld ms (%lld ms after"
                " SIGSTOP)\n",
                busy, timed_out, slowest, (long long)(test_now_ms() - stopped_at));
        CHECK(busy > 0 && timed_out > 0 && busy + timed_out == STUCK, "busy %d timed out %d", busy, timed_out);
        CHECK(slowest <= 30000, "a request on host B waited %ld ms", slowest);

        /* B thaws: the watch sees it again. */
        kill(vmm_b, SIGCONT);
        b_stopped = false;
        CHECK(wait_health("ok", 8000), "/healthz did not say ok again after SIGCONT");
        char path[512];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", b_on_b);
        r = http("GET", path, key_b.secret, NULL, NULL);
        CHECK(r.status == 200, "GET of B's sandbox after SIGCONT: %ld %s", r.status, r.body ? r.body : "");
        resp_free(&r);
}

/* Account B's sandboxes as tally-api lists them: all, and those running. */
static void count_b(int *all, int *running)
{
        struct resp r = http("GET", "/v1/sandboxes", key_b2.secret, NULL, NULL);
        CHECK(r.status == 200, "list: %ld %s", r.status, r.body ? r.body : "");
        json_t *a = json_object_get(r.json, "sandboxes"), *v;
        size_t i;
        *all = (int)json_array_size(a);
        *running = 0;
        json_array_foreach(a, i, v)
                *running += strcmp(test_jstr(v, "state"), "running") == 0;
        resp_free(&r);
}

/* Whether log file name (in the work folder) says needle within ms. */
static bool log_says(const char *name, const char *needle, int ms)
{
        char log[1024];
        snprintf(log, sizeof(log), "%s/%s", work, name);
        for (int64_t until = test_now_ms() + ms;; test_sleep_ms(200)) {
                char *text = test_read_file(log);
                bool said = text && strstr(text, needle);
                free(text);
                if (said || test_now_ms() >= until)
                        return said;
        }
}

/* A create its host does not answer within vmm_create_timeout_s (CREATE_BOUND_S
 * here): both hosts' cgroup parents are frozen, so the sandbox's start waits
 * while each tally-vmm answers everything else, as on a host whose start
 * hangs or that was frozen mid-create. tally-api answers 504 and cancels the
 * create on its host; once thawed, the host finishes the start and stops the
 * sandbox at once: no running, billed sandbox whose id nobody received. */
static void test_create_unanswered(void)
{
        CHECK(wait_health("ok", 10000), "/healthz did not say ok with both hosts");
        int version = 0, all0, run0, all, run;
        CHECK(test_vmm_wait_ready(sock_b, 10000, &version) == 0 && version > 0, "host B's status");
        count_b(&all0, &run0);
        parents_frozen = true;
        CHECK(test_cgroup_freeze(parent, version, true) && test_cgroup_freeze(parent_b, version, true),
              "could not freeze the hosts' cgroup parents");
        int64_t t0 = test_now_ms();
        struct resp r = http("POST", "/v1/sandboxes", key_b2.secret, NULL,
                             "{\"vcpus\":1,\"memory_mib\":64,\"timeout_s\":600,\"labels\":{\"case\":\"unanswered\"}}");
        long took = (long)(test_now_ms() - t0);
        CHECK(r.status == 504, "the create of a frozen start answered %ld %s", r.status, r.body ? r.body : "");
        fprintf(stderr, "create_unanswered: %ld after %ld ms (bound %d s)\n", r.status, took, CREATE_BOUND_S);
        resp_free(&r);
        /* the host answers its probes (only the sandbox is frozen): the cancel goes at the next */
        CHECK(log_says("api.log", "create cancelled on its host", 10000),
              "tally-api did not cancel the unanswered create on its host within 10 s");
        CHECK(test_cgroup_freeze(parent, version, false) && test_cgroup_freeze(parent_b, version, false),
              "could not thaw the hosts' cgroup parents");
        parents_frozen = false;
        bool said = false;
        for (int64_t until = test_now_ms() + 30000; !said && test_now_ms() < until;)
                said = log_says("vmm.log", "a create nobody waits for", 0) ||
                       log_says("vmm-b.log", "a create nobody waits for", 200);
        CHECK(said, "no host said it stopped the sandbox of the unanswered create within 30 s of the thaw");
        count_b(&all, &run);
        fprintf(stderr, "create_unanswered: account B had %d sandboxes (%d running), now %d (%d running)\n", all0,
                run0, all, run);
        CHECK(run == run0, "a sandbox of the unanswered create is running: %d running, %d before", run, run0);
}

/* A create whose client gave up before its host answered (both hosts
 * frozen; the client's bound 1 s): once the host thaws and makes the
 * sandbox, tally-api finds its caller gone and stops it, so no running,
 * billed sandbox is left whose id no client received. */
static void test_abandoned_create(void)
{
        CHECK(wait_health("ok", 10000), "/healthz did not say ok with both hosts");
        int all0, run0, all, run;
        count_b(&all0, &run0);
        kill(vmm_pid, SIGSTOP);
        a_stopped = true;
        kill(vmm_b, SIGSTOP);
        b_stopped = true;
        http_timeout_s = 1;
        struct resp r = http("POST", "/v1/sandboxes", key_b2.secret, NULL,
                             "{\"vcpus\":1,\"memory_mib\":64,\"timeout_s\":600,\"labels\":{\"case\":\"abandoned\"}}");
        http_timeout_s = 60;
        CHECK(r.status == 0, "the create answered %ld while both hosts were stopped", r.status);
        resp_free(&r);
        test_sleep_ms(1000);
        kill(vmm_pid, SIGCONT);
        a_stopped = false;
        kill(vmm_b, SIGCONT);
        b_stopped = false;
        /* The create goes on once its host thaws; then its sandbox is stopped. */
        CHECK(log_says("api.log", "create abandoned by its client", 30000),
              "tally-api did not stop the sandbox of the abandoned create (no log line in 30 s)");
        count_b(&all, &run);
        fprintf(stderr, "abandoned create: account B had %d sandboxes (%d running), now %d (%d running)\n", all0,
                run0, all, run);
        CHECK(run == run0, "a sandbox of the abandoned create is running: %d running, %d before", run, run0);
}

/* A create of memory_mib for key_b2: its status, and its id in id. */
static long create_mib(int mib, char *id, size_t size)
{
        char body[160];
        snprintf(body, sizeof(body), "{\"vcpus\":1,\"memory_mib\":%d,\"disk_mib\":16,\"timeout_s\":600}", mib);
        struct resp r = http("POST", "/v1/sandboxes", key_b2.secret, NULL, body);
        long st = r.status;
        snprintf(id, size, "%s", st == 201 ? test_jstr(r.json, "id") : "");
        if (st != 201 && st != 507)
                fprintf(stderr, "create of %d MiB: %ld %s\n", mib, st, r.body ? r.body : "");
        resp_free(&r);
        return st;
}

/* Leaves the hosts as a case found them: account B's sandboxes deleted, both
 * hosts promising nothing, and tally-api's watch having seen it. */
static void empty_hosts(void)
{
        struct resp r = http("GET", "/v1/sandboxes", key_b2.secret, NULL, NULL);
        json_t *v;
        size_t i;
        json_array_foreach(json_object_get(r.json, "sandboxes"), i, v) {
                char path[160];
                snprintf(path, sizeof(path), "/v1/sandboxes/%s", test_jstr(v, "id"));
                struct resp d = http("DELETE", path, key_b2.secret, NULL, NULL);
                resp_free(&d);
        }
        resp_free(&r);
        int64_t ca, cb;
        for (int64_t until = test_now_ms() + 10000;
             (promised_mib(sock, &ca) != 0 || promised_mib(sock_b, &cb) != 0) && test_now_ms() < until;)
                test_sleep_ms(100);
        test_sleep_ms(2500); /* and tally-api's watch has seen them empty */
}

/* Creates are placed by room (docs/api.md, "Placement"): each host may
 * promise 4,096 MiB here (TALLY_CAPACITY_MEMORY_MIB, main()). 3,000 MiB goes
 * to one host (H1), 1,000 to the other (H2, the emptier), then 2,000 fits
 * only H2: blind turns sent it to H1, which refused it (507). A fourth of
 * 2,000 fits neither: 507, and no host promised more than it may. Then with
 * H2 stopped, a create still lands on H1. */
static void test_placement(void)
{
        CHECK(wait_health("ok", 10000), "/healthz did not say ok with both hosts");
        int64_t cap_a = -1, cap_b = -1;
        CHECK(promised_mib(sock, &cap_a) == 0 && promised_mib(sock_b, &cap_b) == 0 && cap_a == 4096 &&
                      cap_b == 4096,
              "the hosts are not empty with 4096 MiB each (A %lld, B %lld)", (long long)cap_a, (long long)cap_b);
        char x[64], y[64], z[64], w[64], v[64];
        CHECK(create_mib(3000, x, sizeof(x)) == 201, "3,000 MiB on two empty hosts of 4,096");
        const char *h1 = on_host(sock, x) ? sock : sock_b, *h2 = h1 == sock ? sock_b : sock;
        pid_t pid2 = h1 == sock ? vmm_b : vmm_pid;
        test_sleep_ms(2500); /* the watch's next probe has what H1 promised */
        CHECK(create_mib(1000, y, sizeof(y)) == 201 && on_host(h2, y), "1,000 MiB did not go to the emptier host");
        test_sleep_ms(2500);
        CHECK(create_mib(2000, z, sizeof(z)) == 201 && on_host(h2, z),
              "2,000 MiB, which fits only the second host, did not go there");
        /* ...straight there: H1 was never asked (it would have refused it) */
        char log1[1024];
        snprintf(log1, sizeof(log1), "%s/%s", work, h1 == sock ? "vmm.log" : "vmm-b.log");
        char *text = test_read_file(log1);
        CHECK(text && !strstr(text, "sandbox refused"), "the first host was asked for a create it had no room for");
        free(text);
        test_sleep_ms(2500);
        long st = create_mib(2000, w, sizeof(w));
        CHECK(st == 507, "2,000 MiB more, which fits no host, answered %ld", st);
        int64_t c1, c2, p1 = promised_mib(h1, &c1), p2 = promised_mib(h2, &c2);
        fprintf(stderr, "placement: host 1 promised %lld of %lld MiB, host 2 %lld of %lld\n", (long long)p1,
                (long long)c1, (long long)p2, (long long)c2);
        CHECK(p1 >= 0 && p1 <= c1 && p2 >= 0 && p2 <= c2, "a host promised more than it may");
        /* H2 stopped: the create goes to H1, which has room, at once. */
        kill(pid2, SIGSTOP);
        if (pid2 == vmm_b)
                b_stopped = true;
        else
                a_stopped = true;
        CHECK(wait_health("degraded", 10000), "/healthz did not say degraded with a host stopped");
        int64_t t0 = test_now_ms();
        CHECK(create_mib(500, v, sizeof(v)) == 201 && on_host(h1, v), "a create with one host stopped failed");
        fprintf(stderr, "placement: create with a host stopped answered in %lld ms\n", (long long)(test_now_ms() - t0));
        kill(pid2, SIGCONT);
        b_stopped = a_stopped = false;
        CHECK(wait_health("ok", 10000), "/healthz did not say ok again");
        /* Sizes no host has, at the ends of the integers, are scored without
         * overflow (the sanitizer pass would say) and refused by the vmm. */
        static const char *const huge[] = { "{\"memory_mib\":9223372036854775807,\"disk_mib\":16}",
                                            "{\"vcpus\":-9223372036854775807,\"disk_mib\":9223372036854775807}" };
        for (int i = 0; i < 2; i++) {
                struct resp hr = http("POST", "/v1/sandboxes", key_b2.secret, NULL, huge[i]);
                CHECK(hr.status == 400, "create of %s: %ld %s", huge[i], hr.status, hr.body ? hr.body : "");
                resp_free(&hr);
        }
        empty_hosts();
}

/* Host B's state as tally-api's /healthz says the registry has it ("" for none). */
static bool b_registry_is(const char *want, int ms)
{
        int64_t until = test_now_ms() + ms;
        do {
                struct resp r = http("GET", "/healthz", NULL, NULL, NULL);
                json_t *v;
                size_t i;
                bool seen = false;
                json_array_foreach(json_object_get(r.json, "hosts"), i, v)
                        seen |= strcmp(test_jstr(v, "host"), HOST_B) == 0 &&
                                strcmp(json_string_value(json_object_get(v, "registry")) ?: "", want) == 0;
                resp_free(&r);
                if (seen)
                        return true;
                test_sleep_ms(200);
        } while (test_now_ms() < until);
        return false;
}

/* The /healthz hosts entry at index i (a new reference), NULL when none. */
static json_t *health_at(int i, const char **status)
{
        struct resp r = http("GET", "/healthz", NULL, NULL, NULL);
        json_t *e = json_incref(json_array_get(json_object_get(r.json, "hosts"), (size_t)i));
        static char st[32];
        snprintf(st, sizeof(st), "%s", test_jstr(r.json, "status"));
        *status = st;
        resp_free(&r);
        return e;
}

/* tally-api's vmm_sockets names host A only: host B, which registers its
 * https address in the host registry, is found there and reached over
 * mutual TLS like A. A row that names a host id at an address whose
 * certificate names another (an impostor, or a typo) is never reached:
 * it stays down, takes no create, and once forgotten (tally-admin host
 * forget) is retired, so /healthz says ok again and lists skip it. */
static void test_registry_hosts(void)
{
        int64_t t0 = test_now_ms();
        CHECK(wait_health("ok", 20000), "host B, registered, did not appear in /healthz within 20 s");
        fprintf(stderr, "registry_hosts: host B reached from the registry %lld ms after the case began\n",
                (long long)(test_now_ms() - t0));
        CHECK(strstr(api_vmm_sockets, HOST_B) == NULL, "vmm_sockets names B: nothing was found in the registry");
        char addr[64];
        snprintf(addr, sizeof(addr), "https://127.0.0.1:%d", port_a);
        sql_exec("INSERT INTO host_registry (host_id, address, capacity_vcpus, capacity_memory_mib, capacity_disk_mib,"
                 " vcpu_overcommit_percent, memory_overcommit_percent, disk_overcommit_percent)"
                 " VALUES ($1, $2, 64, 1048576, 1048576, 100, 100, 100)",
                 "impostor-host", addr);
        const char *status = "";
        json_t *e = NULL;
        for (int64_t until = test_now_ms() + 10000; !e && test_now_ms() < until; test_sleep_ms(200))
                e = health_at(2, &status);
        CHECK(e != NULL, "the impostor's row was not added as a host within 10 s");
        test_sleep_ms(2500); /* its first probe has failed */
        json_decref(e);
        e = health_at(2, &status);
        CHECK(e && !json_is_true(json_object_get(e, "reachable")) && strcmp(status, "degraded") == 0,
              "a host id at another host's address was reachable (or /healthz said %s)", status);
        json_decref(e);
        for (int k = 0; k < 4; k++) {
                char id[64];
                CHECK(create_mib(64, id, sizeof(id)) == 201 && (on_host(sock, id) || on_host(sock_b, id)),
                      "a create with an impostor registered did not land on A or B");
        }
        char *out = NULL;
        CHECK(admin(&out, "host", "forget", "impostor-host", NULL) == 0, "tally-admin host forget: %s",
              out ? out : "");
        free(out);
        CHECK(wait_health("ok", 10000), "/healthz did not say ok once the impostor was forgotten");
        e = health_at(2, &status);
        CHECK(e && json_is_true(json_object_get(e, "retired")), "the forgotten host is not shown retired");
        json_decref(e);
        /* Registered again at another address (B's: its certificate names B):
         * the down entry is replaced by one at the new address, as unreachable. */
        snprintf(addr, sizeof(addr), "https://127.0.0.1:%d", port_b);
        sql_exec("INSERT INTO host_registry (host_id, address, capacity_vcpus, capacity_memory_mib, capacity_disk_mib,"
                 " vcpu_overcommit_percent, memory_overcommit_percent, disk_overcommit_percent)"
                 " VALUES ($1, $2, 64, 1048576, 1048576, 100, 100, 100)",
                 "impostor-host", addr);
        e = NULL;
        for (int64_t until = test_now_ms() + 10000; !e && test_now_ms() < until; test_sleep_ms(200))
                e = health_at(3, &status);
        CHECK(e != NULL, "the row registered again at another address was not added as a host within 10 s");
        json_decref(e);
        test_sleep_ms(2500);
        e = health_at(3, &status);
        CHECK(e && !json_is_true(json_object_get(e, "reachable")) && strcmp(status, "degraded") == 0,
              "host B's address under another host id was reachable (or /healthz said %s)", status);
        json_decref(e);
        out = NULL;
        CHECK(admin(&out, "host", "forget", "impostor-host", NULL) == 0, "tally-admin host forget (again)");
        free(out);
        CHECK(wait_health("ok", 10000), "/healthz did not say ok once the impostor was forgotten again");
        struct resp r = http("GET", "/v1/sandboxes", key_b2.secret, NULL, NULL);
        CHECK(r.status == 200 && json_array_size(json_object_get(r.json, "hosts_not_answering")) == 0,
              "a list names a host not answering once the impostor is forgotten: %s", r.body ? r.body : "");
        resp_free(&r);
        empty_hosts();
}

/* Draining host B for maintenance (docs/operations.md): `tally-admin host
 * drain` in the registry B heartbeats into; tally-api sends it no create,
 * while its sandbox stays visible and controllable; with every host draining
 * a create is 503 no_host; `host resume` and creates reach B again. */
static void test_drain(void)
{
        CHECK(wait_health("ok", 10000), "/healthz did not say ok with both hosts");
        CHECK(b_registry_is("ready", 20000), "host B did not appear ready in the registry through tally-api");
        char on_b[300] = "", ids[4][64] = { "" };
        for (int i = 0; i < 4 && !*on_b; i++) { /* one sandbox on B first */
                CHECK(create_mib(64, ids[i], sizeof(ids[i])) == 201, "create before the drain");
                if (on_host(sock_b, ids[i]))
                        snprintf(on_b, sizeof(on_b), "%s", ids[i]);
        }
        CHECK(*on_b, "no create went to host B before the drain");
        char *out = NULL;
        CHECK(admin(&out, "host", "drain", HOST_B, NULL) == 0, "tally-admin host drain");
        free(out);
        CHECK(b_registry_is("draining", 10000), "tally-api did not see host B draining");
        int on_a = 0;
        char made[4][64];
        for (int i = 0; i < 4; i++)
                on_a += create_mib(64, made[i], sizeof(made[i])) == 201 && on_host(sock, made[i]);
        CHECK(on_a == 4, "%d of 4 creates went to host A while B drained", on_a);
        char path[160];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", on_b);
        struct resp r = http("GET", path, key_b2.secret, NULL, NULL);
        CHECK(r.status == 200, "B's sandbox while draining: %ld %s", r.status, r.body ? r.body : "");
        resp_free(&r);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/pause", on_b);
        r = http("POST", path, key_b2.secret, NULL, NULL);
        CHECK(r.status == 200, "pausing B's sandbox while draining: %ld %s", r.status, r.body ? r.body : "");
        resp_free(&r);
        /* A draining too: nowhere to create. */
        sql_exec("INSERT INTO host_registry (host_id, capacity_vcpus, capacity_memory_mib, capacity_disk_mib,"
                 " vcpu_overcommit_percent, memory_overcommit_percent, disk_overcommit_percent, state)"
                 " VALUES ($1, 2, 4096, 4096, 100, 100, 100, $2)", HOST_A, "draining");
        long st = 0;
        for (int64_t until = test_now_ms() + 10000; st != 503 && test_now_ms() < until; test_sleep_ms(300)) {
                struct resp c = http("POST", "/v1/sandboxes", key_b2.secret, NULL, "{\"memory_mib\":64}");
                st = c.status;
                CHECK(st == 201 || (st == 503 && strcmp(err_code(&c), "no_host") == 0), "create with A draining: %ld %s",
                      st, c.body ? c.body : "");
                resp_free(&c);
        }
        CHECK(st == 503, "with every host draining a create still ran");
        sql_exec("DELETE FROM host_registry WHERE host_id = $1", HOST_A, NULL);
        CHECK(admin(&out, "host", "resume", HOST_B, NULL) == 0, "tally-admin host resume");
        free(out);
        CHECK(b_registry_is("ready", 10000), "tally-api did not see host B ready again");
        char back[64];
        CHECK(create_mib(64, back, sizeof(back)) == 201 && on_host(sock_b, back),
              "after resume the create did not go to B, the emptier host");
        empty_hosts();
}

const struct test_case hosts_cases[] = {
        { "registry_hosts", test_registry_hosts },
        { "placement", test_placement },
        { "drain", test_drain },
        { "one_host_hangs", test_one_host_hangs },
        { "abandoned_create", test_abandoned_create },
        { "create_unanswered", test_create_unanswered },
};
const size_t hosts_ncases = sizeof(hosts_cases) / sizeof(hosts_cases[0]);
