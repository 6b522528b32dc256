/* Integration: commit groups (aggregator/loop.c, docs/operations.md
 * "Commit latency"). A consumer that keeps up takes the partitions it owns
 * in groups, a batch per group in turn, the messages of the other groups
 * waiting in the aggregator for a batch of their own. That must change what
 * a batch holds, never what is billed; through the real development broker,
 * real tally-aggregators and PostgreSQL:
 *
 *   - 4 partitions, 8 accounts (two on each partition), 3 sandboxes each;
 *     a usage batch per account per tick, ticks paced every 15 ms so the
 *     aggregator keeps up (its batches then take one group: checked in its
 *     log, "partitions=" of each batch committed and the switch logged);
 *   - every 7th tick each account's batch carries a record that does not
 *     decode: a dead letter per such message, so a message lost or taken
 *     twice shows in their count (the usage, from cumulative counters,
 *     would not show a message lost in the middle);
 *   - midway the aggregator is SIGKILLed while batches of one group commit
 *     and the other group's messages wait, and a fresh one takes over;
 *     later a second one joins (a rebalance numbers the groups anew).
 *
 * Then every sandbox is billed its last counters exactly (cpu_ns the last
 * CPU counter; memory 1 GiB x the last running_ns, worked out by hand below),
 * every message is behind the ledger's offsets, and the dead letters number
 * exactly the messages given a bad record. */
#include "aggtest.h"
#include "sample_batch.h"
#include "support.h"
#include "timeutil.h"

#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define GiB UINT64_C(1073741824)
#define SEC NS_PER_SEC
#define PARTITIONS 4
#define ACCOUNTS 8
#define SANDBOXES 3             /* per account */
#define TICKS 600
#define KILL_AT 200             /* tick: the first aggregator SIGKILLed */
#define JOIN_AT 420             /* tick: a second aggregator joins */
#define BAD_EVERY 7             /* ticks: a record that does not decode in each account's batch */
#define TICK_MS 15

static char accounts[ACCOUNTS][32];

/* Sandbox s of account a at tick k (1-based): CPU (s + 1) x 100 ms a tick of
 * one second, running all along on 2 vCPUs with 1 GiB. */
static struct usage_event reading(int a, int s, int k, int64_t base)
{
        char key[EVENT_ID_MAX + 1], sb[EVENT_ID_MAX + 1];
        snprintf(key, sizeof(key), "%.31s-key", accounts[a]);
        snprintf(sb, sizeof(sb), "%.31s-sb%d", accounts[a], s);
        struct usage_event ev = aggtest_sample(accounts[a], key, sb, 1, (uint64_t)k, base + k * SEC, STATE_RUNNING,
                                               (uint64_t)k * (uint64_t)(s + 1) * (SEC / 10), GiB, 0, 2);
        strcpy(ev.host, "host-cg");
        return aggtest_held(ev, (uint64_t)k * SEC, 0);
}

/* Account a's usage batch of tick k; returns 1 if it carries a bad record. */
static int send_tick(struct aggtest *t, int a, int k, int64_t base)
{
        static uint8_t buf[SAMPLE_BATCH_MAX_BYTES];
        int64_t wall = base + k * SEC, mono = 1000 + k * SEC;
        int n = sample_batch_begin(buf, sizeof(buf), "host-cg", wall, mono);
        CHECK(n > 0, "batch header: %d", n);
        size_t len = n > 0 ? (size_t)n : 0;
        int bad = k % BAD_EVERY == 0;
        for (int s = 0; s < SANDBOXES; s++) {
                struct usage_event ev = reading(a, s, k, base), created;
                if (aggtest_needs_created(t, &ev, &created))
                        aggtest_produce(t, &created);
                ev.mono_ns = mono;
                n = sample_batch_record(buf + len, sizeof(buf) - len, wall, mono, &ev);
                CHECK(n > 0, "batch record of %s: %d", ev.sandbox, n);
                len += n > 0 ? (size_t)n : 0;
                if (bad && s == 0) {
                        buf[len++] = 0x01; /* a record of one byte: flags with unknown bits */
                        buf[len++] = 0xe0;
                }
        }
        aggtest_produce_raw(t, accounts[a], buf, len);
        return bad;
}

/* How many "batch committed" lines of the log at path moved fewer than
 * `owned` partitions, and whether it logged taking one commit group. */
static int grouped_batches(const char *path, int owned, bool *switched)
{
        char *log = test_read_file(path);
        int n = 0;
        *switched = log && strstr(log, "msg=\"batches take one commit group\"");
        for (const char *p = log; p && (p = strstr(p, "msg=\"batch committed\"")); p++) {
                const char *q = strstr(p, " partitions=");
                if (q && atoi(q + 12) < owned && atoi(q + 12) > 0)
                        n++;
        }
        free(log);
        return n;
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_commit_groups", PARTITIONS);
        aggtest_accounts_on_partitions(accounts, ACCOUNTS, PARTITIONS, "acct-cg"); /* (two on each) */
        int64_t base = time_wall_ns() - 3600 * SEC;
        const char *extra[] = { "--commit-groups", "2", "--log-level", "debug", NULL };
        pid_t first = aggtest_spawn(&t, extra), second = -1, third = -1;
        char first_log[1024];
        snprintf(first_log, sizeof(first_log), "%s/aggregator.0.log", t.dir);

        int bad = 0;
        for (int k = 1; k <= TICKS; k++) {
                for (int a = 0; a < ACCOUNTS; a++)
                        bad += send_tick(&t, a, k, base);
                aggtest_flush(&t);
                time_sleep_ns(TICK_MS * NS_PER_MS);
                if (k == KILL_AT) {
                        bool switched;
                        int grouped = grouped_batches(first_log, PARTITIONS, &switched);
                        fprintf(stderr, "the first aggregator, at its kill: %d batches of one commit group\n",
                                grouped);
                        CHECK(switched && grouped >= 3,
                              "the first aggregator keeping up took one commit group a batch: %d batches of fewer"
                              " than %d partitions (want 3 or more), the switch %s", grouped, PARTITIONS,
                              switched ? "logged" : "not logged");
                        kill(first, SIGKILL);
                        waitpid(first, NULL, 0);
                        second = aggtest_spawn(&t, extra);
                }
                if (k == JOIN_AT)
                        third = aggtest_spawn(&t, extra);
        }
        CHECK(aggtest_wait_caught_up(&t, 120) == 0, "the aggregators did not catch up");

        for (int a = 0; a < ACCOUNTS; a++)
                for (int s = 0; s < SANDBOXES; s++) {
                        char sb[EVENT_ID_MAX + 1], want[128];
                        snprintf(sb, sizeof(sb), "%.31s-sb%d", accounts[a], s);
                        /* cpu: TICKS x (s + 1) x 100 ms; memory: 1 GiB x TICKS s running,
                         * in byte-ns (past 64 bits: the GiB-seconds, then nine zeros) */
                        snprintf(want, sizeof(want), "%llu/%llu000000000/0",
                                 (unsigned long long)TICKS * (unsigned long long)(s + 1) * (SEC / 10),
                                 (unsigned long long)GiB * (unsigned long long)TICKS);
                        aggtest_expect_billed(&t, sb, want, "a sandbox billed through commit groups");
                }
        char *dead = aggtest_query(&t, "SELECT count(*) FROM dead_letters WHERE reason LIKE '%usage batch%'");
        CHECK(dead && atoi(dead) == bad, "dead letters of the bad records: %s, want %d (one per message)",
              dead ? dead : "?", bad);
        free(dead);
        char *held = aggtest_query(&t, "SELECT count(*) FROM held_readings");
        CHECK(held && strcmp(held, "0") == 0, "readings left held: %s", held ? held : "?");
        free(held);

        CHECK(aggtest_terminate(second) == 0, "the second aggregator did not exit cleanly");
        CHECK(aggtest_terminate(third) == 0, "the third aggregator did not exit cleanly");
        aggtest_stop(&t);
        return test_result();
}
