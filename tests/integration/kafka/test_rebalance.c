/* Integration, Apache Kafka: the consumer group rebalances for real. One
 * tally-aggregator holds every partition of usage; a second joins (Kafka's
 * group coordinator moves partitions to it); then the first dies (SIGKILL, no
 * leave: the coordinator notices at the session timeout) and the second takes
 * everything, starting from the offsets the ledger holds. The stream (with
 * duplicates, resent samples and a replay) goes in throughout. The ledger
 * equals the ground truth, in total and sandbox by sandbox. */
#include "kafkatest.h"
#include "support.h"
#include "timeutil.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(void)
{
        unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();
        fprintf(stderr, "seed %u\n", seed);
        struct aggtest t;
        aggtest_start(&t, "kafka_rebalance", 4);
        CHECK(t.kafka.apache, "not Apache Kafka");
        struct gen_stream g;
        gen_stream_make(&g, seed, 30, 100, aggtest_utc(2026, 2, 28, 22, 0, 0));
        fprintf(stderr, "%zu messages for %zu sandboxes\n", g.nmessages, g.nsandboxes);

        const char *extra[] = { "--batch-messages", "150", "--batch-ms", "30", "--consumer-settings",
                                "session.timeout.ms=6000,heartbeat.interval.ms=500", NULL };
        pid_t a = aggtest_spawn(&t, extra);
        for (int i = 0; i < 300 && kt_log_count(&t, 0, "partition assigned") == 0; i++)
                time_sleep_ns(100 * NS_PER_MS);
        size_t third = g.nmessages / 3;
        kt_produce_paced(&t, &g, 0, third, 10, 100);
        for (int i = 0; i < 300 && aggtest_committed(&t) == 0; i++)
                time_sleep_ns(50 * NS_PER_MS);

        int a_before = kt_log_count(&t, 0, "partition released");
        pid_t b = aggtest_spawn(&t, extra);
        for (int i = 0; i < 300 && kt_log_count(&t, 1, "partition assigned") == 0; i++)
                time_sleep_ns(100 * NS_PER_MS);
        fprintf(stderr, "second aggregator joined: its assignments %d, first's releases %d -> %d\n",
                kt_log_count(&t, 1, "partition assigned"), a_before, kt_log_count(&t, 0, "partition released"));
        CHECK(kt_log_count(&t, 1, "partition assigned") > 0, "the second aggregator got no partition");
        CHECK(kt_log_count(&t, 0, "partition released") > a_before, "the first aggregator gave up no partition");
        kt_produce_paced(&t, &g, third, 2 * third, 10, 100);
        for (int i = 0; i < 100 && aggtest_committed(&t) < (int64_t)third * 3 / 2; i++)
                time_sleep_ns(100 * NS_PER_MS);

        int b_before = kt_log_count(&t, 1, "partition assigned");
        fprintf(stderr, "killing the first aggregator (pid %d) at offset %lld committed\n", (int)a,
                (long long)aggtest_committed(&t));
        kill(a, SIGKILL);
        waitpid(a, NULL, 0);
        kt_produce_paced(&t, &g, 2 * third, g.nmessages, 10, 100);
        CHECK(aggtest_wait_caught_up(&t, 120) == 0, "the second aggregator did not catch up");
        fprintf(stderr, "second aggregator's assignments %d -> %d after the first died\n", b_before,
                kt_log_count(&t, 1, "partition assigned"));
        CHECK(kt_log_count(&t, 1, "partition assigned") > b_before, "the dead aggregator's partitions never moved");
        char *v = aggtest_query(&t, "SELECT count(*) FROM consumer_offsets WHERE generation > 1");
        fprintf(stderr, "partitions whose offsets were written by a later group generation: %s\n", v ? v : "?");
        CHECK(v && atoi(v) > 0, "no partition changed hands");
        free(v);
        kt_compare(&t, &g, (int64_t)g.nmessages);
        CHECK(aggtest_terminate(b) == 0, "the second aggregator did not stop cleanly");
        gen_stream_free(&g);
        aggtest_stop(&t);
        return test_result();
}
