/* Integration: the whole pipeline under faults, checked against the truth.
 *
 * Every part is a real process: a private PostgreSQL cluster (the suite's is
 * shared by concurrent tests, and this test restarts its own), the
 * development broker (with its control socket), tally-vmm with process
 * sandboxes in real cgroups, tally-collector, tally-aggregator, tally-api and
 * tally-notifier, whose one alert destination is a webhook receiver this test
 * runs on 127.0.0.1. A seeded random schedule pauses, resumes, forks, stops
 * and creates sandboxes that burn CPU, reads the key's spend through
 * tally-api now and then, and kill -9s the collector, the aggregator, the
 * vmm, tally-api and tally-notifier and starts them again (TALLY_CHAOS_KILLS,
 * default 24); once it takes the broker down for 30 s (`ctl down` / `ctl up`),
 * once it restarts PostgreSQL (an immediate stop: crash recovery), and reads
 * the spend right after it (the first request must get 200: tally-api's pooled
 * connections all broke). TALLY_CHAOS_SEED replays a run.
 *
 * At the end, for every sandbox: the CPU billed equals, to the ns, its cgroup's
 * counter as the test reads it from the kernel once its processes ended, in
 * the ledger and in tally-api's GET /v1/usage?group_by=sandbox (whose memory
 * equals the ledger's); the time billed running (memory held) and paused
 * (storage held) lies within the moments the test observed around its own
 * create/pause/resume/fork/stop calls (each bound a call's round trip); the
 * key's spend alerts (alert_only, a limit the run passes in its middle)
 * exist once each: 50, 80, 100; every alert of the key is delivered, and the
 * receiver got exactly the alerts' event ids, each at least once. */
#include "pipe.h"
#include "support.h"
#include "timeutil.h"
#include "vmmtest.h"

#include <curl/curl.h>
#include <errno.h>
#include <libpq-fe.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS 200
#define MEM_BYTES (UINT64_C(128) << 20)
#define MAX_SB 64
#define LIVE_MAX 7
/* The key's daily limit, nano-dollars, per kill the run makes (128 MiB held
 * is 260 nano-dollars a second; 4 to 7 sandboxes live): the thresholds are
 * mostly crossed among the kills before the broker's outage (a third of
 * them), the rest when the broker is back and its backlog is billed (later
 * when a killed aggregator's partitions took their ~10 s to come back). */
#define LIMIT_ND_PER_KILL 250
#define KEY "key_chaos"

static struct pipeline P;
static uint64_t rng;
static char lib_sh[600], pg_data[600], pg_log[600], pg_port[16], pg_secrets[600];
static char broker_sock[600], broker_file[600];
static pid_t broker, api_pid = -1, notifier_pid = -1;
static int vmms, aggregators, apis, notifiers, api_port, kills, kills_by[5];
static int64_t limit_nd;
static bool broker_down_done, pg_restart_done;

static uint64_t rnd(void)
{
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}
static int rnd_in(int lo, int hi)
{
        return lo + (int)(rnd() % (uint64_t)(hi - lo + 1));
}

/* ---- the private PostgreSQL, through scripts/lib.sh as the suite's (SCRAM, tally's roles) ---- */

static int lib(const char *fn, const char *a1, const char *a2, const char *a3, const char *a4, char **out)
{
        char *err = NULL;
        char script[128];
        snprintf(script, sizeof(script), "source \"$0\"; %s \"$@\"", fn);
        char *argv[] = { "/bin/bash", "-c", script, lib_sh, (char *)a1, (char *)a2, (char *)a3, (char *)a4, NULL };
        int rc = test_run(argv, out, &err);
        if (rc != 0)
                fprintf(stderr, "%s: exit %d: %s\n", fn, rc, err ? err : "");
        free(err);
        return rc;
}

static void pg_start_private(void)
{
        /* free_port picks below the ephemeral range, but another program may
         * still take the port before PostgreSQL binds it: another port then. */
        bool up = false;
        for (int attempt = 0; attempt < 5 && !up; attempt++) {
                char *port = NULL;
                if (lib("free_port", NULL, NULL, NULL, NULL, &port) != 0 || !port) {
                        fprintf(stderr, "FAIL: no free port for PostgreSQL\n");
                        exit(1);
                }
                snprintf(pg_port, sizeof(pg_port), "%d", atoi(port));
                free(port);
                up = lib("pg_test_start", pg_data, pg_port, pg_log, pg_secrets, NULL) == 0;
        }
        if (!up) {
                fprintf(stderr, "FAIL: the test's PostgreSQL did not start (log %s)\n", pg_log);
                exit(1);
        }
        char url[128];
        snprintf(url, sizeof(url), "postgresql://tally@127.0.0.1:%s/postgres", pg_port);
        setenv("TALLY_TEST_PG_URL", url, 1);
        /* this cluster's passwords (the daemons log in as their roles: test_role_url) */
        char pass[640];
        snprintf(pass, sizeof(pass), "%s/pgpass", pg_secrets);
        setenv("PGPASSFILE", pass, 1);
}

static void pg_restart(void)
{
        int64_t t0 = time_boot_ns();
        /* An immediate stop: no checkpoint, crash recovery at the next start. */
        char *argv[] = { "/bin/bash", "-c", "source \"$0\"; as_pg \"$PG_BIN/pg_ctl\" -D \"$1\" -m immediate -w stop",
                         lib_sh, pg_data, NULL };
        char *err = NULL;
        int rc = test_run(argv, NULL, &err);
        CHECK(rc == 0, "could not stop PostgreSQL: %s", err ? err : "");
        free(err);
        test_sleep_ms(2000);
        bool up = false;
        for (int attempt = 0; attempt < 5 && !(up = lib("pg_test_start", pg_data, pg_port, pg_log, pg_secrets, NULL) == 0); attempt++)
                test_sleep_ms(1000);
        CHECK(up, "PostgreSQL did not start again");
        fprintf(stderr, "chaos: PostgreSQL restarted (immediate stop, down %" PRId64 " ms)\n",
                (time_boot_ns() - t0) / NS_PER_MS);
}

/* ---- daemons ---- */

static pid_t spawn(const char *name, int n, char *const argv[])
{
        char log[700];
        snprintf(log, sizeof(log), "%s/%s.%d.log", P.state_dir, name, n);
        return test_spawn(argv, NULL, log);
}

static void broker_ctl(const char *cmd)
{
        char *argv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--control-socket", broker_sock, "ctl", (char *)cmd,
                         NULL };
        char *err = NULL;
        int rc = test_run(argv, NULL, &err);
        CHECK(rc == 0, "broker ctl %s: %s", cmd, err ? err : "");
        free(err);
}

static void vmm_start(void)
{
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", P.state_dir, "--kafka-brokers", P.brokers,
                         "--cgroup-parent", P.cgroup_parent, "--backend", "process", "--limits-database-url",
                         P.db_url, NULL };
        unlink(P.sock);
        P.vmm = spawn("vmm", vmms++, argv);
        /* Its API answers once the socket is back (control readiness needs the broker). */
        for (int i = 0; i < 400; i++) {
                if (access(P.sock, F_OK) == 0) {
                        int rc = -1;
                        json_decref(test_vmm_cli(P.sock, &rc, NULL, "status", NULL));
                        if (rc == 0)
                                return;
                }
                test_sleep_ms(50);
        }
        fprintf(stderr, "FAIL: tally-vmm did not answer within 20 s of its start\n");
        exit(1);
}

/* tally-api on a port of its own choosing, learnt from its log. */
static void api_start(void)
{
        char log[700];
        snprintf(log, sizeof(log), "%s/api.%d.log", P.state_dir, apis);
        char *argv[] = { (char *)test_env("TALLY_API_BIN"), "--database-url", P.db_url, "--port", "0",
                         "--vmm-sockets", P.sock, "--cookie-secure=false", NULL };
        api_pid = spawn("api", apis++, argv);
        if ((api_port = test_log_port(log, "msg=\"listening\"", 20000)) < 0) {
                fprintf(stderr, "FAIL: tally-api did not listen within 20 s of its start (log %s)\n", log);
                exit(1);
        }
}

/* Retries fast: a delivery a kill left pending is sent again within seconds. */
static void notifier_start(void)
{
        char *argv[] = { (char *)test_env("TALLY_NOTIFIER_BIN"), "--database-url", P.db_url, "--allow-http",
                         "127.0.0.1", "--retry-base-ms", "200", "--retry-max-ms", "2000", "--timeout-ms", "15000",
                         "--log-level", "debug", NULL };
        notifier_pid = spawn("notifier", notifiers++, argv);
}

static void aggregator_start(void)
{
        char *argv[] = { (char *)test_env("TALLY_AGGREGATOR_BIN"), "--database-url", P.db_url, "--kafka-brokers",
                         P.brokers, "--batch-ms", "100", NULL };
        P.aggregator = spawn("aggregator", aggregators++, argv);
}

static void kill9(pid_t *pid)
{
        if (*pid > 0) {
                kill(*pid, SIGKILL);
                waitpid(*pid, NULL, 0);
        }
        *pid = -1;
}

enum { D_COLLECTOR, D_AGGREGATOR, D_VMM, D_API, D_NOTIFIER, D_COUNT };
static const char *const daemon_names[D_COUNT] = { "collector", "aggregator", "vmm", "api", "notifier" };

/* The aggregator's committed position in the usage topic, -1 if unknown. */
static PGconn *watch;
static int64_t committed(void)
{
        int64_t v = -1;
        for (int attempt = 0; attempt < 2 && v < 0; attempt++) {
                /* A connection PostgreSQL's restart broke shows only when used. */
                if (!watch || PQstatus(watch) != CONNECTION_OK || attempt > 0) {
                        PQfinish(watch);
                        watch = PQconnectdb(P.db_url);
                }
                PGresult *r = PQexec(watch, "SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets"
                                            " WHERE group_id = 'tally-aggregator' AND topic = 'usage'");
                if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
                        v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
                PQclear(r);
        }
        return v;
}

/* Waits (up to timeout_s) for the aggregator's committed position to move,
 * so the kill that follows lands right after a commit: harmless when the
 * offsets and the ledger rows commit together, a loss when they do not. */
static bool wait_commit(int timeout_s)
{
        int64_t before = committed(), t0 = time_boot_ns(), deadline = t0 + timeout_s * NS_PER_SEC;
        while (before >= 0 && time_boot_ns() < deadline) {
                int64_t now = committed();
                if (now != before) {
                        fprintf(stderr, "chaos: the aggregator committed %" PRId64 " -> %" PRId64 " after %" PRId64
                                " ms\n", before, now, (time_boot_ns() - t0) / NS_PER_MS);
                        return true;
                }
                usleep(500);
        }
        return false;
}

static void note_vmm_kill(void);

/* Whether the running aggregator holds its partitions yet (a new member waits
 * for the killed one's session to time out, ~10 s): killing it before then
 * would keep the ledger from moving at all. */
static bool aggregator_working(void)
{
        char path[700];
        snprintf(path, sizeof(path), "%s/aggregator.%d.log", P.state_dir, aggregators - 1);
        char *l = test_read_file(path);
        bool yes = l && strstr(l, "partition assigned");
        free(l);
        return yes;
}

static void kill_one(int which)
{
        static const int not_aggregator[] = { D_COLLECTOR, D_VMM, D_API, D_NOTIFIER };
        if (which == D_AGGREGATOR && !aggregator_working())
                which = not_aggregator[rnd_in(0, 3)];
        pid_t *pids[D_COUNT] = { &P.collector, &P.aggregator, &P.vmm, &api_pid, &notifier_pid };
        if (which == D_AGGREGATOR && rnd_in(0, 1))
                wait_commit(3);
        kill9(pids[which]);
        kills++;
        if (which == D_VMM)
                note_vmm_kill();
        fprintf(stderr, "chaos: kill -9 %s (%d)\n", daemon_names[which], kills);
        kills_by[which]++;
        if (which != D_VMM)
                test_sleep_ms(rnd_in(0, 1000)); /* down a while; the vmm's API is needed at once */
        switch (which) {
        case D_COLLECTOR: pipe_collector_start(&P); break;
        case D_AGGREGATOR: aggregator_start(); break;
        case D_VMM: vmm_start(); break;
        case D_API: api_start(); break;
        default: notifier_start(); break;
        }
}

/* ---- tally-api over TCP, as a key or a person ---- */

struct resp {
        long status;
        char *body;
        json_t *json;
        char cookie[256];
};

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
        FILE *f = ud;
        return fwrite(p, 1, size * n, f);
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
        struct resp *r = ud;
        size_t len = size * n;
        if (len > 12 && strncasecmp(p, "Set-Cookie: ", 12) == 0)
                snprintf(r->cookie, sizeof(r->cookie), "%.*s", (int)(len - 12 < 255 ? len - 12 : 255), p + 12);
        return len;
}

/* One request, one try, on a connection of its own: what a client sees. */
static struct resp http(const char *method, const char *path, const char *key, const char *cookie, const char *csrf,
                        const char *body)
{
        struct resp r = { 0 };
        size_t len = 0;
        FILE *f = open_memstream(&r.body, &len);
        CURL *c = curl_easy_init();
        char url[1024], h[3][512];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", api_port, path);
        struct curl_slist *hs = curl_slist_append(NULL, "Content-Type: application/json");
        snprintf(h[0], sizeof(h[0]), "Authorization: Bearer %s", key ? key : "");
        snprintf(h[1], sizeof(h[1]), "Cookie: tally_session=%s", cookie ? cookie : "");
        snprintf(h[2], sizeof(h[2]), "X-CSRF-Token: %s", csrf ? csrf : "");
        if (key)
                hs = curl_slist_append(hs, h[0]);
        if (cookie)
                hs = curl_slist_append(hs, h[1]);
        if (csrf)
                hs = curl_slist_append(hs, h[2]);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, f);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
        if (body)
                curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        if (curl_easy_perform(c) == CURLE_OK)
                curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
        curl_slist_free_all(hs);
        curl_easy_cleanup(c);
        fclose(f);
        r.json = json_loads(r.body, 0, NULL);
        return r;
}

static void resp_free(struct resp *r)
{
        free(r->body);
        json_decref(r->json);
}

/* GET /v1/spend as the key, one try: its spend today, -1 when not 200. */
static int spend_reads, spend_ok;
static int64_t spend_read(long *ret_status)
{
        struct resp r = http("GET", "/v1/spend", KEY, NULL, NULL, NULL);
        int64_t spend = -1;
        size_t i;
        json_t *row;
        json_array_foreach(r.json ? json_object_get(r.json, "data") : NULL, i, row) {
                if (strcmp(test_jstr(row, "key"), KEY) == 0)
                        spend = (int64_t)json_integer_value(json_object_get(row, "spend_nanodollars"));
        }
        spend_reads++;
        spend_ok += r.status == 200;
        CHECK(r.status == 200 && spend >= 0, "GET /v1/spend (read %d): HTTP %ld %s", spend_reads, r.status,
              r.body ? r.body : "");
        *ret_status = r.status;
        resp_free(&r);
        return r.status == 200 ? spend : -1;
}

/* ---- the webhook receiver: records each request's Tally-Event-Id, answers 200 ---- */

#define HOOK_MAX 1024
static int hook_fd = -1, hook_port;
static pthread_t hook_thread;
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hook_cond = PTHREAD_COND_INITIALIZER;
static char hook_ids[HOOK_MAX][80];
static int hook_n, hook_unnamed;
/* The first request is held (up to 10 s, unanswered) until the test has
 * kill -9ed the notifier that sent it: its delivery stays pending and the
 * next notifier must send the same event id again. */
static bool hook_held, hook_holding, hook_released;
static char held_killed[80]; /* the held event's id, once its sender was killed */

static void hook_one(int c)
{
        struct timeval tv = { 5, 0 };
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        char buf[16384];
        size_t len = 0;
        char *end = NULL;
        bool continued = false;
        for (;;) {
                if (!end && (end = memmem(buf, len, "\r\n\r\n", 4))) {
                        *end = '\0'; /* the headers, as a string */
                        if (strcasestr(buf, "\r\nExpect: 100-continue") && !continued) {
                                continued = true;
                                (void)!send(c, "HTTP/1.1 100 Continue\r\n\r\n", 25, MSG_NOSIGNAL);
                        }
                }
                if (end) {
                        const char *cl = strcasestr(buf, "\r\nContent-Length:");
                        size_t want = (size_t)(end - buf) + 4 + (cl ? strtoul(cl + 17, NULL, 10) : 0);
                        if (len >= want)
                                break;
                }
                if (len == sizeof(buf) - 1)
                        return;
                ssize_t n = read(c, buf + len, sizeof(buf) - 1 - len);
                if (n <= 0)
                        return; /* the sender went (a kill): it sends again */
                len += (size_t)n;
                buf[len] = '\0';
        }
        char id[80] = "";
        const char *h = strcasestr(buf, "\r\nTally-Event-Id:");
        if (h)
                sscanf(h + 17, " %79[^\r\n ]", id);
        pthread_mutex_lock(&hook_lock);
        if (!id[0])
                hook_unnamed++;
        else if (hook_n < HOOK_MAX)
                snprintf(hook_ids[hook_n++], sizeof(hook_ids[0]), "%s", id);
        if (!hook_held) {
                hook_held = hook_holding = true;
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_sec += 10;
                while (!hook_released && pthread_cond_timedwait(&hook_cond, &hook_lock, &until) == 0)
                        ;
                hook_holding = false;
        }
        pthread_mutex_unlock(&hook_lock);
        /* MSG_NOSIGNAL: the sender may be dead (a kill), and SIGPIPE would end the test */
        static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        (void)!send(c, ok, sizeof(ok) - 1, MSG_NOSIGNAL);
}

static void *hook_serve(void *arg)
{
        (void)arg;
        for (;;) {
                int c = accept4(hook_fd, NULL, NULL, SOCK_CLOEXEC);
                if (c < 0) {
                        if (errno == EINTR || errno == ECONNABORTED)
                                continue;
                        return NULL; /* shut down */
                }
                hook_one(c);
                close(c);
        }
}

static void hook_start(void)
{
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t alen = sizeof(a);
        hook_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (hook_fd < 0 || bind(hook_fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(hook_fd, 128) < 0 ||
            getsockname(hook_fd, (struct sockaddr *)&a, &alen) < 0 ||
            pthread_create(&hook_thread, NULL, hook_serve, NULL) != 0) {
                fprintf(stderr, "FAIL: the webhook receiver did not start: %s\n", strerror(errno));
                exit(1);
        }
        hook_port = ntohs(a.sin_port);
}

/* While the receiver holds the first alert's request: kill -9 the notifier
 * that sent it, let the receiver go, start another. */
static void hold_kill(void)
{
        pthread_mutex_lock(&hook_lock);
        bool now = hook_holding && !hook_released;
        char id[80];
        snprintf(id, sizeof(id), "%s", hook_n ? hook_ids[hook_n - 1] : "");
        pthread_mutex_unlock(&hook_lock);
        if (!now)
                return;
        kill9(&notifier_pid);
        kills++;
        kills_by[D_NOTIFIER]++;
        snprintf(held_killed, sizeof(held_killed), "%s", id);
        fprintf(stderr, "chaos: kill -9 notifier while the receiver holds event %s unanswered (%d)\n", id, kills);
        pthread_mutex_lock(&hook_lock);
        hook_released = true;
        pthread_cond_signal(&hook_cond);
        pthread_mutex_unlock(&hook_lock);
        notifier_start();
}

static void hook_stop(void)
{
        if (hook_fd < 0)
                return;
        pthread_mutex_lock(&hook_lock);
        hook_released = true;
        pthread_cond_signal(&hook_cond);
        pthread_mutex_unlock(&hook_lock);
        shutdown(hook_fd, SHUT_RDWR);
        pthread_join(hook_thread, NULL);
        close(hook_fd);
        hook_fd = -1;
}

/* A person of the account signs in and makes the receiver the account's one
 * alert destination, through tally-api as the dashboard would. */
static void destination_create(void)
{
        char pw[700];
        snprintf(pw, sizeof(pw), "%s/password", P.dir);
        FILE *f = fopen(pw, "w");
        if (!f || fputs("a long enough password\n", f) < 0 || fclose(f) != 0) {
                fprintf(stderr, "FAIL: could not write %s\n", pw);
                exit(1);
        }
        char *admin[] = { (char *)test_env("TALLY_ADMIN_BIN"), "--database-url", P.db_url, "person", "create",
                          "--account", "acct_pipe", "--email", "owner@chaos.example", "--password-file", pw, NULL };
        char *err = NULL;
        int rc = test_run(admin, NULL, &err);
        if (rc != 0) {
                fprintf(stderr, "FAIL: tally-admin person create: exit %d: %s\n", rc, err ? err : "");
                exit(1);
        }
        free(err);
        struct resp r = http("POST", "/v1/sessions", NULL, NULL, NULL,
                             "{\"email\":\"owner@chaos.example\",\"password\":\"a long enough password\"}");
        char token[128] = "", csrf[128] = "", body[200];
        sscanf(r.cookie, "tally_session=%127[^;]", token);
        snprintf(csrf, sizeof(csrf), "%s", test_jstr(r.json, "csrf_token"));
        long st = r.status;
        resp_free(&r);
        if (st != 201 || !token[0] || !csrf[0]) {
                fprintf(stderr, "FAIL: the person's sign-in: HTTP %ld\n", st);
                exit(1);
        }
        snprintf(body, sizeof(body), "{\"kind\":\"webhook\",\"url\":\"http://127.0.0.1:%d/chaos\"}", hook_port);
        r = http("POST", "/v1/alert-destinations", NULL, token, csrf, body);
        st = r.status;
        if (st != 201)
                fprintf(stderr, "FAIL: POST /v1/alert-destinations: HTTP %ld %s\n", st, r.body ? r.body : "");
        resp_free(&r);
        if (st != 201)
                exit(1);
}

/* ---- sandboxes and what the test saw of them ---- */

struct csb {
        struct sb s;
        bool live, paused;
        struct call last;          /* the last moment its state changed (create, fork, pause, resume) */
        int64_t run_lo, run_hi;    /* time running: at least, at most */
        int64_t pause_lo, pause_hi;
        int64_t disk;              /* bytes its disk uses, read when it was last paused */
        bool forked;               /* a fork's copy (else created) */
        int vmm_restarts;          /* the vmm kills it lived through */
        /* Storage held while paused, byte-ns: the memory size plus the disk
         * bytes used (docs/events.md), times each paused time's bounds. */
        __int128 storage_lo, storage_hi;
};
static struct csb sbs[MAX_SB];
static int nsb;

static void note_vmm_kill(void)
{
        for (int i = 0; i < nsb; i++)
                sbs[i].vmm_restarts += sbs[i].live;
}

/* The state it was in since c0 ends at c1. */
static void close_interval(struct csb *x, const struct call *c1)
{
        int64_t lo = c1->start - x->last.end, hi = c1->end - x->last.start;
        if (x->paused) {
                x->pause_lo += lo;
                x->pause_hi += hi;
                x->storage_lo += (__int128)(MEM_BYTES + (uint64_t)x->disk) * lo;
                x->storage_hi += (__int128)(MEM_BYTES + (uint64_t)x->disk) * hi;
        } else {
                x->run_lo += lo;
                x->run_hi += hi;
        }
        x->last = *c1;
}

static int live_count(bool running_only)
{
        int n = 0;
        for (int i = 0; i < nsb; i++)
                n += sbs[i].live && (!running_only || !sbs[i].paused);
        return n;
}

static struct csb *pick(bool running_only)
{
        int n = live_count(running_only);
        if (n == 0)
                return NULL;
        int k = rnd_in(0, n - 1);
        for (int i = 0; i < nsb; i++)
                if (sbs[i].live && (!running_only || !sbs[i].paused) && k-- == 0)
                        return &sbs[i];
        return NULL;
}

/* Bursts of a shell loop, then a rest: a few % of a CPU each. */
static const char create_body[] =
        "{\"account\": \"acct_pipe\", \"key\": \"key_chaos\", \"vcpus\": 1, \"memory_mib\": 128, \"timeout_s\": 3600,"
        " \"command\": [\"sh\", \"-c\", \"while :; do i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done; sleep 0.7; done\"]}";

static void create_one(void)
{
        if (nsb >= MAX_SB)
                return;
        struct csb *x = &sbs[nsb];
        memset(x, 0, sizeof(*x));
        if (pipe_create(&P, &x->s, create_body) < 0 || pipe_hold(&x->s) < 0)
                return;
        x->live = true;
        x->last = x->s.create;
        nsb++;
}

static void fork_one(struct csb *src)
{
        char path[200];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/fork", src->s.id);
        struct call c;
        json_t *j = pipe_api(&P, "POST", path, "{\"count\": 1}", &c);
        json_t *list = j ? json_object_get(j, "sandboxes") : NULL;
        CHECK(c.status == 201 && json_array_size(list) == 1, "fork of %s: HTTP %ld", src->s.id, c.status);
        for (size_t i = 0; i < json_array_size(list) && nsb < MAX_SB; i++) {
                json_t *o = json_array_get(list, i);
                struct csb *x = &sbs[nsb];
                memset(x, 0, sizeof(*x));
                snprintf(x->s.id, sizeof(x->s.id), "%s", test_jstr(o, "id"));
                snprintf(x->s.cpu_dir, sizeof(x->s.cpu_dir), "%s", test_jstr(o, "cgroup_cpu"));
                CHECK(x->s.id[0] && x->s.cpu_dir[0], "a fork's copy without id or cgroup");
                if (!x->s.id[0] || !x->s.cpu_dir[0] || pipe_hold(&x->s) < 0)
                        continue;
                x->s.create = c;
                x->last = c;
                x->forked = true;
                x->live = true;
                nsb++;
        }
        json_decref(j);
}

static void toggle(struct csb *x)
{
        struct call c;
        if (pipe_action(&P, &x->s, x->paused ? "resume" : "pause", &c) < 0)
                return;
        close_interval(x, &c);
        x->paused = !x->paused;
        /* A frozen sandbox's disk does not change until it runs again. */
        if (x->paused && (x->disk = pipe_disk_bytes(&P, x->s.id)) < 0)
                x->disk = 0;
}

static int procs_in(const char *dir)
{
        char path[700];
        snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
        char *v = test_read_file(path);
        if (!v)
                return -1;
        int n = *v != '\0';
        for (char *q = v; *q; q++)
                n += *q == '\n';
        free(v);
        return n;
}

/* Stops x (timed), then reads the truth: once its cgroup has no process, its
 * CPU counter, when two readings 100 ms apart agree (a task that just left
 * may be charged its last slice a moment later on a loaded host). */
static void stop_one(struct csb *x)
{
        struct sb *s = &x->s;
        if (pipe_action(&P, s, "stop", &s->stop) == 0) {
                close_interval(x, &s->stop);
                x->live = false;
        }
        int left = -1;
        for (int i = 0; i < 500 && (left = procs_in(s->cpu_dir)) != 0; i++)
                test_sleep_ms(10);
        CHECK(left == 0, "sandbox %s: %d process(es) still in its cgroup 5 s after stop", s->id, left);
        int64_t a = pipe_cgroup_cpu_ns(s->cpu_dir), b = -1;
        for (int i = 0; i < 30; i++) {
                test_sleep_ms(100);
                b = pipe_cgroup_cpu_ns(s->cpu_dir);
                if (a >= 0 && a == b)
                        break;
                a = b;
        }
        CHECK(a >= 0 && a == b, "sandbox %s: the CPU counter of a cgroup without processes did not settle in 3 s",
              s->id);
        s->truth_cpu_ns = (uint64_t)(b >= 0 ? b : 0);
        s->have_truth = left == 0 && a >= 0 && a == b;
        CHECK(rmdir(s->hold) == 0, "could not remove %s: %s", s->hold, strerror(errno));
}

/* ---- what tally-api and the notifier say at the end ---- */

static long after_restart_status = -1;

/* A non-negative decimal string as an exact integer in units of 10^-scale
 * ("83.333333333" with scale 9: 83333333333); digits past scale are cut. */
static unsigned __int128 dec_parse(const char *s, int scale)
{
        unsigned __int128 v = 0;
        int frac = -1;
        for (; *s; s++) {
                if (*s == '.') {
                        frac = 0;
                        continue;
                }
                if (*s < '0' || *s > '9' || (frac >= 0 && frac == scale))
                        break;
                v = v * 10 + (unsigned)(*s - '0');
                if (frac >= 0)
                        frac++;
        }
        for (int i = frac < 0 ? 0 : frac; i < scale; i++)
                v *= 10;
        return v;
}

static const char *u128_str(unsigned __int128 v, char out[48])
{
        char tmp[48];
        int n = 0;
        do
                tmp[n++] = (char)('0' + (int)(v % 10));
        while ((v /= 10) && n < 47);
        for (int i = 0; i < n; i++)
                out[i] = tmp[n - 1 - i];
        out[n] = '\0';
        return out;
}

/* One sandbox's usage as tally-api shows it: exact base units summed over its rows. */
struct api_usage {
        unsigned __int128 cpu, mem; /* cpu-ns, byte-ns */
        int rows_bad;
};

/* GET /v1/usage?group_by=sandbox as the key, every page, from a day before
 * the run to the hour after now; into usage[i] for sbs[i]. Each row's
 * quantity must be its quantity_base in the billing unit, rounded half up
 * to 9 decimals: vCPU-hour (3.6e12 ns), GiB-hour (2^30 x 3.6e12 byte-ns). */
static void usage_read(struct api_usage *usage)
{
        memset(usage, 0, sizeof(*usage) * MAX_SB);
        time_t now = time(NULL), from_t = (now / 3600 - 24) * 3600, to_t = (now / 3600 + 1) * 3600;
        char from[32], to[32], cursor[512] = "";
        strftime(from, sizeof(from), "%Y-%m-%dT%H:00:00Z", gmtime(&from_t));
        strftime(to, sizeof(to), "%Y-%m-%dT%H:00:00Z", gmtime(&to_t));
        int pages = 0;
        do {
                char path[1200];
                char *esc = curl_easy_escape(NULL, cursor, 0);
                snprintf(path, sizeof(path),
                         "/v1/usage?from=%s&to=%s&granularity=month&group_by=sandbox&limit=1000%s%s", from, to, cursor[0] ? "&cursor=" : "", cursor[0] ? esc : "");
                curl_free(esc);
                struct resp r = http("GET", path, KEY, NULL, NULL, NULL);
                CHECK(r.status == 200, "GET %s: HTTP %ld %s", path, r.status, r.body ? r.body : "");
                size_t i;
                json_t *row;
                json_array_foreach(r.json ? json_object_get(r.json, "data") : NULL, i, row) {
                        const char *id = test_jstr(json_object_get(row, "group"), "sandbox");
                        const char *meter = test_jstr(row, "meter");
                        unsigned __int128 base = dec_parse(test_jstr(row, "quantity_base"), 0);
                        unsigned __int128 q = dec_parse(test_jstr(row, "quantity"), 9);
                        for (int k = 0; k < nsb; k++) {
                                if (strcmp(sbs[k].s.id, id) != 0)
                                        continue;
                                unsigned __int128 unit = (unsigned __int128)3600000000000;
                                if (strcmp(meter, "cpu") == 0) {
                                        usage[k].cpu += base;
                                } else if (strcmp(meter, "memory") == 0) {
                                        usage[k].mem += base;
                                        unit *= (unsigned __int128)1 << 30;
                                } else {
                                        break;
                                }
                                /* base / unit to 9 decimals, half up: (2 x base x 10^9 + unit) / (2 x unit) */
                                unsigned __int128 want = (2 * base * 1000000000 + unit) / (2 * unit);
                                if (q != want) {
                                        usage[k].rows_bad++;
                                        fprintf(stderr, "chaos: %s %s quantity %s, quantity_base %s\n", id, meter,
                                                test_jstr(row, "quantity"), test_jstr(row, "quantity_base"));
                                }
                        }
                }
                snprintf(cursor, sizeof(cursor), "%s", r.json ? test_jstr(r.json, "next_cursor") : "");
                resp_free(&r);
        } while (cursor[0] && ++pages < 50);
}

/* Every alert of the key delivered, and the receiver got exactly their event
 * ids: each at least once (a notifier killed between its send and its commit
 * sends the same id again), none it should not have. */
static void alerts_check(void)
{
        char *left = NULL;
        for (int i = 0; i < 300; i++) {
                free(left);
                left = pipe_query(&P, "SELECT count(*) FROM alert_deliveries WHERE state <> 'delivered'");
                if (left && strcmp(left, "0") == 0)
                        break;
                test_sleep_ms(100);
                hold_kill();
        }
        CHECK(left && strcmp(left, "0") == 0, "%s alert deliveries not delivered 30 s after the run",
              left ? left : "?");
        free(left);
        char *undelivered = pipe_query(&P, "SELECT count(*) FROM alerts a WHERE key_id = '" KEY "' AND (delivered_at"
                                           " IS NULL OR NOT EXISTS (SELECT 1 FROM alert_deliveries d WHERE d.alert_id"
                                           " = a.id AND d.state = 'delivered'))");
        CHECK(undelivered && strcmp(undelivered, "0") == 0, "%s alert(s) of the key not delivered",
              undelivered ? undelivered : "?");
        free(undelivered);
        char *dup = pipe_query(&P, "SELECT count(*) FROM (SELECT 1 FROM alerts WHERE key_id = '" KEY "'"
                                   " GROUP BY key_id, day, type, threshold_pct HAVING count(*) > 1) x");
        CHECK(dup && strcmp(dup, "0") == 0, "%s (key, day, threshold) with more than one alert", dup ? dup : "?");
        free(dup);

        char *ids = pipe_query(&P, "SELECT string_agg(event_id::text || ' ' || type || ' ' || threshold_pct, ','"
                                   " ORDER BY id) FROM alerts WHERE key_id = '" KEY "'");
        char *all = pipe_query(&P, "SELECT count(*) FROM alerts");
        int nalerts = 0, missing = 0, got_total = 0;
        pthread_mutex_lock(&hook_lock);
        int n = hook_n, unnamed = hook_unnamed;
        pthread_mutex_unlock(&hook_lock);
        /* each alert's id: how many requests carried it */
        for (char *tok = ids ? strtok(ids, ",") : NULL; tok; tok = strtok(NULL, ",")) {
                char id[80] = "", type[64] = "";
                int pct = -1;
                sscanf(tok, "%79s %63s %d", id, type, &pct);
                int times = 0;
                for (int i = 0; i < n; i++)
                        times += strcmp(hook_ids[i], id) == 0;
                fprintf(stderr, "chaos: alert %s %d%%: event %s, received %d time(s)\n", type, pct, id, times);
                CHECK(times >= 1, "the receiver never got event %s (%s %d%%)", id, type, pct);
                CHECK(strcmp(id, held_killed) != 0 || times >= 2,
                      "event %s: its sender was killed while the receiver held it, and it came only once", id);
                missing += times == 0;
                got_total += times;
                nalerts++;
        }
        /* every request the receiver got was one of them */
        CHECK(got_total == n && unnamed == 0, "the receiver got %d request(s), %d of them with an alert's event id"
              " and %d without an event id", n, got_total, unnamed);
        CHECK(all && atoi(all) == nalerts, "%s alerts in the ledger, %d of the key", all ? all : "?", nalerts);
        fprintf(stderr, "chaos: %d alerts of the key, the receiver got %d request(s) (%d again), %d missing\n",
                nalerts, n, got_total - (nalerts - missing), missing);
        free(ids);
        free(all);
}

/* ---- the run ---- */

static void setup(void)
{
        memset(&P, 0, sizeof(P));
        P.tick_ms = TICK_MS;
        P.dir = test_tmpdir("chaos");
        chmod(P.dir, 0755); /* PostgreSQL's user reaches its data folder under it */
        snprintf(lib_sh, sizeof(lib_sh), "%s", test_env("TALLY_LIB_SH"));
        snprintf(pg_data, sizeof(pg_data), "%s/pg/data", P.dir);
        snprintf(pg_log, sizeof(pg_log), "%s/postgresql.log", P.dir);
        snprintf(pg_secrets, sizeof(pg_secrets), "%s/pg-secrets", P.dir);
        pg_start_private();
        snprintf(P.state_dir, sizeof(P.state_dir), "%s/state", P.dir);
        snprintf(P.sock, sizeof(P.sock), "%s/vmm.sock", P.state_dir);
        snprintf(P.cgroup_parent, sizeof(P.cgroup_parent), "tally-test-chaos-%d", (int)getpid());
        mkdir(P.state_dir, 0755);
        P.db_url = test_db_create("chaos");
        char *migrate[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", P.db_url, NULL };
        char *err = NULL;
        if (test_run(migrate, NULL, &err) != 0) {
                fprintf(stderr, "FAIL: tally-migrate: %s\n", err);
                exit(1);
        }
        free(err);
        char sql[400];
        snprintf(sql, sizeof(sql),
                 "INSERT INTO accounts (id, name) VALUES ('acct_pipe', 'chaos');"
                 "INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars, limit_policy)"
                 " VALUES ('" KEY "', 'acct_pipe', sha256('" KEY "'), %" PRId64 ", 'alert_only')", limit_nd);
        pipe_exec_sql(&P, sql);

        snprintf(broker_sock, sizeof(broker_sock), "%s/broker.sock", P.dir);
        snprintf(broker_file, sizeof(broker_file), "%s/broker.bootstrap", P.dir);
        char *b[] = { (char *)test_env("TALLY_BROKER_BIN"), "--port", "0", "--partitions", "2", "--bootstrap-file",
                      broker_file, "--control-socket", broker_sock, NULL };
        broker = spawn("broker", 0, b);
        if (test_wait_file(broker_file, 10000) < 0) {
                fprintf(stderr, "FAIL: the development broker did not start\n");
                exit(1);
        }
        char *bs = test_read_file(broker_file);
        snprintf(P.brokers, sizeof(P.brokers), "%s", bs ? bs : "");
        free(bs);

        vmm_start();
        pipe_collector_start(&P);
        aggregator_start();
        hook_start();
        api_start();
        destination_create();
        notifier_start();
        /* A healthy start: the aggregator holds its partitions before any fault. */
        char agglog[700];
        snprintf(agglog, sizeof(agglog), "%s/aggregator.0.log", P.state_dir);
        bool assigned = false;
        for (int i = 0; i < 300 && !assigned; i++) {
                char *l = test_read_file(agglog);
                assigned = l && strstr(l, "partition assigned");
                free(l);
                if (!assigned)
                        test_sleep_ms(50);
        }
        if (!assigned) {
                fprintf(stderr, "FAIL: the aggregator was not assigned its partitions within 15 s\n");
                exit(1);
        }
}

static void finish(void)
{
        pipe_daemon_stop(notifier_pid);
        pipe_daemon_stop(api_pid);
        notifier_pid = api_pid = -1;
        hook_stop();
        pipe_daemon_stop(P.aggregator);
        pipe_daemon_stop(P.collector);
        pipe_daemon_stop(P.vmm);
        P.aggregator = P.collector = P.vmm = -1;
        pipe_daemon_stop(broker);
        if (test_failures || getenv("TALLY_CHAOS_LOGS")) {
                char cmd[1400];
                /* On stdout: test_run reads stdout to its end before stderr,
                 * and more than a pipe's 64 KiB on stderr would wait forever. */
                snprintf(cmd, sizeof(cmd), "for f in %s/*.log; do echo \"---- $f\"; tail -c ${TALLY_CHAOS_LOG_TAIL:-2500} \"$f\"; done",
                         P.state_dir);
                char *argv[] = { "/bin/sh", "-c", cmd, NULL }, *tails = NULL;
                test_run(argv, &tails, NULL);
                fprintf(stderr, "%s", tails ? tails : "");
                free(tails);
        }
        test_cgroup_remove(P.cgroup_parent, 0);
        test_db_drop(P.db_url);
        char *argv[] = { "/bin/bash", "-c", "source \"$0\"; pg_stop \"$1\"", lib_sh, pg_data, NULL };
        test_run(argv, NULL, NULL);
}

int main(void)
{
        const char *s = getenv("TALLY_CHAOS_SEED"), *k = getenv("TALLY_CHAOS_KILLS");
        uint64_t seed = s && *s ? strtoull(s, NULL, 0) : ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
        int target = k && *k ? atoi(k) : 24;
        limit_nd = (int64_t)(target > 2 ? target : 2) * LIMIT_ND_PER_KILL;
        rng = seed ? seed : 1;
        fprintf(stderr, "chaos: seed %" PRIu64 " (replay: TALLY_CHAOS_SEED=%" PRIu64 "), %d kills, the key's limit %"
                PRId64 " nano-dollars\n", seed, seed, target, limit_nd);
        curl_global_init(CURL_GLOBAL_DEFAULT);
        setup();
        for (int i = 0; i < 4; i++)
                create_one();

        int64_t t0 = time_boot_ns(), broker_up_at = 0;
        bool broker_up = true;
        while (kills < target || !broker_up || !broker_down_done || !pg_restart_done) {
                if (test_failures)
                        break;
                test_sleep_ms(rnd_in(150, 700));
                if (!broker_up && time_boot_ns() >= broker_up_at) {
                        broker_ctl("up");
                        broker_up = true;
                        fprintf(stderr, "chaos: broker up again\n");
                }
                hold_kill();
                bool calm = broker_up; /* creates, forks and stops wait for the broker */
                if (!broker_down_done && kills >= target / 3) {
                        broker_ctl("down");
                        broker_up = false;
                        broker_down_done = true;
                        broker_up_at = time_boot_ns() + 30 * NS_PER_SEC;
                        fprintf(stderr, "chaos: broker down for 30 s\n");
                        continue;
                }
                if (!pg_restart_done && broker_up && kills >= 2 * target / 3) {
                        pg_restart();
                        pg_restart_done = true;
                        /* Every connection tally-api pools broke; the client's first try must get 200. */
                        long st;
                        int64_t spend = spend_read(&st);
                        after_restart_status = st;
                        fprintf(stderr, "chaos: GET /v1/spend right after the restart: HTTP %ld, %" PRId64
                                " nano-dollars\n", st, spend);
                        CHECK(st == 200, "GET /v1/spend right after PostgreSQL's restart: HTTP %ld at the first try",
                              st);
                        continue;
                }
                if (rnd_in(0, 4) == 0) {
                        long st;
                        int64_t spend = spend_read(&st);
                        fprintf(stderr, "chaos: GET /v1/spend: HTTP %ld, %" PRId64 " nano-dollars (%d kills)\n", st,
                                spend, kills);
                }
                int roll = rnd_in(0, 99);
                if (roll < 40 && kills < target) {
                        kill_one(rnd_in(0, D_COUNT - 1));
                } else if (roll < 70) {
                        struct csb *x = pick(false);
                        if (x)
                                toggle(x);
                } else if (roll < 78 && calm && live_count(false) < LIVE_MAX) {
                        struct csb *x = pick(true);
                        if (x)
                                fork_one(x);
                } else if (roll < 88 && calm) {
                        struct csb *x = pick(false);
                        if (x && live_count(false) > 2) {
                                stop_one(x);
                                if (kills < target && rnd_in(0, 1))
                                        kill_one(1);
                                create_one();
                        }
                } else if (calm && live_count(false) < LIVE_MAX) {
                        create_one();
                }
        }
        fprintf(stderr, "chaos: %d kills (collector %d, aggregator %d, vmm %d, api %d, notifier %d) in %" PRId64
                " s\n", kills, kills_by[0], kills_by[1], kills_by[2], kills_by[3], kills_by[4],
                (time_boot_ns() - t0) / NS_PER_SEC);

        /* The end: every sandbox stopped, its truth read, while the aggregator
         * is down; once their last messages are in the broker, the aggregator
         * starts and is killed right after its first commit (which holds
         * them), and starts again. Then the pipeline drains. */
        fprintf(stderr, "chaos: the aggregator's committed position %" PRId64 "\n", committed());
        kill9(&P.aggregator);
        kills++;
        kills_by[D_AGGREGATOR]++;
        for (int i = 0; i < nsb; i++)
                if (sbs[i].live)
                        stop_one(&sbs[i]);
        for (int i = 0; i < nsb; i++)
                pipe_wait_removed(&P, sbs[i].s.id, 60000);
        aggregator_start();
        CHECK(wait_commit(60), "the aggregator committed nothing within 60 s of its start");
        kill9(&P.aggregator);
        kills++;
        kills_by[D_AGGREGATOR]++;
        aggregator_start();
        fprintf(stderr, "chaos: %d kills in all (collector %d, aggregator %d, vmm %d, api %d, notifier %d)\n", kills,
                kills_by[0], kills_by[1], kills_by[2], kills_by[3], kills_by[4]);
        pipe_wait_caught_up(&P, 90000);
        struct api_usage usage[MAX_SB];
        usage_read(usage);

        int64_t cpu_total = 0, run_lo_total = 0;
        for (int i = 0; i < nsb; i++) {
                struct csb *x = &sbs[i];
                if (!x->s.have_truth) {
                        CHECK(0, "sandbox %s: no truth read", x->s.id);
                        continue;
                }
                /* storage_ns, storage_rem: the byte-ns over 1024 (exact, and no overflow). */
                struct billed b = pipe_billed(&P, x->s.id, MEM_BYTES, 1024);
                __int128 storage = (__int128)b.storage_ns * 1024 + b.storage_rem;
                fprintf(stderr,
                        "chaos: %s (%s, %d vmm restarts) cpu billed %" PRId64 " kernel %" PRIu64 "; running billed %" PRId64 " seen %" PRId64
                        "..%" PRId64 "; paused %" PRId64 "..%" PRId64 " ns, storage billed %" PRId64
                        " KiB-ns seen %" PRId64 "..%" PRId64 "\n",
                        x->s.id, x->forked ? "forked" : "created", x->vmm_restarts, b.cpu_ns, x->s.truth_cpu_ns, b.mem_ns, x->run_lo, x->run_hi, x->pause_lo,
                        x->pause_hi, (int64_t)(storage / 1024), (int64_t)(x->storage_lo / 1024),
                        (int64_t)(x->storage_hi / 1024));
                CHECK(b.found, "sandbox %s: nothing billed", x->s.id);
                CHECK((uint64_t)b.cpu_ns == x->s.truth_cpu_ns,
                      "sandbox %s: CPU billed %" PRId64 " ns, the kernel's counter %" PRIu64 " ns (off by %" PRId64 ")",
                      x->s.id, b.cpu_ns, x->s.truth_cpu_ns, b.cpu_ns - (int64_t)x->s.truth_cpu_ns);
                CHECK(b.mem_rem == 0 && b.mem_ns >= x->run_lo && b.mem_ns <= x->run_hi,
                      "sandbox %s: running billed %" PRId64 " ns (+%" PRId64 "/128 MiB), the test saw %" PRId64
                      "..%" PRId64 " ns", x->s.id, b.mem_ns, b.mem_rem, x->run_lo, x->run_hi);
                CHECK(storage >= x->storage_lo && storage <= x->storage_hi,
                      "sandbox %s: storage billed %" PRId64 " KiB-ns, the test saw %" PRId64 "..%" PRId64
                      " KiB-ns (paused %" PRId64 "..%" PRId64 " ns)", x->s.id, (int64_t)(storage / 1024),
                      (int64_t)(x->storage_lo / 1024), (int64_t)(x->storage_hi / 1024), x->pause_lo, x->pause_hi);
                /* tally-api's view of the same sandbox: the kernel's CPU, the ledger's memory. */
                char sql[300], mem_want[48];
                snprintf(sql, sizeof(sql),
                         "SELECT coalesce(sum(mem_byte_ns), 0) FROM usage_hourly WHERE sandbox_id = '%.80s'", x->s.id);
                char *ledger_mem = pipe_query(&P, sql);
                unsigned __int128 ledger = dec_parse(ledger_mem ? ledger_mem : "", 0);
                free(ledger_mem);
                fprintf(stderr,
                        "chaos: %s via tally-api: cpu %s ns (kernel %" PRIu64 "), memory %s byte-ns (ledger %s)\n",
                        x->s.id, u128_str(usage[i].cpu, (char[48]){ 0 }), x->s.truth_cpu_ns,
                        u128_str(usage[i].mem, (char[48]){ 0 }), u128_str(ledger, mem_want));
                CHECK(usage[i].rows_bad == 0, "sandbox %s: %d row(s) of GET /v1/usage whose quantity is not the "
                      "exact quantity_base in the billing unit rounded to 9 decimals", x->s.id, usage[i].rows_bad);
                CHECK(usage[i].cpu == x->s.truth_cpu_ns,
                      "sandbox %s: GET /v1/usage says %s cpu-ns, the kernel's counter %" PRIu64 " ns", x->s.id,
                      u128_str(usage[i].cpu, (char[48]){ 0 }), x->s.truth_cpu_ns);
                CHECK(usage[i].mem == ledger, "sandbox %s: GET /v1/usage says %s byte-ns of memory, the ledger %s",
                      x->s.id, u128_str(usage[i].mem, (char[48]){ 0 }), mem_want);
                cpu_total += (int64_t)x->s.truth_cpu_ns;
                run_lo_total += x->run_lo;
        }
        /* The spend by hand (default plan, nano-dollars x 3.6e12): CPU 25,000,000
         * per CPU-hour, 128 MiB held 937,500 per hour; storage left out (a floor). */
        __int128 spend = (__int128)cpu_total * 25000000 + (__int128)run_lo_total * 937500;
        CHECK(spend >= (__int128)limit_nd * 3600000000000, "the run spent less than the key's limit");
        char *alerts = pipe_query(&P, "SELECT string_agg(threshold_pct::text, ',' ORDER BY threshold_pct) FROM alerts"
                                      " WHERE key_id = '" KEY "' AND type = 'spend.threshold_reached'");
        fprintf(stderr, "chaos: %d sandboxes, cpu %" PRId64 " ns, alerts %s\n", nsb, cpu_total,
                alerts ? alerts : "none");
        CHECK(alerts && strcmp(alerts, "50,80,100") == 0, "alerts %s, wanted 50,80,100 once each",
              alerts ? alerts : "none");
        free(alerts);
        alerts_check();
        fprintf(stderr, "chaos: %d spend reads through tally-api, %d answered 200 (the first after PostgreSQL's "
                "restart: %ld)\n", spend_reads, spend_ok, after_restart_status);
        fprintf(stderr, "chaos: seed %" PRIu64 "\n", seed);
        PQfinish(watch);
        finish();
        curl_global_cleanup();
        free(P.dir);
        return test_result();
}
