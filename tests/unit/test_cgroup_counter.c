/* Unit tests of common/cgroup_counter.c, the one parser of the cgroup CPU
 * counter (the vmm's final counter and the collector's samples). Every input
 * is written by hand; every expected value is worked out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cgroup_counter.h"

#include <errno.h>
#include <string.h>

#define SENTINEL UINT64_C(777)

/* Parses text as a whole; a failure must leave *ret alone. */
static int u64(const char *text, uint64_t *ret)
{
        *ret = SENTINEL;
        return cgroup_counter_parse_u64(text, strlen(text), ret);
}

static int cpu(int version, const char *text, uint64_t *ret)
{
        *ret = SENTINEL;
        return cgroup_counter_parse_cpu(version, text, strlen(text), ret);
}

static void v1_values_and_bounds(void **state)
{
        uint64_t v;
        assert_int_equal(u64("218103808\n", &v), 0);
        assert_true(v == UINT64_C(218103808));
        assert_int_equal(u64("0\n", &v), 0);
        assert_true(v == 0);
        assert_int_equal(u64("42", &v), 0); /* no newline at all */
        assert_true(v == 42);
        assert_int_equal(u64("18446744073709551615\n", &v), 0); /* 2^64 - 1 */
        assert_true(v == UINT64_MAX);
        assert_int_equal(u64("000000000000000000000000000123\n", &v), 0); /* leading zeros are no overflow */
        assert_true(v == 123);
        /* v1's counter is already nanoseconds: taken as it is. */
        assert_int_equal(cpu(1, "5000000123\n", &v), 0);
        assert_true(v == UINT64_C(5000000123));
}

static void v1_refused(void **state)
{
        uint64_t v;
        static const char *const bad[] = {
                "18446744073709551616\n",  /* 2^64 */
                "99999999999999999999\n",  /* over by far */
                "184467440737095516150\n", /* 2^64 - 1 followed by a digit */
                "", "\n", "max\n", "-1\n", "+1\n", " 1\n", "1 \n", "12 34\n",
                "12\n34\n",                /* trailing garbage after the line */
                "12\n\n", "12x\n", "0x10\n", "1.5\n",
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                assert_int_equal(u64(bad[i], &v), -EINVAL);
                assert_true(v == SENTINEL);
                assert_int_equal(cpu(1, bad[i], &v), -EINVAL);
                assert_true(v == SENTINEL);
        }
        /* Only the bytes given are read: "123" of "1234" is 123. */
        v = SENTINEL;
        assert_int_equal(cgroup_counter_parse_u64("1234", 3, &v), 0);
        assert_true(v == 123);
}

static void v2_cpu_stat(void **state)
{
        uint64_t v;
        /* As a v2 host with the cpu controller writes it: µs become ns. */
        assert_int_equal(cpu(2, "usage_usec 1196389000\nuser_usec 700563000\nsystem_usec 495826000\n"
                                "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n", &v), 0);
        assert_true(v == UINT64_C(1196389000000));
        /* Not the first line, and the last one without its newline. */
        assert_int_equal(cpu(2, "nr_periods 3\nusage_usec 42", &v), 0);
        assert_true(v == 42000);
        assert_int_equal(cpu(2, "usage_usec 0\n", &v), 0);
        assert_true(v == 0);
        /* The largest µs whose ns fit: floor((2^64 - 1) / 1000) = 18446744073709551. */
        assert_int_equal(cpu(2, "usage_usec 18446744073709551\n", &v), 0);
        assert_true(v == UINT64_C(18446744073709551000));
}

static void v2_other_keys_are_not_it(void **state)
{
        uint64_t v;
        /* usage_usec inside another key's name, before the real line. */
        assert_int_equal(cpu(2, "core_usage_usec 9\nusage_usec 5\n", &v), 0);
        assert_true(v == 5000);
        assert_int_equal(cpu(2, "xusage_usec 9\nusage_usec_total 8\nusage_usec 7\n", &v), 0);
        assert_true(v == 7000);
        /* ... and with no real line at all: missing, never the other key's value. */
        static const char *const missing[] = {
                "core_usage_usec 9\n", "user_usec 1\nsystem_usec 2\n", "usage_usec_total 8\n",
                "nr_periods 1 usage_usec 5\n", /* in the middle of a line */
                "", "\n", "usage_usec\n", "usage_usec \n", "usage_usec5\n", "USAGE_USEC 5\n",
        };
        for (size_t i = 0; i < sizeof(missing) / sizeof(missing[0]); i++) {
                assert_int_equal(cpu(2, missing[i], &v), -EINVAL);
                assert_true(v == SENTINEL);
        }
}

static void v2_refused(void **state)
{
        uint64_t v;
        static const char *const bad[] = {
                "usage_usec 18446744073709552\n",   /* × 1000 overflows */
                "usage_usec 18446744073709551616\n", /* over 2^64 as µs already */
                "usage_usec twelve\n", "usage_usec -1\n", "usage_usec  5\n", "usage_usec 5 6\n",
                "usage_usec 5x\n", "usage_usec 5\r\n",
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                assert_int_equal(cpu(2, bad[i], &v), -EINVAL);
                assert_true(v == SENTINEL);
        }
        /* The version is v1 or v2, nothing else. */
        assert_int_equal(cpu(0, "5\n", &v), -EINVAL);
        assert_int_equal(cpu(3, "usage_usec 5\n", &v), -EINVAL);
        assert_true(v == SENTINEL);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(v1_values_and_bounds),
                cmocka_unit_test(v1_refused),
                cmocka_unit_test(v2_cpu_stat),
                cmocka_unit_test(v2_other_keys_are_not_it),
                cmocka_unit_test(v2_refused),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
