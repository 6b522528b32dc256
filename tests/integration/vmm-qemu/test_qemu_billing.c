/* test_qemu_billing.c — a qemu sandbox through the whole pipeline, every
 * part a real process: tally-vmm (qemu backend, TCG) launches the microVM
 * jailed in its cgroup, tally-collector samples it, a private Kafka
 * carries the topics, tally-aggregator bills into a real PostgreSQL ledger.
 *
 * Inside the guest the sandbox tries to leave its cgroup (it mounts its own
 * cgroup tree and moves itself to the root) and burns CPU. Checked:
 *   - the QEMU the daemon started is jailed: its uid is 2,100,000,000 + its
 *     pid, no capabilities, seccomp filter mode, and every one of its
 *     threads is in the sandbox's cgroup after the guest's attempt;
 *   - the billed CPU equals the cgroup's counter read by the test itself
 *     from the kernel: once the sandbox is paused its frozen cgroup's counter
 *     stands still (the test reads it twice to be sure), and the ledger must
 *     reach exactly that figure, to the nanosecond;
 *   - after stop, the billed CPU equals the final counter and is not below
 *     the test's own reading. */
#include "support.h"

#include <dirent.h>
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
/* docs/qemu.md: QEMU's uid and gid are 2,100,000,000 plus its pid. */
#define JAIL_UID_BASE 2100000000ul

static char state_dir[512], cgroup_parent[64], brokers[512];
static char *db_url;

static void sleep_ms(int ms)
{
        struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
        nanosleep(&ts, NULL);
}

static const char *str(const char *s)
{
        return s ? s : "(none)";
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
        json_t *j = out ? json_loads(out, 0, NULL) : NULL;
        if (*rc != 0)
                fprintf(stderr, "tally-vmm %s: exit %d: %s%s\n", argv[3], *rc, str(out), str(err));
        free(out);
        free(err);
        return j;
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

/* The cgroup's CPU counter in ns, from the kernel (v1 cpuacct.usage or v2 cpu.stat). */
static bool cgroup_cpu(const char *dir, uint64_t *ret)
{
        char p[700];
        snprintf(p, sizeof(p), "%s/cpuacct.usage", dir);
        char *s = test_read_file(p);
        if (s) {
                *ret = strtoull(s, NULL, 10);
                free(s);
                return true;
        }
        snprintf(p, sizeof(p), "%s/cpu.stat", dir);
        s = test_read_file(p);
        char *u = s ? strstr(s, "usage_usec ") : NULL;
        if (u)
                *ret = strtoull(u + 11, NULL, 10) * 1000;
        free(s);
        return u != NULL;
}

static char *status_field(pid_t pid, const char *key)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/status", (int)pid);
        char *s = test_read_file(p);
        char *v = NULL;
        size_t kl = strlen(key);
        for (char *line = s ? strtok(s, "\n") : NULL; line; line = strtok(NULL, "\n"))
                if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
                        char *b = line + kl + 1;
                        while (*b == ' ' || *b == '\t')
                                b++;
                        v = strdup(b);
                        break;
                }
        free(s);
        return v;
}

/* Every thread of pid has cgroup_rel (e.g. "/tally-x/sbx-1") as its cpu
 * accounting cgroup (v1 cpuacct line, or v2's unified line). */
static int threads_outside(pid_t pid, const char *cgroup_rel, int *ret_n)
{
        char p[64];
        snprintf(p, sizeof(p), "/proc/%d/task", (int)pid);
        DIR *d = opendir(p);
        if (!d)
                return -1;
        int n = 0, outside = 0;
        struct dirent *e;
        while ((e = readdir(d))) {
                if (e->d_name[0] == '.')
                        continue;
                n++;
                char cp[300];
                snprintf(cp, sizeof(cp), "/proc/%d/task/%s/cgroup", (int)pid, e->d_name);
                char *s = test_read_file(cp);
                bool in = false;
                for (char *line = s ? strtok(s, "\n") : NULL; line; line = strtok(NULL, "\n")) {
                        char *path = strrchr(line, ':');
                        bool cpu = strstr(line, ":cpuacct") != NULL || strncmp(line, "0::", 3) == 0;
                        if (path && cpu && strcmp(path + 1, cgroup_rel) == 0)
                                in = true;
                }
                free(s);
                if (!in)
                        outside++;
        }
        closedir(d);
        *ret_n = n;
        return outside;
}

/* Polls the ledger until the sandbox's billed CPU is want, at most timeout_ms;
 * returns the last figure read (malloc'd, or NULL). */
static char *billed_cpu(const char *id, uint64_t want, int timeout_ms)
{
        char sql[512], *billed = NULL;
        snprintf(sql, sizeof(sql), "SELECT sum(cpu_ns)::text FROM usage_hourly WHERE sandbox_id = '%s'", id);
        for (int waited = 0;; waited += 200) {
                free(billed);
                billed = test_db_value(db_url, sql);
                if ((billed && strtoull(billed, NULL, 10) == want) || waited >= timeout_ms)
                        return billed;
                sleep_ms(200);
        }
}

static void qemu_sandbox(void)
{
        int rc;
        const char *create[] = { "create", "--account", "acct_qb", "--key", "key_qb", "--vcpus", "1",
                                 "--memory-mib", "160", "--backend", "qemu", NULL };
        json_t *sb = vmm(&rc, create);
        CHECK(rc == 0 && sb, "create of a qemu sandbox failed");
        if (!sb)
                return;
        char id[80], cg[600];
        snprintf(id, sizeof(id), "%s", str(json_string_value(json_object_get(sb, "id"))));
        snprintf(cg, sizeof(cg), "%s", str(json_string_value(json_object_get(sb, "cgroup_cpu"))));
        pid_t pid = (pid_t)json_integer_value(json_object_get(sb, "pid"));
        json_decref(sb);
        CHECK(pid > 0, "the sandbox has no QEMU pid");

        /* The guest leaves its cgroup, as it sees cgroups, and burns CPU. */
        const char *work[] = { "exec", id, "--timeout-ms", "120000", "--", "sh", "-c",
                               "mkdir -p /cg && mount -t cgroup2 none /cg && echo $$ > /cg/cgroup.procs && "
                               "i=0; while [ $i -lt 40000 ]; do i=$((i+1)); done; echo done",
                               NULL };
        json_t *res = vmm(&rc, work);
        CHECK(rc == 0, "the guest's work failed (exit %d)", rc);
        json_decref(res);

        /* The daemon's QEMU is jailed and wholly in the sandbox's cgroup. */
        char want[64];
        snprintf(want, sizeof(want), "%lu\t", JAIL_UID_BASE + (unsigned long)pid);
        char *uid = status_field(pid, "Uid"), *caps = status_field(pid, "CapEff"), *sec = status_field(pid, "Seccomp");
        CHECK(uid && strncmp(uid, want, strlen(want)) == 0, "the daemon's QEMU runs as uid '%s', want %s", str(uid),
              want);
        CHECK(caps && strcmp(caps, "0000000000000000") == 0, "the daemon's QEMU has capabilities %s", str(caps));
        CHECK(sec && strcmp(sec, "2") == 0, "the daemon's QEMU has seccomp mode %s, want 2", str(sec));
        free(uid);
        free(caps);
        free(sec);
        const char *rel = strstr(cg, cgroup_parent);
        char rel_path[300];
        snprintf(rel_path, sizeof(rel_path), "/%s", rel ? rel : "?");
        int n = 0, outside = threads_outside(pid, rel_path, &n);
        CHECK(outside == 0 && n >= 2, "%d of QEMU's %d threads are outside %s", outside, n, rel_path);

        /* Paused, the frozen cgroup's counter stands still: that reading, by
         * the test from the kernel, is what must be billed. */
        const char *pause[] = { "pause", id, NULL };
        json_decref(vmm(&rc, pause));
        CHECK(rc == 0, "pause failed");
        uint64_t c1 = 0, c2 = 0;
        bool read1 = cgroup_cpu(cg, &c1);
        sleep_ms(3 * TICK_MS);
        bool read2 = cgroup_cpu(cg, &c2);
        CHECK(read1 && read2 && c1 == c2, "the paused sandbox's counter moved: %" PRIu64 " then %" PRIu64, c1, c2);
        CHECK(c1 > 1000000000ull, "the cgroup counted only %" PRIu64 " ns for a TCG boot and the work", c1);
        char *billed = billed_cpu(id, c2, 30000);
        CHECK(billed && strtoull(billed, NULL, 10) == c2, "billed CPU %s ns while paused, the cgroup's counter %" PRIu64,
              str(billed), c2);
        fprintf(stderr, "paused: cgroup counter %" PRIu64 " ns, billed %s ns\n", c2, str(billed));
        free(billed);

        const char *stop[] = { "stop", id, NULL };
        json_t *st = vmm(&rc, stop);
        CHECK(rc == 0 && st, "stop failed");
        uint64_t final = st ? (uint64_t)json_integer_value(json_object_get(st, "final_cpu_ns")) : 0;
        json_decref(st);
        CHECK(final >= c2, "final counter %" PRIu64 " below the test's reading %" PRIu64, final, c2);
        billed = billed_cpu(id, final, 30000);
        CHECK(billed && strtoull(billed, NULL, 10) == final, "billed CPU %s ns after stop, final counter %" PRIu64,
              str(billed), final);
        fprintf(stderr, "stopped: final counter %" PRIu64 " ns, billed %s ns\n", final, str(billed));
        free(billed);
}

static pid_t daemon_start(const char *name, char *const argv[])
{
        char log[600];
        snprintf(log, sizeof(log), "%s/%s.log", state_dir, name);
        return test_spawn(argv, NULL, log);
}

/* Stops a daemon; one that does not go within 10 s of SIGTERM fails the test. */
static void daemon_stop(pid_t pid, const char *name)
{
        kill(pid, SIGTERM);
        for (int i = 0; i < 100; i++) {
                if (waitpid(pid, NULL, WNOHANG) == pid)
                        return;
                sleep_ms(100);
        }
        CHECK(false, "%s did not stop within 10 s of SIGTERM", name);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
}

int main(void)
{
        if (geteuid() != 0) {
                fprintf(stderr, "FAIL: the qemu billing test needs root\n");
                return 1;
        }
        char *dir = test_tmpdir("vmm-qemu-billing");
        snprintf(state_dir, sizeof(state_dir), "%s/state", dir);
        snprintf(cgroup_parent, sizeof(cgroup_parent), "tally-test-qemu-billing-%d", (int)getpid());
        db_url = test_db_create("qemu_billing");
        char *migrate[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", db_url, NULL };
        char *err = NULL;
        CHECK(test_run(migrate, NULL, &err) == 0, "tally-migrate: %s", str(err));
        free(err);
        exec_sql("INSERT INTO accounts (id, name) VALUES ('acct_qb', 'qemu billing');"
                 "INSERT INTO api_keys (id, account_id, key_hash) VALUES ('key_qb', 'acct_qb', sha256('key_qb'))");

        mkdir(state_dir, 0755);
        /* The development broker, or Apache Kafka under TALLY_TEST_KAFKA=apache (tests/support/kafka.c). */
        struct test_kafka kafka;
        test_kafka_start(&kafka, dir, 2, 1);
        snprintf(brokers, sizeof(brokers), "%s", kafka.bootstrap);

        char tick[16];
        snprintf(tick, sizeof(tick), "%d", TICK_MS);
        char *vmmd[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state_dir, "--kafka-brokers", brokers,
                         "--cgroup-parent", cgroup_parent, "--backend", "qemu", "--final-wait-ms", "10000", NULL };
        char *collector[] = { (char *)test_env("TALLY_COLLECTOR_BIN"), "--state-dir", state_dir, "--kafka-brokers",
                              brokers, "--tick-ms", tick, "--metrics-port", "0", NULL };
        char *aggregator[] = { (char *)test_env("TALLY_AGGREGATOR_BIN"), "--database-url", db_url, "--kafka-brokers",
                               brokers, "--batch-ms", "100", NULL };
        setenv("TALLY_QEMU_ACCEL", "tcg", 1); /* KVM does not boot guests here; no 20 s probe */
        pid_t vmm_pid = daemon_start("vmm", vmmd);
        pid_t collector_pid = daemon_start("collector", collector);
        pid_t aggregator_pid = daemon_start("aggregator", aggregator);
        char sock[600];
        snprintf(sock, sizeof(sock), "%s/vmm.sock", state_dir);
        bool up = test_wait_file(sock, 15000) == 0 || access(sock, F_OK) == 0;
        CHECK(up, "tally-vmm did not open its socket");
        sleep_ms(2000); /* the consumers join their groups */

        if (up)
                qemu_sandbox();

        daemon_stop(aggregator_pid, "tally-aggregator");
        daemon_stop(collector_pid, "tally-collector");
        daemon_stop(vmm_pid, "tally-vmm");
        test_kafka_stop(&kafka);
        if (test_failures) {
                const char *logs[] = { "vmm", "collector", "aggregator" };
                for (int i = 0; i < 3; i++) {
                        char path[700];
                        snprintf(path, sizeof(path), "%s/%s.log", state_dir, logs[i]);
                        char *l = test_read_file(path);
                        fprintf(stderr, "---- %s log (tail)\n%s\n", logs[i],
                                l ? (strlen(l) > 3000 ? l + strlen(l) - 3000 : l) : "");
                        free(l);
                }
        }
        /* Whatever is left (a failed run) goes with its processes. */
        char cmd[1200];
        snprintf(cmd, sizeof(cmd),
                 "for h in /sys/fs/cgroup/*/%s /sys/fs/cgroup/%s; do [ -d \"$h\" ] || continue; "
                 "for s in \"$h\"/*/; do [ -d \"$s\" ] || continue; cat \"$s/cgroup.procs\" 2>/dev/null | xargs -r kill -9; "
                 "sleep 0.2; rmdir \"$s\" 2>/dev/null; done; rmdir \"$h\" 2>/dev/null; done; true",
                 cgroup_parent, cgroup_parent);
        if (system(cmd) != 0)
                fprintf(stderr, "cleanup of %s failed\n", cgroup_parent);
        test_db_drop(db_url);
        free(dir);
        return test_result();
}
