/* Unit tests of the aggregator's COPY text (aggregator/text.c): times as the
 * ledger reads them, and the fast appenders a batch's rows are built with.
 * Times are checked against the C library's gmtime_r and strftime (not
 * tally's code), at the calendar's edges (leap days, centuries, the epoch,
 * before it) and at 100,000 instants drawn over 1970..2200; numbers against
 * values written out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text.h"
#include "timeutil.h"

static void libc_ts(char *buf, size_t size, int64_t ns)
{
        int64_t s = ns / NS_PER_SEC - (ns % NS_PER_SEC < 0);
        int64_t frac = ns - s * NS_PER_SEC;
        time_t t = (time_t)s;
        struct tm tm;
        gmtime_r(&t, &tm);
        char date[32];
        strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", &tm);
        snprintf(buf, size, "%s.%06" PRId64 "+00", date, frac / NS_PER_US);
}

static void same_as_libc(int64_t ns)
{
        char got[64], want[64];
        format_ts(got, sizeof(got), ns);
        libc_ts(want, sizeof(want), ns);
        if (strcmp(got, want) != 0)
                fail_msg("ns=%" PRId64 ": %s, want %s", ns, got, want);
}

static void test_times_by_hand(void **state)
{
        (void)state;
        char buf[64];
        format_ts(buf, sizeof(buf), 0);
        assert_string_equal(buf, "1970-01-01 00:00:00.000000+00");
        format_ts(buf, sizeof(buf), -1);
        assert_string_equal(buf, "1969-12-31 23:59:59.999999+00");
        format_ts(buf, sizeof(buf), INT64_C(951782400) * NS_PER_SEC + 123456789); /* 2000-02-29 */
        assert_string_equal(buf, "2000-02-29 00:00:00.123456+00");
        format_ts(buf, sizeof(buf), INT64_C(4107542399) * NS_PER_SEC); /* the last second of 2100-02-28 */
        assert_string_equal(buf, "2100-02-28 23:59:59.000000+00");
        format_ts(buf, sizeof(buf), INT64_C(4107542400) * NS_PER_SEC); /* 2100 is no leap year */
        assert_string_equal(buf, "2100-03-01 00:00:00.000000+00");
        format_ts(buf, 29, 0); /* no room for the whole time: nothing, not a cut one */
        assert_string_equal(buf, "");
        format_ts(buf, 30, 0);
        assert_string_equal(buf, "1970-01-01 00:00:00.000000+00");
}

static void test_times_against_libc(void **state)
{
        (void)state;
        static const int64_t edges[] = { 0, -1, 1, NS_PER_SEC - 1, 86400 * NS_PER_SEC - 1, INT64_C(951868800) * NS_PER_SEC - 1,
                                         INT64_C(1709164800) * NS_PER_SEC, INT64_C(1735689599) * NS_PER_SEC + 999999999,
                                         INT64_C(7258118400) * NS_PER_SEC, INT64_C(-86400) * NS_PER_SEC,
                                         INT64_C(-2208988800) * NS_PER_SEC, INT64_MAX };
        for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++)
                same_as_libc(edges[i]);
        uint64_t x = 88172645463325252ULL; /* xorshift64 */
        for (int i = 0; i < 100000; i++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                same_as_libc((int64_t)(x % (UINT64_C(7258118400) * NS_PER_SEC)));
        }
}

static void test_appenders(void **state)
{
        (void)state;
        struct text t = { 0 };
        assert_int_equal(text_put(&t, "sb-1", '\t'), 0);
        assert_int_equal(text_put(&t, "", '\t'), 0);
        assert_int_equal(text_put_u64(&t, 0, '\t'), 0);
        assert_int_equal(text_put_u64(&t, UINT64_MAX, '\t'), 0);
        assert_int_equal(text_put_i64(&t, -7, '\t'), 0);
        assert_int_equal(text_put_i64(&t, INT64_MIN, '\t'), 0);
        assert_int_equal(text_put_i64(&t, INT64_MAX, '\n'), 0);
        assert_string_equal(t.buf, "sb-1\t\t0\t18446744073709551615\t-7\t-9223372036854775808\t9223372036854775807\n");
        assert_int_equal(t.len, strlen(t.buf));
        /* Past the first buffer (1 MiB): grown, nothing lost. */
        for (int i = 0; i < 200000; i++)
                assert_int_equal(text_put_u64(&t, 1234567, '\n'), 0);
        assert_int_equal(t.len, strlen(t.buf));
        assert_int_equal(t.len, 73 + 200000 * 8);
        free(t.buf);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_times_by_hand),
                cmocka_unit_test(test_times_against_libc),
                cmocka_unit_test(test_appenders),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
