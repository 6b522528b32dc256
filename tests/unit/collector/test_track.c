/* Unit tests of collector/track.c: the epoch rules (a counter that goes
 * backwards gets a new epoch, never a negative delta; the vmm's epoch is
 * followed; a raised epoch survives a restart), seq across restarts, the wall
 * clock guard under clock steps, and tick overruns. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "track.h"

#define SEC INT64_C(1000000000)

static void epoch_follows_counter(void **state)
{
        struct epoch_track t;
        epoch_track_init(&t, 1, 0, 0);
        assert_int_equal(t.epoch, 1);
        assert_false(epoch_track_observe(&t, 1, 100));
        assert_false(epoch_track_observe(&t, 1, 100)); /* equal is not backwards */
        assert_false(epoch_track_observe(&t, 1, 250));
        assert_int_equal(t.epoch, 1);
        /* Backwards without the vmm saying so: cgroup recreated or restored. */
        assert_true(epoch_track_observe(&t, 1, 30));
        assert_int_equal(t.epoch, 2);
        assert_true(epoch_track_is_local(&t));
        assert_false(epoch_track_observe(&t, 1, 40));
        assert_int_equal(t.epoch, 2);
}

static void epoch_follows_vmm(void **state)
{
        struct epoch_track t;
        epoch_track_init(&t, 4, 0, 0);
        assert_false(epoch_track_observe(&t, 4, 1000));
        /* The vmm recreated the cgroup: its epoch, and no comparison with the old counter. */
        assert_true(epoch_track_observe(&t, 5, 10));
        assert_int_equal(t.epoch, 5);
        assert_false(epoch_track_is_local(&t));
        /* We had raised the epoch to 6 over record epoch 5; the vmm then says 6: stay above what we published. */
        assert_true(epoch_track_observe(&t, 5, 1));
        assert_int_equal(t.epoch, 6);
        assert_true(epoch_track_observe(&t, 6, 0));
        assert_int_equal(t.epoch, 7);
        assert_true(epoch_track_is_local(&t));
        /* A much higher vmm epoch is taken as is. */
        assert_true(epoch_track_observe(&t, 20, 5));
        assert_int_equal(t.epoch, 20);
}

static void epoch_survives_restart(void **state)
{
        struct epoch_track t;
        /* Saved: epoch 3 raised over record epoch 2; the record still says 2. */
        epoch_track_init(&t, 2, 3, 2);
        assert_int_equal(t.epoch, 3);
        /* The record moved to 3 while we were away: above what we published (3). */
        epoch_track_init(&t, 3, 3, 2);
        assert_int_equal(t.epoch, 4);
        /* Moved far beyond: the record's. */
        epoch_track_init(&t, 9, 3, 2);
        assert_int_equal(t.epoch, 9);
        /* Nothing saved. */
        epoch_track_init(&t, 7, 0, 0);
        assert_int_equal(t.epoch, 7);
        assert_false(t.have_last);
}

static void seq_increases_across_generations(void **state)
{
        assert_true(seq_make(5, UINT32_MAX) < seq_make(6, 0));
        assert_true(seq_make(5, 1) < seq_make(5, 2));
        /* Generations stay below 2^31 (state.c refuses more), so seq fits the message's int64. */
        assert_true(seq_make(INT32_MAX, UINT32_MAX) < (UINT64_C(1) << 63));
}

static void wall_clock_steps(void **state)
{
        struct wall_guard g = { 0 };
        int64_t base = INT64_C(1795939200) * SEC;
        assert_true(wall_guard_next(&g, base, 10 * SEC) == base);
        assert_true(wall_guard_next(&g, base + SEC, 11 * SEC) == base + SEC);
        assert_int_equal(g.steps, 0);
        /* The wall clock steps back an hour: time keeps moving forward with the monotonic clock. */
        int64_t back = base - 3600 * SEC;
        assert_true(wall_guard_next(&g, back + 2 * SEC, 12 * SEC) == base + 2 * SEC);
        assert_int_equal(g.steps, 1);
        assert_true(wall_guard_next(&g, back + 3 * SEC, 13 * SEC) == base + 3 * SEC);
        assert_int_equal(g.steps, 1); /* one step, counted once */
        /* A forward step is taken as is (and counted). */
        int64_t fwd = base + 7200 * SEC;
        assert_true(wall_guard_next(&g, fwd, 14 * SEC) == fwd);
        assert_int_equal(g.steps, 2);
        /* A stuck clock still gives increasing stamps. */
        int64_t w1 = wall_guard_next(&g, fwd, 14 * SEC);
        assert_true(w1 > fwd);
}

static void tick_overrun(void **state)
{
        bool overran;
        /* On time: the next tick is one interval after the planned start, whatever the tick took. */
        assert_true(tick_next(100 * SEC, SEC, 100 * SEC + SEC / 10, &overran) == 101 * SEC);
        assert_false(overran);
        /* Overran: flagged, and the next tick starts at once, not an interval later. */
        assert_true(tick_next(100 * SEC, SEC, 102 * SEC, &overran) == 102 * SEC);
        assert_true(overran);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(epoch_follows_counter),
                cmocka_unit_test(epoch_follows_vmm),
                cmocka_unit_test(epoch_survives_restart),
                cmocka_unit_test(seq_increases_across_generations),
                cmocka_unit_test(wall_clock_steps),
                cmocka_unit_test(tick_overrun),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
