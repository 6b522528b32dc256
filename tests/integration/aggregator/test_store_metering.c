/* Integration: metering gaps are loud. Two
 * hosts run a sandbox each; host B keeps sampling, host A falls silent. Within
 * the threshold (set to 3 s here by replacing metering_gap_threshold()) plus
 * a check interval, the metering_gaps view lists host A and not B, the
 * aggregator logs it at warning and /metrics shows one host in a gap; A's
 * vmm sending a `stopped` event every second meanwhile (not a sample) does
 * not hide the gap. Once
 * A's sandbox stops (its final sample arrives), the gap closes. Last, the
 * view made slow (2 s a read): a sample is committed while the aggregator's
 * check of it is still out (aggregator/partitions.h, check_metering_gaps),
 * and the check's connection, ended mid-check, is opened again;
 * and the rows the aggregator warmed its session with at start are not in
 * the ledger. */
#include "aggtest.h"
#include "storetest.h"
#include "support.h"
#include "timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (UINT64_C(1) << 20)
/* The aggregator's metering-gap checks under way (pg_stat_activity), after a SELECT list. */
#define CHECKS " FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%FROM metering_gaps ORDER BY host'"

static void sample(struct aggtest *t, const char *host, const char *sb, int seq, int64_t wall, enum sandbox_state st)
{
        struct usage_event ev = aggtest_sample("acct_mg", "key_mg", sb, 1, (uint64_t)seq, wall, st,
                                               (uint64_t)seq * NS_PER_SEC / 10, 128 * MIB, 0, 1);
        snprintf(ev.host, sizeof(ev.host), "%s", host);
        aggtest_produce(t, &ev);
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_store_metering", 4);
        aggtest_exec(&t, "CREATE OR REPLACE FUNCTION metering_gap_threshold() RETURNS interval LANGUAGE sql STABLE"
                         " AS $$ SELECT interval '3 seconds' $$");
        int port = test_free_port();
        char ports[16];
        snprintf(ports, sizeof(ports), "%d", port);
        const char *extra[] = { "--batch-ms", "50", "--metrics-port", ports, NULL };
        pid_t agg = aggtest_spawn(&t, extra);

        int seq = 1;
        sample(&t, "host-mg-a", "sb_mg_a", 1, time_wall_ns(), STATE_RUNNING);
        sample(&t, "host-mg-a", "sb_mg_a2", 1, time_wall_ns(), STATE_RUNNING);
        bool gap_a = false, gap_b = false, logged = false;
        int64_t gauge = -1;
        for (int i = 0; i < 14; i++) { /* host B samples every second; A's collector is silent */
                sample(&t, "host-mg-b", "sb_mg_b", seq++, time_wall_ns(), STATE_RUNNING);
                /* ...while A's vmm still talks: a sandbox's `stopped` event (sent
                 * again each second) is not a sample and must not refresh A */
                struct usage_event st = aggtest_stopped("acct_mg", "key_mg", "sb_mg_a2", 1, time_wall_ns(),
                                                        NS_PER_SEC / 10, 0, 0, 128 * MIB, 1);
                snprintf(st.host, sizeof(st.host), "%s", "host-mg-a");
                aggtest_produce(&t, &st);
                aggtest_flush(&t);
                time_sleep_ns(NS_PER_SEC);
                if (i >= 9) {
                        gap_a |= store_int(&t, "SELECT count(*) FROM metering_gaps WHERE host = 'host-mg-a'") == 1;
                        gap_b |= store_int(&t, "SELECT count(*) FROM metering_gaps WHERE host = 'host-mg-b'") != 0;
                }
        }
        logged = store_log_has(&t, 0, "level=warn") && store_log_has(&t, 0, "metering gap") &&
                 store_log_has(&t, 0, "host=host-mg-a");
        char *page = store_metrics(port);
        gauge = page ? store_metric(page, "tally_aggregator_metering_gap_hosts") : -1;
        CHECK(page && store_metric(page, "tally_aggregator_metering_gaps_total") >= 1, "no gap counted");
        free(page);
        CHECK(gap_a, "host-mg-a, silent with a running sandbox, is not in metering_gaps");
        CHECK(!gap_b, "host-mg-b, sampling every second, was listed in metering_gaps");
        CHECK(logged, "the gap was not logged at warning");
        CHECK(gauge == 1, "metering_gap_hosts is %lld, want 1", (long long)gauge);
        CHECK(!store_log_has(&t, 0, "host=host-mg-b"), "host B was logged as a gap");
        CHECK(store_int(&t, "SELECT count(*) FROM hosts WHERE host = 'host-mg-b'"
                            " AND last_sample_at > now() - interval '5 seconds'") == 1,
              "hosts does not hold host B's last sample");

        /* A's final sample: no running sandbox left on A, the gap closes. */
        sample(&t, "host-mg-a", "sb_mg_a", 2, time_wall_ns(), STATE_STOPPED);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 30) == 0, "not caught up");
        CHECK(store_int(&t, "SELECT count(*) FROM metering_gaps WHERE host = 'host-mg-a'") == 0,
              "host A is still a gap after its sandbox stopped");
        /* Host B goes on sampling every second meanwhile: it is not silent,
         * and must not become a gap of its own while the gauge is read (on
         * Apache Kafka the catch-up alone can outlast the 3 s threshold). */
        gauge = -1;
        for (int i = 0; i < 80 && gauge != 0; i++) {
                if (i % 10 == 0) {
                        sample(&t, "host-mg-b", "sb_mg_b", seq++, time_wall_ns(), STATE_RUNNING);
                        aggtest_flush(&t);
                }
                page = store_metrics(port);
                gauge = page ? store_metric(page, "tally_aggregator_metering_gap_hosts") : -1;
                free(page);
                time_sleep_ns(100 * NS_PER_MS);
        }
        CHECK(gauge == 0, "metering_gap_hosts did not go back to 0 (%lld)", (long long)gauge);

        /* The view made slow (its threshold sleeps 2 s a call): the aggregator
         * goes on committing while its check is out, not after it. */
        aggtest_exec(&t, "CREATE OR REPLACE FUNCTION metering_gap_threshold() RETURNS interval LANGUAGE sql STABLE"
                         " AS $$ SELECT interval '3 seconds' FROM pg_sleep(2) $$");
        const char *checking = "SELECT count(*)" CHECKS;
        bool out = false;
        for (int i = 0; i < 150 && !out; i++) { /* (asked every 5 s) */
                time_sleep_ns(50 * NS_PER_MS);
                out = store_int(&t, checking) == 1;
        }
        CHECK(out, "the aggregator never asked for the metering gaps");
        sample(&t, "host-mg-b", "sb_mg_b", seq++, time_wall_ns(), STATE_RUNNING);
        aggtest_flush(&t);
        int64_t t0 = time_mono_ns();
        CHECK(aggtest_wait_committed(&t, aggtest_topic_end(&t), 10000) == 0, "the sample was not committed");
        int64_t ms = (time_mono_ns() - t0) / NS_PER_MS;
        CHECK(store_int(&t, checking) == 1, "the sample was committed only once the metering gaps' check ended"
                                            " (%lld ms)", (long long)ms);
        /* Its connection lost mid-check: said, opened again, asked again. */
        bool ended = false;
        for (int i = 0; i < 300 && !ended; i++) { /* (one is out 2 s of every 5) */
                ended = store_int(&t, "SELECT count(pg_terminate_backend(pid))" CHECKS) == 1;
                if (!ended)
                        time_sleep_ns(50 * NS_PER_MS);
        }
        CHECK(ended, "no check to end");
        time_sleep_ns(200 * NS_PER_MS); /* (its backend gone from pg_stat_activity) */
        bool again = false;
        for (int i = 0; i < 300 && !again; i++) { /* (asked every 5 s) */
                time_sleep_ns(50 * NS_PER_MS);
                again = store_int(&t, checking) == 1;
        }
        CHECK(store_log_has(&t, 0, "what=metering gaps") ||
                      store_log_has(&t, 0, "lost the connection that watches for metering gaps"),
              "the aggregator did not say its metering gaps' check failed");
        CHECK(again, "the aggregator did not ask for the metering gaps again after losing their connection");
        /* Its session was warmed at start with a row of a sandbox of its own
         * (aggregator/store.h, store_warm), rolled back: nothing of it stays. */
        CHECK(store_log_has(&t, 0, "ledger session warmed"), "the aggregator did not warm its ledger session");
        CHECK(store_int(&t, "SELECT (SELECT count(*) FROM sandboxes WHERE id LIKE 'tally-warm-%')"
                            " + (SELECT count(*) FROM fold_state WHERE sandbox_id LIKE 'tally-warm-%')"
                            " + (SELECT count(*) FROM usage_hourly WHERE sandbox_id LIKE 'tally-warm-%')"
                            " + (SELECT count(*) FROM usage_key_hourly WHERE key_id LIKE 'tally-warm-%')"
                            " + (SELECT count(*) FROM spend_daily WHERE key_id LIKE 'tally-warm-%')") == 0,
              "rows of the session's warming stayed in the ledger");
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        aggtest_stop(&t);
        return test_result();
}
