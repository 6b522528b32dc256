/* Integration: the host registry (issue 30; sql/021, vmm/host_registry.c,
 * api/admin_hosts.c) with two real tally-vmm daemons (process backend, this
 * machine's cgroups, the development broker) beating into a migrated
 * PostgreSQL as tally_vmm, and tally-admin as tally_admin:
 *   - both register: address, capacity and ratios as configured, nothing
 *     promised, ready;
 *   - a create moves the host's promised vCPUs, memory, disk and live count
 *     within a beat or two, and its stop moves them back;
 *   - a host whose tally-vmm is stopped (SIGSTOP) reads `down` once its last
 *     heartbeat is older than host_heartbeat_bound() (15 s): not before 9 s,
 *     within 15 + 5 (a beat) + 10 s of slack; SIGCONT: ready again;
 *   - `tally-admin host drain` makes it draining, audited, and the host's own
 *     heartbeats do not undo it; `host resume` makes it ready; an unknown host
 *     is an error; `host list --json` shows both;
 *   - tally_vmm's role cannot set the state (a real UPDATE refused, 42501),
 *     and a host of another login (a member of tally_vmm) cannot touch or
 *     take over a row another login registered. */
#include "support.h"
#include "vmmtest.h"

#include <errno.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The bound sql/021 sets (host_heartbeat_bound()) and the beat (host_registry.h). */
#define BOUND_S 15
#define BEAT_S  5
/* A loaded 2-core machine: what a deadline may overrun by. */
#define SLACK_S 10

struct host {
        char id[64], parent[64], dir[64];
        char *state, *sock, *log;
        pid_t pid;
        int cgroup_version;
};
static struct host hosts[2];
static char *db_url;

static void cleanup(void)
{
        for (int i = 0; i < 2; i++) {
                struct host *h = &hosts[i];
                if (h->pid > 0)
                        kill(h->pid, SIGCONT);
                test_stop_process(&h->pid, SIGKILL);
                if (*h->parent) {
                        test_cgroup_remove(h->parent, h->cgroup_version);
                        *h->parent = '\0';
                }
                if (*h->dir) {
                        char *l = h->log ? test_read_file(h->log) : NULL;
                        if (l && test_failures)
                                fprintf(stderr, "---- %s's log ----\n%s\n", h->id, l);
                        free(l);
                        test_remove_tree(h->dir);
                        *h->dir = '\0';
                }
        }
        while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
        if (db_url) {
                test_db_drop(db_url);
                db_url = NULL;
        }
}

static void start_host(struct host *h, const char *address)
{
        char *vmm_url = test_role_url(db_url, "tally_vmm");
        char *argv[32] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", h->state, "--socket", h->sock,
                           "--kafka-brokers", (char *)test_env("TALLY_TEST_BROKERS"), "--cgroup-parent", h->parent,
                           "--host-id", h->id, "--backend", "process", "--capacity-vcpus", "4",
                           "--capacity-memory-mib", "4096", "--capacity-disk-mib", "8192",
                           "--host-registry-database-url", vmm_url, "--log-level", "debug", NULL };
        int n = 0;
        while (argv[n])
                n++;
        if (address) {
                argv[n++] = "--host-registry-address";
                argv[n++] = (char *)address;
        }
        h->pid = test_spawn(argv, NULL, h->log);
        free(vmm_url);
        if (test_vmm_wait_ready(h->sock, 20000, &h->cgroup_version) == 0)
                return;
        fprintf(stderr, "FAIL: tally-vmm %s did not become ready in 20 s\n", h->id);
        test_failures++;
        cleanup();
        exit(1);
}

/* The value of sql (one row, one column; $HOST: the host id) or "(none)". */
static char *row(const struct host *h, const char *sql_fmt)
{
        char sql[1024];
        const char *at = strstr(sql_fmt, "$HOST");
        if (at)
                snprintf(sql, sizeof(sql), "%.*s%s%s", (int)(at - sql_fmt), sql_fmt, h->id, at + 5);
        else
                snprintf(sql, sizeof(sql), "%s", sql_fmt);
        char *v = test_db_value(db_url, sql);
        return v ? v : strdup("(none)");
}

/* Polls sql_fmt until it reads want, up to timeout_ms; returns the ms it took, or -1 (the last value in *ret_last). */
static int64_t wait_for(const struct host *h, const char *sql_fmt, const char *want, int timeout_ms, char **ret_last)
{
        int64_t start = test_now_ms();
        char *v = NULL;
        for (;;) {
                free(v);
                v = row(h, sql_fmt);
                if (strcmp(v, want) == 0) {
                        free(v);
                        return test_now_ms() - start;
                }
                if (test_now_ms() - start > timeout_ms)
                        break;
                test_sleep_ms(200);
        }
        if (ret_last)
                *ret_last = v;
        else
                free(v);
        return -1;
}

#define EXPECT_ROW(h, sql_fmt, want, timeout_ms)                                                                 \
        do {                                                                                                   \
                char *last_ = NULL;                                                                            \
                int64_t took_ = wait_for(h, sql_fmt, want, timeout_ms, &last_);                              \
                CHECK(took_ >= 0, "%s: %s reads %s after %d ms, want %s", (h)->id, sql_fmt, last_, timeout_ms, \
                      want);                                                                                   \
                free(last_);                                                                                   \
        } while (0)

static const char FIGURES[] =
        "SELECT concat_ws('/', capacity_vcpus, capacity_memory_mib, capacity_disk_mib, vcpu_overcommit_percent,"
        " memory_overcommit_percent, disk_overcommit_percent, promised_vcpus, promised_memory_mib, promised_disk_mib,"
        " live_sandboxes, effective_state, coalesce(address, '-')) FROM host_states WHERE host_id = '$HOST'";

static void test_register(void)
{
        EXPECT_ROW(&hosts[0], FIGURES, "4/4096/8192/1600/100/100/0/0/0/0/ready/https://127.0.0.1:7443", 15000);
        EXPECT_ROW(&hosts[1], FIGURES, "4/4096/8192/1600/100/100/0/0/0/0/ready/-", 15000);
        char *by = row(&hosts[0], "SELECT registered_by || '/' || state FROM host_registry WHERE host_id = '$HOST'");
        CHECK(strcmp(by, "tally_vmm/ready") == 0, "registered as %s, want tally_vmm/ready", by);
        free(by);
}

static void test_promised(void)
{
        struct host *a = &hosts[0];
        int rc;
        char account[64];
        snprintf(account, sizeof(account), "acct-reg-%d", (int)getpid());
        json_t *j = test_vmm_cli(a->sock, &rc, NULL, "create", "--account", account, "--key", "key-reg", "--vcpus", "2",
                                 "--memory-mib", "256", "--disk-mib", "100", "--timeout", "120", NULL);
        const char *id = test_jstr(j, "id");
        CHECK(rc == 0 && *id, "create failed: rc=%d", rc);
        /* within two beats and slack */
        EXPECT_ROW(a, FIGURES, "4/4096/8192/1600/100/100/2/256/100/1/ready/https://127.0.0.1:7443",
                   (2 * BEAT_S + SLACK_S) * 1000);
        char *free_now = row(a, "SELECT free_vcpus || '/' || free_memory_mib || '/' || free_disk_mib FROM host_states"
                                " WHERE host_id = '$HOST'");
        CHECK(strcmp(free_now, "62/3840/8092") == 0, "free after the create: %s, want 62/3840/8092", free_now);
        free(free_now);
        /* host B's figures did not move */
        EXPECT_ROW(&hosts[1], FIGURES, "4/4096/8192/1600/100/100/0/0/0/0/ready/-", 1000);
        json_t *s = test_vmm_cli(a->sock, &rc, NULL, "stop", id, NULL);
        CHECK(rc == 0, "stop failed: rc=%d", rc);
        json_decref(s);
        EXPECT_ROW(a, FIGURES, "4/4096/8192/1600/100/100/0/0/0/0/ready/https://127.0.0.1:7443",
                   (2 * BEAT_S + SLACK_S) * 1000);
        json_decref(j);
}

static const char STATE[] = "SELECT effective_state FROM host_states WHERE host_id = '$HOST'";

static void test_down_and_back(void)
{
        struct host *b = &hosts[1];
        CHECK(kill(b->pid, SIGSTOP) == 0, "SIGSTOP: %s", strerror(errno));
        int64_t took = wait_for(b, STATE, "down", (BOUND_S + BEAT_S + SLACK_S) * 1000, NULL);
        CHECK(took >= 0, "%s not down within %d s of its SIGSTOP", b->id, BOUND_S + BEAT_S + SLACK_S);
        /* its last beat was at most one beat before the stop */
        CHECK(took < 0 || took >= (BOUND_S - BEAT_S - 1) * 1000, "%s down after %lld ms: before the bound", b->id,
              (long long)took);
        fprintf(stderr, "down %lld ms after SIGSTOP\n", (long long)took);
        /* the other host is not */
        char *a = row(&hosts[0], STATE);
        CHECK(strcmp(a, "ready") == 0, "%s reads %s while %s is stopped", hosts[0].id, a, b->id);
        free(a);
        CHECK(kill(b->pid, SIGCONT) == 0, "SIGCONT: %s", strerror(errno));
        took = wait_for(b, STATE, "ready", (BEAT_S + SLACK_S) * 1000, NULL);
        CHECK(took >= 0, "%s not ready within %d s of its SIGCONT", b->id, BEAT_S + SLACK_S);
        fprintf(stderr, "ready %lld ms after SIGCONT\n", (long long)took);
}

/* tally-admin as tally_admin; its exit status, stdout and stderr. */
static int admin(char **out, char **err, const char *a1, const char *a2, const char *a3)
{
        char *argv[] = { (char *)test_env("TALLY_ADMIN_BIN"), "--database-url", db_url, (char *)a1, (char *)a2,
                         (char *)a3, NULL };
        return test_run(argv, out, err);
}

static void test_drain_resume(void)
{
        struct host *a = &hosts[0];
        char *out = NULL, *err = NULL;
        int rc = admin(&out, &err, "host", "drain", a->id);
        CHECK(rc == 0 && strstr(out, "state=draining") && strstr(out, "changed=true"), "host drain: rc=%d %s %s", rc,
              out, err);
        free(out), free(err);
        char *st = row(a, "SELECT effective_state || '/' || (state_changed_by LIKE 'admin:%') FROM host_states"
                          " WHERE host_id = '$HOST'");
        CHECK(strcmp(st, "draining/true") == 0, "after drain: %s", st);
        free(st);
        /* A beat after the drain has not undone it. */
        char *before = row(a, "SELECT heartbeat_at FROM host_registry WHERE host_id = '$HOST'");
        char sql[512];
        snprintf(sql, sizeof(sql),
                 "SELECT heartbeat_at > '%s'::timestamptz + interval '%d seconds' FROM host_registry WHERE host_id = '$HOST'",
                 before, BEAT_S - 1);
        EXPECT_ROW(a, sql, "t", (2 * BEAT_S + SLACK_S) * 1000);
        free(before);
        EXPECT_ROW(a, "SELECT state || '/' || effective_state FROM host_states WHERE host_id = '$HOST'",
                   "draining/draining", 1000);
        char *audit = row(a, "SELECT action || '/' || (old_value->>'state') || '/' || (new_value->>'state')"
                             " FROM audit_log WHERE object_id = '$HOST' ORDER BY id DESC LIMIT 1");
        CHECK(strcmp(audit, "host.drain/ready/draining") == 0, "audit_log: %s", audit);
        free(audit);
        /* list --json: both hosts, this one draining */
        rc = admin(&out, &err, "host", "list", "--json");
        json_t *list = rc == 0 ? json_loads(out, 0, NULL) : NULL;
        CHECK(json_is_array(list), "host list --json: rc=%d %s %s", rc, out, err);
        int seen = 0;
        for (size_t i = 0; list && i < json_array_size(list); i++) {
                json_t *o = json_array_get(list, i);
                const char *id = test_jstr(o, "host_id");
                if (strcmp(id, a->id) == 0) {
                        seen++;
                        CHECK(strcmp(test_jstr(o, "effective_state"), "draining") == 0 &&
                                      json_integer_value(json_object_get(o, "capacity_vcpus")) == 4,
                              "host list --json: %s", out);
                } else if (strcmp(id, hosts[1].id) == 0) {
                        seen++;
                        CHECK(strcmp(test_jstr(o, "effective_state"), "ready") == 0, "host list --json: %s", out);
                }
        }
        CHECK(seen == 2, "host list --json shows %d of the two hosts: %s", seen, out);
        json_decref(list);
        free(out), free(err);
        rc = admin(&out, &err, "host", "list", NULL);
        CHECK(rc == 0 && strstr(out, a->id) && strstr(out, "draining"), "host list: rc=%d %s %s", rc, out, err);
        free(out), free(err);
        /* an unknown host: a clear error */
        rc = admin(&out, &err, "host", "drain", "no-such-host");
        CHECK(rc != 0 && strstr(err, "no host no-such-host"), "drain of an unknown host: rc=%d %s", rc, err);
        free(out), free(err);
        rc = admin(&out, &err, "host", "resume", a->id);
        CHECK(rc == 0 && strstr(out, "state=ready"), "host resume: rc=%d %s %s", rc, out, err);
        free(out), free(err);
        EXPECT_ROW(a, STATE, "ready", 1000);
        rc = admin(&out, &err, "status", NULL, NULL);
        CHECK(rc == 0 && strstr(out, a->id), "status: rc=%d %s %s", rc, out, err);
        free(out), free(err);
}

static void test_vmm_role(void)
{
        char *url = test_role_url(db_url, "tally_vmm");
        PGconn *c = PQconnectdb(url);
        free(url);
        CHECK(PQstatus(c) == CONNECTION_OK, "connect as tally_vmm: %s", PQerrorMessage(c));
        char sql[512];
        snprintf(sql, sizeof(sql), "UPDATE host_registry SET state = 'draining' WHERE host_id = '%s'", hosts[0].id);
        PGresult *r = PQexec(c, sql);
        const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        CHECK(code && strcmp(code, "42501") == 0, "tally_vmm may set the state: %s (SQLSTATE %s)", sql,
              code ? code : "none");
        PQclear(r);
        PQfinish(c);
        /* Another host's login (a member of tally_vmm) can neither change host A's row nor take it over,
         * nor see it; tally_admin's and tally_api's rights are pg-roles'. */
        c = PQconnectdb(db_url); /* the cluster's superuser: it may make the role and SET ROLE to it */
        char role[64];
        snprintf(role, sizeof(role), "vmmreg_other_%d", (int)getpid());
        snprintf(sql, sizeof(sql), "CREATE ROLE %s NOLOGIN IN ROLE tally_vmm; SET ROLE %s", role, role);
        PQclear(PQexec(c, sql));
        snprintf(sql, sizeof(sql), "UPDATE host_registry SET promised_vcpus = 99 WHERE host_id = '%s'", hosts[0].id);
        r = PQexec(c, sql);
        CHECK(PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdTuples(r), "0") == 0,
              "another host's login changed %s's row: %s %s", hosts[0].id, PQcmdTuples(r), PQerrorMessage(c));
        PQclear(r);
        snprintf(sql, sizeof(sql),
                 "INSERT INTO host_registry (host_id, capacity_vcpus, capacity_memory_mib, capacity_disk_mib,"
                 " vcpu_overcommit_percent, memory_overcommit_percent, disk_overcommit_percent)"
                 " VALUES ('%s', 1, 1, 1, 1, 1, 1) ON CONFLICT (host_id) DO UPDATE SET heartbeat_at = now()",
                 hosts[0].id);
        r = PQexec(c, sql);
        code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        CHECK(code && strcmp(code, "42501") == 0, "another host's login took over %s's row (SQLSTATE %s)", hosts[0].id,
              code ? code : "none");
        PQclear(r);
        r = PQexec(c, "SELECT count(*) FROM host_registry");
        CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && strcmp(PQgetvalue(r, 0, 0), "0") == 0,
              "another host's login sees rows of the registry: %s", PQerrorMessage(c));
        PQclear(r);
        snprintf(sql, sizeof(sql), "RESET ROLE; DROP ROLE %s", role);
        PQclear(PQexec(c, sql));
        PQfinish(c);
}

int main(void)
{
        for (int i = 0; i < 2; i++) {
                struct host *h = &hosts[i];
                snprintf(h->id, sizeof(h->id), "reg-%c-%d", 'a' + i, (int)getpid());
                snprintf(h->parent, sizeof(h->parent), "tally-test-reg%c-%d", 'a' + i, (int)getpid());
                snprintf(h->dir, sizeof(h->dir), "/tmp/tally-reg-XXXXXX");
                if (!mkdtemp(h->dir))
                        return 1;
                if (asprintf(&h->state, "%s/state", h->dir) < 0 || asprintf(&h->sock, "%s/vmm.sock", h->dir) < 0 ||
                    asprintf(&h->log, "%s/vmm.log", h->dir) < 0)
                        return 1;
                h->pid = -1;
        }
        test_cleanup_at_exit(cleanup);
        setenv("COLUMNS", "300", 1); /* tally-admin's tables: whole host ids */
        db_url = test_db_create("vmmreg");
        char *migrate[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", db_url, NULL };
        char *merr = NULL;
        int mrc = test_run(migrate, NULL, &merr);
        CHECK(mrc == 0, "tally-migrate: %s", merr ? merr : "");
        free(merr);
        start_host(&hosts[0], "https://127.0.0.1:7443");
        start_host(&hosts[1], NULL);
        const struct test_case cases[] = {
                { "register", test_register },       { "promised", test_promised },
                { "down_and_back", test_down_and_back }, { "drain_resume", test_drain_resume },
                { "vmm_role", test_vmm_role },
        };
        TEST_RUN_CASES(cases);
        for (int i = 0; i < 2; i++)
                test_stop_process(&hosts[i].pid, SIGTERM);
        return test_result();
}
