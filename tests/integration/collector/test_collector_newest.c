/* Integration: the queue bound and the newest sample. A private tally-broker is
 * taken down (`ctl down`) while a collector with queue_max 2 and a 100 ms tick
 * samples 5 sandboxes whose CPU counters keep rising (a process burning a
 * little CPU in each cgroup), so the queue overflows for seconds. Still during
 * the outage the burners are killed, the test reads each cgroup's counter
 * itself, and after ten more ticks the cgroups are removed (records kept), so
 * no newer reading exists; then the broker comes back. For every sandbox the
 * highest cpu_ns published must be exactly the counter the test read (the
 * newest sample survived the overflow), at most queue_max + one per sandbox of
 * the samples taken during the outage arrive (the bound), and per sandbox seq
 * rises and cpu_ns never falls in publish order. Before the outage every
 * sandbox must be published despite the tiny queue (no sandbox starves). */
#include "sandboxes.h"
#include "support.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SANDBOXES 5
#define QUEUE_MAX 2
#define BURN_S 5

static struct test_sandbox sb[SANDBOXES];
static pid_t burner[SANDBOXES];
static int created;
static char state[600];
static pid_t collector, broker_pid;

static int64_t wall_ns(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t cpu_ns_self(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void join(const char *dir)
{
        char procs[600];
        snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
        FILE *f = fopen(procs, "w");
        if (!f || fputs("0", f) < 0 || fclose(f) != 0)
                _exit(2);
}

/* A process in the sandbox's cgroup(s) burning about 3 ms of CPU every 20 ms until killed. */
static pid_t start_burner(const struct test_sandbox *s)
{
        pid_t pid = fork();
        if (pid == 0) {
                join(s->cpu_dir);
                if (s->version == 1)
                        join(s->mem_dir);
                volatile uint64_t x = 0;
                for (;;) {
                        int64_t until = cpu_ns_self() + 3000000;
                        while (cpu_ns_self() < until)
                                for (int i = 0; i < 10000; i++)
                                        x += (uint64_t)i;
                        msleep(17);
                }
        }
        return pid;
}

static void stop_burner(int i)
{
        if (burner[i] > 0) {
                kill(burner[i], SIGKILL);
                waitpid(burner[i], NULL, 0);
                burner[i] = 0;
        }
        if (sb[i].child > 0) {
                kill(sb[i].child, SIGKILL);
                waitpid(sb[i].child, NULL, 0);
                sb[i].child = 0;
        }
}

/* Runs on every exit, a failed one too: no process or cgroup is left behind. */
static void cleanup(void)
{
        if (collector > 0) {
                kill(collector, SIGKILL);
                waitpid(collector, NULL, 0);
                collector = 0;
        }
        for (int i = 0; i < created; i++) {
                stop_burner(i);
                if (!sb[i].removed)
                        tsb_remove(&sb[i], state);
        }
        if (broker_pid > 0) {
                kill(broker_pid, SIGTERM);
                waitpid(broker_pid, NULL, 0);
                broker_pid = 0;
        }
        tsb_cgroup_parent_remove();
}

static uint64_t metric(const char *text, const char *name)
{
        char key[128];
        snprintf(key, sizeof(key), "\n%s ", name);
        const char *p = text ? strstr(text, key) : NULL;
        return p ? strtoull(p + strlen(key), NULL, 10) : UINT64_MAX;
}

int main(void)
{
        char *dir = test_tmpdir("collector-newest");
        char log[600], prefix[64], port[16];
        snprintf(state, sizeof(state), "%s/state", dir);
        snprintf(log, sizeof(log), "%s/collector.log", dir);
        snprintf(prefix, sizeof(prefix), "new%d_", (int)getpid());
        mkdir(state, 0755);
        atexit(cleanup);
        struct private_broker b;
        private_broker_start(&b, dir);
        broker_pid = b.pid;

        for (int i = 0; i < SANDBOXES; i++) {
                char id[96], acct[32];
                snprintf(id, sizeof(id), "%s%d", prefix, i);
                snprintf(acct, sizeof(acct), "acct_new%d", i % 3);
                tsb_create(&sb[i], state, id, acct, i % 2 ? 2 : 1, 20);
                created = i + 1;
                burner[i] = start_burner(&sb[i]);
                CHECK(burner[i] > 0, "could not start a burner for %s", id);
        }
        int metrics_port = test_free_port();
        snprintf(port, sizeof(port), "%d", metrics_port);
        const char *extra[] = { "--tick-ms", "100", "--queue-max", "2", "--metrics-port", port, NULL };
        collector = collector_start(state, b.bootstrap, log, extra);
        struct consumer *c = consumer_new(b.bootstrap);

        /* Every sandbox is sampled and published before the fault. */
        int seen = 0;
        for (int waited = 0; waited < 20000 && seen < SANDBOXES; waited += 500) {
                consumer_poll(c, prefix, 500);
                size_t n;
                const struct published *p = consumer_items(c, &n);
                seen = 0;
                for (int i = 0; i < SANDBOXES; i++)
                        for (size_t k = 0; k < n; k++)
                                if (strcmp(p[k].sandbox, sb[i].rec.id) == 0) {
                                        seen++;
                                        break;
                                }
        }
        CHECK(seen == SANDBOXES, "only %d of %d sandboxes published before the outage", seen, SANDBOXES);
        /* A consumer does not always find a mock broker again after an outage: read everything afresh later. */
        consumer_free(c);

        private_broker_ctl(&b, "down");
        int64_t down_wall = wall_ns();
        uint64_t at_down[SANDBOXES];
        for (int i = 0; i < SANDBOXES; i++)
                at_down[i] = tsb_read_cpu(&sb[i]);
        /* 50 ticks of rising counters against a queue of 2. */
        sleep(BURN_S);
        char *metrics = http_get_metrics(metrics_port);
        CHECK(metrics && strstr(metrics, "200 OK"), "GET /metrics failed during the outage");
        CHECK(metric(metrics, "tally_collector_queue_depth") <= QUEUE_MAX,
              "queue_depth %" PRIu64 " during the outage, queue_max is %d", metric(metrics, "tally_collector_queue_depth"),
              QUEUE_MAX);
        CHECK(metric(metrics, "tally_collector_pending_newest") == SANDBOXES,
              "pending_newest %" PRIu64 " during the outage, wanted every sandbox (%d)",
              metric(metrics, "tally_collector_pending_newest"), SANDBOXES);
        free(metrics);

        /* Still down: the counters stop changing; the test's own reading is the truth. */
        uint64_t truth[SANDBOXES];
        for (int i = 0; i < SANDBOXES; i++) {
                stop_burner(i);
                truth[i] = tsb_read_cpu(&sb[i]);
                CHECK(truth[i] > at_down[i] + 10000000,
                      "%s: counter rose only from %" PRIu64 " to %" PRIu64 " during the outage", sb[i].rec.id,
                      at_down[i], truth[i]);
        }
        msleep(1000); /* ten ticks that read the final counters */
        for (int i = 0; i < SANDBOXES; i++)
                CHECK(tsb_read_cpu(&sb[i]) == truth[i], "%s: counter still changing after its processes died",
                      sb[i].rec.id);
        /* The cgroups go (the records stay): nothing newer can be read, so after the outage a sample
         * with the final counter can only be one the collector kept while the broker was down. */
        for (int i = 0; i < SANDBOXES; i++) {
                CHECK(rmdir(sb[i].cpu_dir) == 0, "could not remove %s: %m", sb[i].cpu_dir);
                if (sb[i].version == 1)
                        CHECK(rmdir(sb[i].mem_dir) == 0, "could not remove %s: %m", sb[i].mem_dir);
        }
        msleep(300);
        CHECK(kill(collector, 0) == 0, "the collector died during the outage");
        int64_t up_wall = wall_ns();
        private_broker_ctl(&b, "up");
        c = consumer_new(b.bootstrap);

        /* Until every sandbox's outage-time samples include its counter. */
        int done = 0;
        for (int waited = 0; waited < 120000 && done < SANDBOXES; waited += 500) {
                consumer_poll(c, prefix, 500);
                size_t n;
                const struct published *p = consumer_items(c, &n);
                done = 0;
                for (int i = 0; i < SANDBOXES; i++)
                        for (size_t k = 0; k < n; k++)
                                if (strcmp(p[k].sandbox, sb[i].rec.id) == 0 && p[k].cpu_ns == truth[i]) {
                                        done++;
                                        break;
                                }
        }
        CHECK(done == SANDBOXES, "after 120 s only %d of %d sandboxes published their counter taken during the outage",
              done, SANDBOXES);
        consumer_poll(c, prefix, 2000); /* and whatever follows, for the order checks */

        size_t n;
        const struct published *p = consumer_items(c, &n);
        size_t in_outage = 0;
        for (int i = 0; i < SANDBOXES; i++) {
                uint64_t max_outage = 0, max_before = 0, last_seq = 0, last_cpu = 0;
                int outage = 0, total = 0;
                for (size_t k = 0; k < n; k++) {
                        if (strcmp(p[k].sandbox, sb[i].rec.id) != 0)
                                continue;
                        CHECK(total == 0 || p[k].seq > last_seq, "%s: seq %" PRIu64 " after %" PRIu64, sb[i].rec.id,
                              p[k].seq, last_seq);
                        CHECK(p[k].cpu_ns >= last_cpu, "%s: cpu_ns %" PRIu64 " published after %" PRIu64,
                              sb[i].rec.id, p[k].cpu_ns, last_cpu);
                        CHECK(p[k].cpu_ns <= truth[i], "%s: cpu_ns %" PRIu64 " above the counter %" PRIu64,
                              sb[i].rec.id, p[k].cpu_ns, truth[i]);
                        CHECK(!p[k].final && p[k].epoch == 1, "%s: a final or a new epoch", sb[i].rec.id);
                        last_seq = p[k].seq;
                        last_cpu = p[k].cpu_ns;
                        total++;
                        if (p[k].wall_ns < down_wall && p[k].cpu_ns > max_before)
                                max_before = p[k].cpu_ns;
                        CHECK(p[k].wall_ns < up_wall, "%s: a sample taken after its cgroup was removed", sb[i].rec.id);
                        if (p[k].wall_ns >= down_wall) {
                                outage++;
                                if (p[k].cpu_ns > max_outage)
                                        max_outage = p[k].cpu_ns;
                        }
                }
                in_outage += (size_t)outage;
                CHECK(total > 0, "%s: nothing published", sb[i].rec.id);
                CHECK(outage > 0, "%s: no sample taken during the outage arrived", sb[i].rec.id);
                CHECK(max_outage == truth[i],
                      "%s: newest sample taken during the outage says %" PRIu64 ", the kernel said %" PRIu64,
                      sb[i].rec.id, max_outage, truth[i]);
                CHECK(max_before < truth[i], "%s: the counter %" PRIu64 " was published before the outage",
                      sb[i].rec.id, truth[i]);
        }
        /* At most queue_max waited in the queue, plus one newest sample per sandbox. */
        CHECK(in_outage <= QUEUE_MAX + SANDBOXES, "%zu samples taken during the outage arrived, bound %d", in_outage,
              QUEUE_MAX + SANDBOXES);

        int rc = collector_stop(collector);
        collector = 0;
        CHECK(rc == 0, "the collector did not stop cleanly (%d)", rc);
        if (test_failures) {
                for (size_t k = 0; k < n; k++)
                        if (strcmp(p[k].sandbox, sb[0].rec.id) == 0)
                                fprintf(stderr, "%s seq=%" PRIu64 " cpu_ns=%" PRIu64 " at %+.3f s from the outage's start\n",
                                        p[k].sandbox, p[k].seq, p[k].cpu_ns, (double)(p[k].wall_ns - down_wall) / 1e9);
                fprintf(stderr, "broker back up at %+.3f s\n", (double)(up_wall - down_wall) / 1e9);
                char *l = test_read_file(log);
                fprintf(stderr, "collector log:\n%s\n", l ? l : "");
                free(l);
        }
        consumer_free(c);
        free(dir);
        return test_result();
}
