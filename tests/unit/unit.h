/* unit.h — what the cmocka programs share: a skip meson can see.
 *
 * cmocka's skip() marks a test skipped, yet the program exits 0 and meson
 * reports it OK: a test that never ran would look like a pass. UNIT_SKIP
 * says why and counts the skip; unit_run() makes a run with skips and no
 * failure exit 77, which meson reports as SKIP (and scripts/test lists every
 * skipped test at the end of its run). */
#pragma once

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static int unit_skipped;

#define UNIT_SKIP(why)                                              \
        do {                                                        \
                unit_skipped++;                                     \
                print_message("skip: %s: %s\n", __func__, why); \
                skip();                                             \
        } while (0)

/* cmocka's count of failed tests, or 77 when none failed and some skipped. */
static inline int unit_status(int failed)
{
        return failed ? failed : unit_skipped ? 77 : 0;
}

#define unit_run(tests) unit_status(cmocka_run_group_tests(tests, NULL, NULL))
