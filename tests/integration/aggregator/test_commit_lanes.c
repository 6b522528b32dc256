/* Integration: two commits under way at once (aggregator/loop.c, "lanes").
 * While the consumer keeps up, a batch of one commit group commits on a
 * lane of its own while another group's batch is still committing. A real
 * tally-aggregator (commit_groups 2, commit_writers 2) bills into a real
 * PostgreSQL through the development broker:
 *
 *   1. Accounts A and B, on partitions 0 and 1 (commit groups 0 and 1), one
 *      sandbox each, are billed a first sample.
 *   2. Another session holds B's fold_state row (FOR UPDATE): B's next
 *      commit stops at its fold state statement, its transaction open.
 *   3. A's next sample is billed meanwhile, on the other lane. (With
 *      --commit-writers 1 it waits behind B's commit: the check fails.)
 *   4. Another session moves A's fold_state version on, as an owner that
 *      billed it meanwhile would, and A's third sample comes: its commit is
 *      fenced while B's still waits. The aggregator waits for B's commit,
 *      which goes through once the lock is released (its batch committed
 *      with the lock's wait in its lag, not dropped), then reads everything
 *      back from the ledger and bills A's third sample again.
 *   5. A last sample each, after all that.
 *
 * Every sandbox is billed its last counters exactly (worked out by hand),
 * one commit was fenced, and none failed. */
#include "aggtest.h"
#include "storetest.h"
#include "support.h"
#include "timeutil.h"

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PARTITIONS 2
#define MIB (UINT64_C(1) << 20)
#define LOCK_HELD_MS 1500

static char acct[PARTITIONS][32];

/* An account on each partition: librdkafka's partitioner for keyed messages
 * (the producer's, the collector's). */
static void pick_accounts(void)
{
        int n = 0;
        for (int i = 0; n < PARTITIONS && i < 10000; i++) {
                char id[32];
                snprintf(id, sizeof(id), "acct-lane-%d", i);
                int32_t p = rd_kafka_msg_partitioner_consistent(NULL, id, strlen(id), PARTITIONS, NULL, NULL);
                if (p >= 0 && p < PARTITIONS && !acct[p][0]) {
                        snprintf(acct[p], sizeof(acct[p]), "%s", id);
                        n++;
                }
        }
        CHECK(n == PARTITIONS, "an account on every partition: %d of %d", n, PARTITIONS);
}

/* Sample r of account p's sandbox: 10 s of wall time apart, 4 s of CPU each, 256 MiB. */
static void produce_sample(struct aggtest *t, int64_t t0, int p, int r)
{
        char key[48], sb[48];
        snprintf(key, sizeof(key), "%s-key", acct[p]);
        snprintf(sb, sizeof(sb), "%s-sb", acct[p]);
        struct usage_event ev = aggtest_sample(acct[p], key, sb, 1, (uint64_t)r, t0 + r * 10 * NS_PER_SEC,
                                               STATE_RUNNING, (uint64_t)r * 4 * NS_PER_SEC, 256 * MIB, 0, 1);
        aggtest_produce(t, &ev);
        aggtest_flush(t);
}

/* By hand: r samples give r x 4 s of CPU and (r - 1) x 10 s x 256 MiB. */
static void expect_billed(struct aggtest *t, int p, int r, const char *what)
{
        char sb[48], want[96];
        snprintf(sb, sizeof(sb), "%s-sb", acct[p]);
        snprintf(want, sizeof(want), "%llu/%llu/0", (unsigned long long)r * 4000000000ULL,
                 (unsigned long long)(r - 1) * 2684354560000000000ULL);
        aggtest_expect_billed(t, sb, want, what);
}

/* Waits up to timeout_ms for account p's sandbox to be billed r samples. */
static bool wait_billed(struct aggtest *t, int p, int r, int timeout_ms)
{
        char sql[160];
        snprintf(sql, sizeof(sql), "SELECT coalesce(sum(cpu_ns), 0) FROM usage_hourly WHERE sandbox_id = '%s-sb'",
                 acct[p]);
        for (int waited = 0; waited <= timeout_ms; waited += 20) {
                if (store_int(t, sql) == (int64_t)r * 4000000000LL)
                        return true;
                time_sleep_ns(20 * NS_PER_MS);
        }
        return false;
}

/* Waits (up to 10 s) for a session waiting for a lock with the fold state statement. */
static bool wait_fold_blocked(struct aggtest *t)
{
        for (int i = 0; i < 500; i++) {
                if (store_int(t, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                 " AND query LIKE 'WITH w AS (INSERT INTO fold_state %'") > 0)
                        return true;
                time_sleep_ns(20 * NS_PER_MS);
        }
        return false;
}

/* The lag_ms_oldest of the last "batch committed" line before the first
 * line holding `before` in the aggregator's log (-1: none). */
static long lag_before(struct aggtest *t, const char *before)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/aggregator.0.log", t->dir);
        char *log = test_read_file(path);
        char *end = log ? strstr(log, before) : NULL;
        long lag = -1;
        for (const char *p = log; end && (p = strstr(p, "msg=\"batch committed\"")) && p < end; p++) {
                const char *q = strstr(p, " lag_ms_oldest=");
                if (q && q < end)
                        lag = atol(q + 15);
        }
        free(log);
        return lag;
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_commit_lanes", PARTITIONS);
        pick_accounts();
        const char *writers = getenv("TALLY_TEST_COMMIT_WRITERS"); /* (1: the check of step 3 fails) */
        const char *extra[] = { "--commit-groups", "2", "--commit-writers", writers ? writers : "2",
                                "--batch-ms", "20", "--log-level", "debug", NULL };
        pid_t agg = aggtest_spawn(&t, extra);
        int64_t t0 = time_wall_ns() - 10 * 60 * NS_PER_SEC;

        /* 1 */
        for (int p = 0; p < PARTITIONS; p++)
                produce_sample(&t, t0, p, 1);
        CHECK(aggtest_wait_caught_up(&t, 30) == 0, "the first samples were not billed");
        time_sleep_ns(500 * NS_PER_MS);

        /* 2 */
        PGconn *lock = PQconnectdb(t.db_url);
        CHECK(PQstatus(lock) == CONNECTION_OK, "lock session: %s", PQerrorMessage(lock));
        PQclear(PQexec(lock, "BEGIN"));
        char sql[256];
        snprintf(sql, sizeof(sql), "SELECT 1 FROM fold_state WHERE sandbox_id = '%s-sb' FOR UPDATE", acct[1]);
        PGresult *r = PQexec(lock, sql);
        CHECK(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "lock B's fold state: %s",
              PQresultErrorMessage(r));
        PQclear(r);
        produce_sample(&t, t0, 1, 2);
        CHECK(wait_fold_blocked(&t), "B's commit never waited on its fold state row");

        /* 3 */
        produce_sample(&t, t0, 0, 2);
        CHECK(wait_billed(&t, 0, 2, 10000), "A's sample was not billed while B's commit waited on its lock");
        CHECK(!wait_billed(&t, 1, 2, 0), "B's sample was billed through a locked row");
        CHECK(store_log_has(&t, 0, "msg=\"batches take one commit group\""),
              "the aggregator keeping up did not take one commit group a batch");

        /* 4 */
        snprintf(sql, sizeof(sql), "UPDATE fold_state SET version = version + 1 WHERE sandbox_id = '%s-sb'", acct[0]);
        aggtest_exec(&t, sql);
        int64_t held_from = time_mono_ns();
        produce_sample(&t, t0, 0, 3);
        time_sleep_ns(LOCK_HELD_MS * NS_PER_MS);
        CHECK(!wait_billed(&t, 1, 2, 0), "B's sample was billed through a locked row");
        PQclear(PQexec(lock, "ROLLBACK"));
        PQfinish(lock);
        int64_t held_ms = (time_mono_ns() - held_from) / NS_PER_MS;
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the samples were not billed after the fenced commit");
        CHECK(store_log_has(&t, 0, "sandbox fenced: another aggregator billed it meanwhile"),
              "A's commit was not fenced");
        long lag = lag_before(&t, "msg=\"sandbox fenced");
        CHECK(lag >= held_ms, "the batch committed before the fenced one was read again waited %ld ms, want at least"
                              " the %lld ms the lock was held (B's blocked commit went through, not dropped)",
              lag, (long long)held_ms);

        /* 5 */
        produce_sample(&t, t0, 0, 4);
        produce_sample(&t, t0, 1, 3);
        CHECK(aggtest_wait_caught_up(&t, 30) == 0, "the last samples were not billed");
        expect_billed(&t, 0, 4, "A, through a fenced commit beside a blocked one");
        expect_billed(&t, 1, 3, "B, through a commit that waited on a lock");
        CHECK(store_int(&t, "SELECT count(*) FROM dead_letters") == 0, "dead letters");
        CHECK(!store_log_has(&t, 0, "could not commit a batch"), "a commit failed (other than the fenced one)");
        if (test_result() != 0)
                store_log_dump(&t, 0, 6000);
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        aggtest_stop(&t);
        return test_result();
}
