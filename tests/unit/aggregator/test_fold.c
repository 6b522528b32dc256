/* Unit tests of the fold: the counter rules of docs/events.md, hour splits,
 * and the seeds' worked figures rated with the default plan's rates (typed in
 * from DESIGN.md). Expected values are worked out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
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

static struct usage_event sample(uint64_t epoch, uint64_t seq, int64_t wall, enum sandbox_state st, uint64_t cpu)
{
        return (struct usage_event){ .type = EVENT_SAMPLE, .epoch = epoch, .seq = seq, .wall_ns = wall, .state = st,
                                     .cpu_ns = cpu, .mem_size_bytes = 4 * GiB, .disk_bytes = 1000, .vcpus = 2 };
}

static void test_first_sample_bills_counter_no_time(void **unused)
{
        struct fold_state st = { 0 };
        struct sum s = { 0 };
        struct usage_event ev = sample(1, 1, T0 + 10, STATE_RUNNING, 5000);
        assert_int_equal(fold_apply(&st, &ev, collect, &s), FOLD_BILLED);
        assert_int_equal(s.n, 1);
        assert_int_equal(s.cpu[0], 5000);
        assert_true(s.mem[0] == 0);
}

static void test_duplicates_and_old_epochs_change_nothing(void **unused)
{
        struct fold_state st = { 0 };
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
        struct fold_state st = { 0 };
        struct sum s = { 0 };
        struct usage_event a = sample(1, 1, T0, STATE_RUNNING, 900), b = sample(2, 0, T0 + 10, STATE_RUNNING, 40);
        fold_apply(&st, &a, collect, &s);
        assert_int_equal(fold_apply(&st, &b, collect, &s), FOLD_BILLED);
        assert_int_equal(total_cpu(&s), 940);
}

/* Same epoch, higher seq, smaller counter: the counter restarted (issue 9,
 * item 7: 50 -> 1 then rising to 61 burned 50 + 61 = 111). */
static void test_counter_back_is_a_restart(void **unused)
{
        struct fold_state st = { 0 };
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
        struct fold_state st = { 0 };
        struct sum s = { 0 };
        struct usage_event a = sample(1, 1, T0, STATE_STOPPED, 50), b = sample(1, 2, T0 + NS_PER_HOUR, STATE_STOPPED, 50);
        fold_apply(&st, &a, collect, &s);
        fold_apply(&st, &b, collect, &s);
        assert_true(s.mem[0] == 0 && s.sto[0] == 0);
}

static void test_impossible_cpu_is_refused(void **unused)
{
        struct fold_state st = { 0 };
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

/* A busy hour of a 2 vCPU / 4 GiB sandbox rated with $0.025 per vCPU-hour and
 * $0.0075 per GiB-hour: $0.08. */
static void rate_hour(uint64_t milli_vcpus, int64_t want_nanodollars)
{
        struct fold_state st = { 0 };
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
                struct fold_state st = { 0 };
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
                cmocka_unit_test(test_duplicates_and_old_epochs_change_nothing),
                cmocka_unit_test(test_new_epoch_bills_whole_counter),
                cmocka_unit_test(test_counter_back_is_a_restart),
                cmocka_unit_test(test_split_at_hours_by_time_share),
                cmocka_unit_test(test_split_is_exact_for_awkward_numbers),
                cmocka_unit_test(test_stopped_holds_nothing),
                cmocka_unit_test(test_impossible_cpu_is_refused),
                cmocka_unit_test(test_golden_busy_hour),
                cmocka_unit_test(test_golden_waiting_hour),
                cmocka_unit_test(test_golden_thousand_tasks),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
