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

int main(void)
{
        const struct CMUnitTest tests[] = { cmocka_unit_test(floors), cmocka_unit_test(formats) };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
