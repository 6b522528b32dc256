/* Integration: the whole pipeline under faults, checked against the truth.
 *
 * Every part is a real process: a private PostgreSQL cluster (the suite's is
 * shared by concurrent tests, and this test restarts its own), the
 * development broker (with its control socket), tally-vmm with process
 * sandboxes in real cgroups, tally-collector and tally-aggregator. A seeded
 * random schedule pauses, resumes, forks, stops and creates sandboxes that
 * burn CPU, and kill -9s the collector, the aggregator and the vmm and starts
 * them again (TALLY_CHAOS_KILLS, default 24); once it takes the broker down for
 * 30 s (`ctl down` / `ctl up`), once it restarts PostgreSQL (an immediate
 * stop: crash recovery). TALLY_CHAOS_SEED replays a run.
 *
 * At the end, for every sandbox: the CPU billed equals, to the ns, its cgroup's
 * counter as the test reads it from the kernel once its processes ended; the
 * time billed running (memory held) and paused (storage held) lies within the
 * moments the test observed around its own create/pause/resume/fork/stop
 * calls (each bound a call's round trip); and the key's spend alerts
 * (alert_only, a limit the run passes) exist once each: 50, 80, 100. */
#include "pipe.h"
#include "support.h"
#include "timeutil.h"
#include "vmmtest.h"

#include <errno.h>
#include <libpq-fe.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS 200
#define MEM_BYTES (UINT64_C(128) << 20)
#define MAX_SB 64
#define LIVE_MAX 7
/* The key's daily limit, nano-dollars: a few seconds of one sandbox. */
#define LIMIT_ND 50

static struct pipeline P;
static uint64_t rng;
static char lib_sh[600], pg_data[600], pg_log[600], pg_port[16];
static char broker_sock[600], broker_file[600];
static pid_t broker;
static int vmms, aggregators, kills, kills_by[3];
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

/* ---- the private PostgreSQL, through scripts/lib.sh as the suite's ---- */

static int lib(const char *fn, const char *a1, const char *a2, const char *a3, char **out)
{
        char *err = NULL;
        char script[128];
        snprintf(script, sizeof(script), "source \"$0\"; %s \"$@\"", fn);
        char *argv[] = { "/bin/bash", "-c", script, lib_sh, (char *)a1, (char *)a2, (char *)a3, NULL };
        int rc = test_run(argv, out, &err);
        if (rc != 0)
                fprintf(stderr, "%s: exit %d: %s\n", fn, rc, err ? err : "");
        free(err);
        return rc;
}

static void pg_start_private(void)
{
        /* free_port only knows nobody listens: a port an outgoing connection
         * uses cannot be bound either. Another port then. */
        bool up = false;
        for (int attempt = 0; attempt < 5 && !up; attempt++) {
                char *port = NULL;
                if (lib("free_port", NULL, NULL, NULL, &port) != 0 || !port) {
                        fprintf(stderr, "FAIL: no free port for PostgreSQL\n");
                        exit(1);
                }
                snprintf(pg_port, sizeof(pg_port), "%d", atoi(port));
                free(port);
                up = lib("pg_start", pg_data, pg_port, pg_log, NULL) == 0;
        }
        if (!up) {
                fprintf(stderr, "FAIL: the test's PostgreSQL did not start (log %s)\n", pg_log);
                exit(1);
        }
        char url[128];
        snprintf(url, sizeof(url), "postgresql://tally@127.0.0.1:%s/postgres", pg_port);
        setenv("TALLY_TEST_PG_URL", url, 1);
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
        for (int attempt = 0; attempt < 5 && !(up = lib("pg_start", pg_data, pg_port, pg_log, NULL) == 0); attempt++)
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

static const char *const daemon_names[3] = { "collector", "aggregator", "vmm" };

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
        if (which == 1 && !aggregator_working())
                which = rnd_in(0, 1) ? 0 : 2;
        pid_t *pid = which == 0 ? &P.collector : which == 1 ? &P.aggregator : &P.vmm;
        if (which == 1 && rnd_in(0, 1))
                wait_commit(3);
        kill9(pid);
        kills++;
        if (which == 2)
                note_vmm_kill();
        fprintf(stderr, "chaos: kill -9 %s (%d)\n", daemon_names[which], kills);
        kills_by[which]++;
        if (which != 2)
                test_sleep_ms(rnd_in(0, 1000)); /* down a while; the vmm's API is needed at once */
        if (which == 0)
                pipe_collector_start(&P);
        else if (which == 1)
                aggregator_start();
        else
                vmm_start();
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
                 " VALUES ('key_chaos', 'acct_pipe', sha256('key_chaos'), %d, 'alert_only')", LIMIT_ND);
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
        pipe_daemon_stop(P.aggregator);
        pipe_daemon_stop(P.collector);
        pipe_daemon_stop(P.vmm);
        P.aggregator = P.collector = P.vmm = -1;
        pipe_daemon_stop(broker);
        if (test_failures || getenv("TALLY_CHAOS_LOGS")) {
                char cmd[1400];
                snprintf(cmd, sizeof(cmd), "for f in %s/*.log; do echo \"---- $f\"; tail -c ${TALLY_CHAOS_LOG_TAIL:-2500} \"$f\"; done >&2",
                         P.state_dir);
                char *argv[] = { "/bin/sh", "-c", cmd, NULL }, *tails = NULL;
                test_run(argv, NULL, &tails);
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
        rng = seed ? seed : 1;
        fprintf(stderr, "chaos: seed %" PRIu64 " (replay: TALLY_CHAOS_SEED=%" PRIu64 "), %d kills\n", seed, seed,
                target);
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
                        continue;
                }
                int roll = rnd_in(0, 99);
                if (roll < 40 && kills < target) {
                        kill_one(rnd_in(0, 2));
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
        fprintf(stderr, "chaos: %d kills (collector %d, aggregator %d, vmm %d) in %" PRId64 " s\n", kills,
                kills_by[0], kills_by[1], kills_by[2], (time_boot_ns() - t0) / NS_PER_SEC);

        /* The end: every sandbox stopped, its truth read, while the aggregator
         * is down; once their last messages are in the broker, the aggregator
         * starts and is killed right after its first commit (which holds
         * them), and starts again. Then the pipeline drains. */
        fprintf(stderr, "chaos: the aggregator's committed position %" PRId64 "\n", committed());
        kill9(&P.aggregator);
        kills++;
        for (int i = 0; i < nsb; i++)
                if (sbs[i].live)
                        stop_one(&sbs[i]);
        for (int i = 0; i < nsb; i++)
                pipe_wait_removed(&P, sbs[i].s.id, 60000);
        aggregator_start();
        CHECK(wait_commit(60), "the aggregator committed nothing within 60 s of its start");
        kill9(&P.aggregator);
        kills++;
        aggregator_start();
        fprintf(stderr, "chaos: %d kills in all\n", kills);
        pipe_wait_caught_up(&P, 90000);

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
                cpu_total += (int64_t)x->s.truth_cpu_ns;
                run_lo_total += x->run_lo;
        }
        /* The spend by hand (default plan, nano-dollars x 3.6e12): CPU 25,000,000
         * per CPU-hour, 128 MiB held 937,500 per hour; storage left out (a floor). */
        __int128 spend = (__int128)cpu_total * 25000000 + (__int128)run_lo_total * 937500;
        CHECK(spend >= (__int128)LIMIT_ND * 3600000000000, "the run spent less than the key's limit");
        char *alerts = pipe_query(&P, "SELECT string_agg(threshold_pct::text, ',' ORDER BY threshold_pct) FROM alerts"
                                      " WHERE key_id = 'key_chaos'");
        fprintf(stderr, "chaos: %d sandboxes, cpu %" PRId64 " ns, alerts %s\n", nsb, cpu_total,
                alerts ? alerts : "none");
        CHECK(alerts && strcmp(alerts, "50,80,100") == 0, "alerts %s, wanted 50,80,100 once each",
              alerts ? alerts : "none");
        free(alerts);
        fprintf(stderr, "chaos: seed %" PRIu64 "\n", seed);
        PQfinish(watch);
        finish();
        free(P.dir);
        return test_result();
}
