/* Integration: sequence numbers and counters.
 * - A seq that wraps into the next generation ((g << 32) | 0xFFFFFFFA then
 *   ((g + 1) << 32) | 1, the collector's contract) bills everything.
 * - A forged seq of 2^63 - 1 mid-life is a dead letter and does not silence
 *   the sandbox: later real samples bill the full counter. So is a forged
 *   epoch of 2^63 - 1.
 * - A counter that drops within an epoch (50 CPU-s -> 1, then rising to 61)
 *   is a restart: 50 + 61 = 111 CPU-s burned, 111 billed (not 61), logged.
 *
 * Through the real development broker and a real tally-aggregator writing to
 * PostgreSQL. The truths are the counters the test sends, added by hand. */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <stdlib.h>
#include <string.h>

#define GiB (UINT64_C(1) << 30)
#define SEC NS_PER_SEC

static void put(struct aggtest *t, const char *sb, uint64_t epoch, uint64_t seq, int64_t wall, uint64_t cpu_s)
{
        struct usage_event ev = aggtest_sample("acct-fs", "key-fs", sb, epoch, seq, wall, STATE_RUNNING, cpu_s * SEC,
                                               GiB, 0, 4);
        aggtest_produce(t, &ev);
}

static void expect_cpu(struct aggtest *t, const char *sb, const char *want, const char *what)
{
        char *got = aggtest_billed(t, sb);
        size_t n = strlen(want);
        CHECK(strncmp(got, want, n) == 0 && got[n] == '/', "%s (%s): billed %s, want CPU %s ns", what, sb, got, want);
        free(got);
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_fold_counters", 2);
        int64_t b = time_wall_ns() - 7200 * SEC;
        uint64_t g = 3;

        put(&t, "sb-fs-wrap", 1, (g << 32) | 0xFFFFFFFAu, b, 10);
        put(&t, "sb-fs-wrap", 1, (g << 32) | 0xFFFFFFFFu, b + 100 * SEC, 100);
        put(&t, "sb-fs-wrap", 1, ((g + 1) << 32) | 1, b + 200 * SEC, 400);
        put(&t, "sb-fs-wrap", 1, ((g + 1) << 32) | 2, b + 300 * SEC, 700);
        put(&t, "sb-fs-wrap", 1, ((g + 1) << 32) | 3, b + 400 * SEC, 1000);

        put(&t, "sb-fs-forged", 1, 1, b, 0);
        put(&t, "sb-fs-forged", 1, 2, b + 200 * SEC, 500);
        put(&t, "sb-fs-forged", 1, INT64_MAX, b + 250 * SEC, 600);
        put(&t, "sb-fs-forged", 1, 3, b + 500 * SEC, 1500);
        put(&t, "sb-fs-forged", 1, 4, b + 900 * SEC, 3000);

        put(&t, "sb-fs-epoch", 2, 1, b, 5);
        put(&t, "sb-fs-epoch", INT64_MAX, 1, b + 100 * SEC, 50);
        put(&t, "sb-fs-epoch", 2, 2, b + 200 * SEC, 300);
        put(&t, "sb-fs-epoch", 2, 3, b + 300 * SEC, 700);

        put(&t, "sb-fs-drop", 1, 1, b, 0);
        put(&t, "sb-fs-drop", 1, 2, b + 100 * SEC, 50);
        put(&t, "sb-fs-drop", 1, 3, b + 200 * SEC, 1);
        put(&t, "sb-fs-drop", 1, 4, b + 300 * SEC, 30);
        put(&t, "sb-fs-drop", 1, 5, b + 400 * SEC, 61);
        aggtest_flush(&t);

        pid_t agg = aggtest_spawn(&t, NULL);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");

        expect_cpu(&t, "sb-fs-wrap", "1000000000000", "seq wrapping into the next generation");
        expect_cpu(&t, "sb-fs-forged", "3000000000000", "a forged seq does not silence the sandbox");
        expect_cpu(&t, "sb-fs-epoch", "700000000000", "a forged epoch does not silence the sandbox");
        expect_cpu(&t, "sb-fs-drop", "111000000000", "a counter that drops within an epoch is a restart");

        char *v = aggtest_query(&t, "SELECT count(*) FROM dead_letters");
        CHECK(v && strcmp(v, "2") == 0, "two dead letters (the forged seq and epoch): %s", v ? v : "?");
        free(v);
        v = aggtest_query(&t, "SELECT string_agg(reason, ' | ' ORDER BY \"offset\") FROM dead_letters");
        CHECK(v && strstr(v, "seq generation 2147483647 is more than 65536 above the last billed, 0") &&
                      strstr(v, "epoch 9223372036854775807 is more than 65536 above the last billed, 2"),
              "the reasons say what was refused: %s", v ? v : "?");
        free(v);

        char log[1024];
        snprintf(log, sizeof(log), "%s/aggregator.0.log", t.dir);
        char *text = test_read_file(log);
        CHECK(text && strstr(text, "counter went back within an epoch") && strstr(text, "sandbox=sb-fs-drop") &&
                      strstr(text, "cpu_ns=1000000000") && strstr(text, "billed_cpu_ns=50000000000"),
              "the restart is logged with the sandbox and both counters");
        free(text);

        CHECK(aggtest_terminate(agg) == 0, "unclean stop");
        aggtest_stop(&t);
        return test_result();
}
