/* Integration: tally-collector samples real cgroups — v1 (cpuacct + memory)
 * and the unified v2 tree — and publishes each known CPU burn with the exact
 * cumulative counter the kernel reports, running and final. Edge cases with
 * real cgroups: a cgroup removed under a running sandbox's record (ENODEV on
 * the open file) is survived and counted; the same cgroup recreated (its
 * counter restarts from zero) is published under a higher epoch, never as a
 * smaller counter in the same epoch. /metrics answers in Prometheus text.
 * Run twice: with the BPF cgroup walk (TALLY_CGROUP_READER=scan) and with files. */
#include "sandboxes.h"
#include "support.h"
#include "timeutil.h"

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define BURN_MS 300

/* Waits until a running sample of sandbox with exactly cpu_ns arrived. */
static bool wait_running_sample(struct consumer *c, const char *prefix, const char *sandbox, uint64_t cpu_ns,
                                int timeout_ms)
{
        for (int waited = 0; waited < timeout_ms; waited += 200) {
                size_t n;
                const struct published *p = consumer_items(c, &n);
                for (size_t i = 0; i < n; i++)
                        if (strcmp(p[i].sandbox, sandbox) == 0 && p[i].state == STATE_RUNNING && p[i].cpu_ns == cpu_ns)
                                return true;
                consumer_poll(c, prefix, 200);
        }
        return false;
}

static bool wait_final(struct consumer *c, const char *prefix, const char *sandbox, uint64_t *ret_cpu, int timeout_ms)
{
        for (int waited = 0; waited < timeout_ms; waited += 200) {
                if (published_finals(c, sandbox, ret_cpu) > 0)
                        return true;
                consumer_poll(c, prefix, 200);
        }
        return false;
}

static void wait_marker_and_remove(struct test_sandbox *sb, const char *state)
{
        int waited = 0;
        while (!tsb_final_marked(sb, state) && waited < 10000) {
                msleep(50);
                waited += 50;
        }
        CHECK(tsb_final_marked(sb, state), "no %s.final after the record said stopped", sb->rec.id);
        tsb_remove(sb, state);
}

/* Held time (docs/events.md): every sample of a running sandbox carries
 * running_ns = (the reading's instant - the creation) on the boot clock. The
 * test took the creation on the boot and monotonic clocks together, and the
 * collector stamps mono_ns with the boot clock it computes held time from, so
 * mono_ns - running_ns must be the creation's monotonic instant: 1 ms allows
 * for the reads of the two clocks on both sides, and a suspended host. */
/* Per sandbox, in the order published: epochs never go down; within one, counters never go
 * down and seq always goes up. */
static void check_order(struct consumer *c)
{
        size_t n;
        const struct published *p = consumer_items(c, &n);
        for (size_t i = 0; i < n; i++)
                for (size_t j = i + 1; j < n; j++) {
                        if (strcmp(p[i].sandbox, p[j].sandbox) != 0)
                                continue;
                        CHECK(p[j].epoch >= p[i].epoch, "%s: epoch %" PRIu64 " after %" PRIu64, p[i].sandbox,
                              p[j].epoch, p[i].epoch);
                        if (p[i].epoch != p[j].epoch)
                                continue;
                        CHECK(p[j].cpu_ns >= p[i].cpu_ns, "%s: counter went down within epoch %" PRIu64,
                              p[i].sandbox, p[i].epoch);
                        CHECK(p[j].seq > p[i].seq, "%s: seq did not increase", p[i].sandbox);
                }
}

static void check_held(struct consumer *c, const struct test_sandbox *sb)
{
        size_t n;
        const struct published *p = consumer_items(c, &n);
        uint64_t last = 0;
        int seen = 0;
        for (size_t i = 0; i < n; i++) {
                if (strcmp(p[i].sandbox, sb->rec.id) != 0 || p[i].state != STATE_RUNNING)
                        continue;
                seen++;
                int before = test_failures; /* one report per sandbox, not one per sample */
                CHECK(p[i].held_known && p[i].paused_ns == 0, "%s: a running sample without held time", sb->rec.id);
                CHECK(p[i].running_ns >= last, "%s: running_ns went back from %" PRIu64 " to %" PRIu64, sb->rec.id,
                      last, p[i].running_ns);
                last = p[i].running_ns;
                int64_t created = p[i].mono_ns - (int64_t)p[i].running_ns;
                CHECK(created - sb->created_mono < 1000000 && sb->created_mono - created < 1000000,
                      "%s: running_ns %" PRIu64 " at mono %" PRId64 " puts the creation at %" PRId64
                      ", the test created it at %" PRId64,
                      sb->rec.id, p[i].running_ns, p[i].mono_ns, created, sb->created_mono);
                if (test_failures > before)
                        break;
        }
        CHECK(seen > 0, "%s: no running samples", sb->rec.id);
}

/* The final sample of a stopped sandbox: its held time is the life the test measured by hand
 * (stop - creation on the boot clock), and it is dated at the stop, within the 10 ms rule. */
static void check_final_held(struct consumer *c, const struct test_sandbox *sb)
{
        size_t n;
        const struct published *p = consumer_items(c, &n);
        for (size_t i = 0; i < n; i++) {
                if (strcmp(p[i].sandbox, sb->rec.id) != 0 || !p[i].final)
                        continue;
                /* tsb_stop added the time since the last state change to that state's total, by hand. */
                CHECK(p[i].held_known && p[i].running_ns == sb->rec.running_ns && p[i].paused_ns == sb->rec.paused_ns,
                      "%s: final held running %" PRIu64 " paused %" PRIu64 ", the test measured %" PRIu64 " and %" PRIu64,
                      sb->rec.id, p[i].running_ns, p[i].paused_ns, sb->rec.running_ns, sb->rec.paused_ns);
                CHECK(sb->rec.running_ns + sb->rec.paused_ns == (uint64_t)(sb->stopped_boot - sb->created_boot),
                      "%s: the test's totals do not add up to its life", sb->rec.id);
                int64_t off = p[i].wall_ns - sb->stopped_wall;
                CHECK(off < 10000000 && off > -10000000, "%s: final dated %" PRId64 " ns from the stop", sb->rec.id,
                      off);
                return;
        }
        CHECK(0, "%s: no final sample", sb->rec.id);
}

/* Tampering: the v1 sandbox's counter written back to 0 in the same cgroup (what a
 * sandbox with write access to cpuacct.usage can do). Loud: a warning and a metric;
 * and a new epoch, so the counter is billed again from zero rather than not at all.
 * Returns the counter after the reset. */
static uint64_t check_tampering(struct consumer *c, const char *prefix, const struct test_sandbox *v1, uint64_t truth1,
                                int metrics_port, const char *log)
{
        char *metrics = http_get_metrics(metrics_port);
        uint64_t backwards_before = metric_value(metrics, "counter_backwards_total");
        free(metrics);
        CHECK(backwards_before == 0, "%" PRIu64 " counters went backwards before any was reset (a recreated cgroup "
              "is not tampering)", backwards_before);
        char usage[600];
        snprintf(usage, sizeof(usage), "%s/cpuacct.usage", v1->cpu_dir);
        CHECK(write_file(usage, "0"), "could not reset %s: %m", usage);
        uint64_t reset = tsb_read_cpu(v1);
        CHECK(reset < truth1, "the reset counter %" PRIu64 " is not below %" PRIu64, reset, truth1);
        CHECK(wait_running_sample(c, prefix, v1->rec.id, reset, 20000), "no sample of the reset counter %" PRIu64, reset);
        size_t n;
        const struct published *p = consumer_items(c, &n);
        uint64_t epoch_before = 0, epoch_after = 0;
        for (size_t i = 0; i < n; i++)
                if (strcmp(p[i].sandbox, v1->rec.id) == 0) {
                        if (p[i].cpu_ns == truth1)
                                epoch_before = p[i].epoch;
                        if (p[i].cpu_ns == reset)
                                epoch_after = p[i].epoch;
                }
        CHECK(epoch_after > epoch_before && epoch_before >= 1, "the reset counter went out under epoch %" PRIu64
              " after %" PRIu64, epoch_after, epoch_before);
        /* ...announced before any sample under it, as aggregators bill no epoch its host did not announce. */
        uint64_t first_after = UINT64_MAX, announced_at = 0;
        for (size_t i = 0; i < n; i++)
                if (strcmp(p[i].sandbox, v1->rec.id) == 0 && p[i].epoch == epoch_after && p[i].order < first_after)
                        first_after = p[i].order;
        char reason[EVENT_REASON_MAX + 1] = "";
        CHECK(published_restart(c, v1->rec.id, epoch_after, reason, sizeof(reason), &announced_at) &&
                      announced_at < first_after && strcmp(reason, "counter_back") == 0,
              "epoch %" PRIu64 " was not announced (restarted, counter_back) before its first sample: reason \"%s\"",
              epoch_after, reason);
        metrics = http_get_metrics(metrics_port);
        CHECK(metric_value(metrics, "counter_backwards_total") == 1, "counter_backwards_total is %" PRIu64
              " after one reset", metric_value(metrics, "counter_backwards_total"));
        free(metrics);
        char *logtext = test_read_file(log), want[200];
        snprintf(want, sizeof(want), "possible tampering; new epoch\" sandbox=%s account=acct_cg1 previous_cpu_ns=%" PRIu64
                 " cpu_ns=%" PRIu64, v1->rec.id, truth1, reset);
        CHECK(logtext && strstr(logtext, want), "the log does not say: %s", want);
        free(logtext);
        return reset;
}

int main(void)
{
        const char *brokers = test_env("TALLY_TEST_BROKERS");
        char *dir = test_tmpdir("collector-cgroups");
        char state[600], log[600], prefix[64], port[16];
        snprintf(state, sizeof(state), "%s/state", dir);
        snprintf(log, sizeof(log), "%s/collector.log", dir);
        snprintf(prefix, sizeof(prefix), "cgt%d_", (int)getpid());
        int metrics_port = test_free_port();
        snprintf(port, sizeof(port), "%d", metrics_port);
        mkdir(state, 0755);

        struct test_sandbox v1, v2, gone;
        char id[96];
        snprintf(id, sizeof(id), "%sv1", prefix);
        tsb_create(&v1, state, id, "acct_cg1", 1, BURN_MS);
        snprintf(id, sizeof(id), "%sv2", prefix);
        tsb_create(&v2, state, id, "acct_cg2", 2, BURN_MS);
        snprintf(id, sizeof(id), "%sgone", prefix);
        tsb_create(&gone, state, id, "acct_cg3", 1, 50);

        /* The burners are blocked now: their counters hold still, and the test reads them itself. */
        uint64_t truth1 = tsb_read_cpu(&v1), truth2 = tsb_read_cpu(&v2);
        CHECK(truth1 >= (uint64_t)BURN_MS * 1000000, "v1 cgroup counted %" PRIu64 " ns of a %d ms burn", truth1, BURN_MS);
        CHECK(truth2 >= (uint64_t)BURN_MS * 1000000, "v2 cgroup counted %" PRIu64 " ns of a %d ms burn", truth2, BURN_MS);

        /* 1,100 descriptors the collector inherits, as a host's counter files would be: its
         * /metrics sockets then sit above select()'s FD_SETSIZE (1024) and must still be served. */
        int held[1100];
        for (int i = 0; i < 1100; i++)
                held[i] = open("/dev/null", O_RDONLY);
        const char *extra[] = { "--tick-ms", "200", "--metrics-port", port, NULL };
        pid_t collector = collector_start(state, brokers, log, extra);
        for (int i = 0; i < 1100; i++)
                close(held[i]);
        struct consumer *c = consumer_new(brokers);

        CHECK(wait_running_sample(c, prefix, v1.rec.id, truth1, 20000),
              "no running sample of the v1 sandbox with its exact counter %" PRIu64, truth1);
        CHECK(wait_running_sample(c, prefix, v2.rec.id, truth2, 20000),
              "no running sample of the v2 sandbox with its exact counter %" PRIu64, truth2);

        /* v1 reports memory and its peak; the burner holds some. */
        size_t n;
        const struct published *p = consumer_items(c, &n);
        bool mem_seen = false;
        for (size_t i = 0; i < n; i++)
                if (strcmp(p[i].sandbox, v1.rec.id) == 0 && p[i].mem_bytes > 0 && p[i].mem_peak_bytes >= p[i].mem_bytes)
                        mem_seen = true;
        /* v2 reports memory.current and memory.peak where its tree has the memory
         * controller: a pure v2 host (not the hybrid unified tree of a v1 host). */
        struct test_cgroup_layout layout;
        bool v2_memory = test_cgroup_layout(&layout) == 0 && layout.v2_memory;
        CHECK(mem_seen || (v1.version == 2 && !v2_memory),
              "no v1 sample with memory.usage_in_bytes and a peak at least as large");
        if (v2_memory && v2.version == 2) {
                mem_seen = false;
                for (size_t i = 0; i < n; i++)
                        if (strcmp(p[i].sandbox, v2.rec.id) == 0 && p[i].mem_bytes > 0 &&
                            p[i].mem_peak_bytes >= p[i].mem_bytes)
                                mem_seen = true;
                CHECK(mem_seen, "no v2 sample with memory.current and a peak at least as large");
        }

        /* Removed between discovery and read: the record still says running. */
        uint64_t gone_first = tsb_read_cpu(&gone);
        CHECK(wait_running_sample(c, prefix, gone.rec.id, gone_first, 20000), "no sample of the sandbox to remove");
        kill(gone.child, SIGKILL);
        waitpid(gone.child, NULL, 0);
        gone.child = 0;
        /* v2: one folder for both counters */
        CHECK(rmdir(gone.cpu_dir) == 0 && (gone.version == 2 || rmdir(gone.mem_dir) == 0), "could not remove the cgroup: %m");
        msleep(800);
        CHECK(kill(collector, 0) == 0, "the collector died when a cgroup vanished");
        char *metrics = http_get_metrics(metrics_port);
        CHECK(metrics && strstr(metrics, "200 OK"), "GET /metrics failed: %s", metrics ? metrics : "(no answer)");
        CHECK(metric_value(metrics, "read_errors_total") >= 1, "read errors not counted after the cgroup vanished");
        /* The reader this run asked for (TALLY_CGROUP_READER, inherited) is the one in use. */
        const char *reader = getenv("TALLY_CGROUP_READER");
        bool scan = reader && strcmp(reader, "scan") == 0;
        CHECK(metrics && strstr(metrics, scan ? "\ntally_collector_scan_active 1\n" : "\ntally_collector_scan_active 0\n"),
              "/metrics does not say the cgroup walk is %s", scan ? "in use" : "off");
        /* And the readings came from it: with the walk, files only for the vanished cgroup and the
         * first tick of each sandbox; without it, every reading. */
        uint64_t samples = metric_value(metrics, "samples_total"), file_reads = metric_value(metrics, "file_reads_total");
        CHECK(scan ? 2 * file_reads < samples : file_reads >= samples,
              "%" PRIu64 " of %" PRIu64 " readings came from files with cgroup_reader %s", file_reads, samples,
              scan ? "scan" : "files");
        CHECK(metrics && strstr(metrics, "# TYPE tally_collector_sandboxes gauge\ntally_collector_sandboxes 3\n"),
              "/metrics does not say 3 sandboxes tracked");
        CHECK(metrics && strstr(metrics, "tally_collector_queue_depth ") && strstr(metrics, "tally_collector_spool_entries ") &&
                      strstr(metrics, "tally_collector_tick_duration_us ") &&
                      strstr(metrics, "tally_collector_samples_per_second ") &&
                      strstr(metrics, "tally_collector_publish_errors_total "),
              "/metrics lacks a metric");
        free(metrics);

        /* Recreated at the same path: the counter restarts below what was published. */
        struct test_sandbox again;
        struct sandbox_record keep = gone.rec;
        tsb_create(&again, state, gone.rec.id, "acct_cg3", 1, 20);
        /* The same sandbox's life goes on (held time never restarts within it; docs/events.md). */
        again.created_boot = gone.created_boot;
        again.created_mono = gone.created_mono;
        again.rec.state_since_boot_ns = gone.created_boot;
        CHECK(registry_write(state, &again.rec) == 0, "could not rewrite the record");
        (void)keep;
        uint64_t again_cpu = tsb_read_cpu(&again);
        CHECK(again_cpu < gone_first, "the recreated cgroup's counter %" PRIu64 " is not below %" PRIu64, again_cpu,
              gone_first);
        CHECK(wait_running_sample(c, prefix, again.rec.id, again_cpu, 20000),
              "no sample of the recreated cgroup with its counter %" PRIu64, again_cpu);
        p = consumer_items(c, &n);
        uint64_t first_epoch = 0, new_epoch = 0;
        for (size_t i = 0; i < n; i++) {
                if (strcmp(p[i].sandbox, again.rec.id) != 0)
                        continue;
                if (p[i].cpu_ns == gone_first)
                        first_epoch = p[i].epoch;
                if (p[i].cpu_ns == again_cpu)
                        new_epoch = p[i].epoch;
        }
        CHECK(first_epoch >= 1 && new_epoch > first_epoch,
              "counter went back from %" PRIu64 " to %" PRIu64 " but the epoch went %" PRIu64 " -> %" PRIu64,
              gone_first, again_cpu, first_epoch, new_epoch);
        check_order(c);
        check_held(c, &v1);
        check_held(c, &v2);

        /* v2 paused, recorded as the vmm does at that moment (its burner already holds still),
         * under the registry's moment lock as the vmm's moments are: no tick stamped after the
         * pause's clock extrapolates the running state past it while the record is written
         * (which took 19 ms on a loaded machine). Its samples keep running_ns at the pause and
         * count paused_ns from it. */
        int moment = registry_moment_begin(state, 5000);
        CHECK(moment >= 0, "could not take the moment lock: %s", strerror(-moment));
        int64_t pause_boot = time_boot_ns(), pause_mono = time_mono_ns();
        uint64_t ran = (uint64_t)(pause_boot - v2.created_boot);
        v2.rec.running_ns = ran;
        v2.rec.state_since_boot_ns = pause_boot;
        v2.rec.state = STATE_PAUSED;
        CHECK(registry_write(state, &v2.rec) == 0, "could not write the paused record");
        registry_moment_end(moment);
        int paused_seen = 0;
        for (int waited = 0; waited < 20000 && paused_seen < 3; waited += 200) {
                consumer_poll(c, prefix, 200);
                p = consumer_items(c, &n);
                paused_seen = 0;
                for (size_t i = 0; i < n; i++)
                        paused_seen += strcmp(p[i].sandbox, v2.rec.id) == 0 && p[i].state == STATE_PAUSED;
        }
        CHECK(paused_seen >= 3, "only %d paused samples of v2", paused_seen);
        for (size_t i = 0; i < n; i++) {
                if (strcmp(p[i].sandbox, v2.rec.id) != 0 || p[i].state != STATE_PAUSED)
                        continue;
                /* No tick runs past the pause (the moment lock); 1 ms for the order of the clock reads. */
                CHECK(p[i].held_known && p[i].running_ns >= ran && p[i].running_ns - ran < 1000000,
                      "v2 paused: running_ns %" PRIu64 ", %" PRIu64 " at the pause", p[i].running_ns, ran);
                int64_t paused_at = p[i].mono_ns - (int64_t)p[i].paused_ns;
                CHECK(paused_at - pause_mono < 1000000 && pause_mono - paused_at < 1000000,
                      "v2 paused: paused_ns %" PRIu64 " at mono %" PRId64 " puts the pause at %" PRId64 ", it was at %" PRId64,
                      p[i].paused_ns, p[i].mono_ns, paused_at, pause_mono);
                if (test_failures)
                        break;
        }

        /* cgroup v2 has no writable CPU counter (cpu.stat is read-only; v1's
         * cpuacct.usage takes a write), so tampering by a reset is v1's alone; on
         * a v2 host the counter can only restart with a recreated cgroup (above). */
        uint64_t reset = truth1;
        if (v1.version == 1)
                reset = check_tampering(c, prefix, &v1, truth1, metrics_port, log);
        else
                printf("tampering: not run, v1 only: this host's sandboxes are cgroup v2, whose cpu.stat cannot be "
                       "written\n");

        /* Stop all as the vmm does (the records carry no final counter); each final sample must
         * carry the counter the test reads itself from the kernel once the collector is done. */
        struct test_sandbox *all[] = { &v1, &v2, &again };
        for (int i = 0; i < 3; i++)
                tsb_stop(all[i], state);
        for (int i = 0; i < 3; i++) {
                uint64_t fin = 0;
                CHECK(wait_final(c, prefix, all[i]->rec.id, &fin, 20000), "no final sample of %s", all[i]->rec.id);
                wait_marker_and_remove(all[i], state);
                CHECK(fin == all[i]->truth_cpu_ns, "%s: final counter %" PRIu64 ", the kernel said %" PRIu64,
                      all[i]->rec.id, fin, all[i]->truth_cpu_ns);
                check_final_held(c, all[i]);
        }
        /* Killing a process costs it a little CPU too, so the final counter is the running one or more. */
        CHECK(v1.truth_cpu_ns >= reset && v2.truth_cpu_ns >= truth2, "counters went down when the burners died");

        consumer_poll(c, prefix, 500);
        check_order(c);
        CHECK(collector_stop(collector) == 0, "the collector did not stop cleanly on SIGTERM");
        char spool[700];
        snprintf(spool, sizeof(spool), "%s/collector/spool/%s.json", state, v1.rec.id);
        CHECK(access(spool, F_OK) != 0, "an acknowledged final sample is still in the spool");
        consumer_free(c);
        tsb_cgroup_parent_remove();
        if (test_failures) {
                char *l = test_read_file(log);
                fprintf(stderr, "collector log:\n%s\n", l ? l : "");
                free(l);
        }
        free(dir);
        return test_result();
}
