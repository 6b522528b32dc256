/* Integration: tally-vmm as a real daemon with the process backend, on this
 * machine's real cgroups, the development broker and PostgreSQL.
 *
 * Ground truth is read independently of tally-vmm: straight from the cgroup
 * files (cpuacct.usage / cpu.stat, memory.max_usage_in_bytes, freezer.state),
 * from /proc, from CPU time the burning program measures for itself, and from
 * the Kafka topic. Every cgroup and process the test makes is removed at exit,
 * also when a check fails. */
#include "support.h"
#include "vmmtest.h"
#include "control.h"
#include "event.h"
#include "kafka.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char parent[64];          /* our own cgroup parent: tally-test-vmm-<pid> */
static char account[64];
static char *work, *state, *sock, *db_url;
static pid_t daemon_pid = -1, broker_pid = -1;
static const char *brokers;      /* the shared test broker, or the outage case's private one */
static struct test_kafka outage_kafka; /* the outage case's Apache Kafka (TALLY_TEST_KAFKA=apache) */
static const char *final_wait_ms = "4000";
static int cgroup_version;
static int metrics_port;         /* the daemon's /metrics */
static char metrics_port_arg[16];

/* ---- cleaning up whatever the test made ---- */

static void cleanup(void)
{
        test_stop_process(&daemon_pid, SIGKILL);
        test_stop_process(&broker_pid, SIGTERM);
        if (outage_kafka.apache) {
                test_kafka_stop(&outage_kafka);
                outage_kafka.apache = 0;
        }
        if (!*parent)
                return;
        test_cgroup_remove(parent, cgroup_version);
        /* Reap the sandboxes' inits, whose parent the killed daemon was. */
        while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
        if (db_url) {
                test_db_drop(db_url);
                db_url = NULL;
        }
}

/* ---- talking to the daemon, through its own command line client ---- */

static json_t *cli(int *ret_rc, const char *first, ...)
{
        char *err = NULL;
        va_list ap;
        va_start(ap, first);
        json_t *j = test_vmm_cli_v(sock, ret_rc, &err, first, ap);
        va_end(ap);
        /* The client's complaints go with its answer into a failed check's message. */
        if (err && *err && !json_object_get(j, "raw_stdout"))
                json_object_set_new(j, "raw_stderr", json_string(err));
        free(err);
        return j;
}

static long long jint(json_t *j, const char *key)
{
        return json_integer_value(json_object_get(j, key));
}

/* exec through the client: the client prints the command's stdout and exits with its status. */
static int sh_exec(const char *id, const char *script, char **out, char **err)
{
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--socket", sock, "exec", (char *)id, "--",
                         "/bin/sh", "-c", (char *)script, NULL };
        return test_run(argv, out, err);
}

static json_t *create(const char *key, const char *vcpus, const char *mem, const char *timeout, const char *cmd)
{
        int rc;
        json_t *j = cmd ? cli(&rc, "create", "--account", account, "--key", key, "--vcpus", vcpus, "--memory-mib",
                              mem, "--timeout", timeout, "--label", "suite=vmm", "--", "/bin/sh", "-c", cmd, NULL)
                        : cli(&rc, "create", "--account", account, "--key", key, "--vcpus", vcpus, "--memory-mib",
                              mem, "--timeout", timeout, "--label", "suite=vmm", NULL);
        CHECK(rc == 0 && *test_jstr(j, "id"), "create failed: rc=%d %s", rc, json_dumps(j, 0));
        return j;
}

static void start_daemon(void)
{
        char log[1024];
        snprintf(log, sizeof(log), "%s/vmm.log", work);
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state, "--socket", sock,
                         "--kafka-brokers", (char *)brokers, "--cgroup-parent", parent,
                         "--host-id", "test-vmm-host", "--backend", "process", "--final-wait-ms", (char *)final_wait_ms,
                         "--limits-database-url", db_url,
                         "--blocked-key-query", "SELECT 1 FROM blocked WHERE account_id = $1 AND key_id = $2",
                         "--metrics-port", metrics_port_arg, "--log-level", "debug", NULL };
        /* Append: a restarted daemon's log follows the first one's. */
        daemon_pid = test_spawn(argv, NULL, log);
        if (test_vmm_wait_ready(sock, 20000, &cgroup_version) == 0)
                return;
        char *l = test_read_file(log);
        fprintf(stderr, "FAIL: tally-vmm did not become ready in 20 s; its log:\n%s\n", l ? l : "");
        free(l);
        cleanup();
        exit(1);
}

static void stop_daemon(void)
{
        kill(daemon_pid, SIGTERM);
        int status = 0;
        waitpid(daemon_pid, &status, 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "tally-vmm exited with status %d on SIGTERM", status);
        daemon_pid = -1;
}

/* ---- ground truth from the cgroup files ---- */

static uint64_t read_u64(const char *dir, const char *file)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, file);
        char *t = test_read_file(path);
        uint64_t v = t ? strtoull(t, NULL, 10) : 0;
        CHECK(t != NULL, "could not read %s", path);
        free(t);
        return v;
}

/* The cgroup's CPU counter, read by this test from the file the kernel keeps. */
static uint64_t cgroup_cpu(json_t *sb)
{
        const char *dir = test_jstr(sb, "cgroup_cpu");
        if (cgroup_version == 1)
                return read_u64(dir, "cpuacct.usage");
        char path[1024];
        snprintf(path, sizeof(path), "%s/cpu.stat", dir);
        char *t = test_read_file(path);
        char *u = t ? strstr(t, "usage_usec ") : NULL;
        uint64_t v = u ? strtoull(u + 11, NULL, 10) * 1000 : 0;
        free(t);
        return v;
}

static bool dir_exists(const char *path)
{
        struct stat st;
        return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool pid_alive(pid_t pid)
{
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        char *t = test_read_file(path);
        /* A zombie (state Z) is not running any more. */
        bool alive = t && !strstr(strrchr(t, ')') ? strrchr(t, ')') : t, ") Z");
        free(t);
        return alive;
}

static json_t *show(const char *id)
{
        int rc;
        return cli(&rc, "show", id, NULL);
}

static bool wait_state(const char *id, const char *want, int timeout_ms)
{
        int64_t until = test_now_ms() + timeout_ms;
        do {
                json_t *j = show(id);
                bool ok = strcmp(test_jstr(j, "state"), want) == 0;
                json_decref(j);
                if (ok)
                        return true;
                test_sleep_ms(20);
        } while (test_now_ms() < until);
        return false;
}

/* ---- /metrics ---- */

static char *metrics_page(void)
{
        char *p = test_get_metrics(metrics_port);
        CHECK(p && strstr(p, " 200 ") && strstr(p, "\r\n\r\n# HELP "), "GET /metrics on port %d: %.200s",
              metrics_port, p ? p : "no answer");
        return p;
}

static int64_t metric(const char *page, const char *series)
{
        return test_metric(page, series, false);
}

/* Every figure of the page after real creates, execs, a fork, a pause and a stop,
 * each counted here by hand. Runs first: the daemon has no sandbox yet. */
static void test_metrics(void)
{
        char *p = metrics_page();
        static const char *const zero[] = {
                "tally_vmm_sandboxes{state=\"running\"}", "tally_vmm_sandboxes{state=\"paused\"}",
                "tally_vmm_sandboxes{state=\"stopped\"}", "tally_vmm_creates_total{result=\"ok\"}",
                "tally_vmm_execs_total{result=\"ok\"}", "tally_vmm_forks_total{result=\"ok\"}",
                "tally_vmm_exec_duration_seconds_count", "tally_vmm_control_commands_total",
                "tally_vmm_control_applied_total", "tally_vmm_registry_write_failures_total",
        };
        for (size_t i = 0; i < sizeof(zero) / sizeof(zero[0]); i++)
                CHECK(metric(p, zero[i]) == 0, "a fresh daemon's %s is %lld, not 0", zero[i],
                      (long long)metric(p, zero[i]));
        free(p);

        json_t *a = create("key-metrics", "1", "64", "120", NULL), *b = create("key-metrics", "1", "64", "120", NULL);
        const char *ida = test_jstr(a, "id"), *idb = test_jstr(b, "id");
        int rc;
        json_decref(cli(&rc, "create", "--account", account, "--key", "key-blocked", NULL)); /* refused: blocked */
        CHECK(rc == 1, "a blocked key's create was not refused: rc=%d", rc);
        /* Three execs that run (one whose command fails is still an exec done), one of 300 ms. */
        CHECK(sh_exec(ida, "true", NULL, NULL) == 0, "exec true");
        CHECK(sh_exec(ida, "exit 3", NULL, NULL) == 3, "exec exit 3");
        int64_t t0 = test_now_ms();
        CHECK(sh_exec(ida, "sleep 0.3", NULL, NULL) == 0, "exec sleep 0.3");
        CHECK(test_now_ms() - t0 >= 300, "sleep 0.3 took less than 300 ms");
        json_decref(cli(&rc, "pause", idb, NULL));
        CHECK(rc == 0, "pause failed: rc=%d", rc);
        CHECK(sh_exec(idb, "true", NULL, NULL) != 0, "exec in a paused sandbox ran"); /* a failed exec */
        json_t *f = cli(&rc, "fork", ida, "--count", "2", NULL);
        json_t *copies = json_object_get(f, "sandboxes");
        CHECK(rc == 0 && json_array_size(copies) == 2, "fork failed: rc=%d %s", rc, json_dumps(f, 0));
        const char *copy2 = test_jstr(json_array_get(copies, 1), "id");
        json_decref(cli(&rc, "stop", copy2, NULL));
        CHECK(rc == 0, "stop failed: rc=%d", rc);

        p = metrics_page();
        static const struct {
                const char *series;
                int64_t want;
        } want[] = {
                /* a and the first copy run; b is paused; the second copy is stopped */
                { "tally_vmm_sandboxes{state=\"running\"}", 2 },
                { "tally_vmm_sandboxes{state=\"paused\"}", 1 },
                { "tally_vmm_creates_total{result=\"ok\"}", 2 },
                { "tally_vmm_creates_total{result=\"failed\"}", 1 },
                { "tally_vmm_create_duration_seconds_count", 3 },
                { "tally_vmm_forks_total{result=\"ok\"}", 1 },
                { "tally_vmm_forks_total{result=\"failed\"}", 0 },
                { "tally_vmm_fork_copies_total", 2 },
                { "tally_vmm_fork_duration_seconds_count", 1 },
                { "tally_vmm_execs_total{result=\"ok\"}", 3 },
                { "tally_vmm_execs_total{result=\"failed\"}", 1 },
                { "tally_vmm_exec_duration_seconds_count", 4 },
                { "tally_vmm_exec_duration_seconds_bucket{le=\"+Inf\"}", 4 },
                { "tally_vmm_control_commands_total", 0 },
                { "tally_vmm_registry_write_failures_total", 0 },
        };
        for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
                CHECK(metric(p, want[i].series) == want[i].want, "%s is %lld, not %lld", want[i].series,
                      (long long)metric(p, want[i].series), (long long)want[i].want);
        /* The stopped copy counts until its clean-up (final_wait_ms with no collector). */
        int64_t stopped = metric(p, "tally_vmm_sandboxes{state=\"stopped\"}");
        CHECK(stopped == 0 || stopped == 1, "stopped sandboxes: %lld, not 0 or 1", (long long)stopped);
        /* The 300 ms exec is above the 250 ms bucket and in the sum. */
        int64_t le250 = metric(p, "tally_vmm_exec_duration_seconds_bucket{le=\"0.250\"}");
        int64_t sum_us = test_metric(p, "tally_vmm_exec_duration_seconds_sum", true);
        CHECK(le250 >= 0 && le250 <= 3, "execs within 250 ms: %lld, more than the 3 that did not sleep",
              (long long)le250);
        CHECK(sum_us >= 300000, "exec time summed: %lld us, less than the 300 ms slept", (long long)sum_us);
        CHECK(test_metric(p, "tally_vmm_create_duration_seconds_sum", true) > 0, "no create time summed");
        free(p);
        for (size_t i = 0; i < json_array_size(copies); i++)
                json_decref(cli(&rc, "stop", test_jstr(json_array_get(copies, i), "id"), NULL));
        json_decref(cli(&rc, "stop", ida, NULL));
        json_decref(cli(&rc, "stop", idb, NULL));
        json_decref(f);
        json_decref(a);
        json_decref(b);
}

/* ---- the usage topic ---- */

static rd_kafka_t *usage_consumer;

static void open_usage_consumer(void)
{
        static int opened;
        char err[512], group[96];
        snprintf(group, sizeof(group), "test-vmm-%d-%d", (int)getpid(), opened++);
        usage_consumer = kafka_consumer_new(brokers, group, test_kafka_conf(NULL), NULL, err, sizeof(err));
        CHECK(usage_consumer != NULL, "consumer: %s", err);
        rd_kafka_topic_partition_list_t *t = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(t, TOPIC_USAGE, RD_KAFKA_PARTITION_UA);
        rd_kafka_subscribe(usage_consumer, t);
        rd_kafka_topic_partition_list_destroy(t);
}

struct seen {
        int n;
        struct usage_event ev[256];
};
static struct seen events;

/* Reads the usage topic until an event of type for sandbox id arrives (or timeout). */
static struct usage_event *wait_event(enum event_type type, const char *id, int timeout_ms)
{
        int64_t until = test_now_ms() + timeout_ms;
        for (;;) {
                for (int i = 0; i < events.n; i++)
                        if (events.ev[i].type == type && strcmp(events.ev[i].sandbox, id) == 0)
                                return &events.ev[i];
                if (test_now_ms() >= until)
                        return NULL;
                rd_kafka_message_t *m = rd_kafka_consumer_poll(usage_consumer, 100);
                if (!m)
                        continue;
                struct usage_event ev;
                char why[256];
                if (!m->err && event_decode(m->payload, m->len, &ev, why, sizeof(why)) == 0) {
                        bool ours = strcmp(ev.account, account) == 0 && m->key_len == strlen(account) &&
                                    memcmp(m->key, account, m->key_len) == 0;
                        if (ours && events.n < 256)
                                events.ev[events.n++] = ev;
                        else
                                event_clear(&ev);
                }
                rd_kafka_message_destroy(m);
        }
}

/* ---- the cases ---- */

/* CPU burned inside a sandbox appears in its cgroup and is not lost when it stops. */
static void test_cpu_conserved(void)
{
        json_t *sb = create("key-cpu", "1", "128", "120", NULL);
        const char *id = test_jstr(sb, "id");
        /* The burner reports the CPU time it used itself (utime + stime in clock ticks from /proc/self/stat). */
        char *out = NULL;
        int rc = sh_exec(id, "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; "
                             "set -- $(cut -d')' -f2 /proc/$$/stat); echo $(( ${12} + ${13} ))", &out, NULL);
        CHECK(rc == 0, "burn exited %d", rc);
        long ticks = out ? atol(out) : 0;
        uint64_t self_ns = (uint64_t)ticks * (1000000000ULL / (uint64_t)sysconf(_SC_CLK_TCK));
        free(out);
        CHECK(self_ns >= 200000000ULL, "the burner used only %" PRIu64 " ns: the test did not burn", self_ns);
        uint64_t during = cgroup_cpu(sb);
        CHECK(during >= self_ns, "cgroup counter %" PRIu64 " < CPU the burner measured %" PRIu64, during, self_ns);

        int src;
        json_t *st = cli(&src, "stop", id, NULL);
        CHECK(src == 0 && strcmp(test_jstr(st, "state"), "stopped") == 0, "stop: %s", json_dumps(st, 0));
        uint64_t after = cgroup_cpu(sb); /* the cgroup outlives the stop until its counter is safe */
        uint64_t final = (uint64_t)jint(st, "final_cpu_ns");
        CHECK(final == after, "final_cpu_ns %" PRIu64 " != the stopped cgroup's counter %" PRIu64, final, after);
        CHECK(final >= during, "final %" PRIu64 " < counter seen while running %" PRIu64, final, during);

        /* The registry record carries it too. */
        char rec_path[1024];
        snprintf(rec_path, sizeof(rec_path), "%s/sandboxes/%s.json", state, id);
        json_t *rec = json_load_file(rec_path, 0, NULL);
        CHECK(rec && (uint64_t)jint(rec, "final_cpu_ns") == after && strcmp(test_jstr(rec, "state"), "stopped") == 0,
              "registry record lacks the final counter: %s", rec ? json_dumps(rec, 0) : "(none)");
        json_decref(rec);

        struct usage_event *ev = wait_event(EVENT_STOPPED, id, 10000);
        CHECK(ev != NULL, "no stopped event for %s on the usage topic", id);
        if (ev)
                CHECK(ev->cpu_ns == after, "stopped event cpu_ns %" PRIu64 " != cgroup counter %" PRIu64, ev->cpu_ns,
                      after);
        struct usage_event *cr = wait_event(EVENT_CREATED, id, 5000);
        CHECK(cr && cr->nlabels == 1 && strcmp(cr->labels[0].key, "suite") == 0 && cr->vcpus == 1 &&
                      cr->mem_size_bytes == 128ULL << 20 && strcmp(cr->key, "key-cpu") == 0,
              "created event missing or without its spec and labels");

        /* Stopping twice is harmless. */
        json_t *again = cli(&src, "stop", id, NULL);
        CHECK(src == 0, "second stop failed: %s", json_dumps(again, 0));
        json_decref(again);

        /* The collector's .final lets tally-vmm remove the cgroup and the record. */
        char final_path[1024];
        snprintf(final_path, sizeof(final_path), "%s/sandboxes/%s.final", state, id);
        FILE *f = fopen(final_path, "w");
        if (f)
                fclose(f);
        const char *cpu_dir = test_jstr(sb, "cgroup_cpu");
        int64_t until = test_now_ms() + 5000;
        while ((dir_exists(cpu_dir) || access(rec_path, F_OK) == 0) && test_now_ms() < until)
                test_sleep_ms(50);
        CHECK(!dir_exists(cpu_dir) && access(rec_path, F_OK) != 0, "cgroup or record left after the final sample");
        json_decref(st);
        json_decref(sb);
}

/* The counter of a cgroup whose processes are all gone once two readings 100 ms
 * apart agree: the kernel's final figure, read by the test itself. */
static uint64_t settled_cpu(json_t *sb)
{
        const char *dir = test_jstr(sb, "cgroup_cpu");
        char procs[1024];
        snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
        for (int i = 0; i < 500; i++) {
                char *t = test_read_file(procs);
                bool empty = t && !*t;
                free(t);
                if (empty)
                        break;
                test_sleep_ms(10);
        }
        uint64_t a = cgroup_cpu(sb), b = a;
        for (int i = 0; i < 30; i++) {
                test_sleep_ms(100);
                b = cgroup_cpu(sb);
                if (a == b)
                        break;
                a = b;
        }
        CHECK(a == b, "the CPU counter of a stopped sandbox did not settle in 3 s");
        return b;
}

/* The final counter is the kernel's last word. A task leaves cgroup.procs early
 * in its exit and is charged CPU until it is released (the rest of its exit,
 * its last slice): a counter read as soon as cgroup.procs is empty bills less
 * than the kernel's final one (the chaos test saw 13,981 and 53,420 ns short).
 * A daemon that started the sandbox waits for its init, and so for the whole
 * pid namespace; a restarted one cannot: so sandboxes of many processes, two
 * of them busy, are stopped by a restarted daemon while the host is busy, and
 * each stop's final counter must equal the counter once it has settled. */
static void test_final_settled(void)
{
        enum { ROUNDS = 10 };
        json_t *sbs[ROUNDS];
        for (int i = 0; i < ROUNDS; i++)
                sbs[i] = create("key-final", "2", "256", "120",
                                "i=0; while [ $i -lt 200 ]; do sleep 1000 & i=$((i+1)); done; "
                                "(while :; do :; done) & (while :; do :; done) & wait");
        test_sleep_ms(500);
        /* The daemon restarted keeps stopped cgroups 60 s without a collector (the
         * outage case before set 300 ms), so the test reads each counter itself. */
        final_wait_ms = "60000";
        stop_daemon();
        start_daemon();
        /* Busy loops on the host (outside the sandboxes) so that the dying tasks
         * wait for a CPU in the middle of their exit, as on a loaded host. */
        pid_t hogs[4];
        for (size_t i = 0; i < sizeof(hogs) / sizeof(hogs[0]); i++)
                if ((hogs[i] = fork()) == 0)
                        for (;;)
                                ;
        int short_rounds = 0;
        int64_t slowest = 0;
        for (int i = 0; i < ROUNDS; i++) {
                int rc;
                int64_t t0 = test_now_ms();
                json_t *st = cli(&rc, "stop", test_jstr(sbs[i], "id"), NULL);
                int64_t took = test_now_ms() - t0;
                if (took > slowest)
                        slowest = took;
                CHECK(rc == 0 && strcmp(test_jstr(st, "state"), "stopped") == 0, "stop: %s", json_dumps(st, 0));
                uint64_t final = (uint64_t)jint(st, "final_cpu_ns");
                uint64_t truth = settled_cpu(sbs[i]);
                if (final != truth)
                        short_rounds++;
                CHECK(final == truth, "sandbox %d: final_cpu_ns %" PRIu64 " != the settled counter %" PRIu64
                                      " (off by %" PRId64 " ns)", i, final, truth, (int64_t)(final - truth));
                json_decref(st);
                json_decref(sbs[i]);
        }
        for (size_t i = 0; i < sizeof(hogs) / sizeof(hogs[0]); i++)
                test_stop_process(&hogs[i], SIGKILL);
        fprintf(stderr, "final_settled: %d of %d stops read the counter before it settled; the slowest stop took %" PRId64
                " ms\n", short_rounds, ROUNDS, slowest);
        char vmm_log[1024];
        snprintf(vmm_log, sizeof(vmm_log), "%s/vmm.log", work);
        char *log = test_read_file(vmm_log);
        CHECK(!log || !strstr(log, "were not seen released"), "tally-vmm did not see a stopped sandbox's tasks released");
        free(log);
}

/* The memory limit holds: a command that wants more is killed, and the group never held more. */
static void test_memory_limit(void)
{
        json_t *sb = create("key-mem", "1", "64", "120", NULL);
        const char *id = test_jstr(sb, "id");
        int small = sh_exec(id, "head -c 16000000 /dev/zero | tail -c 1 >/dev/null", NULL, NULL);
        CHECK(small == 0, "a 16 MB command failed in a 64 MiB sandbox: %d", small);
        /* tail -c N keeps N bytes in memory: 200 MB cannot fit. */
        char *err = NULL;
        int big = sh_exec(id, "dd if=/dev/zero of=/dev/null bs=200M count=1", NULL, &err);
        CHECK(big == 137, "a 200 MB command in a 64 MiB sandbox was not killed: exit %d, %s", big, err ? err : "");
        free(err);
        const char *mem = test_jstr(sb, "cgroup_memory");
        if (cgroup_version == 1) {
                uint64_t limit = read_u64(mem, "memory.limit_in_bytes");
                uint64_t peak = read_u64(mem, "memory.max_usage_in_bytes");
                CHECK(limit == 64ULL << 20, "memory.limit_in_bytes is %" PRIu64, limit);
                CHECK(peak <= limit, "peak %" PRIu64 " above the limit %" PRIu64, peak, limit);
                char path[1024];
                snprintf(path, sizeof(path), "%s/memory.oom_control", mem);
                char *oom = test_read_file(path);
                char *k = oom ? strstr(oom, "oom_kill ") : NULL;
                CHECK(k && atol(k + 9) > 0, "the kernel killed nothing at the limit: %s", oom ? oom : "(unreadable)");
                free(oom);
        } else {
                uint64_t limit = read_u64(mem, "memory.max");
                CHECK(limit == 64ULL << 20, "memory.max is %" PRIu64, limit);
                uint64_t peak = read_u64(mem, "memory.peak");
                CHECK(peak <= limit, "peak %" PRIu64 " above the limit", peak);
                char path[1024];
                snprintf(path, sizeof(path), "%s/memory.events", mem);
                char *events_text = test_read_file(path);
                char *k = events_text ? strstr(events_text, "oom_kill ") : NULL;
                CHECK(k && atol(k + 9) > 0, "the kernel killed nothing at the limit");
                free(events_text);
        }
        int rc;
        json_decref(cli(&rc, "stop", id, NULL));
        json_decref(sb);
}

/* A paused sandbox accrues no CPU; resumed, it does again. */
static void test_pause(void)
{
        json_t *sb = create("key-pause", "1", "64", "120", "while :; do :; done");
        const char *id = test_jstr(sb, "id");
        /* Let the loop burn 100 ms of CPU first, however loaded the machine is
         * (the wait is on the cgroup's own counter, bounded at 30 s). */
        for (int i = 0; i < 300 && cgroup_cpu(sb) <= 100000000ULL; i++)
                test_sleep_ms(100);
        int rc;
        json_t *p = cli(&rc, "pause", id, NULL);
        CHECK(rc == 0 && strcmp(test_jstr(p, "state"), "paused") == 0, "pause: %s", json_dumps(p, 0));
        json_decref(p);
        if (cgroup_version == 1) {
                char dir[1024];
                snprintf(dir, sizeof(dir), "/sys/fs/cgroup/freezer/%s/%s/freezer.state", parent, id);
                char *fs = test_read_file(dir);
                CHECK(fs && strcmp(fs, "FROZEN") == 0, "freezer.state is %s", fs ? fs : "(unreadable)");
                free(fs);
        }
        uint64_t a = cgroup_cpu(sb);
        CHECK(a > 100000000ULL, "the busy loop burned only %" PRIu64 " ns before the pause", a);
        test_sleep_ms(1000);
        uint64_t b = cgroup_cpu(sb);
        CHECK(a == b, "a paused sandbox accrued %" PRIu64 " ns of CPU", b - a);
        char *err = NULL;
        int ex = sh_exec(id, "true", NULL, &err);
        CHECK(ex != 0 && err && strstr(err, "paused"), "exec in a paused sandbox: rc=%d %s", ex, err ? err : "");
        free(err);
        json_t *r = cli(&rc, "resume", id, NULL);
        CHECK(rc == 0 && strcmp(test_jstr(r, "state"), "running") == 0, "resume: %s", json_dumps(r, 0));
        json_decref(r);
        test_sleep_ms(300);
        uint64_t c = cgroup_cpu(sb);
        CHECK(c > b + 50000000ULL, "resumed sandbox burned only %" PRIu64 " ns in 300 ms", c - b);
        CHECK(wait_event(EVENT_PAUSED, id, 5000) && wait_event(EVENT_RESUMED, id, 5000),
              "paused/resumed events missing");
        json_decref(cli(&rc, "stop", id, NULL));
        json_decref(sb);
}

/* A timeout stops the sandbox, with its final counter published. */
static void test_timeout(void)
{
        json_t *sb = create("key-timeout", "1", "64", "1", "sleep 1000");
        const char *id = test_jstr(sb, "id");
        pid_t pid = (pid_t)jint(sb, "pid");
        CHECK(pid_alive(pid), "the sandbox's init is not running");
        CHECK(wait_state(id, "stopped", 4000), "a 1 s sandbox was not stopped after 4 s");
        CHECK(!pid_alive(pid), "the init of a timed-out sandbox still runs");
        CHECK(wait_event(EVENT_STOPPED, id, 5000), "no stopped event after the timeout");
        json_decref(sb);

        /* A sandbox whose main process is killed from outside is stopped too, its counter kept. */
        sb = create("key-killed", "1", "64", "120", NULL);
        id = test_jstr(sb, "id");
        kill((pid_t)jint(sb, "pid"), SIGKILL);
        CHECK(wait_state(id, "stopped", 4000), "a sandbox whose init was killed still counts as running");
        struct usage_event *ev = wait_event(EVENT_STOPPED, id, 5000);
        CHECK(ev && ev->cpu_ns > 0, "no stopped event with a counter for a killed sandbox");
        json_decref(sb);
}

/* fork makes the asked number of running copies with the source's files. */
static void test_fork(void)
{
        json_t *sb = create("key-fork", "1", "64", "120", NULL);
        const char *id = test_jstr(sb, "id");
        CHECK(sh_exec(id, "echo forked-data > note.txt", NULL, NULL) == 0, "could not write a file");
        int rc;
        json_t *f = cli(&rc, "fork", id, "--count", "3", NULL);
        json_t *copies = json_object_get(f, "sandboxes");
        CHECK(rc == 0 && json_array_size(copies) == 3, "fork --count 3: %s", json_dumps(f, 0));
        CHECK(json_is_false(json_object_get(f, "processes_copied")), "process backend claims it copied processes");
        size_t i;
        json_t *c;
        json_array_foreach(copies, i, c) {
                const char *cid = test_jstr(c, "id");
                CHECK(strcmp(cid, id) != 0 && strcmp(test_jstr(c, "parent"), id) == 0, "copy %s has parent %s", cid,
                      test_jstr(c, "parent"));
                CHECK(pid_alive((pid_t)jint(c, "pid")), "copy %s is not running", cid);
                CHECK(dir_exists(test_jstr(c, "cgroup_cpu")), "copy %s has no cgroup", cid);
                char *out = NULL;
                CHECK(sh_exec(cid, "cat note.txt", &out, NULL) == 0 && out && strcmp(out, "forked-data\n") == 0,
                      "copy %s lacks the source's file: %s", cid, out ? out : "");
                free(out);
                struct usage_event *ev = wait_event(EVENT_CREATED, cid, 5000);
                CHECK(ev && strcmp(ev->parent, id) == 0, "created event of copy %s lacks its parent", cid);
                json_decref(cli(&rc, "stop", cid, NULL));
        }
        struct usage_event *fe = wait_event(EVENT_FORKED, id, 5000);
        CHECK(fe && fe->fork_count == 3, "forked event missing or wrong count");
        json_t *bad = cli(&rc, "fork", id, "--count", "11", NULL);
        CHECK(rc != 0, "fork --count 11 was accepted");
        json_decref(bad);
        json_decref(cli(&rc, "stop", id, NULL));
        json_decref(f);
        json_decref(sb);
}

/* The names of the sandbox cgroups under our parent, one per line (malloc'd). */
static char *cgroup_names(void)
{
        char dir[512];
        snprintf(dir, sizeof(dir), cgroup_version == 2 ? "/sys/fs/cgroup/%s" : "/sys/fs/cgroup/memory/%s", parent);
        DIR *d = opendir(dir);
        char *names = strdup("\n");
        struct dirent *de;
        while (d && (de = readdir(d))) {
                if (de->d_type != DT_DIR || de->d_name[0] == '.')
                        continue;
                char *n;
                if (asprintf(&n, "%s%s\n", names, de->d_name) < 0)
                        abort();
                free(names);
                names = n;
        }
        if (d)
                closedir(d);
        return names;
}

/* True if every line of after is a line of before: nothing new appeared. */
static bool nothing_new(const char *before, const char *after)
{
        char *copy = strdup(after), *save = NULL;
        bool ok = true;
        for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                char needle[256];
                snprintf(needle, sizeof(needle), "\n%s\n", line);
                if (!strstr(before, needle)) {
                        fprintf(stderr, "new: %s\n", line);
                        ok = false;
                }
        }
        free(copy);
        return ok;
}

/* The ids tally-vmm lists, one per line (malloc'd). */
static char *listed_ids(void)
{
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--socket", sock, "ls", NULL };
        char *out = NULL;
        test_run(argv, &out, NULL);
        char *ids = strdup("\n"), *save = NULL;
        for (char *line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
                if (strncmp(line, "sbx-", 4) != 0)
                        continue;
                char *sp = strchr(line, ' ');
                if (sp)
                        *sp = '\0';
                char *n;
                if (asprintf(&n, "%s%s\n", ids, line) < 0)
                        abort();
                free(ids);
                ids = n;
        }
        free(out);
        return ids;
}

/* Bad input gets a clear error and creates nothing. */
static void test_bad_input(void)
{
        char *before_cg = cgroup_names(), *before_ls = listed_ids();
        char long_label[400];
        memset(long_label, 'x', sizeof(long_label) - 1);
        long_label[sizeof(long_label) - 1] = '\0';
        char label_arg[420];
        snprintf(label_arg, sizeof(label_arg), "big=%s", long_label);
        struct {
                const char *what, *needle;
                json_t *answer;
                int rc;
        } cases[6];
        cases[0].what = "0 vCPUs";
        cases[0].needle = "vcpus";
        cases[0].answer = cli(&cases[0].rc, "create", "--account", account, "--key", "k", "--vcpus", "0", NULL);
        cases[1].what = "more memory than the host";
        cases[1].needle = "more than this host's memory";
        cases[1].answer = cli(&cases[1].rc, "create", "--account", account, "--key", "k", "--memory-mib", "99999999",
                              NULL);
        cases[2].what = "a label too long";
        cases[2].needle = "label";
        cases[2].answer = cli(&cases[2].rc, "create", "--account", account, "--key", "k", "--label", label_arg, NULL);
        cases[3].what = "an unknown backend";
        cases[3].needle = "unknown backend";
        cases[3].answer = cli(&cases[3].rc, "create", "--account", account, "--key", "k", "--backend", "xen", NULL);
        cases[4].what = "a blocked key";
        cases[4].needle = "daily spend limit";
        cases[4].answer = cli(&cases[4].rc, "create", "--account", account, "--key", "key-blocked", NULL);
        cases[5].what = "an image on the process backend";
        cases[5].needle = "has no images";
        cases[5].answer = cli(&cases[5].rc, "create", "--account", account, "--key", "k", "--image", "ubuntu", NULL);
        for (int i = 0; i < 6; i++) {
                const char *err = test_jstr(cases[i].answer, "raw_stderr");
                CHECK(cases[i].rc == 1 && strstr(err, cases[i].needle), "%s: rc=%d stderr=%s", cases[i].what,
                      cases[i].rc, err);
                json_decref(cases[i].answer);
        }
        char *after_cg = cgroup_names(), *after_ls = listed_ids();
        CHECK(nothing_new(before_cg, after_cg), "a refused create left a cgroup");
        CHECK(nothing_new(before_ls, after_ls), "a refused create left a sandbox");
        free(before_cg);
        free(after_cg);
        free(before_ls);
        free(after_ls);

        /* exec in a stopped sandbox */
        json_t *sb = create("key-bad", "1", "64", "120", NULL);
        int rc;
        json_decref(cli(&rc, "stop", test_jstr(sb, "id"), NULL));
        char *err = NULL;
        int ex = sh_exec(test_jstr(sb, "id"), "true", NULL, &err);
        CHECK(ex == 1 && err && strstr(err, "stopped"), "exec in a stopped sandbox: rc=%d %s", ex, err ? err : "");
        free(err);
        json_decref(sb);
        /* exec with output caps and a timeout */
        sb = create("key-exec", "1", "64", "120", NULL);
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--socket", sock, "exec", (char *)test_jstr(sb, "id"),
                         "--output-cap", "1000", "--timeout-ms", "700", "--", "/bin/sh", "-c",
                         "head -c 5000 /dev/zero | tr '\\0' a; echo oops >&2; sleep 30", NULL };
        char *out = NULL;
        int64_t t0 = test_now_ms();
        ex = test_run(argv, &out, &err);
        int64_t took = test_now_ms() - t0;
        CHECK(ex == 124 && out && strlen(out) == 1000 && err && strstr(err, "oops"),
              "capped, timed-out exec: rc=%d out=%zu bytes err=%s", ex, out ? strlen(out) : 0, err ? err : "");
        CHECK(took < 5000, "a 700 ms exec timeout took %lld ms", (long long)took);
        free(out);
        free(err);
        /* Without the init's exec socket (a sandbox from an older tally-vmm, a state folder
         * too deep for a socket path) exec joins the namespaces and cgroup itself. */
        char init_sock[1100];
        snprintf(init_sock, sizeof(init_sock), "%s/init.sock", test_jstr(sb, "dir"));
        CHECK(access(init_sock, F_OK) == 0, "no exec socket at %s", init_sock);
        unlink(init_sock);
        out = NULL;
        ex = sh_exec(test_jstr(sb, "id"), "cat /proc/self/cgroup; hostname", &out, NULL);
        /* Inside its cgroup namespace, rooted at the sandbox's cgroup: "/" there;
         * from any other cgroup the path would climb out ("/.."). */
        CHECK(ex == 0 && out && strstr(out, test_jstr(sb, "id")) && strstr(out, "0::/\n") && !strstr(out, "/.."),
              "exec without the init's socket did not run in the sandbox: rc=%d %s", ex, out ? out : "");
        free(out);
        /* The daemon's flags (a database URL) and environment do not show inside. */
        out = NULL;
        err = NULL;
        ex = sh_exec(test_jstr(sb, "id"), "tr '\\0' ' ' < /proc/1/cmdline; echo; tr '\\0' ' ' < /proc/1/environ; env",
                     &out, &err);
        CHECK(ex == 0 && out && strstr(out, "tally-sandbox-init") && !strstr(out, "limits-database-url") &&
                      !strstr(out, "postgresql:") && !strstr(out, "TALLY_"),
              "the daemon's command line or environment shows in the sandbox: rc=%d %s %s", ex, out ? out : "",
              err ? err : "");
        free(out);
        free(err);
        json_decref(cli(&rc, "stop", test_jstr(sb, "id"), NULL));
        json_decref(sb);
}

/* A pause command on the control topic pauses the key's running sandboxes within a second. */
static void test_control(void)
{
        json_t *a = create("key-ctl", "1", "64", "120", NULL), *b = create("key-ctl", "1", "64", "120", NULL),
               *other = create("key-other", "1", "64", "120", NULL);
        char *page = metrics_page();
        int64_t commands0 = metric(page, "tally_vmm_control_commands_total"),
                applied0 = metric(page, "tally_vmm_control_applied_total");
        free(page);
        char err[512];
        rd_kafka_t *p = kafka_producer_new(brokers, test_kafka_conf(NULL), NULL, err, sizeof(err));
        CHECK(p != NULL, "producer: %s", err);
        /* Warm the producer (connection, producer id) with a command about no sandbox of
         * ours, so the clock below measures tally-vmm, not this test's start-up. */
        struct control_command warm = { .action = CONTROL_PAUSE };
        snprintf(warm.account, sizeof(warm.account), "%s", account);
        snprintf(warm.sandbox, sizeof(warm.sandbox), "sbx-none");
        char wbuf[1024];
        int wn = control_encode(&warm, wbuf, sizeof(wbuf));
        rd_kafka_producev(p, RD_KAFKA_V_TOPIC(TOPIC_CONTROL), RD_KAFKA_V_KEY(account, strlen(account)),
                          RD_KAFKA_V_VALUE(wbuf, (size_t)wn), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        rd_kafka_flush(p, 5000);
        struct control_command c = { .action = CONTROL_PAUSE };
        snprintf(c.account, sizeof(c.account), "%s", account);
        snprintf(c.key, sizeof(c.key), "key-ctl");
        snprintf(c.reason, sizeof(c.reason), "daily_limit");
        c.issued_ns = (int64_t)time(NULL) * 1000000000LL + 999999999LL;
        char buf[1024];
        int n = control_encode(&c, buf, sizeof(buf));
        int64_t t0 = test_now_ms();
        rd_kafka_producev(p, RD_KAFKA_V_TOPIC(TOPIC_CONTROL), RD_KAFKA_V_KEY(account, strlen(account)),
                          RD_KAFKA_V_VALUE(buf, (size_t)n), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        rd_kafka_flush(p, 5000);
        bool pa = wait_state(test_jstr(a, "id"), "paused", 3000), pb = wait_state(test_jstr(b, "id"), "paused", 3000);
        int64_t took = test_now_ms() - t0;
        CHECK(pa && pb, "the key's sandboxes were not paused by the control command");
        /* tally-vmm aims at a second; the check allows the design's two (invariant 5) so a
         * loaded 2-CPU test machine does not make it flaky, and prints what it saw. */
        fprintf(stderr, "control: paused %lld ms after the command was published\n", (long long)took);
        CHECK(took <= 2000, "pausing took %lld ms from the command's publication (more than two seconds)",
              (long long)took);
        json_t *o = show(test_jstr(other, "id"));
        CHECK(strcmp(test_jstr(o, "state"), "running") == 0, "another key's sandbox was paused");
        json_decref(o);
        /* stop for the key */
        c.action = CONTROL_STOP;
        n = control_encode(&c, buf, sizeof(buf));
        rd_kafka_producev(p, RD_KAFKA_V_TOPIC(TOPIC_CONTROL), RD_KAFKA_V_KEY(account, strlen(account)),
                          RD_KAFKA_V_VALUE(buf, (size_t)n), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        rd_kafka_flush(p, 5000);
        CHECK(wait_state(test_jstr(a, "id"), "stopped", 3000) && wait_state(test_jstr(b, "id"), "stopped", 3000),
              "the control stop command did not stop the key's sandboxes");
        rd_kafka_destroy(p);
        /* Three commands read (the warm-up, the pause, the stop; other tests on the shared broker
         * may add theirs); four changes (a and b paused, then stopped: only this account's
         * sandboxes match). The count follows the change a moment later: waited for, then exact. */
        int64_t commands = -1, applied = -1;
        for (int64_t until = test_now_ms() + 3000; test_now_ms() < until; test_sleep_ms(50)) {
                page = metrics_page();
                commands = metric(page, "tally_vmm_control_commands_total") - commands0;
                applied = metric(page, "tally_vmm_control_applied_total") - applied0;
                free(page);
                if (commands >= 3 && applied >= 4)
                        break;
        }
        CHECK(commands >= 3 && applied == 4, "/metrics: %lld control commands applied to %lld sandboxes, not 3 to 4",
              (long long)commands, (long long)applied);
        int rc;
        json_decref(cli(&rc, "stop", test_jstr(other, "id"), NULL));
        json_decref(a);
        json_decref(b);
        json_decref(other);
}

/* A restarted daemon finds its running and paused sandboxes; orphaned cgroups go. */
static void test_restart(void)
{
        json_t *run = create("key-restart", "1", "64", "120", NULL), *paused = create("key-restart", "1", "64", "120", NULL);
        int rc;
        json_decref(cli(&rc, "pause", test_jstr(paused, "id"), NULL));
        /* An orphan: a cgroup with no record, as a crash mid-create would leave. */
        char orphan[512];
        snprintf(orphan, sizeof(orphan), cgroup_version == 2 ? "/sys/fs/cgroup/%s/sbx-orphan" :
                 "/sys/fs/cgroup/memory/%s/sbx-orphan", parent);
        CHECK(mkdir(orphan, 0755) == 0, "could not make an orphan cgroup %s: %s", orphan, strerror(errno));
        /* A command running through exec does not hold up the daemon's exit. */
        char *long_exec[] = { (char *)test_env("TALLY_VMM_BIN"), "--socket", sock, "exec", (char *)test_jstr(run, "id"),
                              "--timeout-ms", "60000", "--", "sleep", "50", NULL };
        pid_t client = test_spawn(long_exec, NULL, NULL);
        test_sleep_ms(500);
        int64_t t0 = test_now_ms();
        stop_daemon();
        int64_t took = test_now_ms() - t0;
        CHECK(took < 5000, "tally-vmm took %lld ms to exit with an exec running", (long long)took);
        int cstatus = 0;
        waitpid(client, &cstatus, 0);
        CHECK(WIFEXITED(cstatus) && WEXITSTATUS(cstatus) == 1, "the ended exec's client exited with %d", cstatus);
        CHECK(pid_alive((pid_t)jint(run, "pid")), "the sandbox died with the daemon");
        start_daemon();
        json_t *r = show(test_jstr(run, "id")), *p = show(test_jstr(paused, "id"));
        CHECK(strcmp(test_jstr(r, "state"), "running") == 0 && jint(r, "pid") == jint(run, "pid"),
              "the running sandbox was not found again: %s", json_dumps(r, 0));
        CHECK(strcmp(test_jstr(p, "state"), "paused") == 0, "the paused sandbox was not found again");
        char *out = NULL;
        CHECK(sh_exec(test_jstr(run, "id"), "echo still-here", &out, NULL) == 0 && out && strcmp(out, "still-here\n") == 0,
              "exec after the restart failed");
        free(out);
        CHECK(!dir_exists(orphan), "the orphaned cgroup was not removed");
        json_decref(cli(&rc, "resume", test_jstr(paused, "id"), NULL));
        json_t *st = cli(&rc, "stop", test_jstr(run, "id"), NULL);
        CHECK(rc == 0 && strcmp(test_jstr(st, "state"), "stopped") == 0, "stop after the restart failed");
        CHECK(!pid_alive((pid_t)jint(run, "pid")), "a recovered sandbox's init survived its stop");
        json_decref(st);
        json_decref(cli(&rc, "stop", test_jstr(paused, "id"), NULL));
        json_decref(r);
        json_decref(p);
        json_decref(run);
        json_decref(paused);
}

static int broker_ctl(const char *ctl_sock, const char *cmd)
{
        char *out = NULL;
        char *argv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--control-socket", (char *)ctl_sock, "ctl",
                         (char *)cmd, NULL };
        int rc = test_run(argv, &out, NULL);
        CHECK(rc == 0 && out && strncmp(out, "ok", 2) == 0, "broker ctl %s: rc=%d %s", cmd, rc, out ? out : "");
        free(out);
        return rc;
}

/* The outage case's broker down and up: the development broker's `ctl`, or
 * on Apache Kafka its one node killed (SIGKILL) and started again on its data. */
static void outage_broker(const char *ctl_sock, const char *cmd)
{
        if (!outage_kafka.apache)
                broker_ctl(ctl_sock, cmd);
        else if (strcmp(cmd, "down") == 0)
                test_kafka_kill_node(&outage_kafka, 1);
        else
                test_kafka_restart_node(&outage_kafka, 1);
}

/* While the broker is down, a stopped sandbox's cgroup and record stay, even
 * with the collector's final sample taken and the wait over: the stopped event
 * is not yet acknowledged. Once the broker is back, the event arrives with the
 * final counter and only then the cgroup goes. Runs against a private broker
 * (the fault must not disturb other tests) and a daemon of its own. */
static void test_outage(void)
{
        stop_daemon();
        rd_kafka_consumer_close(usage_consumer);
        rd_kafka_destroy(usage_consumer);
        char file[1024], ctl_sock[1024], log[1024];
        snprintf(file, sizeof(file), "%s/broker.bootstrap", work);
        snprintf(ctl_sock, sizeof(ctl_sock), "%s/broker.sock", work);
        snprintf(log, sizeof(log), "%s/broker.log", work);
        if (test_kafka_is_apache()) {
                char dir[1100];
                snprintf(dir, sizeof(dir), "%s/kafka-outage", work);
                test_kafka_start(&outage_kafka, dir, 2, 1);
                brokers = outage_kafka.bootstrap;
        } else {
                char *argv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--partitions", "2", "--bootstrap-file", file,
                                 "--control-socket", ctl_sock, NULL };
                broker_pid = test_spawn(argv, NULL, log);
                if (test_wait_file(file, 10000) < 0) {
                        CHECK(0, "the private broker did not start");
                        return;
                }
                brokers = test_read_file(file);
        }
        final_wait_ms = "300";
        free(state);
        free(sock);
        if (asprintf(&state, "%s/state-outage", work) < 0 || asprintf(&sock, "%s/vmm-outage.sock", work) < 0)
                abort();
        open_usage_consumer();
        start_daemon();
        json_t *sb = create("key-outage", "1", "64", "120", NULL);
        const char *id = test_jstr(sb, "id");
        CHECK(sh_exec(id, "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done", NULL, NULL) == 0, "burn failed");
        outage_broker(ctl_sock, "down");
        int rc;
        json_t *st = cli(&rc, "stop", id, NULL);
        uint64_t final = (uint64_t)jint(st, "final_cpu_ns");
        CHECK(rc == 0 && final > 0 && final == cgroup_cpu(sb), "stop with the broker down: %s", json_dumps(st, 0));
        char final_path[1024], rec_path[1024];
        snprintf(final_path, sizeof(final_path), "%s/sandboxes/%s.final", state, id);
        snprintf(rec_path, sizeof(rec_path), "%s/sandboxes/%s.json", state, id);
        FILE *f = fopen(final_path, "w");
        if (f)
                fclose(f);
        test_sleep_ms(2000); /* well past final_wait_ms */
        const char *cpu_dir = test_jstr(sb, "cgroup_cpu");
        CHECK(dir_exists(cpu_dir) && access(rec_path, F_OK) == 0,
              "the cgroup or record went before the stopped event was acknowledged");
        outage_broker(ctl_sock, "up");
        int64_t until = test_now_ms() + 30000;
        while (dir_exists(cpu_dir) && test_now_ms() < until)
                test_sleep_ms(100);
        CHECK(!dir_exists(cpu_dir) && access(rec_path, F_OK) != 0,
              "the cgroup stayed after the broker came back");
        if (outage_kafka.apache) {
                /* The test's own reader, connected to the node that was killed, can take
                 * minutes to find the restarted group coordinator: a new one reads the topic. */
                rd_kafka_destroy_flags(usage_consumer, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
                open_usage_consumer();
        }
        struct usage_event *ev = wait_event(EVENT_STOPPED, id, outage_kafka.apache ? 60000 : 20000);
        CHECK(ev && ev->cpu_ns == final, "the stopped event after the outage carries %" PRIu64 ", wanted %" PRIu64,
              ev ? ev->cpu_ns : 0, final);
        json_decref(st);
        json_decref(sb);
}

static void make_limits_db(void)
{
        db_url = test_db_create("vmm");
        PGconn *c = PQconnectdb(db_url);
        /* tally-vmm reads it as its own role, tally_vmm (test_spawn), as it reads key_blocks */
        PGresult *r = PQexec(c, "CREATE TABLE blocked (account_id text, key_id text);"
                                "GRANT SELECT ON blocked TO tally_vmm");
        CHECK(PQresultStatus(r) == PGRES_COMMAND_OK, "create table: %s", PQerrorMessage(c));
        PQclear(r);
        char sql[256];
        snprintf(sql, sizeof(sql), "INSERT INTO blocked VALUES ('%s', 'key-blocked')", account);
        r = PQexec(c, sql);
        PQclear(r);
        PQfinish(c);
}

int main(void)
{
        snprintf(parent, sizeof(parent), "tally-test-vmm-%d", (int)getpid());
        snprintf(account, sizeof(account), "acct-vmm-%d", (int)getpid());
        work = test_tmpdir("vmm");
        if (asprintf(&state, "%s/state", work) < 0 || asprintf(&sock, "%s/vmm.sock", work) < 0)
                return 1;
        test_cleanup_at_exit(cleanup);
        brokers = test_env("TALLY_TEST_BROKERS");
        make_limits_db();
        metrics_port = test_free_port();
        snprintf(metrics_port_arg, sizeof(metrics_port_arg), "%d", metrics_port);
        open_usage_consumer();
        start_daemon();
        const struct test_case cases[] = {
                { "metrics", test_metrics },
                { "cpu_conserved", test_cpu_conserved }, { "memory_limit", test_memory_limit },
                { "pause", test_pause },                 { "timeout", test_timeout },
                { "fork", test_fork },                   { "bad_input", test_bad_input },
                { "control", test_control },             { "restart", test_restart },
                { "outage", test_outage },               { "final_settled", test_final_settled },
        };
        TEST_RUN_CASES(cases);
        stop_daemon();
        rd_kafka_consumer_close(usage_consumer);
        rd_kafka_destroy(usage_consumer);
        for (int i = 0; i < events.n; i++)
                event_clear(&events.ev[i]);
        return test_result();
}
