/* Integration: held time never runs past a lifecycle moment the collector has
 * not read yet (invariant 2; docs/registry.md, "Moments and ticks").
 *
 * The test plays the vmm with a real cgroup and the real tally-collector
 * (tick 200 ms), following the vmm's protocol at each moment: take the
 * registry's moment lock (shared), read the moment on the boot clock, then —
 * slower than any vmm, 1.5 ticks, what an fsync under load or a late inotify
 * drain looks like to the collector — write the record carrying the moment,
 * rename it into place, release the lock. A collector that ticks meanwhile and
 * extrapolates the old state from its cached record bills the gap to the old
 * state, and never goes back (aggregators keep the highest totals).
 *
 * The truth is the test's own clock reads: the sandbox ran from T0 (its
 * creation) to the pause P, was paused until the resume R, ran until the stop
 * S. Every sample read from the broker must carry, at its own instant, no more
 * running and no more paused time than that truth gives plus 10 ms (the rule);
 * the final sample exactly (P - T0) + (S - R) running and R - P paused.
 *
 * A sandbox being created: the vmm's first record is written before the
 * backend starts, marked starting and with no moment yet. The collector must
 * send nothing for it (a sample without held time there is billed by the
 * interval rule, off by up to the start's duration); once the record with the
 * start's moment S0 replaces it (written as the vmm does, 1.5 ticks after S0
 * under the lock), every sample carries running time within 10 ms of its
 * instant - S0.
 *
 * Then a lock held past the collector's bound (2 s): the collector must keep
 * sampling, count moment_lock_timeouts_total and say so in its log. */
#include "sandboxes.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define TICK_MS 200
#define GAP_MS 300                  /* moment to rename: 1.5 ticks */
#define RULE_NS (10 * NS_PER_MS)    /* invariant 2: within 10 ms of the moments */

static int64_t t0, p_at, r_at, s_at; /* the moments, on the boot clock (0: not yet) */

/* The truth at boot instant t: running and paused ns since the creation. */
static void truth_at(int64_t t, int64_t *ret_run, int64_t *ret_paused)
{
        int64_t run = 0, paused = 0;
        if (!p_at || t < p_at) {
                run = t - t0;
        } else if (!r_at || t < r_at) {
                run = p_at - t0;
                paused = t - p_at;
        } else if (!s_at || t < s_at) {
                run = (p_at - t0) + (t - r_at);
                paused = r_at - p_at;
        } else {
                run = (p_at - t0) + (s_at - r_at);
                paused = r_at - p_at;
        }
        *ret_run = run;
        *ret_paused = paused;
}

/* One moment played as the vmm plays it, with the gap before the rename. */
static int64_t moment(struct test_sandbox *sb, const char *state, enum sandbox_state to)
{
        int lock = registry_moment_begin(state, 2000);
        CHECK(lock >= 0, "could not take the moment lock: %s", strerror(-lock));
        if (to == STATE_STOPPED && sb->child > 0) {
                kill(sb->child, SIGKILL);
                waitpid(sb->child, NULL, 0);
                sb->child = 0;
        }
        int64_t at = time_boot_ns();
        msleep(GAP_MS);
        /* By hand, not with registry_set_state: the time in the state it leaves goes to that state's total. */
        uint64_t spent = (uint64_t)(at - sb->rec.state_since_boot_ns);
        if (sb->rec.state == STATE_PAUSED)
                sb->rec.paused_ns += spent;
        else
                sb->rec.running_ns += spent;
        sb->rec.state = to;
        sb->rec.state_since_boot_ns = at;
        int rc = registry_write(state, &sb->rec);
        CHECK(rc == 0, "registry_write: %s", strerror(-rc));
        registry_moment_end(lock);
        return at;
}

/* Polls until want samples (not finals) of sandbox id in state st arrived in all. */
static size_t wait_samples(struct consumer *c, const char *prefix, const char *id, enum sandbox_state st, int want,
                           int timeout_ms)
{
        int seen = 0;
        for (int waited = 0; waited <= timeout_ms; waited += 100) {
                size_t n;
                const struct published *p = consumer_items(c, &n);
                seen = 0;
                for (size_t i = 0; i < n; i++)
                        seen += strcmp(p[i].sandbox, id) == 0 && p[i].state == st && !p[i].final;
                if (seen >= want)
                        return (size_t)seen;
                consumer_poll(c, prefix, 100);
        }
        CHECK(0, "only %d samples in state %s, waited for %d", seen, sandbox_state_name(st), want);
        return (size_t)seen;
}

int main(void)
{
        const char *brokers = test_env("TALLY_TEST_BROKERS");
        char *dir = test_tmpdir("collector-moments");
        char state[600], log[600], prefix[64], port[16], id[96];
        snprintf(state, sizeof(state), "%s/state", dir);
        snprintf(log, sizeof(log), "%s/collector.log", dir);
        snprintf(prefix, sizeof(prefix), "cmo%d_", (int)getpid());
        int metrics_port = test_free_port();
        snprintf(port, sizeof(port), "%d", metrics_port);
        mkdir(state, 0755);

        struct test_sandbox sb;
        snprintf(id, sizeof(id), "%ssb", prefix);
        tsb_create(&sb, state, id, "acct_moments", 1, 20);
        t0 = sb.created_boot;
        /* The collector's mono_ns and the boot clock differ by a constant while the host does not sleep. */
        int64_t boot_minus_mono = sb.created_boot - sb.created_mono;

        char tick[16];
        snprintf(tick, sizeof(tick), "%d", TICK_MS);
        const char *extra[] = { "--tick-ms", tick, "--metrics-port", port, NULL };
        pid_t collector = collector_start(state, brokers, log, extra);
        struct consumer *c = consumer_new(brokers);

        wait_samples(c, prefix, sb.rec.id, STATE_RUNNING, 3, 20000);
        p_at = moment(&sb, state, STATE_PAUSED);
        wait_samples(c, prefix, sb.rec.id, STATE_PAUSED, 3, 20000);
        r_at = moment(&sb, state, STATE_RUNNING);
        size_t n;
        const struct published *p = consumer_items(c, &n);
        int running_before = 0;
        for (size_t i = 0; i < n; i++)
                running_before += strcmp(p[i].sandbox, sb.rec.id) == 0 && p[i].state == STATE_RUNNING;
        wait_samples(c, prefix, sb.rec.id, STATE_RUNNING, running_before + 3, 20000);
        s_at = moment(&sb, state, STATE_STOPPED);

        uint64_t fin_cpu = 0;
        for (int waited = 0; waited < 20000 && published_finals(c, sb.rec.id, &fin_cpu) == 0; waited += 200)
                consumer_poll(c, prefix, 200);
        for (int waited = 0; waited < 10000 && !tsb_final_marked(&sb, state); waited += 50)
                msleep(50);
        CHECK(tsb_final_marked(&sb, state), "no %s.final after the record said stopped", sb.rec.id);
        tsb_remove(&sb, state);
        CHECK(fin_cpu == sb.truth_cpu_ns, "final counter %" PRIu64 ", the kernel said %" PRIu64, fin_cpu,
              sb.truth_cpu_ns);

        /* Every sample against the truth at its own instant. */
        p = consumer_items(c, &n);
        int samples = 0, finals = 0, shown = 0;
        int64_t worst_run = INT64_MIN, worst_paused = INT64_MIN;
        for (size_t i = 0; i < n; i++) {
                if (strcmp(p[i].sandbox, sb.rec.id) != 0)
                        continue;
                CHECK(p[i].held_known, "a sample without held time");
                int64_t run, paused;
                if (p[i].final) {
                        finals++;
                        truth_at(s_at, &run, &paused);
                        CHECK(p[i].running_ns == (uint64_t)run && p[i].paused_ns == (uint64_t)paused,
                              "final: running %" PRIu64 " paused %" PRIu64 " ns, the truth is %" PRId64 " and %" PRId64,
                              p[i].running_ns, p[i].paused_ns, run, paused);
                        continue;
                }
                samples++;
                truth_at(p[i].mono_ns + boot_minus_mono, &run, &paused);
                int64_t over_run = (int64_t)p[i].running_ns - run, over_paused = (int64_t)p[i].paused_ns - paused;
                worst_run = over_run > worst_run ? over_run : worst_run;
                worst_paused = over_paused > worst_paused ? over_paused : worst_paused;
                if ((over_run > RULE_NS || over_paused > RULE_NS) && shown++ < 5)
                        fprintf(stderr, "  sample %s at +%" PRId64 " ms: running %" PRIu64 " (truth %" PRId64
                                "), paused %" PRIu64 " (truth %" PRId64 ")\n", sandbox_state_name(p[i].state),
                                (p[i].mono_ns + boot_minus_mono - t0) / NS_PER_MS, p[i].running_ns, run,
                                p[i].paused_ns, paused);
        }
        CHECK(finals == 1, "%d final samples", finals);
        CHECK(samples >= 9, "only %d samples", samples);
        CHECK(worst_run <= RULE_NS, "a sample carried %" PRId64 " ns more running time than the sandbox had run",
              worst_run);
        CHECK(worst_paused <= RULE_NS, "a sample carried %" PRId64 " ns more paused time than the sandbox had been "
              "paused", worst_paused);
        fprintf(stderr, "%d samples; at most %" PRId64 " ns running and %" PRId64 " ns paused above the truth "
                "(moments %d ms before their records)\n", samples, worst_run, worst_paused, GAP_MS);

        /* A sandbox being created: its cgroup and burner made in a folder the collector does not
         * watch, then its record written here as the vmm's first write is. */
        char prestate[600];
        snprintf(prestate, sizeof(prestate), "%s/prestate", dir);
        mkdir(prestate, 0755);
        struct test_sandbox fresh;
        snprintf(id, sizeof(id), "%sfresh", prefix);
        tsb_create(&fresh, prestate, id, "acct_moments", 1, 20);
        registry_remove(prestate, fresh.rec.id);
        fresh.rec.starting = true;
        fresh.rec.state_since_boot_ns = 0;
        CHECK(registry_write(state, &fresh.rec) == 0, "could not write the starting record");
        msleep(3 * TICK_MS);
        consumer_poll(c, prefix, 200);
        p = consumer_items(c, &n);
        int early = 0;
        for (size_t i = 0; i < n; i++)
                early += strcmp(p[i].sandbox, fresh.rec.id) == 0;
        CHECK(early == 0, "%d samples of a sandbox whose record says it has not started", early);
        int lock = registry_moment_begin(state, 2000);
        CHECK(lock >= 0, "could not take the moment lock: %s", strerror(-lock));
        int64_t started = time_boot_ns();
        msleep(GAP_MS);
        fresh.rec.starting = false;
        fresh.rec.state_since_boot_ns = started;
        CHECK(registry_write(state, &fresh.rec) == 0, "could not write the started record");
        registry_moment_end(lock);
        wait_samples(c, prefix, fresh.rec.id, STATE_RUNNING, 3, 20000);
        p = consumer_items(c, &n);
        for (size_t i = 0; i < n; i++) {
                if (strcmp(p[i].sandbox, fresh.rec.id) != 0)
                        continue;
                int64_t truth = p[i].mono_ns + boot_minus_mono - started, off = (int64_t)p[i].running_ns - truth;
                CHECK(p[i].held_known && off <= RULE_NS && off >= -RULE_NS,
                      "a sample of the new sandbox carried running %" PRIu64 " ns (held time %s), it had run %"
                      PRId64 " ns", p[i].running_ns, p[i].held_known ? "sent" : "not sent", truth);
        }
        tsb_stop(&fresh, state);
        for (int waited = 0; waited < 10000 && !tsb_final_marked(&fresh, state); waited += 50)
                msleep(50);
        tsb_remove(&fresh, state);

        /* A lease ending while no vmm runs: the sandbox's own init ends it at the lease, and a
         * vmm that comes back dates the stop there. No sample may carry running time past it. */
        struct test_sandbox leased;
        snprintf(id, sizeof(id), "%sleased", prefix);
        tsb_create(&leased, state, id, "acct_moments", 1, 20);
        wait_samples(c, prefix, leased.rec.id, STATE_RUNNING, 1, 20000);
        int64_t lease_boot = time_boot_ns() + 600 * NS_PER_MS;
        leased.rec.timeout_ns = time_wall_ns() + 600 * NS_PER_MS;
        CHECK(registry_write(state, &leased.rec) == 0, "could not write the leased record");
        int64_t lease_run = lease_boot - leased.rec.state_since_boot_ns;
        msleep(600);
        if (leased.child > 0) {
                kill(leased.child, SIGKILL); /* what its init does at the lease */
                waitpid(leased.child, NULL, 0);
                leased.child = 0;
        }
        consumer_poll(c, prefix, 100);
        p = consumer_items(c, &n);
        int leased_before = 0;
        for (size_t i = 0; i < n; i++)
                leased_before += strcmp(p[i].sandbox, leased.rec.id) == 0;
        wait_samples(c, prefix, leased.rec.id, STATE_RUNNING, leased_before + 5, 20000);
        p = consumer_items(c, &n);
        int64_t lease_over = INT64_MIN;
        for (size_t i = 0; i < n; i++)
                if (strcmp(p[i].sandbox, leased.rec.id) == 0 && (int64_t)p[i].running_ns - lease_run > lease_over)
                        lease_over = (int64_t)p[i].running_ns - lease_run;
        CHECK(lease_over <= RULE_NS, "a sample carried running time %" PRId64 " ns past the sandbox's lease",
              lease_over);
        fprintf(stderr, "lease: at most %" PRId64 " ns of running time past the lease's end\n", lease_over);
        tsb_stop(&leased, state);
        for (int waited = 0; waited < 10000 && !tsb_final_marked(&leased, state); waited += 50)
                msleep(50);
        tsb_remove(&leased, state);

        /* A vmm wedged inside a moment: the collector waits 2 s at most, then samples on. */
        struct test_sandbox other;
        snprintf(id, sizeof(id), "%sother", prefix);
        tsb_create(&other, state, id, "acct_moments", 1, 20);
        wait_samples(c, prefix, other.rec.id, STATE_RUNNING, 2, 20000);
        int wedged = registry_moment_begin(state, 2000);
        CHECK(wedged >= 0, "could not take the moment lock: %s", strerror(-wedged));
        p = consumer_items(c, &n);
        int before = 0;
        for (size_t i = 0; i < n; i++)
                before += strcmp(p[i].sandbox, other.rec.id) == 0;
        wait_samples(c, prefix, other.rec.id, STATE_RUNNING, before + 2, 10000);
        char *metrics = http_get_metrics(metrics_port);
        uint64_t timeouts = metric_value(metrics, "moment_lock_timeouts_total");
        CHECK(timeouts >= 1, "moment_lock_timeouts_total is %" PRIu64 " while the lock was held", timeouts);
        free(metrics);
        registry_moment_end(wedged);
        char *logtext = test_read_file(log);
        CHECK(logtext && strstr(logtext, "could not take the registry's moment lock"),
              "the collector's log does not say it sampled without the lock");
        free(logtext);
        tsb_stop(&other, state);
        for (int waited = 0; waited < 10000 && !tsb_final_marked(&other, state); waited += 50)
                msleep(50);
        tsb_remove(&other, state);

        CHECK(collector_stop(collector) == 0, "the collector did not stop cleanly on SIGTERM");
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
