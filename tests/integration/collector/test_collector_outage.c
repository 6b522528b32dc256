/* Integration: the development broker goes down for 30 s (a private
 * tally-broker, `ctl down` then `ctl up`) while sandboxes stop. The collector
 * spools their final samples, lets the vmm remove the cgroups, and once the
 * broker is back every final sample arrives with the exact counter the kernel
 * reported; the spool is empty afterwards. The queue of ordinary samples is
 * bounded to 4 here, so it overflows during the outage. */
#include "sandboxes.h"
#include "support.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SANDBOXES 6
#define OUTAGE_S 30

static int spool_files(const char *state)
{
        char cmd[700];
        snprintf(cmd, sizeof(cmd), "ls %s/collector/spool | grep -c '\\.json$'", state);
        FILE *f = popen(cmd, "r");
        int n = -1;
        if (f) {
                if (fscanf(f, "%d", &n) != 1)
                        n = -1;
                pclose(f);
        }
        return n;
}

int main(void)
{
        char *dir = test_tmpdir("collector-outage");
        char state[600], log[600], prefix[64];
        snprintf(state, sizeof(state), "%s/state", dir);
        snprintf(log, sizeof(log), "%s/collector.log", dir);
        snprintf(prefix, sizeof(prefix), "out%d_", (int)getpid());
        mkdir(state, 0755);
        struct private_broker b;
        private_broker_start(&b, dir);

        struct test_sandbox sb[SANDBOXES];
        for (int i = 0; i < SANDBOXES; i++) {
                char id[96], acct[32];
                snprintf(id, sizeof(id), "%s%d", prefix, i);
                snprintf(acct, sizeof(acct), "acct_out%d", i % 3);
                tsb_create(&sb[i], state, id, acct, i % 2 ? 2 : 1, 30 + 10 * i);
        }
        /* A small queue bound: during the outage ordinary samples overflow it; finals never wait on it. */
        const char *extra[] = { "--tick-ms", "200", "--queue-max", "4", NULL };
        pid_t collector = collector_start(state, b.bootstrap, log, extra);
        struct consumer *c = consumer_new(b.bootstrap);

        /* Samples flow before the fault. */
        size_t n = 0;
        for (int waited = 0; waited < 20000 && n < SANDBOXES * 2; waited += 500) {
                consumer_poll(c, prefix, 500);
                consumer_items(c, &n);
        }
        CHECK(n >= SANDBOXES * 2, "only %zu samples before the outage", n);

        private_broker_ctl(&b, "down");
        time_t down_at = time(NULL);
        for (int i = 0; i < SANDBOXES; i++) {
                tsb_stop(&sb[i], state);
                msleep(300);
        }
        /* The collector marks every final taken while the broker is down; the vmm removes the cgroups. */
        for (int i = 0; i < SANDBOXES; i++) {
                for (int waited = 0; waited < 10000 && !tsb_final_marked(&sb[i], state); waited += 100)
                        msleep(100);
                CHECK(tsb_final_marked(&sb[i], state), "%s: no .final while the broker was down", sb[i].rec.id);
                tsb_remove(&sb[i], state);
        }
        CHECK(spool_files(state) == SANDBOXES, "%d final samples spooled during the outage, wanted %d",
              spool_files(state), SANDBOXES);
        while (time(NULL) - down_at < OUTAGE_S)
                msleep(500);
        private_broker_ctl(&b, "up");

        int arrived = 0;
        for (int waited = 0; waited < 90000 && arrived < SANDBOXES; waited += 500) {
                consumer_poll(c, prefix, 500);
                arrived = 0;
                for (int i = 0; i < SANDBOXES; i++) {
                        uint64_t cpu = 0;
                        if (published_finals(c, sb[i].rec.id, &cpu) > 0)
                                arrived++;
                }
        }
        for (int i = 0; i < SANDBOXES; i++) {
                uint64_t cpu = 0;
                int finals = published_finals(c, sb[i].rec.id, &cpu);
                CHECK(finals >= 1, "%s: its final sample never arrived after the outage", sb[i].rec.id);
                CHECK(finals == 0 || cpu == sb[i].truth_cpu_ns, "%s: final counter %" PRIu64 ", the kernel said %" PRIu64,
                      sb[i].rec.id, cpu, sb[i].truth_cpu_ns);
        }
        for (int waited = 0; waited < 10000 && spool_files(state) != 0; waited += 200)
                msleep(200);
        CHECK(spool_files(state) == 0, "%d final samples still spooled after the broker acknowledged them",
              spool_files(state));
        CHECK(collector_stop(collector) == 0, "the collector did not stop cleanly");
        consumer_free(c);
        private_broker_stop(&b);
        tsb_cgroup_parent_remove();
        if (test_failures) {
                char *l = test_read_file(log);
                fprintf(stderr, "collector log:\n%s\n", l ? l : "");
                free(l);
        }
        free(dir);
        return test_result();
}
