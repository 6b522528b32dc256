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

#include <errno.h>

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

/* A host's persisted generation, as state.c keeps it; fail makes the next raise fail. */
struct host {
        uint32_t stored;
        int raises;
        int fail;
};

static int raise_gen(void *ctx, uint32_t next)
{
        struct host *h = ctx;
        if (h->fail)
                return -h->fail;
        h->stored = next;
        h->raises++;
        return 0;
}

static void seq_wraps_into_a_new_generation(void **state)
{
        struct host h = { .stored = 7 };
        uint32_t gen = 7;
        /* Injected near 2^32: a sandbox whose n is about to run out, and one far from it. */
        struct seq_track a = { 7, UINT32_MAX - 2 }, b = { 7, 5 };
        uint64_t seq, last = 0;
        for (int i = 0; i < 2; i++) {
                assert_int_equal(seq_next(&a, &gen, raise_gen, &h, &seq), 0);
                assert_true(seq > last);
                last = seq;
        }
        assert_true(seq == seq_make(7, UINT32_MAX));
        assert_int_equal(h.raises, 0);
        /* n would pass 2^32 - 1: the generation is raised and persisted first, n restarts at 1. */
        assert_int_equal(seq_next(&a, &gen, raise_gen, &h, &seq), 0);
        assert_true(seq == seq_make(8, 1));
        assert_true(seq > last);
        assert_int_equal(gen, 8);
        assert_int_equal(h.stored, 8);
        assert_int_equal(h.raises, 1);
        /* The other sandbox goes on under the raised generation: still increasing. */
        uint64_t b_before = seq_make(7, 5);
        assert_int_equal(seq_next(&b, &gen, raise_gen, &h, &seq), 0);
        assert_true(seq == seq_make(8, 6) && seq > b_before);
        /* A second sandbox running out after the host's generation moved on needs no new raise. */
        struct seq_track c = { 7, UINT32_MAX };
        assert_int_equal(seq_next(&c, &gen, raise_gen, &h, &seq), 0);
        assert_true(seq == seq_make(8, 1) && seq > seq_make(7, UINT32_MAX));
        assert_int_equal(h.raises, 1);
        /* Every seq of one sandbox over 2^32 + 10 samples increases: checked across the wrap. */
        struct seq_track d = { 8, UINT32_MAX - 5 };
        last = seq_make(8, UINT32_MAX - 5);
        for (int i = 0; i < 10; i++) {
                assert_int_equal(seq_next(&d, &gen, raise_gen, &h, &seq), 0);
                assert_true(seq > last);
                last = seq;
        }
        assert_int_equal(gen, 9);
}

static void seq_failed_raise_publishes_nothing(void **state)
{
        struct host h = { .stored = 3, .fail = EROFS };
        uint32_t gen = 3;
        struct seq_track a = { 3, UINT32_MAX };
        uint64_t seq = 42;
        /* A generation that is not on disk is never used: a restart would reuse it. */
        assert_int_equal(seq_next(&a, &gen, raise_gen, &h, &seq), -EROFS);
        assert_int_equal(gen, 3);
        assert_true(a.generation == 3 && a.n == UINT32_MAX);
        assert_true(seq == 42);
        h.fail = 0;
        assert_int_equal(seq_next(&a, &gen, raise_gen, &h, &seq), 0);
        assert_true(seq == seq_make(4, 1));
        /* Past 2^31 - 1 the seq would leave int64: refused. */
        uint32_t top = SEQ_GENERATION_MAX;
        struct seq_track z = { SEQ_GENERATION_MAX, UINT32_MAX };
        assert_int_equal(seq_next(&z, &top, raise_gen, &h, &seq), -EOVERFLOW);
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
                cmocka_unit_test(seq_wraps_into_a_new_generation),
                cmocka_unit_test(seq_failed_raise_publishes_nothing),
                cmocka_unit_test(wall_clock_steps),
                cmocka_unit_test(tick_overrun),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
