/* Unit tests of common/money.c. Expected values are worked by hand from the
 * seeds' prices, not by the code under test. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "money.h"

#include <errno.h>
#include <string.h>

static void parse_exact(void **state)
{
        int64_t v;
        assert_int_equal(money_parse("0.025", &v), 0);
        assert_int_equal(v, 25000000);
        assert_int_equal(money_parse("0.0075", &v), 0);
        assert_int_equal(v, 7500000);
        assert_int_equal(money_parse("$17.08", &v), 0);
        assert_int_equal(v, 17080000000);
        assert_int_equal(money_parse("-3", &v), 0);
        assert_int_equal(v, -3000000000);
        assert_int_equal(money_parse("0.000000001", &v), 0);
        assert_int_equal(v, 1);
        assert_int_equal(money_parse("0.0000000001", &v), -EINVAL); /* below a nano-dollar */
        assert_int_equal(money_parse("1.2.3", &v), -EINVAL);
        assert_int_equal(money_parse("", &v), -EINVAL);
        assert_int_equal(money_parse(".", &v), -EINVAL);
        assert_int_equal(money_parse("99999999999", &v), -ERANGE);
}

static void muldiv_rounds_half_away(void **state)
{
        int64_t v;
        assert_int_equal(money_muldiv(5, 1, 2, &v), 0);
        assert_int_equal(v, 3);
        assert_int_equal(money_muldiv(-5, 1, 2, &v), 0);
        assert_int_equal(v, -3);
        assert_int_equal(money_muldiv(4, 1, 3, &v), 0);
        assert_int_equal(v, 1);
        assert_int_equal(money_muldiv(1, 1, 0, &v), -EDOM);
        assert_int_equal(money_muldiv(INT64_MAX, 2, 1, &v), -ERANGE);
        /* 128-bit intermediate: 1 hour of 16 vCPUs in ns times $0.025/h, over ns per hour. */
        int64_t ns = INT64_C(16) * 3600 * 1000000000;
        assert_int_equal(money_muldiv(ns, 25000000, INT64_C(3600) * 1000000000, &v), 0);
        assert_int_equal(v, 400000000); /* $0.40 */
}

static void format_rounds_once(void **state)
{
        char buf[32];
        money_format(buf, sizeof(buf), INT64_C(17083333333), 2);
        assert_string_equal(buf, "17.08");
        money_format(buf, sizeof(buf), INT64_C(2083333333), 2);
        assert_string_equal(buf, "2.08");
        money_format(buf, sizeof(buf), 31250000, 5);
        assert_string_equal(buf, "0.03125");
        money_format(buf, sizeof(buf), 5000000, 2); /* half a cent rounds away from zero */
        assert_string_equal(buf, "0.01");
        money_format(buf, sizeof(buf), -5000000, 2);
        assert_string_equal(buf, "-0.01");
        money_format(buf, sizeof(buf), 1, 9);
        assert_string_equal(buf, "0.000000001");
        money_format(buf, sizeof(buf), 15000000000, 0);
        assert_string_equal(buf, "15");
        assert_int_equal(money_to_cents(4999999), 0);
        assert_int_equal(money_to_cents(5000000), 1);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(parse_exact),
                cmocka_unit_test(muldiv_rounds_half_away),
                cmocka_unit_test(format_rounds_once),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
