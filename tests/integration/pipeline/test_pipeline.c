/* Integration: the whole pipeline, every part a real process.
 *
 * tally-vmm runs process sandboxes in real cgroups, tally-collector samples
 * them, a private tally-broker carries the usage and control topics, and
 * tally-aggregator rates the usage into a real PostgreSQL ledger. Checked:
 *   - conservation: a sandbox's billed CPU equals its cgroup's final counter to
 *     the nanosecond, and is at least what the test read from the cgroup itself
 *     once the sandbox's work was done;
 *   - coverage: its held memory is billed for the time it ran, within the
 *     sampling tick of the wall-clock time the test measured around it;
 *   - spend limits: a key with a daily limit and a sandbox burning CPU gets its
 *     50/80/100% alerts once each, its sandbox paused (no CPU accrues after),
 *     and a new sandbox for it refused. */
#include "support.h"

#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS 200
#define MEM_MIB 128

static char state_dir[512], cgroup_parent[64], brokers[128];
static char *db_url;

static int64_t now_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void sleep_ms(int ms)
{
        struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
        nanosleep(&ts, NULL);
}

/* Runs `tally-vmm --state-dir S ARGS...` and parses its JSON answer (NULL if none). */
static json_t *vmm(int *rc, const char *const *args)
{
        char *argv[32] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state_dir };
        int n = 3;
        for (; *args && n < 31; args++)
                argv[n++] = (char *)*args;
        argv[n] = NULL;
        char *out = NULL, *err = NULL;
        *rc = test_run(argv, &out, &err);
        json_t *j = json_loads(out, 0, NULL);
        if (*rc != 0 && !j)
                fprintf(stderr, "tally-vmm %s: exit %d: %s%s\n", argv[3], *rc, out, err);
        free(out);
        free(err);
        return j;
}

static char *query1(const char *sql)
{
        PGconn *c = PQconnectdb(db_url);
        PGresult *r = PQexec(c, sql);
        char *v = NULL;
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
                v = strdup(PQgetvalue(r, 0, 0));
        PQclear(r);
        PQfinish(c);
        return v;
}

static void exec_sql(const char *sql)
{
        PGconn *c = PQconnectdb(db_url);
        PGresult *r = PQexec(c, sql);
        CHECK(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK, "%s: %s", sql,
              PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
}

static uint64_t read_u64(const char *path)
{
        char *s = test_read_file(path);
        uint64_t v = s ? strtoull(s, NULL, 10) : 0;
        free(s);
        return v;
}

static pid_t daemon_start(const char *name, char *const argv[])
{
        char log[600];
        snprintf(log, sizeof(log), "%s/%s.log", state_dir, name);
        return test_spawn(argv, NULL, log);
}

static void daemon_stop(pid_t pid)
{
        kill(pid, SIGTERM);
        for (int i = 0; i < 100; i++) {
                if (waitpid(pid, NULL, WNOHANG) == pid)
                        return;
                sleep_ms(100);
        }
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
}

static void conservation(void)
{
        int rc;
        const char *create[] = { "create", "--account", "acct_pipe", "--key", "key_free", "--vcpus", "1",
                                 "--memory-mib", "128", NULL };
        int64_t t_create = now_ns();
        json_t *sb = vmm(&rc, create);
        CHECK(rc == 0 && sb, "create failed");
        if (!sb)
                return;
        char id[80], cpu_path[600];
        snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(sb, "id")));
        snprintf(cpu_path, sizeof(cpu_path), "%s/cpuacct.usage", json_string_value(json_object_get(sb, "cgroup_cpu")));
        json_decref(sb);

        /* The work: a shell loop, about a CPU-second. */
        const char *work[] = { "exec", id, "--timeout-ms", "60000", "--", "sh", "-c",
                               "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; echo done", NULL };
        json_t *res = vmm(&rc, work);
        CHECK(rc == 0, "exec of the work failed (exit %d)", rc);
        json_decref(res);
        uint64_t seen = read_u64(cpu_path); /* the test's own reading of the cgroup */
        CHECK(seen > 100000000, "the work used only %" PRIu64 " ns of CPU", seen);

        sleep_ms(1000); /* a few more samples of an idle sandbox */
        const char *stop[] = { "stop", id, NULL };
        int64_t t_stop = now_ns();
        json_t *st = vmm(&rc, stop);
        CHECK(rc == 0 && st, "stop failed");
        uint64_t final = st ? (uint64_t)json_integer_value(json_object_get(st, "final_cpu_ns")) : 0;
        json_decref(st);
        CHECK(final >= seen, "final counter %" PRIu64 " below the test's reading %" PRIu64, final, seen);

        /* The ledger catches up within a few ticks and batches. */
        char sql[512], *billed = NULL;
        snprintf(sql, sizeof(sql), "SELECT sum(cpu_ns)::text FROM usage_hourly WHERE sandbox_id = '%s'", id);
        for (int i = 0; i < 150; i++) {
                free(billed);
                billed = query1(sql);
                if (billed && strtoull(billed, NULL, 10) == final)
                        break;
                sleep_ms(200);
        }
        CHECK(billed && strtoull(billed, NULL, 10) == final, "billed CPU %s ns, the cgroup's final counter %" PRIu64,
              billed ? billed : "none", final);
        free(billed);

        /* Held memory: billed for the running time, within the sampling tick. */
        snprintf(sql, sizeof(sql),
                 "SELECT (sum(mem_byte_ns) / %d::numeric / 1048576)::bigint::text FROM usage_hourly WHERE sandbox_id = '%s'",
                 MEM_MIB, id);
        char *held = query1(sql);
        int64_t held_ns = held ? strtoll(held, NULL, 10) : 0, wall = t_stop - t_create;
        CHECK(held_ns <= wall + 50000000, "memory billed for %" PRId64 " ns, longer than the %" PRId64 " ns it lived",
              held_ns, wall);
        CHECK(held_ns >= wall - 3 * TICK_MS * 1000000LL - 500000000,
              "memory billed for %" PRId64 " ns of the %" PRId64 " ns it ran", held_ns, wall);
        fprintf(stderr, "conservation: cpu %" PRIu64 " ns billed exactly; memory held %" PRId64 " of %" PRId64 " ns\n",
                final, held_ns, wall);
        free(held);
}

static void spend_limit(void)
{
        /* $0.025 per vCPU-hour: 20,000 nano-dollars is about 2.9 CPU-seconds. */
        exec_sql("INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars, limit_policy)"
                 " VALUES ('key_lim', 'acct_pipe', sha256('key_lim'), 20000, 'pause')");
        int rc;
        const char *create[] = { "create", "--account", "acct_pipe", "--key", "key_lim", "--vcpus", "1",
                                 "--memory-mib", "128", "--", "sh", "-c", "while :; do :; done", NULL };
        json_t *sb = vmm(&rc, create);
        CHECK(rc == 0 && sb, "create of the burning sandbox failed");
        if (!sb)
                return;
        char id[80], cpu_path[600], show_id[80];
        snprintf(id, sizeof(id), "%s", json_string_value(json_object_get(sb, "id")));
        snprintf(show_id, sizeof(show_id), "%s", id);
        snprintf(cpu_path, sizeof(cpu_path), "%s/cpuacct.usage", json_string_value(json_object_get(sb, "cgroup_cpu")));
        json_decref(sb);

        const char *show[] = { "show", show_id, NULL };
        bool paused = false;
        for (int i = 0; i < 300 && !paused; i++) {
                json_t *s = vmm(&rc, show);
                paused = s && strcmp(json_string_value(json_object_get(s, "state")), "paused") == 0;
                json_decref(s);
                if (!paused)
                        sleep_ms(100);
        }
        CHECK(paused, "the sandbox was not paused after its key reached the limit");
        uint64_t a = read_u64(cpu_path);
        sleep_ms(1000);
        uint64_t b = read_u64(cpu_path);
        CHECK(paused && a == b, "a paused sandbox accrued %" PRIu64 " ns of CPU", b - a);

        char *alerts = query1("SELECT string_agg(threshold_pct::text, ',' ORDER BY threshold_pct) FROM alerts"
                              " WHERE key_id = 'key_lim'");
        CHECK(alerts && strcmp(alerts, "50,80,100") == 0, "alerts %s, wanted 50,80,100 once each",
              alerts ? alerts : "none");
        free(alerts);

        const char *again[] = { "create", "--account", "acct_pipe", "--key", "key_lim", NULL };
        json_t *refused = vmm(&rc, again);
        CHECK(rc != 0, "a new sandbox started for a key over its daily limit");
        json_decref(refused);

        const char *stop[] = { "stop", id, NULL };
        json_decref(vmm(&rc, stop));
}

int main(void)
{
        char *dir = test_tmpdir("pipeline");
        snprintf(state_dir, sizeof(state_dir), "%s/state", dir);
        snprintf(cgroup_parent, sizeof(cgroup_parent), "tally-test-pipeline-%d", (int)getpid());
        db_url = test_db_create("pipeline");
        char *migrate[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", db_url, NULL };
        char *err = NULL;
        CHECK(test_run(migrate, NULL, &err) == 0, "tally-migrate: %s", err);
        free(err);
        exec_sql("INSERT INTO accounts (id, name) VALUES ('acct_pipe', 'pipeline');"
                 "INSERT INTO api_keys (id, account_id, key_hash) VALUES ('key_free', 'acct_pipe', sha256('key_free'))");

        char bootstrap[600];
        snprintf(bootstrap, sizeof(bootstrap), "%s/broker.bootstrap", dir);
        mkdir(state_dir, 0755);
        char *broker[] = { (char *)test_env("TALLY_BROKER_BIN"), "--partitions", "2", "--bootstrap-file", bootstrap, NULL };
        pid_t broker_pid = daemon_start("broker", broker);
        if (test_wait_file(bootstrap, 10000) < 0) {
                fprintf(stderr, "FAIL: the broker did not start\n");
                return 1;
        }
        char *b = test_read_file(bootstrap);
        snprintf(brokers, sizeof(brokers), "%s", b);
        free(b);

        char tick[16];
        snprintf(tick, sizeof(tick), "%d", TICK_MS);
        char *vmmd[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state_dir, "--kafka-brokers", brokers,
                         "--cgroup-parent", cgroup_parent, "--backend", "process", "--limits-database-url", db_url,
                         NULL };
        char *collector[] = { (char *)test_env("TALLY_COLLECTOR_BIN"), "--state-dir", state_dir, "--kafka-brokers",
                              brokers, "--tick-ms", tick, "--metrics-port", "0", NULL };
        char *aggregator[] = { (char *)test_env("TALLY_AGGREGATOR_BIN"), "--database-url", db_url, "--kafka-brokers",
                               brokers, "--batch-ms", "100", NULL };
        pid_t vmm_pid = daemon_start("vmm", vmmd);
        pid_t collector_pid = daemon_start("collector", collector);
        pid_t aggregator_pid = daemon_start("aggregator", aggregator);
        char sock[600];
        snprintf(sock, sizeof(sock), "%s/vmm.sock", state_dir);
        CHECK(test_wait_file(sock, 15000) == 0 || access(sock, F_OK) == 0, "tally-vmm did not open its socket");
        sleep_ms(2000); /* the consumers join their groups */

        conservation();
        spend_limit();

        /* The vmm removes each sandbox's cgroup once its final counter is safe. */
        char parent[256];
        snprintf(parent, sizeof(parent), "/sys/fs/cgroup/cpuacct/%s", cgroup_parent);
        sleep_ms(1000);
        daemon_stop(aggregator_pid);
        daemon_stop(collector_pid);
        daemon_stop(vmm_pid);
        daemon_stop(broker_pid);
        if (test_failures) {
                const char *logs[] = { "vmm", "collector", "aggregator" };
                for (int i = 0; i < 3; i++) {
                        char path[700];
                        snprintf(path, sizeof(path), "%s/%s.log", state_dir, logs[i]);
                        char *l = test_read_file(path);
                        fprintf(stderr, "---- %s log (tail)\n%s\n", logs[i], l ? (strlen(l) > 3000 ? l + strlen(l) - 3000 : l) : "");
                        free(l);
                }
        }
        /* Whatever is left (a failed run) goes with its processes. */
        char cmd[1200];
        snprintf(cmd, sizeof(cmd),
                 "for h in /sys/fs/cgroup/*/%s; do [ -d \"$h\" ] || continue; "
                 "for s in \"$h\"/*/; do [ -d \"$s\" ] || continue; cat \"$s/cgroup.procs\" 2>/dev/null | xargs -r kill -9; "
                 "rmdir \"$s\" 2>/dev/null; done; rmdir \"$h\" 2>/dev/null; done; true", cgroup_parent);
        if (system(cmd) != 0)
                fprintf(stderr, "cleanup of %s failed\n", cgroup_parent);
        test_db_drop(db_url);
        free(dir);
        return test_result();
}
