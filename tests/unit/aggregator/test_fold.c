/* Unit tests of the fold: the counter rules of docs/events.md, hour splits,
 * and the seeds' worked figures rated with the default plan's rates (typed in
 * from docs/architecture.md). Expected values are worked out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "fold.h"
#include "money.h"
#include "timeutil.h"

#define GiB (UINT64_C(1) << 30)
#define T0 (INT64_C(1780000000) * NS_PER_SEC - INT64_C(1780000000) % 3600 * NS_PER_SEC) /* an hour start */

struct sum {
        int n;
        int64_t hours[16];
        uint64_t cpu[16];
        u128 mem[16], sto[16];
        uint64_t peak;
};

static void collect(void *ctx, const struct fold_usage *u)
{
        struct sum *s = ctx;
        int i = 0;
        while (i < s->n && s->hours[i] != u->hour_ns)
                i++;
        if (i == s->n) {
                assert_true(s->n < 16);
                s->hours[s->n++] = u->hour_ns;
        }
        s->cpu[i] += u->cpu_ns;
        s->mem[i] += u->mem_byte_ns;
        s->sto[i] += u->storage_byte_ns;
        if (u->mem_peak_bytes > s->peak)
                s->peak = u->mem_peak_bytes;
}

static uint64_t total_cpu(const struct sum *s)
{
        uint64_t t = 0;
        for (int i = 0; i < s->n; i++)
                t += s->cpu[i];
        return t;
}

/* The counter rules below are those of a sandbox whose provenance is settled:
 * its created event seen (moment unknown: the 366-day bound), every epoch
 * announced. The provenance rules have tests of their own. */
#define PROVEN { .created = true, .epoch_max = INT64_MAX }

static struct usage_event sample(uint64_t epoch, uint64_t seq, int64_t wall, enum sandbox_state st, uint64_t cpu)
{
        return (struct usage_event){ .type = EVENT_SAMPLE, .epoch = epoch, .seq = seq, .wall_ns = wall, .state = st,
                                     .cpu_ns = cpu, .mem_size_bytes = 4 * GiB, .disk_bytes = 1000, .vcpus = 2 };
}

static void test_first_sample_bills_counter_no_time(void **unused)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event ev = sample(1, 1, T0 + 10, STATE_RUNNING, 5000);
        assert_int_equal(fold_apply(&st, &ev, collect, &s), FOLD_BILLED);
        assert_int_equal(s.n, 1);
        assert_int_equal(s.cpu[0], 5000);
        assert_true(s.mem[0] == 0);
}

static void test_duplicates_and_old_epochs_change_nothing(void **unused)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = sample(2, 5, T0, STATE_RUNNING, 100), b = sample(2, 6, T0 + NS_PER_SEC, STATE_RUNNING, 300);
        fold_apply(&st, &a, collect, &s);
        fold_apply(&st, &b, collect, &s);
        struct fold_state before = st;
        struct sum s2 = { 0 };
        struct usage_event dup = b, older = a, old_epoch = sample(1, 99, T0 + 2 * NS_PER_SEC, STATE_RUNNING, 10000);
        assert_int_equal(fold_apply(&st, &dup, collect, &s2), FOLD_DUPLICATE);
        assert_int_equal(fold_apply(&st, &older, collect, &s2), FOLD_DUPLICATE);
        assert_int_equal(fold_apply(&st, &old_epoch, collect, &s2), FOLD_OLD_EPOCH);
        assert_int_equal(s2.n, 0);
        assert_memory_equal(&st, &before, sizeof(st));
}

static void test_new_epoch_bills_whole_counter(void **unused)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = sample(1, 1, T0, STATE_RUNNING, 900), b = sample(2, 0, T0 + 10, STATE_RUNNING, 40);
        fold_apply(&st, &a, collect, &s);
        assert_int_equal(fold_apply(&st, &b, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 940);
}

/* Same epoch, higher seq, smaller counter: the counter restarted
 * (50 -> 1 then rising to 61 burned 50 + 61 = 111). */
static void test_counter_back_is_a_restart(void **unused)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = sample(1, 1, T0, STATE_RUNNING, 50 * NS_PER_SEC),
                           b = sample(1, 2, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 1 * NS_PER_SEC),
                           c = sample(1, 3, T0 + 70 * NS_PER_SEC, STATE_RUNNING, 61 * NS_PER_SEC);
        fold_apply(&st, &a, collect, &s);
        assert_int_equal(fold_apply(&st, &b, collect, &s), FOLD_COUNTER_RESET);
        assert_int_equal(total_cpu(&s), 51 * NS_PER_SEC);
        assert_int_equal(fold_apply(&st, &c, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 111 * NS_PER_SEC);
        assert_true(s.mem[0] == (u128)70 * NS_PER_SEC * 4 * GiB); /* the time is billed throughout */
        /* A resent older sample of before the restart changes nothing. */
        struct sum s2 = { 0 };
        assert_int_equal(fold_apply(&st, &a, collect, &s2), FOLD_DUPLICATE);
        assert_int_equal(s2.n, 0);
}

static void test_split_at_hours_by_time_share(void **unused)
{
        /* 22:15 -> 01:45, 7000 units of CPU over 3.5 h: 1500, 2000, 2000, 1500. */
        struct sum s = { 0 };
        int64_t from = T0 + 15 * 60 * NS_PER_SEC, to = T0 + (3 * 60 + 45) * 60 * NS_PER_SEC;
        fold_split(from, to, 7000, STATE_PAUSED, 10, 5, collect, &s);
        assert_int_equal(s.n, 4);
        assert_int_equal(s.cpu[0], 1500);
        assert_int_equal(s.cpu[1], 2000);
        assert_int_equal(s.cpu[2], 2000);
        assert_int_equal(s.cpu[3], 1500);
        assert_true(s.sto[0] == (u128)45 * 60 * NS_PER_SEC * 15);
        assert_true(s.sto[1] == (u128)3600 * NS_PER_SEC * 15);
        assert_true(s.mem[1] == 0);
        assert_true(s.hours[1] == T0 + NS_PER_HOUR);
}

static void test_split_is_exact_for_awkward_numbers(void **unused)
{
        struct sum s = { 0 };
        fold_split(T0 + 1, T0 + 5 * NS_PER_HOUR + 7, 1000000007, STATE_RUNNING, 3, 0, collect, &s);
        assert_int_equal(s.n, 6);
        assert_int_equal(total_cpu(&s), 1000000007);
        u128 held = 0;
        for (int i = 0; i < s.n; i++)
                held += s.mem[i];
        assert_true(held == (u128)(5 * NS_PER_HOUR + 6) * 3);
}

static void test_stopped_holds_nothing(void **unused)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = sample(1, 1, T0, STATE_STOPPED, 50), b = sample(1, 2, T0 + NS_PER_HOUR, STATE_STOPPED, 50);
        fold_apply(&st, &a, collect, &s);
        fold_apply(&st, &b, collect, &s);
        assert_true(s.mem[0] == 0 && s.sto[0] == 0);
}

static void test_impossible_cpu_is_refused(void **unused)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        /* 2 vCPUs for 60 s can use at most 120 CPU-s (+ an hour of slack for
         * clock skew): 10 hours of CPU in a minute is refused, and changes nothing. */
        struct usage_event a = sample(1, 1, T0, STATE_RUNNING, 0),
                           b = sample(1, 2, T0 + 60 * NS_PER_SEC, STATE_RUNNING, 36000 * NS_PER_SEC),
                           c = sample(2, 1, T0 + 60 * NS_PER_SEC, STATE_RUNNING, 36000 * NS_PER_SEC),
                           d = sample(1, 3, T0 + 120 * NS_PER_SEC, STATE_RUNNING, 240 * NS_PER_SEC);
        fold_apply(&st, &a, collect, &s);
        struct fold_state before = st;
        assert_int_equal(fold_apply(&st, &b, collect, &s), FOLD_IMPOSSIBLE);
        assert_int_equal(fold_apply(&st, &c, collect, &s), FOLD_IMPOSSIBLE);
        assert_memory_equal(&st, &before, sizeof(st));
        assert_int_equal(fold_apply(&st, &d, collect, &s), FOLD_BILLED); /* 240 CPU-s in 120 s: fine */
        assert_int_equal(total_cpu(&s), 240 * NS_PER_SEC);
}

/* ---- held time from cumulative counters ---- */

static struct usage_event held(uint64_t seq, int64_t wall, enum sandbox_state st, uint64_t cpu, uint64_t run,
                               uint64_t paused)
{
        struct usage_event ev = sample(1, seq, wall, st, cpu);
        ev.held_known = true;
        ev.running_ns = run;
        ev.paused_ns = paused;
        return ev;
}

static struct usage_event stopped(uint64_t epoch, int64_t wall, uint64_t cpu, uint64_t run, uint64_t paused)
{
        struct usage_event ev = held(0, wall, STATE_STOPPED, cpu, run, paused);
        ev.type = EVENT_STOPPED;
        ev.epoch = epoch;
        ev.final = true;
        ev.disk_bytes = 0; /* the vmm does not say it: the state's is used */
        return ev;
}

static u128 total_mem(const struct sum *s)
{
        u128 t = 0;
        for (int i = 0; i < s->n; i++)
                t += s->mem[i];
        return t;
}

static u128 total_sto(const struct sum *s)
{
        u128 t = 0;
        for (int i = 0; i < s->n; i++)
                t += s->sto[i];
        return t;
}

static void test_first_sample_bills_whole_held_life(void **unused)
{
        /* Created 0.3 s before its first sample (shorter than a tick): its
         * whole 0.3 s running is billed, placed before the sample's time. */
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event ev = held(1, T0 + NS_PER_HOUR + 100 * NS_PER_MS, STATE_RUNNING, 7, 300 * NS_PER_MS, 0);
        assert_int_equal(fold_apply(&st, &ev, collect, &s), FOLD_BILLED);
        /* 200 ms in the first hour, 100 ms in the next; CPU 7 ns by share: 4 + 3 */
        assert_int_equal(s.n, 2);
        assert_true(s.hours[0] == T0 && s.hours[1] == T0 + NS_PER_HOUR);
        assert_true(s.mem[0] == (u128)200 * NS_PER_MS * 4 * GiB);
        assert_true(s.mem[1] == (u128)100 * NS_PER_MS * 4 * GiB);
        assert_int_equal(s.cpu[0], 4);
        assert_int_equal(s.cpu[1], 3);
        assert_true(st.held && st.running_ns == 300 * NS_PER_MS);
}

static void test_held_counters_bill_their_increase_whatever_the_ticks(void **unused)
{
        /* Samples 10 s apart but the sandbox was paused 2.5 s of the second
         * interval: memory 7.5 s, storage 2.5 s x (4 GiB + 1000). */
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = held(1, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 0, 10 * NS_PER_SEC, 0),
                           b = held(2, T0 + 20 * NS_PER_SEC, STATE_RUNNING, 0, 17500 * NS_PER_MS, 2500 * NS_PER_MS);
        fold_apply(&st, &a, collect, &s);
        fold_apply(&st, &b, collect, &s);
        assert_true(total_mem(&s) == (u128)17500 * NS_PER_MS * 4 * GiB);
        assert_true(total_sto(&s) == (u128)2500 * NS_PER_MS * (4 * GiB + 1000));
        /* a sample with the same counters later bills no time */
        struct sum s2 = { 0 };
        struct usage_event c = held(3, T0 + 30 * NS_PER_SEC, STATE_PAUSED, 0, 17500 * NS_PER_MS, 2500 * NS_PER_MS);
        assert_int_equal(fold_apply(&st, &c, collect, &s2), FOLD_BILLED);
        assert_true(total_mem(&s2) == 0 && total_sto(&s2) == 0);
}

static void test_interval_then_held_bills_no_time_twice(void **unused)
{
        /* An old collector (no held counters) then a new one: the interval
         * up to the first sample with counters is billed by time, then the
         * counters' increase. Running throughout: 30 s in all. */
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = sample(1, 1, T0, STATE_RUNNING, 0),
                           b = held(2, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 0, 500 * NS_PER_SEC, 0),
                           c = held(3, T0 + 30 * NS_PER_SEC, STATE_RUNNING, 0, 520 * NS_PER_SEC, 0);
        fold_apply(&st, &a, collect, &s);
        fold_apply(&st, &b, collect, &s);
        fold_apply(&st, &c, collect, &s);
        assert_true(total_mem(&s) == (u128)30 * NS_PER_SEC * 4 * GiB);
}

/* The vmm's stopped event and the collector's final sample, in either order,
 * with a late sample of before the stop after both: billed once, to the
 * final counters. */
static void stop_orders(bool stop_first)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = held(5, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 3 * NS_PER_SEC, 10 * NS_PER_SEC, 0),
                           late = held(6, T0 + 11 * NS_PER_SEC, STATE_RUNNING, 4 * NS_PER_SEC, 11 * NS_PER_SEC, 0),
                           fin = held(8, T0 + 25 * NS_PER_SEC, STATE_STOPPED, 6 * NS_PER_SEC, 12 * NS_PER_SEC, 0),
                           stop = stopped(1, T0 + 12 * NS_PER_SEC, 6 * NS_PER_SEC, 12 * NS_PER_SEC, 0);
        fold_apply(&st, &a, collect, &s);
        if (stop_first) {
                assert_int_equal(fold_apply(&st, &stop, collect, &s), FOLD_BILLED);
                assert_int_equal(fold_apply(&st, &fin, collect, &s), FOLD_BILLED);
        } else {
                assert_int_equal(fold_apply(&st, &fin, collect, &s), FOLD_BILLED);
                assert_int_equal(fold_apply(&st, &stop, collect, &s), FOLD_BILLED);
        }
        assert_int_equal(total_cpu(&s), 6 * NS_PER_SEC);
        assert_true(total_mem(&s) == (u128)12 * NS_PER_SEC * 4 * GiB);
        assert_int_equal(st.state, STATE_STOPPED);
        /* a sample of before the stop, sent late with a higher seq: nothing more, no restart */
        late.seq = 9;
        struct sum s2 = { 0 };
        assert_int_equal(fold_apply(&st, &late, collect, &s2), FOLD_BILLED);
        assert_int_equal(total_cpu(&s2), 0);
        assert_true(total_mem(&s2) == 0);
        assert_int_equal(st.state, STATE_STOPPED);
}

static void test_stop_event_then_final_sample(void **unused) { stop_orders(true); }
static void test_final_sample_then_stop_event(void **unused) { stop_orders(false); }

static void test_stopped_state_read_back_without_the_flag_is_closed(void **unused)
{
        /* A state read back from a store that kept only its columns (state
         * stopped, no closed flag): a late sample with a smaller counter is
         * from before the stop, not a restart. */
        struct fold_state st = { .created = true, .epoch_max = INT64_MAX, .known = true, .epoch = 1, .seq = 5, .cpu_ns = 900, .wall_ns = T0,
                                 .state = STATE_STOPPED, .mem_size_bytes = 4 * GiB };
        struct sum s = { 0 };
        struct usage_event late = sample(1, 6, T0 - NS_PER_SEC, STATE_RUNNING, 800);
        assert_int_equal(fold_apply(&st, &late, collect, &s), FOLD_BILLED);
        assert_int_equal(s.n, 0);
        assert_int_equal(st.cpu_ns, 900);
        assert_int_equal(st.state, STATE_STOPPED);
}

static void test_stop_event_closes_the_bill_alone(void **unused)
{
        /* The collector died after its first sample: the stopped event bills
         * the CPU and held time after it; with epoch missing (0) it is the
         * state's. Paused 5 s at the end: storage with the state's disk bytes. */
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = held(1, T0 + NS_PER_SEC, STATE_RUNNING, NS_PER_SEC, NS_PER_SEC, 0);
        a.epoch = 3;
        struct usage_event stop = stopped(0, T0 + 100 * NS_PER_SEC, 80 * NS_PER_SEC, 95 * NS_PER_SEC, 5 * NS_PER_SEC);
        fold_apply(&st, &a, collect, &s);
        assert_int_equal(fold_apply(&st, &stop, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 80 * NS_PER_SEC);
        assert_true(total_mem(&s) == (u128)95 * NS_PER_SEC * 4 * GiB);
        assert_true(total_sto(&s) == (u128)5 * NS_PER_SEC * (4 * GiB + 1000));
        assert_int_equal(st.epoch, 3);
        /* the same event again bills nothing */
        struct sum s2 = { 0 };
        fold_apply(&st, &stop, collect, &s2);
        assert_int_equal(s2.n, 0);
}

static void test_stop_event_of_a_sandbox_never_sampled(void **unused)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event stop = stopped(1, T0 + NS_PER_SEC, 250 * NS_PER_MS, 700 * NS_PER_MS, 0);
        assert_int_equal(fold_apply(&st, &stop, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 250 * NS_PER_MS);
        assert_true(total_mem(&s) == (u128)700 * NS_PER_MS * 4 * GiB);
        /* its final sample afterwards (any generation: no seq was billed yet): nothing more */
        struct usage_event fin = held((UINT64_C(70000) << 32) | 7, T0 + 2 * NS_PER_SEC, STATE_STOPPED, 250 * NS_PER_MS,
                                      700 * NS_PER_MS, 0);
        struct sum s2 = { 0 };
        assert_int_equal(fold_apply(&st, &fin, collect, &s2), FOLD_BILLED);
        assert_int_equal(s2.n, 0);
}

static void test_clock_ahead_bills_the_truth(void **unused)
{
        /* +1 h on one sample: with held counters the held time billed is
         * the truth; the usage of that sample is placed at the aggregator's
         * clock and the state's wall time does not move. */
        struct fold_clock clk = { .now_ns = T0 + 20 * NS_PER_SEC, .max_ahead_ns = 300 * NS_PER_SEC,
                                  .max_behind_ns = 0 };
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        unsigned notes = 0;
        struct usage_event a = held(1, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 0, 10 * NS_PER_SEC, 0),
                           b = held(2, T0 + 20 * NS_PER_SEC + NS_PER_HOUR, STATE_RUNNING, 0, 20 * NS_PER_SEC, 0),
                           c = held(3, T0 + 30 * NS_PER_SEC, STATE_RUNNING, 0, 30 * NS_PER_SEC, 0);
        fold_apply_at(&st, &a, &clk, &notes, collect, &s);
        assert_int_equal(notes, 0);
        assert_int_equal(fold_apply_at(&st, &b, &clk, &notes, collect, &s), FOLD_BILLED);
        assert_int_equal(notes, FOLD_NOTE_CLOCK_AHEAD);
        assert_true(st.wall_ns == T0 + 10 * NS_PER_SEC);
        clk.now_ns = T0 + 30 * NS_PER_SEC;
        fold_apply_at(&st, &c, &clk, &notes, collect, &s);
        assert_int_equal(s.n, 1);
        assert_true(total_mem(&s) == (u128)30 * NS_PER_SEC * 4 * GiB);
}

static void test_clock_ahead_without_held_counters_bills_no_extra_time(void **unused)
{
        /* Interval rule: the sample from the future moves no interval; the
         * next good one bills the time since the last good one. */
        struct fold_clock clk = { .now_ns = T0 + 20 * NS_PER_SEC, .max_ahead_ns = 300 * NS_PER_SEC };
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = sample(1, 1, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 0),
                           b = sample(1, 2, T0 + 10 * 365 * NS_PER_DAY, STATE_RUNNING, 5),
                           c = sample(1, 3, T0 + 30 * NS_PER_SEC, STATE_RUNNING, 9);
        fold_apply_at(&st, &a, &clk, NULL, collect, &s);
        fold_apply_at(&st, &b, &clk, NULL, collect, &s);
        clk.now_ns = T0 + 30 * NS_PER_SEC;
        fold_apply_at(&st, &c, &clk, NULL, collect, &s);
        assert_int_equal(s.n, 1);
        assert_int_equal(total_cpu(&s), 9);
        assert_true(total_mem(&s) == (u128)20 * NS_PER_SEC * 4 * GiB);
}

static void test_clock_behind_is_placed_at_the_aggregators_clock(void **unused)
{
        struct fold_clock clk = { .now_ns = T0, .max_ahead_ns = 300 * NS_PER_SEC, .max_behind_ns = NS_PER_DAY };
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        unsigned notes = 0;
        struct usage_event a = held(1, T0 - 3 * NS_PER_DAY, STATE_RUNNING, 5, NS_PER_SEC, 0);
        fold_apply_at(&st, &a, &clk, &notes, collect, &s);
        assert_int_equal(notes, FOLD_NOTE_CLOCK_BEHIND);
        assert_int_equal(s.n, 1);
        assert_true(s.hours[0] == T0 - NS_PER_HOUR); /* the second before T0 */
        assert_int_equal(total_cpu(&s), 5);
}

static void test_seq_generation_jump_is_refused(void **unused)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        uint64_t g = 7;
        struct usage_event a = sample(1, (g << 32) | 0xFFFFFFFAu, T0, STATE_RUNNING, 10 * NS_PER_SEC),
                           wrap = sample(1, ((g + 1) << 32) | 1, T0 + 60 * NS_PER_SEC, STATE_RUNNING, 70 * NS_PER_SEC),
                           forged = sample(1, INT64_MAX, T0 + 61 * NS_PER_SEC, STATE_RUNNING, 70 * NS_PER_SEC),
                           edge = sample(1, ((g + 1 + 65536) << 32) | 1, T0 + 62 * NS_PER_SEC, STATE_RUNNING,
                                         71 * NS_PER_SEC),
                           later = sample(1, ((g + 1 + 65537) << 32) | 1, T0 + 70 * NS_PER_SEC, STATE_RUNNING,
                                          80 * NS_PER_SEC);
        fold_apply(&st, &a, collect, &s);
        assert_int_equal(fold_apply(&st, &wrap, collect, &s), FOLD_BILLED);
        struct fold_state before = st;
        assert_int_equal(fold_apply(&st, &forged, collect, &s), FOLD_SEQ_JUMP);
        assert_memory_equal(&st, &before, sizeof(st));
        /* exactly 65,536 generations up is accepted, then one more from there too */
        assert_int_equal(fold_apply(&st, &edge, collect, &s), FOLD_BILLED);
        assert_int_equal(fold_apply(&st, &later, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 80 * NS_PER_SEC);
}

static void test_epoch_jump_is_refused(void **unused)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = sample(4, 1, T0, STATE_RUNNING, 10), forged = sample(INT64_MAX, 1, T0 + 1, STATE_RUNNING, 10),
                           next = sample(4, 2, T0 + 2, STATE_RUNNING, 30);
        fold_apply(&st, &a, collect, &s);
        assert_int_equal(fold_apply(&st, &forged, collect, &s), FOLD_EPOCH_JUMP);
        assert_int_equal(fold_apply(&st, &next, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 30);
}

static void test_impossible_held_time_is_refused(void **unused)
{
        /* 10 s between samples cannot hold 2 hours (1 h of slack); a first
         * sample cannot carry more than 366 days. Nothing moves. */
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        struct usage_event a = held(1, T0, STATE_RUNNING, 0, NS_PER_SEC, 0),
                           b = held(2, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 0, 2 * NS_PER_HOUR, 0),
                           first = held(1, T0, STATE_RUNNING, 0, INT64_MAX, 0);
        fold_apply(&st, &a, collect, &s);
        struct fold_state before = st;
        assert_int_equal(fold_apply(&st, &b, collect, &s), FOLD_IMPOSSIBLE);
        assert_memory_equal(&st, &before, sizeof(st));
        struct fold_state fresh = PROVEN;
        assert_int_equal(fold_apply(&fresh, &first, collect, &s), FOLD_IMPOSSIBLE);
        assert_false(fresh.known);
}

static void test_held_counter_back_bills_only_beyond_the_highest(void **unused)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        unsigned notes = 0;
        struct usage_event a = held(1, T0, STATE_RUNNING, 0, 50 * NS_PER_SEC, 0),
                           b = held(2, T0 + NS_PER_SEC, STATE_RUNNING, 0, 40 * NS_PER_SEC, 0),
                           c = held(3, T0 + 2 * NS_PER_SEC, STATE_RUNNING, 0, 52 * NS_PER_SEC, 0);
        fold_apply_at(&st, &a, NULL, &notes, collect, &s);
        fold_apply_at(&st, &b, NULL, &notes, collect, &s);
        assert_int_equal(notes, FOLD_NOTE_HELD_BACK);
        fold_apply_at(&st, &c, NULL, &notes, collect, &s);
        assert_true(total_mem(&s) == (u128)52 * NS_PER_SEC * 4 * GiB);
}

static void test_place_is_exact(void **unused)
{
        struct sum s = { 0 };
        /* 3 h + 7 ns of held time ending 5 ns into an hour: it starts 2 ns
         * before T0 - 3 h, so 5 hours get a piece */
        fold_place(T0 + 5, 1000000007, 2 * NS_PER_HOUR + 3, NS_PER_HOUR + 4, 3, 2, collect, &s);
        assert_int_equal(s.n, 5);
        assert_int_equal(total_cpu(&s), 1000000007);
        assert_true(total_mem(&s) == (u128)(2 * NS_PER_HOUR + 3) * 3);
        assert_true(total_sto(&s) == (u128)(NS_PER_HOUR + 4) * 5);
        assert_true(s.hours[0] == T0 - 4 * NS_PER_HOUR && s.hours[4] == T0);
        /* the first hour has 2 of the span's ns: CPU floor(1000000007 x 2 / span) = 0 */
        assert_true(s.mem[0] + s.sto[0] > 0);
        assert_int_equal(s.cpu[0], 0);
}

static void test_state_text_round_trip_and_v1(void **unused)
{
        struct fold_state st = { .known = true, .epoch = 3, .seq = (UINT64_C(5) << 32) | 9, .cpu_ns = 123,
                                 .wall_ns = T0, .state = STATE_PAUSED, .mem_size_bytes = 4 * GiB, .disk_bytes = 77,
                                 .held = true, .running_ns = 11, .paused_ns = 22, .closed = true, .created = true,
                                 .created_ns = T0 - 5, .created_vcpus = 4, .epoch_max = 6, .host = "host-a.1" }, back;
        char buf[FOLD_STATE_TEXT_MAX];
        assert_true(fold_state_format(&st, buf, sizeof(buf)) > 0);
        assert_int_equal(strncmp(buf, "v3 ", 3), 0);
        memset(&back, 0xff, sizeof(back));
        assert_int_equal(fold_state_parse(buf, &back), 0);
        assert_true(back.known && back.epoch == 3 && back.seq == st.seq && back.cpu_ns == 123 && back.wall_ns == T0 &&
                    back.state == STATE_PAUSED && back.mem_size_bytes == 4 * GiB && back.disk_bytes == 77 &&
                    back.held && back.running_ns == 11 && back.paused_ns == 22 && back.closed);
        assert_true(back.created && back.created_ns == T0 - 5 && back.created_vcpus == 4 && back.epoch_max == 6 &&
                    strcmp(back.host, "host-a.1") == 0);
        /* No host yet (a state made before its created event) */
        struct fold_state none = { 0 };
        assert_true(fold_state_format(&none, buf, sizeof(buf)) > 0);
        memset(&back, 0xff, sizeof(back));
        assert_int_equal(fold_state_parse(buf, &back), 0);
        assert_true(!back.known && !back.created && back.host[0] == '\0');
        /* v2 and v1 came before provenance: created on any host, their epoch announced */
        assert_int_equal(fold_state_parse("v2 known=1 epoch=3 seq=4 cpu_ns=5 wall_ns=6 state=0 mem_size_bytes=7"
                                          " disk_bytes=8 held=1 running_ns=9 paused_ns=10 closed=0", &back), 0);
        assert_true(back.known && back.epoch == 3 && back.held && back.running_ns == 9 && back.created &&
                    back.created_ns == 0 && back.epoch_max == 3 && back.host[0] == '\0');
        assert_int_equal(fold_state_parse("v1 known=1 epoch=3 seq=4 cpu_ns=5 wall_ns=6 state=1 mem_size_bytes=7"
                                          " disk_bytes=8", &back), 0);
        assert_true(back.known && back.epoch == 3 && back.seq == 4 && back.cpu_ns == 5 && back.wall_ns == 6 &&
                    back.state == STATE_PAUSED && back.mem_size_bytes == 7 && back.disk_bytes == 8 && !back.held &&
                    !back.closed && back.created && back.epoch_max == 3);
        assert_int_equal(fold_state_parse("v3 known=1", &back), -EINVAL);
        assert_int_equal(fold_state_parse("v2 known=1 epoch=3", &back), -EINVAL);
        assert_int_equal(fold_state_parse("v2 known=1 epoch=3 seq=4 cpu_ns=5 wall_ns=6 state=0 mem_size_bytes=7"
                                          " disk_bytes=8 held=1 running_ns=9 paused_ns=10 closed=7", &back), -EINVAL);
        char bad[FOLD_STATE_TEXT_MAX + 8];
        assert_true(fold_state_format(&st, buf, sizeof(buf)) > 0);
        snprintf(bad, sizeof(bad), "%s two", buf); /* a host is one id */
        assert_int_equal(fold_state_parse(bad, &back), -EINVAL);
}

static struct usage_event created_event(const char *host, int64_t wall, uint32_t vcpus)
{
        struct usage_event ev = { .type = EVENT_CREATED, .epoch = 1, .wall_ns = wall, .vcpus = vcpus,
                                  .mem_size_bytes = 4 * GiB };
        strcpy(ev.host, host);
        return ev;
}

static void test_nothing_is_billed_before_created(void **unused)
{
        struct fold_state st = { 0 };
        struct sum s = { 0 };
        struct usage_event a = sample(1, 1, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 5 * NS_PER_SEC);
        assert_int_equal(fold_apply(&st, &a, collect, &s), FOLD_UNANNOUNCED);
        assert_false(st.known);
        assert_int_equal(s.n, 0);
        struct usage_event c = created_event("h1", T0, 2);
        assert_int_equal(fold_announce(&st, &c), 0);
        assert_int_equal(fold_apply(&st, &a, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 5 * NS_PER_SEC);
        assert_string_equal(st.host, "h1");
        assert_true(st.created && st.created_ns == T0 && st.created_vcpus == 2);
}

static void test_first_reading_is_bounded_by_the_time_since_created(void **unused)
{
        /* Created with 2 vCPUs at T0; a first reading 10 s later may carry
         * 2 x (10 s + 60 s of slack) = 140 CPU-s and 70 s of held time. */
        struct fold_state st = { 0 };
        struct sum s = { 0 };
        struct usage_event c = created_event("h1", T0, 2);
        assert_int_equal(fold_announce(&st, &c), 0);
        struct usage_event over = sample(1, 1, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 140 * NS_PER_SEC + 1);
        over.vcpus = 1024; /* a sample cannot raise the vCPUs the sandbox was created with */
        struct fold_state before = st;
        assert_int_equal(fold_apply(&st, &over, collect, &s), FOLD_IMPOSSIBLE);
        assert_memory_equal(&st, &before, sizeof(st));
        struct usage_event held_over = held(1, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 0, 70 * NS_PER_SEC + 1, 0);
        assert_int_equal(fold_apply(&st, &held_over, collect, &s), FOLD_IMPOSSIBLE);
        struct usage_event ok = sample(1, 1, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 140 * NS_PER_SEC);
        assert_int_equal(fold_apply(&st, &ok, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 140 * NS_PER_SEC);
}

static void test_an_epoch_needs_its_announcement(void **unused)
{
        struct fold_state st = { 0 };
        struct sum s = { 0 };
        struct usage_event c = created_event("h1", T0, 2);
        assert_int_equal(fold_announce(&st, &c), 0);
        struct usage_event a = sample(1, 1, T0 + 10 * NS_PER_SEC, STATE_RUNNING, 10 * NS_PER_SEC),
                           forged = sample(2, 1, T0 + 20 * NS_PER_SEC, STATE_RUNNING, 0),
                           b = sample(1, 2, T0 + 30 * NS_PER_SEC, STATE_RUNNING, 30 * NS_PER_SEC);
        assert_int_equal(fold_apply(&st, &a, collect, &s), FOLD_BILLED);
        struct fold_state before = st;
        assert_int_equal(fold_apply(&st, &forged, collect, &s), FOLD_UNANNOUNCED);
        assert_memory_equal(&st, &before, sizeof(st));
        assert_int_equal(fold_apply(&st, &b, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 30 * NS_PER_SEC);
        /* Announced from another host: refused; from its own: the epoch bills. */
        struct usage_event r = { .type = EVENT_RESTARTED, .epoch = 2, .wall_ns = T0 + 35 * NS_PER_SEC };
        strcpy(r.host, "h2");
        assert_int_equal(fold_announce(&st, &r), -EPERM);
        strcpy(r.host, "h1");
        r.epoch = 2 + FOLD_JUMP_MAX;
        assert_int_equal(fold_announce(&st, &r), -ERANGE);
        r.epoch = 2;
        assert_int_equal(fold_announce(&st, &r), 0);
        struct usage_event e2 = sample(2, 1, T0 + 40 * NS_PER_SEC, STATE_RUNNING, 4 * NS_PER_SEC);
        assert_int_equal(fold_apply(&st, &e2, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 34 * NS_PER_SEC);
}

static void test_stopped_behind_the_billed_counter_is_refused(void **unused)
{
        struct fold_state st = { 0 };
        struct sum s = { 0 };
        struct usage_event c = created_event("h1", T0, 2);
        fold_announce(&st, &c);
        struct usage_event a = sample(1, 1, T0 + 100 * NS_PER_SEC, STATE_RUNNING, 100 * NS_PER_SEC);
        assert_int_equal(fold_apply(&st, &a, collect, &s), FOLD_BILLED);
        struct usage_event stop = { .type = EVENT_STOPPED, .epoch = 1, .wall_ns = T0 + 110 * NS_PER_SEC,
                                    .cpu_ns = NS_PER_SEC, .vcpus = 2 };
        struct fold_state before = st;
        assert_int_equal(fold_apply(&st, &stop, collect, &s), FOLD_STOP_BEHIND);
        assert_memory_equal(&st, &before, sizeof(st));
        stop.cpu_ns = 120 * NS_PER_SEC;
        stop.wall_ns = T0 + 100 * NS_PER_SEC - FOLD_CPU_SLACK_NS - 1; /* long before the last reading */
        assert_int_equal(fold_apply(&st, &stop, collect, &s), FOLD_STOP_BEHIND);
        stop.wall_ns = T0 + 110 * NS_PER_SEC;
        assert_int_equal(fold_apply(&st, &stop, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 120 * NS_PER_SEC);
        /* Once stopped, a lower reading is one from before the stop: nothing billed, not refused. */
        struct usage_event late = sample(1, 2, T0 + 105 * NS_PER_SEC, STATE_RUNNING, 110 * NS_PER_SEC);
        assert_int_equal(fold_apply(&st, &late, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 120 * NS_PER_SEC);
}

/* A busy hour of a 2 vCPU / 4 GiB sandbox rated with $0.025 per vCPU-hour and
 * $0.0075 per GiB-hour: $0.08. */
static void rate_hour(uint64_t milli_vcpus, int64_t want_nanodollars)
{
        struct fold_state st = PROVEN;
        struct sum s = { 0 };
        for (int m = 0; m <= 60; m++) {
                struct usage_event ev = sample(1, (uint64_t)m + 1, T0 + m * 60 * NS_PER_SEC, STATE_RUNNING,
                                               milli_vcpus * (uint64_t)m * 60 * NS_PER_SEC / 1000);
                fold_apply(&st, &ev, collect, &s);
        }
        assert_int_equal(s.n, 1);
        int64_t cpu, mem;
        assert_int_equal(money_muldiv((int64_t)s.cpu[0], 25000000, 3600 * NS_PER_SEC, &cpu), 0);
        assert_true(s.mem[0] % GiB == 0);
        assert_int_equal(money_muldiv((int64_t)(s.mem[0] / GiB), 7500000, 3600 * NS_PER_SEC, &mem), 0);
        assert_int_equal(cpu + mem, want_nanodollars);
}

static void test_golden_busy_hour(void **unused) { rate_hour(2000, 80000000); }
static void test_golden_waiting_hour(void **unused) { rate_hour(50, 31250000); }

/* 1,000 tasks of 30 min with 300 CPU-s each: CPU $2.08, memory $15.00, total $17.08. */
static void test_golden_thousand_tasks(void **unused)
{
        struct sum s = { 0 };
        for (int i = 0; i < 1000; i++) {
                struct fold_state st = PROVEN;
                int64_t start = T0 + (int64_t)i * 37 * 60 * NS_PER_SEC;
                for (int k = 0; k <= 6; k++) {
                        struct usage_event ev = sample(1, (uint64_t)k + 1, start + k * 5 * 60 * NS_PER_SEC,
                                                       k == 6 ? STATE_STOPPED : STATE_RUNNING,
                                                       (uint64_t)k * 50 * NS_PER_SEC);
                        struct sum one = { 0 };
                        fold_apply(&st, &ev, collect, &one);
                        for (int h = 0; h < one.n; h++) {
                                s.cpu[0] += one.cpu[h];
                                s.mem[0] += one.mem[h];
                        }
                }
        }
        int64_t cpu, mem;
        assert_int_equal(money_muldiv((int64_t)s.cpu[0], 25000000, 3600 * NS_PER_SEC, &cpu), 0);
        assert_int_equal(money_muldiv((int64_t)(s.mem[0] / GiB), 7500000, 3600 * NS_PER_SEC, &mem), 0);
        assert_int_equal(money_to_cents(cpu), 208);
        assert_int_equal(money_to_cents(mem), 1500);
        assert_int_equal(money_to_cents(cpu) + money_to_cents(mem), 1708);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_first_sample_bills_counter_no_time),
                cmocka_unit_test(test_nothing_is_billed_before_created),
                cmocka_unit_test(test_first_reading_is_bounded_by_the_time_since_created),
                cmocka_unit_test(test_an_epoch_needs_its_announcement),
                cmocka_unit_test(test_stopped_behind_the_billed_counter_is_refused),
                cmocka_unit_test(test_duplicates_and_old_epochs_change_nothing),
                cmocka_unit_test(test_new_epoch_bills_whole_counter),
                cmocka_unit_test(test_counter_back_is_a_restart),
                cmocka_unit_test(test_split_at_hours_by_time_share),
                cmocka_unit_test(test_split_is_exact_for_awkward_numbers),
                cmocka_unit_test(test_stopped_holds_nothing),
                cmocka_unit_test(test_impossible_cpu_is_refused),
                cmocka_unit_test(test_first_sample_bills_whole_held_life),
                cmocka_unit_test(test_held_counters_bill_their_increase_whatever_the_ticks),
                cmocka_unit_test(test_interval_then_held_bills_no_time_twice),
                cmocka_unit_test(test_stop_event_then_final_sample),
                cmocka_unit_test(test_final_sample_then_stop_event),
                cmocka_unit_test(test_stop_event_closes_the_bill_alone),
                cmocka_unit_test(test_stopped_state_read_back_without_the_flag_is_closed),
                cmocka_unit_test(test_stop_event_of_a_sandbox_never_sampled),
                cmocka_unit_test(test_clock_ahead_bills_the_truth),
                cmocka_unit_test(test_clock_ahead_without_held_counters_bills_no_extra_time),
                cmocka_unit_test(test_clock_behind_is_placed_at_the_aggregators_clock),
                cmocka_unit_test(test_seq_generation_jump_is_refused),
                cmocka_unit_test(test_epoch_jump_is_refused),
                cmocka_unit_test(test_impossible_held_time_is_refused),
                cmocka_unit_test(test_held_counter_back_bills_only_beyond_the_highest),
                cmocka_unit_test(test_place_is_exact),
                cmocka_unit_test(test_state_text_round_trip_and_v1),
                cmocka_unit_test(test_golden_busy_hour),
                cmocka_unit_test(test_golden_waiting_hour),
                cmocka_unit_test(test_golden_thousand_tasks),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
