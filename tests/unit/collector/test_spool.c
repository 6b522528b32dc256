/* Unit tests of collector/spool.c and collector/state.c: a final sample added
 * to the spool is on disk at once and found again by a new spool (a restart);
 * acknowledging deletes it; a file that is not a sample is moved aside, not
 * sent; the start generation only grows; saved epochs round-trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "event.h"
#include "spool.h"
#include "state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static int setup(void **state)
{
        snprintf(dir, sizeof(dir), "/tmp/tally-spool-unit.XXXXXX");
        if (!mkdtemp(dir))
                return -1;
        return state_prepare(dir);
}

static int teardown(void **state)
{
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        return system(cmd);
}

static int encode_final(const char *sandbox, uint64_t cpu_ns, char *buf, size_t size)
{
        struct usage_event ev = { .type = EVENT_SAMPLE, .epoch = 1, .seq = 9, .wall_ns = INT64_C(1795939200000000000),
                                  .state = STATE_STOPPED, .cpu_ns = cpu_ns, .mem_size_bytes = 1 << 30, .vcpus = 2,
                                  .final = true };
        strcpy(ev.host, "h1");
        snprintf(ev.sandbox, sizeof(ev.sandbox), "%s", sandbox);
        strcpy(ev.account, "acct_1");
        strcpy(ev.key, "key_1");
        return event_encode(&ev, buf, size);
}

static void survives_restart(void **state)
{
        struct spool s;
        assert_int_equal(spool_open(&s, dir), 0);
        assert_int_equal(s.count, 0);
        char buf[1024];
        int len = encode_final("sb_a", 123456789, buf, sizeof(buf));
        assert_true(len > 0);
        struct spool_entry *e = spool_add(&s, "sb_a", "acct_1", buf, (size_t)len);
        assert_non_null(e);
        assert_null(spool_add(&s, "sb_a", "acct_1", buf, (size_t)len));
        assert_int_equal(errno, EEXIST);
        len = encode_final("sb_b", 5, buf, sizeof(buf));
        assert_non_null(spool_add(&s, "sb_b", "acct_1", buf, (size_t)len));
        assert_int_equal(s.count, 2);
        spool_close(&s); /* as if killed: only the files remain */

        struct spool again;
        assert_int_equal(spool_open(&again, dir), 0);
        assert_int_equal(again.count, 2);
        struct spool_entry *a = spool_find(&again, "sb_a");
        assert_non_null(a);
        assert_string_equal(a->account, "acct_1");
        assert_false(a->in_flight);
        struct usage_event ev;
        char why[128];
        assert_int_equal(event_decode(a->payload, a->len, &ev, why, sizeof(why)), 0);
        assert_true(ev.final);
        assert_int_equal(ev.cpu_ns, 123456789);
        event_clear(&ev);

        /* Acknowledged: gone from disk, so a further restart does not send it. */
        assert_int_equal(spool_done(&again, a), 0);
        assert_null(spool_find(&again, "sb_a"));
        spool_close(&again);
        assert_int_equal(spool_open(&again, dir), 0);
        assert_int_equal(again.count, 1);
        assert_non_null(spool_find(&again, "sb_b"));
        assert_int_equal(spool_done(&again, spool_find(&again, "sb_b")), 0);
        spool_close(&again);
}

static void bad_entry_moved_aside(void **state)
{
        char path[256];
        snprintf(path, sizeof(path), "%s/collector/spool/junk.json", dir);
        FILE *f = fopen(path, "w");
        fputs("{\"v\":1,\"type\":\"sample\"", f);
        fclose(f);
        struct spool s;
        assert_int_equal(spool_open(&s, dir), 0);
        assert_int_equal(s.count, 0);
        assert_int_not_equal(access(path, F_OK), 0);
        strcat(path, ".bad");
        assert_int_equal(access(path, F_OK), 0);
        spool_close(&s);
}

static void generation_grows(void **state)
{
        uint32_t g1, g2, g3;
        /* None stored: the hours since 2023-11-14, plus the margin for a host that started
         * more often than hourly. */
        assert_int_equal(state_next_generation(dir, GENERATION_EPOCH_S + 1000 * 3600 + 5, &g1), 0);
        assert_int_equal(g1, 1000 + GENERATION_LOST_MARGIN);
        /* Then one more at each start, or the clock's hours — but a clock far ahead raises it by
         * GENERATION_LEAP_MAX at most (an aggregator refuses jumps over 65,536). */
        assert_int_equal(state_next_generation(dir, GENERATION_EPOCH_S + INT64_C(90000) * 3600, &g2), 0);
        assert_int_equal(g2, g1 + 1 + GENERATION_LEAP_MAX);
        assert_int_equal(state_next_generation(dir, 0, &g3), 0);
        assert_int_equal(g3, g2 + 1);
        /* A generation raised during a run is where the next start counts from. */
        assert_int_equal(state_save_generation(dir, 50000), 0);
        assert_int_equal(state_next_generation(dir, 0, &g3), 0);
        assert_int_equal(g3, 50001);
        /* A clock behind the stored generation changes nothing. */
        assert_int_equal(state_next_generation(dir, GENERATION_EPOCH_S + 40000 * 3600, &g3), 0);
        assert_int_equal(g3, 50002);
        /* A clock ahead of it, within the leap: the clock's hours. */
        assert_int_equal(state_next_generation(dir, GENERATION_EPOCH_S + 60000 * 3600 + 7, &g3), 0);
        assert_int_equal(g3, 60000);
        assert_int_equal(state_save_generation(dir, INT32_MAX), 0);
        assert_int_equal(state_next_generation(dir, 0, &g3), -EOVERFLOW);
        char path[512];
        snprintf(path, sizeof(path), "%s/" COLLECTOR_DIR "/generation", dir);
        unlink(path);
}

/* The aggregator's rule (aggregator/fold.h FOLD_JUMP_MAX, docs/events.md): a generation more than
 * this above the last billed for a sandbox is dead-lettered; one below it is ignored. */
#define JUMP_MAX 65536
#define HOUR INT64_C(3600)

static void lose_folder(void)
{
        char path[512];
        snprintf(path, sizeof(path), "%s/" COLLECTOR_DIR "/generation", dir);
        unlink(path);
}

/* The generation a new folder starts from lands above the last one a long-lived sandbox used and
 * within the jump rule, after years: the host made on 2023-11-15, its collector restarted once a
 * month for 9 years (no raise during its runs), then the folder lost with 10 minutes down. */
static void lost_folder_after_years_of_restarts(void **state)
{
        lose_folder(); /* a host of its own, whatever a failed test left */
        int64_t t = GENERATION_EPOCH_S + 24 * HOUR;
        uint32_t g;
        assert_int_equal(state_next_generation(dir, t, &g), 0);
        for (int month = 0; month < 9 * 12; month++) {
                t += 730 * HOUR;
                assert_int_equal(state_next_generation(dir, t, &g), 0);
        }
        uint32_t last_used = g;
        lose_folder();
        uint32_t fresh;
        assert_int_equal(state_next_generation(dir, t + 600, &fresh), 0);
        assert_true(fresh > last_used);
        assert_true(fresh - last_used <= JUMP_MAX);
        lose_folder();
}

/* The same for a collector that ran 9 years without a restart: the generation follows the clock
 * during the run (one raise an hour at most), so the folder lost after it is no jump. */
static void lost_folder_after_a_run_of_years(void **state)
{
        lose_folder(); /* a host of its own, whatever a failed test left */
        int64_t t = GENERATION_EPOCH_S + 24 * HOUR, mono = 0, raised = 0;
        uint32_t g;
        assert_int_equal(state_next_generation(dir, t, &g), 0);
        for (int64_t h = 0; h < 9 * 8766; h++) {
                t += HOUR;
                mono += HOUR * 1000000000;
                uint32_t next = generation_follow_clock(g, t, mono - raised);
                assert_true(next == g || next == g + 1);
                if (next != g) {
                        g = next;
                        raised = mono;
                }
        }
        /* Never a raise without an hour of monotonic time, whatever the wall clock says. */
        assert_int_equal(generation_follow_clock(g, t + 100000 * HOUR, HOUR * 1000000000 - 1), g);
        lose_folder();
        uint32_t fresh;
        assert_int_equal(state_next_generation(dir, t + 600, &fresh), 0);
        assert_true(fresh > g);
        assert_true(fresh - g <= JUMP_MAX);
        lose_folder();
}

/* A crash loop (500 starts within an hour) of a host whose generation followed the clock, just
 * before the folder is lost: still above. */
static void lost_folder_after_a_crash_loop(void **state)
{
        lose_folder(); /* a host of its own, whatever a failed test left */
        int64_t t = GENERATION_EPOCH_S + 20000 * HOUR;
        uint32_t g;
        assert_int_equal(state_save_generation(dir, 20000), 0);
        for (int i = 0; i < 500; i++)
                assert_int_equal(state_next_generation(dir, t + i, &g), 0);
        lose_folder();
        uint32_t fresh;
        assert_int_equal(state_next_generation(dir, t + 3000, &fresh), 0);
        assert_true(fresh > g);
        assert_true(fresh - g <= JUMP_MAX);
        lose_folder();
}

static void epochs_round_trip(void **state)
{
        uint64_t e = 9, r = 9;
        assert_int_equal(state_load_epoch(dir, "sb_x", &e, &r), 0);
        assert_int_equal(e, 0);
        assert_int_equal(r, 0);
        assert_int_equal(state_save_epoch(dir, "sb_x", 7, 5), 0);
        assert_int_equal(state_load_epoch(dir, "sb_x", &e, &r), 0);
        assert_int_equal(e, 7);
        assert_int_equal(r, 5);
        assert_int_equal(state_remove_epoch(dir, "sb_x"), 0);
        assert_int_equal(state_remove_epoch(dir, "sb_x"), 0);
        assert_int_equal(state_load_epoch(dir, "sb_x", &e, &r), 0);
        assert_int_equal(e, 0);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(survives_restart),
                cmocka_unit_test(bad_entry_moved_aside),
                cmocka_unit_test(generation_grows),
                cmocka_unit_test(lost_folder_after_years_of_restarts),
                cmocka_unit_test(lost_folder_after_a_run_of_years),
                cmocka_unit_test(lost_folder_after_a_crash_loop),
                cmocka_unit_test(epochs_round_trip),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
