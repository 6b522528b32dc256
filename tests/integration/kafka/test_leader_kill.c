/* Integration, Apache Kafka: the leader of a partition of `usage` is killed
 * with SIGKILL mid-run. Three KRaft nodes (each broker and controller), usage
 * replicated 3 times with min.insync.replicas 2; a real tally-aggregator
 * consumes while a random stream (streamgen: duplicates, resent samples, a
 * replay) is produced by an idempotent producer. A third of the stream goes in,
 * the node leading usage/0 is killed, a third goes in while it is dead (to the
 * leaders elected in its place), it comes back, the rest goes in. Nothing lost,
 * nothing doubled: the topic holds exactly the messages produced, the
 * aggregator commits to its end, and the ledger equals the ground truth the
 * generator summed, in total and sandbox by sandbox. */
#include "kafkatest.h"
#include "support.h"
#include "timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(void)
{
        unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
        fprintf(stderr, "seed %u\n", seed);
        setenv("TALLY_TEST_KAFKA_NODES", "3", 1);
        struct aggtest t;
        aggtest_start(&t, "kafka_leader_kill", 4);
        CHECK(t.kafka.apache && t.kafka.nodes == 3, "not a 3-node Apache Kafka");
        struct gen_stream g;
        gen_stream_make(&g, seed, 40, 100, aggtest_utc(2026, 3, 31, 22, 0, 0));
        fprintf(stderr, "%zu messages for %zu sandboxes\n", g.nmessages, g.nsandboxes);

        const char *extra[] = { "--batch-messages", "150", "--batch-ms", "30", "--consumer-settings",
                                "session.timeout.ms=6000,heartbeat.interval.ms=500", NULL };
        pid_t agg = aggtest_spawn(&t, extra);
        size_t third = g.nmessages / 3;
        kt_produce_paced(&t, &g, 0, third, 10, 100);
        /* Mid-run: the aggregator is consuming (it has committed something) when the leader dies. */
        for (int i = 0; i < 300 && aggtest_committed(&t) == 0; i++)
                time_sleep_ns(50 * NS_PER_MS);
        CHECK(aggtest_committed(&t) > 0, "the aggregator committed nothing before the kill");
        kt_print_leaders(&t, "before the kill");
        int leader = kt_leader(&t, 0);
        CHECK(leader >= 1 && leader <= 3, "usage/0 has no leader (%d)", leader);
        if (leader < 1 || leader > 3)
                leader = 1;
        fprintf(stderr, "killing node %d (pid %d), leader of usage/0, at offset %lld committed\n", leader,
                (int)test_kafka_node_pid(&t.kafka, leader), (long long)aggtest_committed(&t));
        test_kafka_kill_node(&t.kafka, leader);
        CHECK(test_kafka_node_pid(&t.kafka, leader) == 0, "node %d still runs", leader);

        kt_produce_paced(&t, &g, third, 2 * third, 10, 100);
        int now = kt_leader(&t, 0);
        kt_print_leaders(&t, "with the node dead");
        CHECK(now >= 1 && now != leader, "usage/0 led by %d after its leader %d died", now, leader);

        test_kafka_restart_node(&t.kafka, leader);
        fprintf(stderr, "node %d back\n", leader);
        kt_produce_paced(&t, &g, 2 * third, g.nmessages, 10, 100);

        CHECK(aggtest_wait_caught_up(&t, 120) == 0, "the aggregator did not catch up after the leader died");
        kt_print_leaders(&t, "at the end");
        kt_compare(&t, &g, (int64_t)g.nmessages);
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        gen_stream_free(&g);
        aggtest_stop(&t);
        return test_result();
}
