/* Integration: the collector-outage alert fires within its window.
 *
 * Two hosts on this machine, each with its own tally-vmm (process backend),
 * tally-collector, state folder, cgroup parent and host id (host-a,
 * host-b), on one development broker; one tally-aggregator serving /metrics;
 * and a real Prometheus server (Debian's `prometheus`) that scrapes that
 * /metrics and evaluates its rules every second, with the shipped rule file
 * (dist/prometheus/tally.rules.yml, TALLY_PROMETHEUS_RULES) loaded as it is,
 * after `promtool check rules` accepted it. One sandbox runs on each host,
 * sampled by its host's collector.
 *
 * Then host B's collector is SIGKILLed; host A's runs on, and B's vmm goes on
 * creating and stopping a sandbox every few seconds: lifecycle events reach
 * the ledger, and must not count as samples. From B's last sample as the
 * ledger has it (hosts.last_sample_at: the aggregator's clock at the commit),
 * checked, with Prometheus' /api/v1/alerts polled every 250 ms:
 *   - TallyMeteringGap fires;
 *   - it was pending no earlier than metering_gap_threshold() (30 s) after
 *     that sample, and fired no earlier than 45 s (the threshold, then the
 *     rule's `for: 15s`);
 *   - it fired within 60 s (docs/operations.md, "Metrics");
 *   - metering_gaps then lists host-b and not host-a, whose last sample is a
 *     few seconds old.
 * The figures (the view, pending and firing, in seconds after the last
 * sample) are printed with the load average. Every process and cgroup goes
 * at exit, a failed check or a signal included. */
#include "pipe.h"
#include "support.h"
#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS     1000 /* the collectors' production default */
#define THRESHOLD_S 30   /* metering_gap_threshold() (sql/003_store.sql) */
#define FOR_S       15   /* the rule's `for` */
#define WINDOW_S    60   /* docs/operations.md: fires within this of the last sample */
#define GIVE_UP_S   150  /* how long the test waits for it (the old `for: 1m` fired after 95 s) */

#define SANDBOX_BODY                                                                     \
        "{\"account\": \"acct_pipe\", \"key\": \"key_free\", \"vcpus\": 1, \"memory_mib\": 64," \
        " \"command\": [\"sleep\", \"600\"]}"

static struct pipeline A, B;
static pid_t prom;
static char prom_url[64], prom_log[600];
static atomic_bool churn_stop;
static atomic_int churned;

/* The ns of an RFC 3339 time ("2026-05-01T12:34:56.123456789Z", or with an
 * offset), or -1. */
static int64_t rfc3339_ns(const char *s)
{
        struct tm tm = { 0 };
        int n = 0;
        if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                         &tm.tm_sec, &n) != 6)
                return -1;
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        int64_t ns = (int64_t)timegm(&tm) * NS_PER_SEC;
        const char *q = s + n;
        if (*q == '.')
                for (int64_t scale = NS_PER_SEC / 10; *++q >= '0' && *q <= '9'; scale /= 10)
                        ns += (*q - '0') * scale;
        if (*q == 'Z')
                return ns;
        char sign;
        int oh, om;
        if (sscanf(q, "%c%2d:%2d", &sign, &oh, &om) != 3 || (sign != '+' && sign != '-'))
                return -1;
        int64_t off = ((int64_t)oh * 3600 + om * 60) * NS_PER_SEC;
        return sign == '+' ? ns - off : ns + off;
}

/* "12.345 s" for the time from since to t (ns), or "never" when t < 0. */
static const char *secs(char buf[32], int64_t t, int64_t since)
{
        if (t < 0)
                return "never";
        int64_t ms = (t - since) / NS_PER_MS, a = ms < 0 ? -ms : ms;
        snprintf(buf, 32, "%s%" PRId64 ".%03" PRId64 " s", ms < 0 ? "-" : "", a / 1000, a % 1000);
        return buf;
}

/* A Prometheus API answer's `data` (the caller owns it), or NULL. */
static json_t *prom_get(const char *path)
{
        char url[512];
        snprintf(url, sizeof(url), "%s%s", prom_url, path);
        long status = 0;
        char *body = pipe_http_get(url, &status);
        json_t *j = body && status == 200 ? json_loads(body, 0, NULL) : NULL;
        free(body);
        json_t *data = j && strcmp(test_jstr(j, "status"), "success") == 0 ? json_incref(json_object_get(j, "data")) : NULL;
        json_decref(j);
        return data;
}

/* TallyMeteringGap's entry in /api/v1/alerts (the caller owns it), or NULL
 * when it is not active; *ret_ok says whether Prometheus answered. */
static json_t *gap_alert(bool *ret_ok)
{
        json_t *data = prom_get("/api/v1/alerts"), *found = NULL, *a;
        size_t i;
        *ret_ok = data != NULL;
        json_array_foreach(json_object_get(data, "alerts"), i, a)
                if (strcmp(test_jstr(json_object_get(a, "labels"), "alertname"), "TallyMeteringGap") == 0)
                        found = json_incref(a);
        json_decref(data);
        return found;
}

/* The ledger's time (a timestamptz expression of one row) in ns, or -1. */
static int64_t ledger_ns(const char *expr)
{
        char sql[400];
        snprintf(sql, sizeof(sql), "SELECT (extract(epoch FROM %s) * 1000000)::bigint", expr);
        char *v = pipe_query(&A, sql);
        int64_t us = v ? strtoll(v, NULL, 10) : -1;
        free(v);
        return us >= 0 ? us * NS_PER_US : -1;
}

static int64_t ledger_int(const char *sql)
{
        char *v = pipe_query(&A, sql);
        int64_t n = v ? strtoll(v, NULL, 10) : -1;
        free(v);
        return n;
}

/* Host B's vmm, its collector dead, goes on creating and stopping sandboxes. */
static void *churn(void *arg)
{
        (void)arg;
        while (!atomic_load(&churn_stop)) {
                struct sb s;
                if (pipe_create(&B, &s, SANDBOX_BODY) == 0) {
                        test_sleep_ms(1000);
                        pipe_action(&B, &s, "stop", NULL);
                        atomic_fetch_add(&churned, 1);
                }
                for (int i = 0; i < 20 && !atomic_load(&churn_stop); i++)
                        test_sleep_ms(100);
        }
        return NULL;
}

/* The path of program name in $PATH (malloc'd), or NULL: test_run and
 * test_spawn run a path, not a name. */
static char *in_path(const char *name)
{
        const char *path = getenv("PATH");
        char buf[4096];
        snprintf(buf, sizeof(buf), "%s", path && *path ? path : "/usr/bin:/bin");
        char *save = NULL;
        for (char *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
                char full[4200];
                snprintf(full, sizeof(full), "%s/%s", d, name);
                if (access(full, X_OK) == 0)
                        return strdup(full);
        }
        return NULL;
}

static void tail_prometheus(void)
{
        char *l = test_read_file(prom_log);
        if (!l)
                return;
        size_t n = strlen(l);
        fprintf(stderr, "---- prometheus log (tail)\n%s\n", n > 3000 ? l + n - 3000 : l);
        free(l);
}

/* At exit, on a signal, or at the end: every process and cgroup goes. */
static void cleanup(void)
{
        static bool done;
        if (done)
                return;
        done = true;
        atomic_store(&churn_stop, true);
        if (prom > 0) {
                pipe_daemon_stop(prom);
                prom = 0;
                if (test_failures)
                        tail_prometheus();
        }
        pipe_finish(&B);
        pipe_finish(&A);
}

/* Starts Prometheus on a free loopback port, scraping the aggregator's
 * /metrics at metrics_port, with the rule file as it is. */
static void prometheus_start(const char *bin, const char *rules, int metrics_port)
{
        char *dir = test_tmpdir("prometheus");
        char conf[600], data[600], listen[64];
        snprintf(conf, sizeof(conf), "%s/prometheus.yml", dir);
        snprintf(data, sizeof(data), "%s/data", dir);
        snprintf(prom_log, sizeof(prom_log), "%s/prometheus.log", dir);
        FILE *f = fopen(conf, "w");
        if (!f) {
                fprintf(stderr, "FAIL: could not write %s: %s\n", conf, strerror(errno));
                exit(1);
        }
        fprintf(f,
                "global:\n"
                "  scrape_interval: 1s\n"
                "  scrape_timeout: 1s\n"
                "  evaluation_interval: 1s\n"
                "rule_files:\n"
                "  - %s\n"
                "scrape_configs:\n"
                "  - job_name: tally-aggregator\n"
                "    static_configs:\n"
                "      - targets: ['127.0.0.1:%d']\n",
                rules, metrics_port);
        fclose(f);
        int port = test_free_port();
        snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
        snprintf(prom_url, sizeof(prom_url), "http://127.0.0.1:%d", port);
        char a_conf[700], a_data[700], a_listen[100];
        snprintf(a_conf, sizeof(a_conf), "--config.file=%s", conf);
        snprintf(a_data, sizeof(a_data), "--storage.tsdb.path=%s", data);
        snprintf(a_listen, sizeof(a_listen), "--web.listen-address=%s", listen);
        char *argv[] = { (char *)bin, a_conf, a_data, a_listen, NULL };
        prom = test_spawn(argv, NULL, prom_log);
        free(dir);
        bool ready = false;
        for (int i = 0; i < 300 && !ready; i++) {
                char url[128];
                snprintf(url, sizeof(url), "%s/-/ready", prom_url);
                long status = 0;
                char *body = pipe_http_get(url, &status);
                ready = body && status == 200;
                free(body);
                if (!ready)
                        test_sleep_ms(100);
        }
        if (!ready) {
                fprintf(stderr, "FAIL: prometheus was not ready within 30 s\n");
                tail_prometheus();
                exit(1);
        }
}

/* Prometheus has the aggregator's gauge at 0 and has evaluated the rule
 * without error, up to 30 s. */
static bool prometheus_watching(void)
{
        for (int i = 0; i < 120; i++) {
                json_t *q = prom_get("/api/v1/query?query=tally_aggregator_metering_gap_hosts");
                json_t *v = json_array_get(json_object_get(json_array_get(json_object_get(q, "result"), 0), "value"), 1);
                bool scraped = json_is_string(v) && strcmp(json_string_value(v), "0") == 0;
                json_decref(q);
                bool evaluated = false;
                json_t *rules = prom_get("/api/v1/rules"), *g, *r;
                size_t gi, ri;
                json_array_foreach(json_object_get(rules, "groups"), gi, g)
                        json_array_foreach(json_object_get(g, "rules"), ri, r)
                                if (strcmp(test_jstr(r, "name"), "TallyMeteringGap") == 0)
                                        evaluated = strcmp(test_jstr(r, "health"), "ok") == 0;
                json_decref(rules);
                if (scraped && evaluated)
                        return true;
                test_sleep_ms(250);
        }
        return false;
}

int main(void)
{
        test_cleanup_at_exit(cleanup);
        const char *rules = test_env("TALLY_PROMETHEUS_RULES");
        char *prometheus = in_path("prometheus"), *promtool = in_path("promtool");
        if (!prometheus || !promtool) {
                fprintf(stderr, "FAIL: prometheus and promtool are not installed: Debian's `prometheus` package "
                                "(scripts/lib.sh installs it; ./scripts/test does)\n");
                return 1;
        }
        /* The shipped file, as an operator would check it. */
        char *out = NULL, *err = NULL;
        char *check[] = { promtool, "check", "rules", (char *)rules, NULL };
        int rc = test_run(check, &out, &err);
        CHECK(rc == 0, "promtool check rules %s: exit %d: %s%s", rules, rc, out ? out : "", err ? err : "");
        free(out);
        free(err);
        if (rc != 0)
                goto out;

        int metrics_port = test_free_port();
        char mport[16];
        snprintf(mport, sizeof(mport), "%d", metrics_port);
        const char *vmm_extra[] = { "--final-wait-ms", "500", NULL };
        const char *agg_extra[] = { "--metrics-port", mport, NULL };
        struct pipe_options o = { .vmm_extra = vmm_extra, .aggregator_extra = agg_extra, .host_id = "host-a" };
        pipe_start_with(&A, "metering_alert", TICK_MS, &o);
        pipe_add_host(&A, &B, "host-b", vmm_extra);

        struct sb sa, sbb;
        if (pipe_create(&A, &sa, SANDBOX_BODY) < 0 || pipe_create(&B, &sbb, SANDBOX_BODY) < 0)
                goto out;
        /* Both hosts metered: a sample of each committed within the last 3 s,
         * each sandbox running on its own host in the ledger. */
        char sql[600];
        snprintf(sql, sizeof(sql),
                 "SELECT (SELECT count(*) FROM hosts WHERE host IN ('host-a', 'host-b')"
                 "  AND last_sample_at > now() - interval '3 seconds')"
                 " + (SELECT count(*) FROM sandboxes WHERE state = 'running'"
                 "  AND ((id = '%s' AND host = 'host-a') OR (id = '%s' AND host = 'host-b')))",
                 sa.id, sbb.id);
        int64_t metered = 0;
        for (int i = 0; i < 300 && metered != 4; i++) {
                metered = ledger_int(sql);
                if (metered != 4)
                        test_sleep_ms(100);
        }
        CHECK(metered == 4, "host-a and host-b were not both metered within 30 s (%" PRId64 " of 4 facts)", metered);
        if (metered != 4)
                goto out;

        prometheus_start(prometheus, rules, metrics_port);
        CHECK(prometheus_watching(), "prometheus did not scrape the aggregator's gauge at 0 and evaluate"
                                     " TallyMeteringGap within 30 s");
        bool ok;
        json_t *before = gap_alert(&ok);
        CHECK(ok && !before, "TallyMeteringGap is %s before any collector stopped",
              before ? test_jstr(before, "state") : "not known (prometheus did not answer)");
        json_decref(before);
        if (test_failures)
                goto out;

        /* Host B's collector dies; host A's runs on. */
        kill(B.collector, SIGKILL);
        waitpid(B.collector, NULL, 0);
        B.collector = 0;
        int64_t killed = time_wall_ns();
        pthread_t churner;
        bool churning = pthread_create(&churner, NULL, churn, NULL) == 0;
        CHECK(churning, "could not start the thread that drives host-b's vmm");

        int64_t listed = -1, pending = -1, active = -1, firing = -1;
        while (firing < 0 && time_wall_ns() < killed + GIVE_UP_S * NS_PER_SEC) {
                if (listed < 0 && ledger_int("SELECT count(*) FROM metering_gaps WHERE host = 'host-b'") == 1)
                        listed = time_wall_ns();
                json_t *a = gap_alert(&ok);
                int64_t now = time_wall_ns();
                const char *state = a ? test_jstr(a, "state") : "";
                if (strcmp(state, "pending") == 0 || strcmp(state, "firing") == 0) {
                        if (pending < 0)
                                pending = now;
                        active = rfc3339_ns(test_jstr(a, "activeAt"));
                }
                if (strcmp(state, "firing") == 0)
                        firing = now;
                json_decref(a);
                if (firing < 0)
                        test_sleep_ms(250);
        }
        atomic_store(&churn_stop, true);
        if (churning)
                pthread_join(churner, NULL);

        /* B's last sample as the ledger has it: nothing samples B any more. */
        int64_t last = ledger_ns("(SELECT last_sample_at FROM hosts WHERE host = 'host-b')");
        char b1[32], b2[32], b3[32], b4[32], b5[32];
        CHECK(last > 0 && last > killed - 5 * NS_PER_SEC && last < killed + 5 * NS_PER_SEC,
              "host-b's last sample in the ledger is %s from its collector's kill, not within 5 s",
              secs(b1, last, killed));
        char *gaps = pipe_query(&A, "SELECT coalesce(string_agg(host, ',' ORDER BY host), '') FROM metering_gaps");
        CHECK(gaps && strcmp(gaps, "host-b") == 0, "metering_gaps lists \"%s\", want \"host-b\" alone",
              gaps ? gaps : "(no answer)");
        free(gaps);
        CHECK(ledger_int("SELECT count(*) FROM hosts WHERE host = 'host-a'"
                         " AND last_sample_at > now() - interval '5 seconds'") == 1,
              "host-a, whose collector runs on, has no sample committed in the last 5 s");
        CHECK(test_pid_running(A.collector), "host-a's collector is not running");
        int64_t b_sandboxes = ledger_int("SELECT count(*) FROM sandboxes WHERE host = 'host-b'");
        CHECK(atomic_load(&churned) >= 1 && b_sandboxes >= 2,
              "host-b's vmm did not go on talking while its collector was down (%d sandboxes made and stopped,"
              " %" PRId64 " of host-b's in the ledger)", atomic_load(&churned), b_sandboxes);

        int64_t since = last > 0 ? last : killed;
        char *load = test_read_file("/proc/loadavg");
        fprintf(stderr,
                "metering alert: host-b's last sample committed %s after its collector's kill; after it:"
                " in metering_gaps at %s, TallyMeteringGap pending (activeAt) at %s (seen %s),"
                " firing seen at %s (want %d..%d s); host-b's vmm made and stopped %d sandboxes meanwhile;"
                " load average %s\n",
                secs(b1, last, killed), secs(b2, listed, since), secs(b3, active, since), secs(b4, pending, since),
                secs(b5, firing, since), THRESHOLD_S + FOR_S, WINDOW_S, atomic_load(&churned), load ? load : "?");
        free(load);
        CHECK(firing >= 0, "TallyMeteringGap did not fire within %d s of host-b's collector's kill", GIVE_UP_S);
        if (firing >= 0 && last > 0) {
                CHECK(active >= last + THRESHOLD_S * NS_PER_SEC,
                      "TallyMeteringGap was active %s after host-b's last sample, before the %d s threshold",
                      secs(b1, active, last), THRESHOLD_S);
                CHECK(firing >= last + (THRESHOLD_S + FOR_S) * NS_PER_SEC,
                      "TallyMeteringGap fired %s after host-b's last sample, before threshold + for (%d s)",
                      secs(b1, firing, last), THRESHOLD_S + FOR_S);
                CHECK(firing <= last + WINDOW_S * NS_PER_SEC,
                      "TallyMeteringGap fired %s after host-b's last sample, beyond the documented %d s",
                      secs(b1, firing, last), WINDOW_S);
        }
out:
        cleanup();
        free(prometheus);
        free(promtool);
        return test_result();
}
