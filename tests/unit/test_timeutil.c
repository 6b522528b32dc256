/* Unit tests of common/timeutil.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "timeutil.h"

static void floors(void **state)
{
        /* 2026-11-29T07:14:17.5Z is 1795936457.5 s after the epoch (date -d @1795936457 -u). */
        int64_t t = INT64_C(1795936457500000000);
        assert_int_equal(time_hour_start(t), INT64_C(1795935600000000000));
        assert_int_equal(time_day_start(t), INT64_C(1795910400000000000));
        assert_int_equal(time_hour_start(-1), -NS_PER_HOUR);
        assert_int_equal(time_hour_start(0), 0);
}

static void formats(void **state)
{
        char buf[40];
        time_format(buf, sizeof(buf), INT64_C(1795936457000000123));
        assert_string_equal(buf, "2026-11-29T07:14:17.000000123Z");
}

/* The three clocks of one instant: each within the reads made around it, and
 * the wall clock's distance from the boot clock the same over many calls (to
 * 1 ms: a try more than 20 us apart is read again). */
static void now3(void **state)
{
        int64_t first_offset = 0;
        for (int i = 0; i < 5000; i++) {
                int64_t w0 = time_wall_ns(), b0 = time_boot_ns(), w, m, b;
                time_now3(&w, &m, &b);
                int64_t w1 = time_wall_ns(), b1 = time_boot_ns();
                assert_true(w0 <= w && w <= w1);
                assert_true(b0 <= b && b <= b1);
                assert_true(m > 0);
                if (i == 0)
                        first_offset = w - b;
                int64_t drift = (w - b) - first_offset;
                assert_true(drift < NS_PER_MS && drift > -NS_PER_MS);
        }
        time_now3(NULL, NULL, NULL);
}

int main(void)
{
        const struct CMUnitTest tests[] = { cmocka_unit_test(floors), cmocka_unit_test(formats), cmocka_unit_test(now3) };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
