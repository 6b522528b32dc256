/* Integration: daily spend limits, checked right at each crossing.
 *
 * invariant 5: once a key's spend today reaches its daily limit, its
 * running sandboxes are paused (or stopped, by the key's policy) within 2 s,
 * so the spend overshoots by no more than what 2 s of the sandbox can burn.
 * Alerts fire once per (key, day, threshold): 50%, 80%, 100%.
 *
 * The sandbox is a busy 2 vCPU / 4 GiB one, sampled every second as the
 * collector does. With the default plan's prices (docs/architecture.md: $0.025 per
 * vCPU-hour, $0.0075 per GiB-hour) a second of it costs 2 x 25,000,000 / 3600
 * + 4 x 7,500,000 / 3600 = 22,222.2 nano-dollars; 2 s of it 44,444.4. A limit
 * of 1,010,000 nd is crossed at 50% (505,000) by the sample of second 23
 * (22 s: 488,888.9; 23 s: 511,111.1), at 80% (808,000) by second 37 (36 s:
 * 800,000; 37 s: 822,222.2) and at 100% by second 46 (45 s: 1,000,000; 46 s:
 * 1,022,222.2) — worked by hand, not by tally's code. Before each crossing
 * sample the test sees no alert (and no block, no command); after it the
 * alert, the block and the command must appear within 2 s of the sample
 * being produced, and the alert must record the spend exactly: the key's
 * spend after the crossing sample, s x 200,000 / 9 nano-dollars rounded
 * once (23 s: 511,111; 37 s: 822,222; 46 s: 1,022,222), never the threshold
 * it crossed. A key without a limit never alerts, and replays fire nothing
 * twice. A pause limit caps spend: the storage of the sandboxes its block
 * paused is waived, not that of sandboxes already paused, and not once a
 * person raised the limit (waivers(), worked by hand). */
#include "aggtest.h"
#include "control.h"
#include "kafka.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define GiB (UINT64_C(1) << 30)
#define LIMIT 1010000

static struct aggtest t;
static int64_t t0;
static rd_kafka_t *control;
/* When the test's consumer saw each command (boot clock; 0: not yet). */
static int64_t pause_kp_seen, stop_ks_seen;
static int other_commands;

/* Samples of the busy sandbox, seconds [from, to]. */
static void busy(const char *key, const char *sandbox, int from, int to)
{
        for (int s = from; s <= to; s++) {
                struct usage_event ev = aggtest_sample("lim", key, sandbox, 1, (uint64_t)s + 1, t0 + s * NS_PER_SEC,
                                                       STATE_RUNNING, (uint64_t)s * 2 * NS_PER_SEC, 4 * GiB, 0, 2);
                /* Held time as the vmm keeps it (docs/events.md), the same as the samples' times. */
                ev.held_known = true;
                ev.running_ns = (uint64_t)s * NS_PER_SEC;
                aggtest_produce(&t, &ev);
        }
        aggtest_flush(&t);
}

static void control_poll(int ms)
{
        int64_t until = time_boot_ns() + ms * NS_PER_MS;
        do {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(control, 10);
                if (!m)
                        continue;
                struct control_command cmd;
                char why[256];
                if (!m->err && control_decode(m->payload, m->len, &cmd, why, sizeof(why)) == 0) {
                        if (strcmp(cmd.key, "kp") == 0 && cmd.action == CONTROL_PAUSE && strcmp(cmd.account, "lim") == 0)
                                pause_kp_seen = pause_kp_seen ? pause_kp_seen : time_boot_ns();
                        else if (strcmp(cmd.key, "ks") == 0 && cmd.action == CONTROL_STOP)
                                stop_ks_seen = stop_ks_seen ? stop_ks_seen : time_boot_ns();
                        else
                                other_commands++;
                        CHECK(strcmp(cmd.reason, "daily_limit") == 0 && cmd.issued_ns > 0, "command fields");
                }
                rd_kafka_message_destroy(m);
        } while (time_boot_ns() < until);
}

static char *q(const char *sql)
{
        char *v = aggtest_query(&t, sql);
        return v ? v : calloc(1, 1);
}

static void expect(const char *sql, const char *want, const char *what)
{
        char *v = q(sql);
        CHECK(strcmp(v, want) == 0, "%s: got %s, want %s", what, v, want);
        free(v);
}

static char *alerts_of(const char *key)
{
        char sql[300];
        snprintf(sql, sizeof(sql), "SELECT coalesce(string_agg(threshold_pct::text, ',' ORDER BY threshold_pct), '')"
                                   " FROM alerts WHERE key_id = '%s'", key);
        return q(sql);
}

static bool blocked(const char *key)
{
        char sql[200];
        snprintf(sql, sizeof(sql), "SELECT key_blocked('%s')::text", key);
        char *b = q(sql);
        bool yes = strcmp(b, "true") == 0;
        free(b);
        return yes;
}

static int64_t command_seen(const char *key)
{
        return strcmp(key, "kp") == 0 ? pause_kp_seen : stop_ks_seen;
}

/* Produces the crossing sample `second` and waits, at most 2 s from just
 * before it was produced, until the key shows `want` alerts (and, at 100%, is
 * blocked and its command seen). Checks the alert's recorded spend: exactly
 * `spend` (nothing after the crossing sample is produced before the check). */
static void cross(const char *key, const char *sandbox, int second, int pct, const char *before_want, const char *want,
                  int64_t spend_want)
{
        char *before = alerts_of(key);
        CHECK(strcmp(before, before_want) == 0,
              "%s before the sample of second %d (spend below %d%%): alerts '%s', want '%s'", key, second, pct, before,
              before_want);
        free(before);
        if (pct == 100) {
                CHECK(!blocked(key), "%s blocked below its limit", key);
                control_poll(100);
                CHECK(!command_seen(key), "a command for %s below its limit", key);
        }

        int64_t produced = time_boot_ns(), deadline = produced + 2 * NS_PER_SEC, done = 0;
        busy(key, sandbox, second, second);
        while (!done && time_boot_ns() <= deadline) {
                char *a = alerts_of(key);
                bool ok = strcmp(a, want) == 0;
                free(a);
                if (ok && pct == 100) {
                        control_poll(0);
                        ok = blocked(key) && command_seen(key);
                }
                if (ok)
                        done = time_boot_ns();
                else
                        control_poll(10);
        }
        char *a = alerts_of(key);
        CHECK(done, "%s, 2 s after the sample of second %d that took spend past %d%%: alerts '%s' (want '%s')%s%s",
              key, second, pct, a, want, pct < 100 ? "" : blocked(key) ? ", blocked" : ", not blocked",
              pct < 100 ? "" : command_seen(key) ? ", command seen" : ", no command seen");
        free(a);
        if (done)
                fprintf(stderr, "%s %d%%: seen %" PRId64 " ms after the crossing sample was produced\n", key, pct,
                        (done - produced) / NS_PER_MS);

        char sql[300];
        snprintf(sql, sizeof(sql), "SELECT spend_nanodollars FROM alerts WHERE key_id = '%s' AND threshold_pct = %d", key,
                 pct);
        char *v = q(sql);
        int64_t spend = *v ? strtoll(v, NULL, 10) : -1;
        CHECK(spend == spend_want,
              "%s's %d%% alert recorded spend %" PRId64 " nd: want %" PRId64 " (the spend after second %d; the"
              " threshold is %d)", key, pct, spend, spend_want, second, LIMIT * pct / 100);
        free(v);
}

/* What a pause limit caps (docs/billing.md), worked by hand. Key kw (pause, 11,000 nd) has two
 * sandboxes of 3,240,000,000 bytes of storage each, which cost 100 nd a second while paused
 * (3.24e9 B x 1e9 ns x 80,000,000 nd / (1e9 B x 2,592,000e9 ns)):
 *  - w1 runs at 0.144 vCPU (144,000,000 CPU-ns a second: 144e6 x 25,000,000 / 3.6e12 = 1,000 nd) with
 *    no memory size (its running memory costs nothing; its storage is its disk);
 *  - w2 was paused by its tenant from the start: 100 nd a second.
 * Seconds 0..10: 1,100 nd a second; the limit is reached by second 10 (11,000 nd): the block finds w1
 * running (waived) and w2 paused (not). Seconds 11..20, both paused: w1's storage is waived, w2's is
 * charged: 11,000 + 10 x 100 = 12,000 nd (the old rule: 13,000). A person raises the limit to
 * 20,000 nd and lifts the block; seconds 21..30, both paused: both charged, 14,000 nd. */
static void waivers(void)
{
        const uint64_t disk = 3240000000;
        aggtest_exec(&t, "INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars, limit_policy)"
                         " VALUES ('kw', 'lim', sha256('kw'), 11000, 'pause')");
        for (int s = 0; s <= 30; s++) {
                bool running = s <= 10;
                struct usage_event w1 = aggtest_sample("lim", "kw", "sb-w1", 1, (uint64_t)s + 1, t0 + s * NS_PER_SEC,
                                                       running ? STATE_RUNNING : STATE_PAUSED,
                                                       (uint64_t)(running ? s : 10) * 144000000, 0, disk, 1);
                w1 = aggtest_held(w1, (uint64_t)(running ? s : 10) * NS_PER_SEC,
                                  (uint64_t)(running ? 0 : s - 10) * NS_PER_SEC);
                struct usage_event w2 = aggtest_sample("lim", "kw", "sb-w2", 1, (uint64_t)s + 1, t0 + s * NS_PER_SEC,
                                                       STATE_PAUSED, 0, 0, disk, 1);
                w2 = aggtest_held(w2, 0, (uint64_t)s * NS_PER_SEC);
                aggtest_produce(&t, &w2);
                aggtest_produce(&t, &w1);
                aggtest_flush(&t);
                if (s == 10 || s == 20) {
                        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
                        expect("SELECT nanodollars::text FROM spend_daily WHERE key_id = 'kw'",
                               s == 10 ? "11000" : "12000",
                               s == 10 ? "kw's spend at its block" : "kw's spend 10 s after its block, w1 waived");
                        expect("SELECT string_agg(sandbox_id, ',') FROM limit_waivers WHERE key_id = 'kw'", "sb-w1",
                               "the sandboxes the block found running");
                }
                if (s == 20)
                        aggtest_exec(&t, "UPDATE api_keys SET daily_limit_nanodollars = 20000 WHERE id = 'kw';"
                                         "DELETE FROM key_blocks WHERE key_id = 'kw'");
        }
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
        expect("SELECT nanodollars::text FROM spend_daily WHERE key_id = 'kw'", "14000",
               "kw's spend after a person raised its limit: both sandboxes' storage charged");
        expect("SELECT key_blocked('kw')::text", "false", "kw blocked again under its raised limit");
        /* Exactly: w1 10 s waived and 10 s charged, w2 30 s charged, in byte-ns. */
        expect("SELECT sum(storage_waived_byte_ns)::text || '/' || sum(storage_byte_ns)::text FROM usage_hourly"
               " WHERE sandbox_id = 'sb-w1'", "32400000000000000000/32400000000000000000", "w1's storage");
        expect("SELECT sum(storage_waived_byte_ns)::text || '/' || sum(storage_byte_ns)::text FROM usage_hourly"
               " WHERE sandbox_id = 'sb-w2'", "0/97200000000000000000", "w2's storage");
}

int main(void)
{
        aggtest_start(&t, "agg_limits", 2);
        /* Today (UTC), in the past: the samples end a minute before now. In the
         * first two minutes of a day they start at midnight instead. */
        int64_t now = time_wall_ns(), day0 = time_day_start(now);
        t0 = now - 120 * NS_PER_SEC > day0 ? now - 120 * NS_PER_SEC : day0;
        aggtest_exec(&t, "INSERT INTO accounts (id, name) VALUES ('lim', 'limits');"
                         "INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars, limit_policy) VALUES"
                         " ('kp', 'lim', sha256('kp'), 1010000, 'pause'),"
                         " ('ks', 'lim', sha256('ks'), 1010000, 'stop'),"
                         " ('kn', 'lim', sha256('kn'), NULL, 'pause')");

        /* The test's view of the control topic, joined before any crossing. */
        char err[512];
        const char *const pairs[] = { "fetch.wait.max.ms=50", NULL };
        control = kafka_consumer_new(t.bootstrap, "limits-test-control", test_kafka_conf(NULL), pairs, err, sizeof(err));
        if (!control) {
                fprintf(stderr, "FAIL: consumer: %s\n", err);
                return 1;
        }
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, TOPIC_CONTROL, RD_KAFKA_PARTITION_UA);
        rd_kafka_subscribe(control, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        bool assigned = false;
        for (int i = 0; i < 150 && !assigned; i++) {
                control_poll(100);
                rd_kafka_topic_partition_list_t *as = NULL;
                assigned = rd_kafka_assignment(control, &as) == 0 && as && as->cnt > 0;
                if (as)
                        rd_kafka_topic_partition_list_destroy(as);
        }
        CHECK(assigned, "the test's control consumer got no partition in 15 s");

        pid_t agg = aggtest_spawn(&t, NULL);

        busy("kn", "sb-n", 0, 200);
        busy("kp", "sb-p", 0, 22);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
        cross("kp", "sb-p", 23, 50, "", "50", 511111);
        busy("kp", "sb-p", 24, 36);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
        cross("kp", "sb-p", 37, 80, "50", "50,80", 822222);
        busy("kp", "sb-p", 38, 45);
        busy("ks", "sb-s", 0, 45);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
        expect("SELECT coalesce(string_agg(threshold_pct::text, ',' ORDER BY threshold_pct), '') FROM alerts"
               " WHERE key_id = 'ks'", "50,80", "stop-policy key below its limit");
        cross("kp", "sb-p", 46, 100, "50,80", "50,80,100", 1022222);
        cross("ks", "sb-s", 46, 100, "50,80", "50,80,100", 1022222);
        expect("SELECT key_blocked('kp', now() + interval '1 day')::text", "false", "a new UTC day lifts the block");

        /* Replays and more usage: no alert fires twice. */
        busy("kp", "sb-p", 0, 60);
        busy("ks", "sb-s", 0, 50);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
        control_poll(500);
        expect("SELECT count(*)::text FROM alerts", "6", "each (key, day, threshold) once");
        expect("SELECT count(*)::text FROM alerts WHERE key_id = 'kn'", "0", "no limit, no alerts");
        expect("SELECT count(*)::text FROM alerts WHERE day <> (now() AT TIME ZONE 'UTC')::date", "0", "UTC day");
        CHECK(other_commands == 0, "%d command(s) for keys within their limits", other_commands);
        rd_kafka_consumer_close(control);
        rd_kafka_destroy(control);
        waivers();

        CHECK(aggtest_terminate(agg) == 0, "unclean stop");
        aggtest_stop(&t);
        return test_result();
}
