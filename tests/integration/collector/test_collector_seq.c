/* Integration: sequence numbers never wrap and never go back, and state the
 * collector could not store never lets it publish an epoch or seq it might
 * repeat lower after a restart (docs/events.md, "Sequence numbers").
 *
 * Two sandboxes (v1, v2) on real cgroups, the collector started with every
 * sandbox's n injected just below 2^32 (seq_start, a test setting):
 *  1. the wrap: each sandbox's seq keeps increasing; the host's generation
 *     is raised by exactly one and stored;
 *  2. a restart (SIGTERM): seq keeps increasing, one generation more;
 *  3. the state folder refuses writes (a folder where the collector's
 *     temporary file would go) while a sandbox's n runs out and while the v1
 *     counter is reset in the same cgroup (a new epoch to store): neither the
 *     raised generation nor the new epoch is published, the failures are
 *     counted and logged; once writes work again both are published;
 *  4. kill -9 and restart: still no epoch lower, no seq lower in an epoch.
 * Finally both stop, and their finals carry the kernel's counters. */
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

#define N_MAX UINT64_C(0xFFFFFFFF)
#define GEN(seq) ((seq) >> 32)
#define NUM(seq) ((seq) & N_MAX)

static const char *state_dir;

static uint64_t stored_generation(void)
{
        char path[700];
        snprintf(path, sizeof(path), "%s/collector/generation", state_dir);
        char *t = test_read_file(path);
        uint64_t g = t ? strtoull(t, NULL, 10) : 0;
        free(t);
        return g;
}

/* The published samples of one sandbox, in the order published (one partition). */
static size_t samples_of(struct consumer *c, const char *sandbox, const struct published **out, size_t max)
{
        size_t n, k = 0;
        const struct published *p = consumer_items(c, &n);
        for (size_t i = 0; i < n && k < max; i++)
                if (strcmp(p[i].sandbox, sandbox) == 0)
                        out[k++] = &p[i];
        return k;
}

/* Polls until pred holds for every sandbox, or fails at the timeout. */
static bool wait_until(struct consumer *c, const char *prefix, struct test_sandbox **sbs, int nsb,
                       bool (*pred)(struct consumer *, const struct test_sandbox *, uint64_t), uint64_t arg,
                       int timeout_ms, const char *what)
{
        for (int waited = 0; waited <= timeout_ms; waited += 200) {
                bool all = true;
                for (int i = 0; i < nsb && all; i++)
                        all = pred(c, sbs[i], arg);
                if (all)
                        return true;
                consumer_poll(c, prefix, 200);
        }
        CHECK(0, "timed out after %d ms waiting for %s", timeout_ms, what);
        return false;
}

/* At least arg samples under a generation above the first one seen (after a wrap). */
static bool wrapped(struct consumer *c, const struct test_sandbox *sb, uint64_t arg)
{
        const struct published *p[4096];
        size_t n = samples_of(c, sb->rec.id, p, 4096);
        size_t after = 0;
        for (size_t i = 0; i < n; i++)
                after += GEN(p[i]->seq) > GEN(p[0]->seq);
        return n > 0 && after >= arg;
}

/* A sample with generation >= arg. */
static bool has_generation(struct consumer *c, const struct test_sandbox *sb, uint64_t arg)
{
        const struct published *p[4096];
        size_t n = samples_of(c, sb->rec.id, p, 4096);
        for (size_t i = 0; i < n; i++)
                if (GEN(p[i]->seq) >= arg)
                        return true;
        return false;
}

static bool has_epoch(struct consumer *c, const struct test_sandbox *sb, uint64_t arg)
{
        const struct published *p[4096];
        size_t n = samples_of(c, sb->rec.id, p, 4096);
        for (size_t i = 0; i < n; i++)
                if (p[i]->epoch >= arg)
                        return true;
        return false;
}

static uint64_t max_generation(struct consumer *c, const struct test_sandbox *sb)
{
        const struct published *p[4096];
        size_t n = samples_of(c, sb->rec.id, p, 4096);
        uint64_t g = 0;
        for (size_t i = 0; i < n; i++)
                if (GEN(p[i]->seq) > g)
                        g = GEN(p[i]->seq);
        return g;
}

/* The invariant, over everything published: per sandbox, epochs never go down, and within an
 * epoch seq always goes up and the counter never goes down. */
static void check_order(struct consumer *c, const struct test_sandbox *sb)
{
        const struct published *p[4096];
        size_t n = samples_of(c, sb->rec.id, p, 4096);
        for (size_t i = 1; i < n; i++) {
                const struct published *a = p[i - 1], *b = p[i];
                CHECK(b->epoch >= a->epoch, "%s: epoch %" PRIu64 " published after %" PRIu64, sb->rec.id, b->epoch,
                      a->epoch);
                if (b->epoch != a->epoch)
                        continue;
                CHECK(b->seq > a->seq, "%s: seq %" PRIu64 ":%" PRIu64 " published after %" PRIu64 ":%" PRIu64,
                      sb->rec.id, GEN(b->seq), NUM(b->seq), GEN(a->seq), NUM(a->seq));
                CHECK(b->cpu_ns >= a->cpu_ns, "%s: counter %" PRIu64 " after %" PRIu64 " in epoch %" PRIu64,
                      sb->rec.id, b->cpu_ns, a->cpu_ns, a->epoch);
        }
}

static pid_t start(const char *brokers, const char *log, const char *seq_start, const char *port)
{
        const char *extra[] = { "--tick-ms", "100", "--metrics-port", port, "--seq-start", seq_start, NULL };
        return collector_start(state_dir, brokers, log, extra);
}

/* Waits until the collector started after a stop stored its generation (above `before`), then
 * for samples of both sandboxes under it. Returns that generation. */
static uint64_t wait_started(struct consumer *c, const char *prefix, struct test_sandbox **sbs, uint64_t before)
{
        for (int waited = 0; waited < 10000 && stored_generation() <= before; waited += 50)
                msleep(50);
        uint64_t g = stored_generation();
        CHECK(g == before + 1, "the start stored generation %" PRIu64 " after %" PRIu64, g, before);
        wait_until(c, prefix, sbs, 2, has_generation, g, 20000, "the first samples of a new start");
        return g;
}

int main(void)
{
        const char *brokers = test_env("TALLY_TEST_BROKERS");
        char *dir = test_tmpdir("collector-seq");
        char state[600], log[4][700], prefix[64], port[16], id[96];
        snprintf(state, sizeof(state), "%s/state", dir);
        state_dir = state;
        for (int i = 0; i < 4; i++)
                snprintf(log[i], sizeof(log[i]), "%s/collector-%d.log", dir, i + 1);
        snprintf(prefix, sizeof(prefix), "seq%d_", (int)getpid());
        int metrics_port = test_free_port();
        snprintf(port, sizeof(port), "%d", metrics_port);
        mkdir(state, 0755);

        struct test_sandbox v1, v2;
        snprintf(id, sizeof(id), "%sv1", prefix);
        tsb_create(&v1, state, id, "acct_seq1", 1, 60);
        snprintf(id, sizeof(id), "%sv2", prefix);
        tsb_create(&v2, state, id, "acct_seq2", 2, 40);
        struct test_sandbox *both[] = { &v1, &v2 };
        struct consumer *c = consumer_new(brokers);

        /* 1. The wrap: n starts 6 below 2^32 - 1, so at a 100 ms tick it runs out in under a second. */
        pid_t collector = start(brokers, log[0], "4294967289", port);
        wait_until(c, prefix, both, 2, wrapped, 5, 20000, "5 samples of each sandbox after the wrap");
        const struct published *p[4096];
        size_t n = samples_of(c, v1.rec.id, p, 4096);
        uint64_t g1 = n ? GEN(p[0]->seq) : 0;
        CHECK(n > 0 && NUM(p[0]->seq) == 4294967290, "the first seq's n is %" PRIu64 ", injected 4294967290",
              n ? NUM(p[0]->seq) : 0);
        for (int s = 0; s < 2; s++) {
                n = samples_of(c, both[s]->rec.id, p, 4096);
                bool saw_max = false, saw_one = false;
                for (size_t i = 0; i < n; i++) {
                        saw_max |= p[i]->seq == ((g1 << 32) | N_MAX);
                        saw_one |= p[i]->seq == (((g1 + 1) << 32) | 1);
                }
                CHECK(saw_max && saw_one, "%s: no seq %" PRIu64 ":2^32-1 then %" PRIu64 ":1 (the wrap)",
                      both[s]->rec.id, g1, g1 + 1);
                check_order(c, both[s]);
        }
        /* Both ran out in the same tick: one raise serves both. */
        CHECK(stored_generation() == g1 + 1, "stored generation %" PRIu64 " after one wrap from %" PRIu64,
              stored_generation(), g1);
        CHECK(collector_stop(collector) == 0, "the collector did not stop cleanly");

        /* 2. A restart: one generation more, n from 1. */
        collector = start(brokers, log[1], "0", port);
        wait_started(c, prefix, both, g1 + 1);
        consumer_poll(c, prefix, 500);
        CHECK(max_generation(c, &v1) == g1 + 2 && stored_generation() == g1 + 2,
              "after a restart: generation %" PRIu64 " published, %" PRIu64 " stored; wanted %" PRIu64,
              max_generation(c, &v1), stored_generation(), g1 + 2);
        check_order(c, &v1);
        check_order(c, &v2);
        CHECK(collector_stop(collector) == 0, "the collector did not stop cleanly");

        /* 3. Writes refused: a folder where the collector writes its temporary files (root passes
         * permission checks, not this). n starts 25 below the end: about 2.5 s before the wrap. */
        collector = start(brokers, log[2], "4294967270", port);
        uint64_t g3 = wait_started(c, prefix, both, g1 + 2);
        char gen_block[800], epoch_block[800];
        snprintf(gen_block, sizeof(gen_block), "%s/collector/generation.tmp", state);
        snprintf(epoch_block, sizeof(epoch_block), "%s/collector/epochs/%s.tmp", state, v1.rec.id);
        CHECK(mkdir(gen_block, 0755) == 0 && mkdir(epoch_block, 0755) == 0, "could not block the state files: %m");
        /* The v1 counter reset in the same cgroup: a new epoch the collector cannot store.
         * v1 only: a cgroup v2 CPU counter (cpu.stat) cannot be written, so on a v2 host
         * only the generation is refused here. */
        bool reset = v1.version == 1;
        if (reset) {
                char usage[600];
                snprintf(usage, sizeof(usage), "%s/cpuacct.usage", v1.cpu_dir);
                CHECK(write_file(usage, "0"), "could not reset %s: %m", usage);
        } else {
                printf("the epoch part of step 3: not run, v1 only: this host's sandboxes are cgroup v2, whose "
                       "cpu.stat cannot be written\n");
        }
        msleep(4000); /* past the wrap */
        consumer_poll(c, prefix, 1000);
        CHECK(!has_generation(c, &v2, g3 + 1), "a generation that could not be stored was published");
        CHECK(!reset || !has_epoch(c, &v1, 2), "an epoch that could not be stored was published");
        n = samples_of(c, v2.rec.id, p, 4096);
        CHECK(n > 0 && p[n - 1]->seq == ((g3 << 32) | N_MAX), "v2's last seq before the block lifted is %" PRIu64
              ":%" PRIu64 ", not its last n", n ? GEN(p[n - 1]->seq) : 0, n ? NUM(p[n - 1]->seq) : 0);
        char *metrics = http_get_metrics(metrics_port);
        CHECK(metric_value(metrics, "state_save_errors_total") >= (reset ? 2 : 1) &&
                      metric_value(metrics, "samples_held_total") >= (reset ? 2 : 1),
              "state_save_errors_total %" PRIu64 ", samples_held_total %" PRIu64,
              metric_value(metrics, "state_save_errors_total"), metric_value(metrics, "samples_held_total"));
        CHECK(metric_value(metrics, "counter_backwards_total") == (reset ? 1 : 0), "counter_backwards_total %" PRIu64,
              metric_value(metrics, "counter_backwards_total"));
        free(metrics);
        char *text = test_read_file(log[2]);
        CHECK(text && strstr(text, "could not store a raised generation") &&
                      (!reset || strstr(text, "could not persist a sandbox's epoch")),
              "the failed writes were not logged");
        free(text);
        CHECK(rmdir(gen_block) == 0 && rmdir(epoch_block) == 0, "could not unblock: %m");
        wait_until(c, prefix, both + 1, 1, has_generation, g3 + 1, 5000, "the raised generation once stored");
        if (reset)
                wait_until(c, prefix, both, 1, has_epoch, 2, 5000, "the new epoch once stored");
        CHECK(stored_generation() == g3 + 1, "stored generation %" PRIu64 ", wanted %" PRIu64, stored_generation(),
              g3 + 1);

        /* 4. kill -9 and restart: the stored generation and epoch carry on. */
        kill(collector, SIGKILL);
        waitpid(collector, NULL, 0);
        uint64_t before = stored_generation(); /* v1 may have run out of n too by now */
        collector = start(brokers, log[3], "0", port);
        wait_started(c, prefix, both, before);
        consumer_poll(c, prefix, 500);
        for (int s = 0; s < 2; s++)
                check_order(c, both[s]);

        /* The finals carry the kernel's counters, read by the test once the collector is done. */
        for (int s = 0; s < 2; s++)
                tsb_stop(both[s], state);
        for (int s = 0; s < 2; s++) {
                for (int waited = 0; waited < 10000 && !tsb_final_marked(both[s], state); waited += 100)
                        msleep(100);
                CHECK(tsb_final_marked(both[s], state), "%s: no .final", both[s]->rec.id);
                tsb_remove(both[s], state);
        }
        uint64_t fin[2] = { 0, 0 };
        for (int waited = 0; waited < 10000; waited += 500) {
                if (published_finals(c, v1.rec.id, &fin[0]) > 0 && published_finals(c, v2.rec.id, &fin[1]) > 0)
                        break;
                consumer_poll(c, prefix, 500);
        }
        for (int s = 0; s < 2; s++) {
                CHECK(published_finals(c, both[s]->rec.id, &fin[s]) > 0, "%s: no final sample", both[s]->rec.id);
                CHECK(fin[s] == both[s]->truth_cpu_ns, "%s: final counter %" PRIu64 ", the kernel said %" PRIu64,
                      both[s]->rec.id, fin[s], both[s]->truth_cpu_ns);
                check_order(c, both[s]);
        }
        CHECK(collector_stop(collector) == 0, "the collector did not stop cleanly");
        consumer_free(c);
        tsb_cgroup_parent_remove();
        if (test_failures)
                for (int i = 0; i < 4; i++) {
                        char *l = test_read_file(log[i]);
                        fprintf(stderr, "collector log %d:\n%s\n", i + 1, l ? l : "");
                        free(l);
                }
        free(dir);
        return test_result();
}
