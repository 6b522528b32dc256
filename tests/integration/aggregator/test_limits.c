/* Integration: daily spend limits. A key's alerts fire once per threshold
 * (50%, 80%, 100%) however often its usage is replayed; at 100% the key is
 * blocked for the UTC day (key_blocked) and a pause or stop command, by the
 * key's policy, appears on the control topic. A key without a limit never
 * alerts. Prices are the default plan's: a 2 vCPU / 4 GiB sandbox with both
 * CPUs busy costs $0.08 an hour, so a $0.10 limit is crossed at 50% after
 * 37.5 min, 80% after 60 min and 100% after 75 min. */
#include "aggtest.h"
#include "control.h"
#include "kafka.h"
#include "support.h"
#include "timeutil.h"

#include <stdlib.h>
#include <string.h>

#define GiB (UINT64_C(1) << 30)

static int64_t day0;

/* Samples of a busy 2 vCPU / 4 GiB sandbox, minutes [from, to]. */
static void busy(struct aggtest *t, const char *key, const char *sandbox, int from, int to)
{
        for (int m = from; m <= to; m++) {
                struct usage_event ev = aggtest_sample("lim", key, sandbox, 1, (uint64_t)m + 1,
                                                       day0 + m * 60 * NS_PER_SEC, STATE_RUNNING,
                                                       (uint64_t)m * 120 * NS_PER_SEC, 4 * GiB, 0, 2);
                aggtest_produce(t, &ev);
        }
        aggtest_flush(t);
}

static void expect(struct aggtest *t, const char *sql, const char *want, const char *what)
{
        char *v = aggtest_query(t, sql);
        CHECK(v && strcmp(v, want) == 0, "%s: got %s, want %s", what, v ? v : "(none)", want);
        free(v);
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_limits", 2);
        day0 = time_day_start(time_wall_ns());
        aggtest_exec(&t, "INSERT INTO accounts (id, name) VALUES ('lim', 'limits');"
                         "INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars, limit_policy) VALUES"
                         " ('kp', 'lim', sha256('kp'), 100000000, 'pause'),"
                         " ('ks', 'lim', sha256('ks'), 50000000, 'stop'),"
                         " ('kn', 'lim', sha256('kn'), NULL, 'pause')");
        pid_t agg = aggtest_spawn(&t, NULL);
        const char *alerts = "SELECT coalesce(string_agg(threshold_pct::text, ',' ORDER BY threshold_pct), '')"
                             " FROM alerts WHERE key_id = 'kp'";

        busy(&t, "kp", "sb-p", 0, 40);
        busy(&t, "kn", "sb-n", 0, 200);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
        expect(&t, alerts, "50", "after 40 min");
        expect(&t, "SELECT key_blocked('kp')::text", "false", "not blocked below the limit");

        busy(&t, "kp", "sb-p", 41, 65);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
        expect(&t, alerts, "50,80", "after 65 min");

        busy(&t, "kp", "sb-p", 66, 80);
        busy(&t, "ks", "sb-s", 0, 45);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
        expect(&t, alerts, "50,80,100", "after 80 min");
        expect(&t, "SELECT key_blocked('kp')::text", "true", "blocked at the limit");
        expect(&t, "SELECT key_blocked('kp', now() + interval '1 day')::text", "false", "a new UTC day lifts the block");
        expect(&t, "SELECT string_agg(threshold_pct::text, ',' ORDER BY threshold_pct) FROM alerts WHERE key_id = 'ks'",
               "50,80,100", "stop-policy key");

        /* Replays and more usage: no alert fires twice. */
        busy(&t, "kp", "sb-p", 0, 90);
        busy(&t, "ks", "sb-s", 0, 50);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
        expect(&t, "SELECT count(*)::text FROM alerts", "6", "each (key, day, threshold) once");
        expect(&t, "SELECT count(*)::text FROM alerts WHERE key_id = 'kn'", "0", "no limit, no alerts");
        expect(&t, "SELECT count(*)::text FROM alerts WHERE day <> (now() AT TIME ZONE 'UTC')::date", "0", "UTC day");

        /* The commands on the control topic. */
        char err[512];
        rd_kafka_t *c = kafka_consumer_new(t.bootstrap, "limits-test-control", NULL, NULL, err, sizeof(err));
        CHECK(c != NULL, "consumer: %s", err);
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, TOPIC_CONTROL, RD_KAFKA_PARTITION_UA);
        rd_kafka_subscribe(c, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        bool paused_kp = false, stopped_ks = false, other = false;
        int64_t deadline = time_mono_ns() + 30 * NS_PER_SEC;
        while (!(paused_kp && stopped_ks) && time_mono_ns() < deadline) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 200);
                if (!m)
                        continue;
                struct control_command cmd;
                char why[256];
                if (!m->err && control_decode(m->payload, m->len, &cmd, why, sizeof(why)) == 0) {
                        if (strcmp(cmd.key, "kp") == 0 && cmd.action == CONTROL_PAUSE && strcmp(cmd.account, "lim") == 0)
                                paused_kp = true;
                        else if (strcmp(cmd.key, "ks") == 0 && cmd.action == CONTROL_STOP)
                                stopped_ks = true;
                        else
                                other = true;
                        CHECK(strcmp(cmd.reason, "daily_limit") == 0 && cmd.issued_ns > 0, "command fields");
                }
                rd_kafka_message_destroy(m);
        }
        CHECK(paused_kp, "no pause command for key kp");
        CHECK(stopped_ks, "no stop command for key ks");
        CHECK(!other, "a command for a key within its limit");
        rd_kafka_consumer_close(c);
        rd_kafka_destroy(c);

        CHECK(aggtest_terminate(agg) == 0, "unclean stop");
        aggtest_stop(&t);
        return test_result();
}
