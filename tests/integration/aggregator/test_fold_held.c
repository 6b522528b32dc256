/* Integration: held time is billed from the vmm's
 * cumulative held counters, not from sample ticks, and the vmm's `stopped`
 * event closes a sandbox's bill — alone when the collector is gone for good,
 * and in either order with the collector's final sample, never twice.
 *
 * Through the real development broker and a real tally-aggregator writing to
 * PostgreSQL. The expected totals are worked out by hand from the counters
 * the messages carry (2 GiB of memory = 2147483648 bytes; storage also keeps
 * the 10^9 disk bytes the samples report: 3147483648 bytes). */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <stdlib.h>
#include <string.h>

#define GiB  (UINT64_C(1) << 30)
#define MS   NS_PER_MS
#define SEC  NS_PER_SEC
#define DISK UINT64_C(1000000000)

static struct usage_event tick(const char *sb, uint64_t seq, int64_t wall, enum sandbox_state st, uint64_t cpu,
                               uint64_t run, uint64_t paused)
{
        struct usage_event ev = aggtest_sample("acct-fh", "key-fh", sb, 1, seq, wall, st, cpu, 2 * GiB, DISK, 2);
        ev.final = st == STATE_STOPPED;
        return aggtest_held(ev, run, paused);
}

static struct usage_event stop(const char *sb, int64_t wall, uint64_t cpu, uint64_t run, uint64_t paused)
{
        return aggtest_stopped("acct-fh", "key-fh", sb, 1, wall, cpu, run, paused, 2 * GiB, 2);
}

static void put(struct aggtest *t, struct usage_event ev)
{
        aggtest_produce(t, &ev);
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_fold_held", 2);
        int64_t base = time_wall_ns() - 3600 * SEC;

        /* 1. The collector dies for good after two samples; the sandbox runs
         * on, is paused 10 s and stops: only the vmm's stopped event says so.
         * Truth: CPU 150 s, running 86.25 s, paused 10 s. */
        put(&t, tick("sb-fh-lost", 1, base, STATE_RUNNING, 500 * MS, 1 * SEC, 0));
        put(&t, tick("sb-fh-lost", 2, base + 10 * SEC, STATE_RUNNING, 8 * SEC, 11 * SEC, 0));
        put(&t, stop("sb-fh-lost", base + 95250 * MS, 150 * SEC, 86250 * MS, 10 * SEC));

        /* 2. The stopped event before the collector's last samples: a sample
         * read before the stop but sent after it, and a final sample stamped
         * 10 s after the stop by a collector that came back late.
         * Truth: CPU 40 s, running 32.5 s. */
        put(&t, tick("sb-fh-stopfirst", 1, base, STATE_RUNNING, 1 * SEC, 2 * SEC, 0));
        put(&t, stop("sb-fh-stopfirst", base + 30500 * MS, 40 * SEC, 32500 * MS, 0));
        put(&t, tick("sb-fh-stopfirst", 2, base + 20 * SEC, STATE_RUNNING, 25 * SEC, 22 * SEC, 0));
        put(&t, tick("sb-fh-stopfirst", 3, base + 40500 * MS, STATE_STOPPED, 40 * SEC, 32500 * MS, 0));

        /* 3. The same life with the final sample first, then the stopped event. */
        put(&t, tick("sb-fh-finalfirst", 1, base, STATE_RUNNING, 1 * SEC, 2 * SEC, 0));
        put(&t, tick("sb-fh-finalfirst", 2, base + 20 * SEC, STATE_RUNNING, 25 * SEC, 22 * SEC, 0));
        put(&t, tick("sb-fh-finalfirst", 3, base + 40500 * MS, STATE_STOPPED, 40 * SEC, 32500 * MS, 0));
        put(&t, stop("sb-fh-finalfirst", base + 30500 * MS, 40 * SEC, 32500 * MS, 0));

        /* 4. Shorter than a tick, never sampled: created, stopped 0.3 s later.
         * Truth: CPU 0.12 s, running 0.3 s. */
        struct usage_event created = { .type = EVENT_CREATED, .wall_ns = base, .mem_size_bytes = 2 * GiB, .vcpus = 2 };
        strcpy(created.host, "host-1");
        strcpy(created.sandbox, "sb-fh-tiny");
        strcpy(created.account, "acct-fh");
        strcpy(created.key, "key-fh");
        strcpy(created.backend, "process");
        aggtest_produce(&t, &created);
        put(&t, stop("sb-fh-tiny", base + 300 * MS, 120 * MS, 300 * MS, 0));

        /* 5. Paused and resumed between ticks (1 s apart): paused at 0.9 s of
         * its life, resumed at 2.3 s, stopped at 2.9 s. Truth: running 1.5 s,
         * paused 1.4 s, CPU 0.7 s. */
        put(&t, tick("sb-fh-pause", 1, base, STATE_RUNNING, 100 * MS, 400 * MS, 0));
        put(&t, tick("sb-fh-pause", 2, base + 1 * SEC, STATE_PAUSED, 400 * MS, 900 * MS, 500 * MS));
        put(&t, tick("sb-fh-pause", 3, base + 2 * SEC, STATE_RUNNING, 450 * MS, 1000 * MS, 1400 * MS));
        put(&t, stop("sb-fh-pause", base + 2500 * MS, 700 * MS, 1500 * MS, 1400 * MS));
        put(&t, tick("sb-fh-pause", 4, base + 3 * SEC, STATE_STOPPED, 700 * MS, 1500 * MS, 1400 * MS));
        aggtest_flush(&t);

        pid_t agg = aggtest_spawn(&t, NULL);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");

        aggtest_expect_billed(&t, "sb-fh-lost", "150000000000/185220464640000000000/31474836480000000000",
               "the stopped event closes the bill when the collector is gone");
        aggtest_expect_billed(&t, "sb-fh-stopfirst", "40000000000/69793218560000000000/0",
               "stopped event first: the final counters, billed once");
        aggtest_expect_billed(&t, "sb-fh-finalfirst", "40000000000/69793218560000000000/0",
               "final sample first: the same");
        aggtest_expect_billed(&t, "sb-fh-tiny", "120000000/644245094400000000/0", "a sandbox shorter than a tick: its whole life");
        aggtest_expect_billed(&t, "sb-fh-pause", "700000000/3221225472000000000/4406477107200000000",
               "pause and resume between ticks: the held counters' time");
        char *v = aggtest_query(&t, "SELECT count(*) FROM sandboxes WHERE account_id = 'acct-fh' AND state = 'stopped'");
        CHECK(v && strcmp(v, "5") == 0, "every sandbox stopped in the ledger: %s of 5", v ? v : "?");
        free(v);
        v = aggtest_query(&t, "SELECT count(*) FROM dead_letters");
        CHECK(v && strcmp(v, "0") == 0, "no dead letters: %s", v ? v : "?");
        free(v);

        CHECK(aggtest_terminate(agg) == 0, "unclean stop");

        /* After a restart (the fold state read back from the ledger), a
         * sample read before the stop and sent late, with a higher seq and a
         * smaller counter, is not a restart of the counter: nothing more. */
        put(&t, tick("sb-fh-lost", 3, base + 50 * SEC, STATE_RUNNING, 100 * SEC, 51 * SEC, 0));
        aggtest_flush(&t);
        agg = aggtest_spawn(&t, NULL);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up after the restart");
        aggtest_expect_billed(&t, "sb-fh-lost", "150000000000/185220464640000000000/31474836480000000000",
               "a late sample after the stop and a restart bills nothing more");
        CHECK(aggtest_terminate(agg) == 0, "unclean stop");
        aggtest_stop(&t);
        return test_result();
}
