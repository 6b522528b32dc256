/* Integration: a commit that fails on the writer thread while the next batch
 * is being folded (aggregator/loop.c: a batch commits while the next one is
 * folded). A real tally-aggregator bills into a real PostgreSQL:
 *
 *   1. Round 1 of 10 sandboxes is billed.
 *   2. Another session holds `hosts` locked, so the commit of round 2 stops
 *      at its last statement with its transaction open.
 *   3. Round 3 is produced and folded into the next batch meanwhile.
 *   4. The blocked commit's backend is terminated: the transaction is lost.
 *
 * The aggregator must drop both batches (round 3 was folded on top of round
 * 2's state), read the state back from the ledger and bill rounds 2 and 3
 * once each: every sandbox's counters exactly, worked out by hand. Its log
 * says the open batch went with the failed commit.
 *
 * Then held readings in a batch handed to the writer: with batches of two
 * messages, a sandbox's two samples (its `created` event not seen yet, so
 * both held) fill one batch, and its `created` event, in the same poll,
 * opens the next. The event must find them, though the batch holding them
 * was still committing: the sandbox is billed its final counter and nothing
 * stays held.
 *
 * Then `created` rows committed ahead of their batch (announce.h): 100 new
 * sandboxes' created events in one burst, then two samples each, produced
 * once the aggregator has its partitions (batch_ms 2000: the batch is not
 * due when the idle writer is free). The rows of the first poll's created
 * events (64 or more) must be in the ledger while the batch's own commit
 * still waits on `hosts`; that commit is then lost (its
 * backend ended), the batch read again, its created events written again:
 * every row as its created event says, each sandbox billed once.
 *
 * Last, the rows ahead are what fails: their backend is ended while they
 * wait on a lock of `sandboxes`. The aggregator says so, and the batch
 * writes them itself: every row there, each sandbox billed once. */
#include "aggtest.h"
#include "storetest.h"
#include "support.h"
#include "timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SANDBOXES 10
#define MIB (UINT64_C(1) << 20)

/* Round r of sandbox i: 10 s of wall time apart, 4 s of CPU each round, 256 MiB. */
static void produce_round(struct aggtest *t, int64_t t0, int r)
{
        for (int i = 0; i < SANDBOXES; i++) {
                char sb[32];
                snprintf(sb, sizeof(sb), "sb_inflight_%d", i);
                struct usage_event ev = aggtest_sample("acct_inflight", "key_inflight", sb, 1, (uint64_t)r,
                                                       t0 + r * 10 * NS_PER_SEC, STATE_RUNNING,
                                                       (uint64_t)r * 4 * NS_PER_SEC, 256 * MIB, 0, 1);
                aggtest_produce(t, &ev);
        }
        aggtest_flush(t);
}

/* The backend of a session waiting for a lock with an INSERT INTO table (the
 * writer's), or -1. */
static int64_t blocked_writer(struct aggtest *t, const char *table)
{
        char sql[256];
        snprintf(sql, sizeof(sql), "SELECT coalesce(min(pid), -1) FROM pg_stat_activity"
                                   " WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO %s %%'", table);
        return store_int(t, sql);
}

/* Waits (up to 10 s) for blocked_writer(t, table). */
static int64_t wait_blocked(struct aggtest *t, const char *table)
{
        int64_t pid = -1;
        for (int i = 0; i < 500 && pid < 0; i++) {
                time_sleep_ns(20 * NS_PER_MS);
                pid = blocked_writer(t, table);
        }
        return pid;
}

/* AHEAD new sandboxes PREFIX_i of acct_ahead: their created events in one
 * burst (so a poll holds ANNOUNCE_MIN, 64, or more), then two samples each,
 * 10 s apart, 4 s of CPU each, 256 MiB, 2 vCPUs. */
#define AHEAD 100
static void produce_new_sandboxes(struct aggtest *t, const char *prefix, int64_t t0)
{
        char buf[4096];
        for (int k = 0; k <= 2; k++) {
                for (int i = 0; i < AHEAD; i++) {
                        char sb[32];
                        snprintf(sb, sizeof(sb), "%s_%d", prefix, i);
                        int round = k ? k : 1;
                        struct usage_event ev = aggtest_sample("acct_ahead", "key_ahead", sb, 1, (uint64_t)round,
                                                               t0 + round * 10 * NS_PER_SEC, STATE_RUNNING,
                                                               (uint64_t)round * 4 * NS_PER_SEC, 256 * MIB, 0, 2);
                        if (k == 0)
                                ev = aggtest_created_for(&ev);
                        int len = event_encode(&ev, buf, sizeof(buf));
                        CHECK(len > 0, "encode");
                        aggtest_produce_raw(t, "acct_ahead", buf, len > 0 ? (size_t)len : 0);
                }
                aggtest_flush(t);
        }
}

/* Each of PREFIX_0.. billed its last counter, 2 x 4 s of CPU, and 10 s x
 * 256 MiB between its two samples (by hand); its row as its created event
 * and samples say. */
static void expect_new_sandboxes(struct aggtest *t, const char *prefix, const char *what)
{
        for (int i = 0; i < AHEAD; i++) {
                char sb[32];
                snprintf(sb, sizeof(sb), "%s_%d", prefix, i);
                aggtest_expect_billed(t, sb, "8000000000/2684354560000000000/0", what);
        }
        char sql[256];
        snprintf(sql, sizeof(sql), "SELECT count(*) FROM sandboxes WHERE id LIKE '%s\\_%%' AND vcpus = 2"
                                   " AND state = 'running' AND host <> '' AND account_id = 'acct_ahead'", prefix);
        CHECK(store_int(t, sql) == AHEAD, "%s: the sandboxes rows are not as their created events and samples say",
              what);
}

/* A session holding table locked (EXCLUSIVE: reads pass, writes wait). */
static PGconn *lock_table(struct aggtest *t, const char *table)
{
        PGconn *lock = PQconnectdb(t->db_url);
        CHECK(PQstatus(lock) == CONNECTION_OK, "lock session: %s", PQerrorMessage(lock));
        PQclear(PQexec(lock, "BEGIN"));
        char sql[128];
        snprintf(sql, sizeof(sql), "LOCK TABLE %s IN EXCLUSIVE MODE", table);
        PGresult *r = PQexec(lock, sql);
        CHECK(PQresultStatus(r) == PGRES_COMMAND_OK, "lock %s: %s", table, PQresultErrorMessage(r));
        PQclear(r);
        return lock;
}

/* Starts the n-th aggregator of the test (its log n) and waits up to 30 s
 * for its partitions. */
static pid_t spawn_assigned(struct aggtest *t, const char *const *args, int n)
{
        pid_t agg = aggtest_spawn(t, args);
        for (int i = 0; i < 600 && !store_log_has(t, n, "partition assigned"); i++)
                time_sleep_ns(50 * NS_PER_MS);
        return agg;
}

/* Ends backend pid, then the lock session. */
static void end_backend(struct aggtest *t, int64_t pid, PGconn *lock)
{
        char sql[128];
        snprintf(sql, sizeof(sql), "SELECT pg_terminate_backend(%lld)::int", (long long)pid);
        CHECK(store_int(t, sql) == 1, "could not end the writer's backend %lld", (long long)pid);
        PQclear(PQexec(lock, "ROLLBACK"));
        PQfinish(lock);
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_store_inflight", 2);
        const char *extra[] = { "--batch-ms", "50", NULL };
        pid_t agg = aggtest_spawn(&t, extra);
        int64_t t0 = time_wall_ns() - 10 * 60 * NS_PER_SEC;

        produce_round(&t, t0, 1);
        CHECK(aggtest_wait_caught_up(&t, 30) == 0, "round 1 was not billed");
        int64_t after1 = aggtest_committed(&t);
        /* The writer's session ran every commit statement once at start, rolled back (store_warm). */
        CHECK(store_log_has(&t, 0, "msg=\"ledger session warmed\""),
              "the aggregator did not warm its writer's session at start");

        PGconn *lock = lock_table(&t, "hosts");
        produce_round(&t, t0, 2);
        int64_t writer = wait_blocked(&t, "hosts");
        CHECK(writer > 0, "round 2's commit never waited on hosts");

        /* Round 3 is taken into the next batch while round 2's commit waits. */
        produce_round(&t, t0, 3);
        time_sleep_ns(NS_PER_SEC);
        CHECK(aggtest_committed(&t) == after1, "something committed past round 1 while hosts was locked");

        end_backend(&t, writer, lock);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "rounds 2 and 3 were not billed after the failed commit");
        /* By hand: the last counter, 3 x 4 s of CPU; memory between the first
         * and the last reading, 20 s x 256 MiB. */
        for (int i = 0; i < SANDBOXES; i++) {
                char sb[32];
                snprintf(sb, sizeof(sb), "sb_inflight_%d", i);
                aggtest_expect_billed(&t, sb, "12000000000/5368709120000000000/0", "after the failed commit");
        }
        CHECK(store_log_has(&t, 0, "the batch folded during a failed commit is dropped too"),
              "the aggregator did not say the open batch went with the failed commit");
        if (test_result() != 0)
                store_log_dump(&t, 0, 4000);
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");

        /* 2: produced whole before the aggregator starts, so one poll takes all three. */
        struct usage_event h1 = aggtest_sample("acct_inflight", "key_inflight", "sb_inflight_held", 1, 1,
                                               t0 + 10 * NS_PER_SEC, STATE_RUNNING, 1 * NS_PER_SEC, 256 * MIB, 0, 1);
        struct usage_event h2 = aggtest_sample("acct_inflight", "key_inflight", "sb_inflight_held", 1, 2,
                                               t0 + 20 * NS_PER_SEC, STATE_STOPPED, 3 * NS_PER_SEC, 256 * MIB, 0, 1);
        struct usage_event created = aggtest_created_for(&h1);
        char buf[4096];
        const struct usage_event *order[] = { &h1, &h2, &created };
        for (size_t i = 0; i < 3; i++) {
                int n = event_encode(order[i], buf, sizeof(buf));
                CHECK(n > 0, "encode");
                aggtest_produce_raw(&t, "acct_inflight", buf, n > 0 ? (size_t)n : 0);
        }
        aggtest_flush(&t);
        const char *two[] = { "--batch-messages", "2", NULL };
        agg = aggtest_spawn(&t, two);
        CHECK(aggtest_wait_caught_up(&t, 30) == 0, "the held readings' messages were not taken");
        /* By hand: the final counter, 3 s of CPU; 10 s x 256 MiB between the two samples. */
        for (int i = 0; i < 50 && store_int(&t, "SELECT count(*) FROM held_readings") != 0; i++)
                time_sleep_ns(100 * NS_PER_MS);
        aggtest_expect_billed(&t, "sb_inflight_held", "3000000000/2684354560000000000/0",
                              "held readings whose batch was committing when their created event came");
        CHECK(store_int(&t, "SELECT count(*) FROM held_readings") == 0, "readings left held");
        if (test_result() != 0)
                store_log_dump(&t, 1, 4000);
        CHECK(aggtest_terminate(agg) == 0, "the second aggregator did not stop cleanly");

        /* 3: created rows ahead of a batch whose commit is then lost. Produced
         * once the aggregator has its partitions: rows are committed ahead only
         * for a consumer at the head of the stream (announce.h). */
        lock = lock_table(&t, "hosts");
        const char *slow[] = { "--batch-ms", "2000", "--log-level", "debug", NULL };
        agg = spawn_assigned(&t, slow, 2);
        /* Started while hosts is locked: it gave up warming its session (lock_timeout), not starting. */
        CHECK(store_log_has(&t, 2, "could not warm the ledger session"),
              "the aggregator started beside a locked hosts table did not say it could not warm its session");
        produce_new_sandboxes(&t, "sb_ahead", t0);
        writer = wait_blocked(&t, "hosts");
        CHECK(writer > 0, "the batch's commit never waited on hosts");
        int64_t ahead = store_int(&t, "SELECT count(*) FROM sandboxes WHERE id LIKE 'sb\\_ahead\\_%'"
                                      " AND account_id = 'acct_ahead' AND key_id = 'key_ahead' AND vcpus = 2"
                                      " AND state = 'running'");
        CHECK(ahead >= 64 && ahead <= AHEAD, "%lld created rows in the ledger while their batch's commit waited",
              (long long)ahead);
        CHECK(store_int(&t, "SELECT count(*) FROM usage_hourly WHERE sandbox_id LIKE 'sb\\_ahead\\_%'") == 0,
              "usage committed while the batch's commit waited");
        end_backend(&t, writer, lock);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the batch was not billed after its lost commit");
        CHECK(store_log_has(&t, 2, "created events committed ahead of their batch"),
              "the aggregator did not say it committed created events ahead");
        expect_new_sandboxes(&t, "sb_ahead", "created rows committed ahead");
        if (test_result() != 0)
                store_log_dump(&t, 2, 6000);
        CHECK(aggtest_terminate(agg) == 0, "the third aggregator did not stop cleanly");

        /* 4: the rows ahead are what fails (their backend ended while they wait
         * on a lock of sandboxes): said, and the batch writes them itself. */
        agg = spawn_assigned(&t, slow, 3);
        lock = lock_table(&t, "sandboxes"); /* (after the start: its statements are prepared then) */
        produce_new_sandboxes(&t, "sb_ahead2", t0);
        writer = wait_blocked(&t, "sandboxes");
        CHECK(writer > 0, "the created rows ahead never waited on sandboxes");
        CHECK(store_int(&t, "SELECT count(*) FROM sandboxes WHERE id LIKE 'sb\\_ahead2\\_%'") == 0,
              "created rows in the ledger while their upsert waited");
        end_backend(&t, writer, lock);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the batch was not billed after the rows ahead failed");
        CHECK(store_log_has(&t, 3, "could not commit created events ahead of their batch; the batch writes them"),
              "the aggregator did not say the rows ahead failed");
        expect_new_sandboxes(&t, "sb_ahead2", "created rows ahead lost");
        if (test_result() != 0)
                store_log_dump(&t, 3, 6000);
        CHECK(aggtest_terminate(agg) == 0, "the fourth aggregator did not stop cleanly");
        aggtest_stop(&t);
        return test_result();
}
