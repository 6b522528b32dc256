/* Integration: kill -9 of tally-collector mid-run while sandboxes stop, then a
 * restart: no sandbox's final counter is missing. Three groups of sandboxes:
 * stopped and acknowledged before the kill; stopped while the (private)
 * broker was down, so their finals sat unacknowledged in the spool at the
 * kill; stopped while the collector was dead, which it comes back to 3 s
 * late: their finals are dated at the stop and carry the life the test
 * measured, not the 3 s more a collector that stamps its own tick would bill.
 * Every final counter is the cgroup's, read by the test from the kernel.
 * Sequence numbers keep increasing across the restart within each epoch. */
#include "sandboxes.h"
#include "support.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define PER_GROUP 3
#define SANDBOXES (3 * PER_GROUP)

/* Waits for <id>.final; a timeout is a failure. */
static void wait_marked(struct test_sandbox *sb, const char *state)
{
        for (int waited = 0; waited < 10000 && !tsb_final_marked(sb, state); waited += 50)
                msleep(50);
        CHECK(tsb_final_marked(sb, state), "%s: no .final after 10 s", sb->rec.id);
}

#define LATE_MS 3000

int main(void)
{
        char *dir = test_tmpdir("collector-kill");
        char state[600], log1[600], log2[600], prefix[64];
        snprintf(state, sizeof(state), "%s/state", dir);
        snprintf(log1, sizeof(log1), "%s/collector-1.log", dir);
        snprintf(log2, sizeof(log2), "%s/collector-2.log", dir);
        snprintf(prefix, sizeof(prefix), "kil%d_", (int)getpid());
        mkdir(state, 0755);
        struct private_broker b;
        private_broker_start(&b, dir);

        struct test_sandbox sb[SANDBOXES];
        for (int i = 0; i < SANDBOXES; i++) {
                char id[96], acct[32];
                snprintf(id, sizeof(id), "%s%d", prefix, i);
                snprintf(acct, sizeof(acct), "acct_kill%d", i % 4);
                tsb_create(&sb[i], state, id, acct, i % 3 == 2 ? 2 : 1, 20 + 5 * i);
        }
        const char *extra[] = { "--tick-ms", "100", NULL };
        pid_t collector = collector_start(state, b.bootstrap, log1, extra);
        struct consumer *c = consumer_new(b.bootstrap);
        size_t n = 0;
        for (int waited = 0; waited < 20000 && n < SANDBOXES * 2; waited += 300) {
                consumer_poll(c, prefix, 300);
                consumer_items(c, &n);
        }
        CHECK(n >= SANDBOXES * 2, "only %zu samples before the kill", n);

        /* Group 1: stopped, finals acknowledged, removed by the vmm. */
        for (int i = 0; i < PER_GROUP; i++) {
                tsb_stop(&sb[i], state);
                wait_marked(&sb[i], state);
                CHECK(tsb_final_marked(&sb[i], state), "%s: no .final", sb[i].rec.id);
                tsb_remove(&sb[i], state);
        }
        msleep(500);
        /* Group 2: stopped while the broker is down; the finals wait in the spool, unacknowledged. */
        private_broker_ctl(&b, "down");
        for (int i = PER_GROUP; i < 2 * PER_GROUP; i++) {
                tsb_stop(&sb[i], state);
                wait_marked(&sb[i], state);
                CHECK(tsb_final_marked(&sb[i], state), "%s: no .final", sb[i].rec.id);
                tsb_remove(&sb[i], state);
        }
        kill(collector, SIGKILL);
        int st;
        waitpid(collector, &st, 0);
        CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the collector was not killed by SIGKILL");
        /* The proof that the kill hit unacknowledged finals: group 2's are on disk, not on the broker. */
        char path[800];
        for (int i = PER_GROUP; i < 2 * PER_GROUP; i++) {
                snprintf(path, sizeof(path), "%s/collector/spool/%s.json", state, sb[i].rec.id);
                CHECK(access(path, F_OK) == 0, "%s: no spooled final at the kill", sb[i].rec.id);
        }
        private_broker_ctl(&b, "up");
        /* Group 3: stopped while no collector runs; the vmm keeps their records and cgroups. */
        for (int i = 2 * PER_GROUP; i < SANDBOXES; i++)
                tsb_stop(&sb[i], state);
        msleep(LATE_MS);

        collector = collector_start(state, b.bootstrap, log2, extra);
        for (int i = 2 * PER_GROUP; i < SANDBOXES; i++) {
                wait_marked(&sb[i], state);
                CHECK(tsb_final_marked(&sb[i], state), "%s: no .final after the restart", sb[i].rec.id);
                tsb_remove(&sb[i], state);
        }
        int arrived = 0;
        for (int waited = 0; waited < 60000 && arrived < SANDBOXES; waited += 500) {
                consumer_poll(c, prefix, 500);
                arrived = 0;
                for (int i = 0; i < SANDBOXES; i++) {
                        uint64_t cpu;
                        arrived += published_finals(c, sb[i].rec.id, &cpu) > 0;
                }
        }
        for (int i = 0; i < SANDBOXES; i++) {
                uint64_t cpu = 0;
                int finals = published_finals(c, sb[i].rec.id, &cpu);
                CHECK(finals >= 1, "%s (group %d): final sample missing after kill -9 and restart", sb[i].rec.id,
                      i / PER_GROUP + 1);
                CHECK(finals == 0 || cpu == sb[i].truth_cpu_ns, "%s: final counter %" PRIu64 ", the kernel said %" PRIu64,
                      sb[i].rec.id, cpu, sb[i].truth_cpu_ns);
        }
        /* Every final, and above all those taken late: dated at the stop (10 ms rule), held time =
         * the life the test measured on the boot clock (stop - creation), to the nanosecond. */
        const struct published *f = consumer_items(c, &n);
        for (int i = 0; i < SANDBOXES; i++)
                for (size_t k = 0; k < n; k++) {
                        if (!f[k].final || strcmp(f[k].sandbox, sb[i].rec.id) != 0)
                                continue;
                        int64_t off = f[k].wall_ns - sb[i].stopped_wall;
                        CHECK(off < 10000000 && off > -10000000,
                              "%s (group %d): final dated %" PRId64 " ms from the stop", sb[i].rec.id,
                              i / PER_GROUP + 1, off / 1000000);
                        uint64_t life = (uint64_t)(sb[i].stopped_boot - sb[i].created_boot);
                        CHECK(f[k].held_known && f[k].running_ns == life && f[k].paused_ns == 0,
                              "%s (group %d): final held running %" PRIu64 " ns, it lived %" PRIu64, sb[i].rec.id,
                              i / PER_GROUP + 1, f[k].running_ns, life);
                        break;
                }
        /* Across the restart: within an epoch, a later sample never has a lower seq or counter;
         * a repeated final (re-sent from the spool) is the same sample again. */
        const struct published *p = consumer_items(c, &n);
        for (size_t i = 0; i < n; i++)
                for (size_t j = i + 1; j < n; j++) {
                        if (strcmp(p[i].sandbox, p[j].sandbox) != 0 || p[i].epoch != p[j].epoch)
                                continue;
                        bool repeat = p[i].seq == p[j].seq && p[i].cpu_ns == p[j].cpu_ns && p[i].final == p[j].final;
                        CHECK(repeat || p[j].seq > p[i].seq, "%s: seq %" PRIu64 " after %" PRIu64 " in epoch %" PRIu64,
                              p[i].sandbox, p[j].seq, p[i].seq, p[i].epoch);
                        CHECK(p[j].cpu_ns >= p[i].cpu_ns, "%s: counter went down within an epoch", p[i].sandbox);
                }
        CHECK(collector_stop(collector) == 0, "the restarted collector did not stop cleanly");
        consumer_free(c);
        private_broker_stop(&b);
        tsb_cgroup_parent_remove();
        if (test_failures) {
                char *l = test_read_file(log1);
                fprintf(stderr, "first collector's log:\n%s\n", l ? l : "");
                free(l);
                l = test_read_file(log2);
                fprintf(stderr, "restarted collector's log:\n%s\n", l ? l : "");
                free(l);
        }
        free(dir);
        return test_result();
}
