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
        /* None stored: the hours since 2023-11-14. */
        assert_int_equal(state_next_generation(dir, GENERATION_EPOCH_S + 1000 * 3600 + 5, &g1), 0);
        assert_int_equal(g1, 1000);
        /* Then one more at each start, whatever the clock says (an aggregator refuses big jumps). */
        assert_int_equal(state_next_generation(dir, GENERATION_EPOCH_S + 90000 * 3600, &g2), 0);
        assert_int_equal(g2, 1001);
        assert_int_equal(state_next_generation(dir, 0, &g3), 0);
        assert_int_equal(g3, 1002);
        /* A generation raised during a run is where the next start counts from. */
        assert_int_equal(state_save_generation(dir, 5000), 0);
        assert_int_equal(state_next_generation(dir, 0, &g3), 0);
        assert_int_equal(g3, 5001);
        assert_int_equal(state_save_generation(dir, INT32_MAX), 0);
        assert_int_equal(state_next_generation(dir, 0, &g3), -EOVERFLOW);
        char path[512];
        snprintf(path, sizeof(path), "%s/" COLLECTOR_DIR "/generation", dir);
        unlink(path);
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
                cmocka_unit_test(epochs_round_trip),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
