/* Integration, Apache Kafka: a broker is away for 30 s. Three KRaft nodes,
 * usage replicated 3 times with min.insync.replicas 2. While a real
 * tally-aggregator consumes, the node leading the most partitions of usage is
 * stopped (SIGTERM, its controlled shutdown) and kept away for 30 s while the
 * stream goes on at a steady pace, then started again on its data and the rest
 * of the stream goes in. Nothing lost, nothing doubled: the topic holds exactly
 * the messages produced, the aggregator commits to its end, and the ledger
 * equals the ground truth, in total and sandbox by sandbox. */
#include "kafkatest.h"
#include "support.h"
#include "timeutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define AWAY_S 30

int main(void)
{
        unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
        fprintf(stderr, "seed %u\n", seed);
        setenv("TALLY_TEST_KAFKA_NODES", "3", 1);
        struct aggtest t;
        aggtest_start(&t, "kafka_outage", 4);
        CHECK(t.kafka.apache && t.kafka.nodes == 3, "not a 3-node Apache Kafka");
        struct gen_stream g;
        gen_stream_make(&g, seed, 40, 100, aggtest_utc(2026, 4, 30, 22, 0, 0));
        fprintf(stderr, "%zu messages for %zu sandboxes\n", g.nmessages, g.nsandboxes);

        const char *extra[] = { "--batch-messages", "150", "--batch-ms", "30", "--consumer-settings",
                                "session.timeout.ms=6000,heartbeat.interval.ms=500", NULL };
        pid_t agg = aggtest_spawn(&t, extra);
        size_t quarter = g.nmessages / 4;
        kt_produce_paced(&t, &g, 0, quarter, 10, 100);
        for (int i = 0; i < 300 && aggtest_committed(&t) == 0; i++)
                time_sleep_ns(50 * NS_PER_MS);

        kt_print_leaders(&t, "before the outage");
        int leads[4] = { 0 }, away = 1;
        for (int p = 0; p < 4; p++) {
                int l = kt_leader(&t, p);
                if (l >= 1 && l <= 3)
                        leads[l]++;
        }
        for (int n = 2; n <= 3; n++)
                if (leads[n] > leads[away])
                        away = n;
        pid_t pid = test_kafka_node_pid(&t.kafka, away);
        fprintf(stderr, "stopping node %d (pid %d, leader of %d partitions) for %d s, at offset %lld committed\n",
                away, (int)pid, leads[away], AWAY_S, (long long)aggtest_committed(&t));
        int64_t t0 = time_boot_ns();
        CHECK(pid > 0 && kill(pid, SIGTERM) == 0, "could not stop node %d", away);
        for (int i = 0; i < 300 && test_kafka_node_pid(&t.kafka, away); i++)
                time_sleep_ns(100 * NS_PER_MS);
        CHECK(test_kafka_node_pid(&t.kafka, away) == 0, "node %d did not stop", away);

        /* Half the stream while it is away, at a steady pace over the 30 s. */
        kt_produce_paced(&t, &g, quarter, 3 * quarter, AWAY_S - 2, 1000);
        kt_print_leaders(&t, "with the node away");
        int64_t left = (int64_t)AWAY_S * NS_PER_SEC - (time_boot_ns() - t0);
        if (left > 0)
                time_sleep_ns(left);
        fprintf(stderr, "node %d away %.1f s; committed %lld meanwhile\n", away,
                (double)(time_boot_ns() - t0) / 1e9, (long long)aggtest_committed(&t));
        test_kafka_restart_node(&t.kafka, away);
        kt_produce_paced(&t, &g, 3 * quarter, g.nmessages, 10, 100);

        CHECK(aggtest_wait_caught_up(&t, 120) == 0, "the aggregator did not catch up after the outage");
        kt_print_leaders(&t, "at the end");
        kt_compare(&t, &g, (int64_t)g.nmessages);
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        gen_stream_free(&g);
        aggtest_stop(&t);
        return test_result();
}
