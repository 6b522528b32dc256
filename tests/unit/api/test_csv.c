/* CSV cells against OWASP's CSV injection rule: a cell starting with = + - @,
 * tab or CR is written quoted behind a ' (shown as text by a spreadsheet);
 * a plain number, negative ones included, is written as it is. Expected
 * text written out by hand. */
#include "csv.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

static void one(const char *cell, const char *want)
{
        struct csv c = { 0 };
        csv_field(&c, cell);
        size_t len;
        char *text = csv_take(&c, &len);
        assert_non_null(text);
        assert_string_equal(text, want);
        free(text);
}

static void formulas(void **state)
{
        (void)state;
        one("=HYPERLINK(\"http://x\",\"y\")", "\"'=HYPERLINK(\"\"http://x\"\",\"\"y\"\")\"");
        one("+cmd|' /C calc'!A0", "\"'+cmd|' /C calc'!A0\"");
        one("-2+3", "\"'-2+3\"");
        one("@SUM(A1:A2)", "\"'@SUM(A1:A2)\"");
        one("\tx", "\"'\tx\"");
        one("\r=1", "\"'\r=1\"");
        one("-", "\"'-\"");
        one("-1e3", "\"'-1e3\"");
}

static void plain(void **state)
{
        (void)state;
        one("-12", "-12");
        one("-0.000000278", "-0.000000278");
        one("17.08", "17.08");
        one("agent=1", "agent=1"); /* = not first */
        one("a,b", "\"a,b\"");
        one("", "");
}

int main(void)
{
        const struct CMUnitTest tests[] = { cmocka_unit_test(formulas), cmocka_unit_test(plain) };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
