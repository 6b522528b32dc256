/* Unit tests of vmm/capacity.c: the admission rule against hand-computed
 * capacities (a 1000 MiB, 2-CPU, 10,000 MiB host with explicit ratios). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "capacity.h"

#include <errno.h>
#include <string.h>

#define MiB (UINT64_C(1) << 20)

static struct capacity host(int64_t mem_pct, int64_t vcpu_pct, int64_t disk_pct)
{
        struct capacity_settings s = { .memory_mib = 1000, .vcpus = 2, .disk_mib = 10000,
                                       .memory_overcommit_pct = mem_pct, .vcpu_overcommit_pct = vcpu_pct,
                                       .disk_overcommit_pct = disk_pct };
        struct capacity c;
        char err[256];
        assert_int_equal(capacity_init(&c, &s, "/", err, sizeof(err)), 0);
        return c;
}

/* A sandbox with 90 % of the memory, then copies of it: the first copy is refused. */
static void ninety_percent_then_a_copy(void **state)
{
        (void)state;
        struct capacity c = host(100, 1600, 100);
        assert_int_equal(c.limit.mem_bytes, 1000 * MiB);
        assert_int_equal(c.limit.vcpus, 32);
        struct capacity_use none = { 0 }, big = { 900 * MiB, 1, 1024 * MiB };
        char why[512];
        assert_int_equal(capacity_check(&c, &none, &big, why, sizeof(why)), 0);
        assert_int_equal(capacity_check(&c, &big, &big, why, sizeof(why)), -ENOSPC);
        assert_non_null(strstr(why, "not enough memory (900 MiB asked, 100 MiB left of the 1000 MiB"));
        /* an honest small one still fits: 900 + 100 = 1000 */
        struct capacity_use small = { 100 * MiB, 1, 16 * MiB };
        assert_int_equal(capacity_check(&c, &big, &small, why, sizeof(why)), 0);
}

/* Ratios: 150 % of 1000 MiB is 1500 MiB; 50 % of 2 CPUs is 1 vCPU; disk 10,000 MiB at 100 %. */
static void ratios(void **state)
{
        (void)state;
        struct capacity c = host(150, 50, 100);
        assert_int_equal(c.limit.mem_bytes, 1500 * MiB);
        assert_int_equal(c.limit.vcpus, 1);
        char why[512];
        struct capacity_use used = { 1400 * MiB, 0, 0 }, want = { 100 * MiB, 1, 0 };
        assert_int_equal(capacity_check(&c, &used, &want, why, sizeof(why)), 0);
        want.vcpus = 2;
        assert_int_equal(capacity_check(&c, &used, &want, why, sizeof(why)), -ENOSPC);
        assert_non_null(strstr(why, "not enough vCPUs (2 asked, 1 left of the 1 it may promise: 50 % of 2)"));
        struct capacity_use disk = { 0, 0, 10001 * MiB };
        assert_int_equal(capacity_check(&c, &(struct capacity_use){ 0 }, &disk, why, sizeof(why)), -ENOSPC);
        assert_non_null(strstr(why, "not enough disk (10001 MiB asked, 10000 MiB left"));
}

/* A disk larger than the free space under a folder is refused, whatever the settings. */
static void free_space(void **state)
{
        (void)state;
        char why[512] = "";
        assert_int_equal(capacity_check_free("/", UINT64_C(1) << 62, why, sizeof(why)), -ENOSPC);
        assert_non_null(strstr(why, "MiB disk is more than the"));
        assert_int_equal(capacity_check_free("/", 1, why, sizeof(why)), 0);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(ninety_percent_then_a_copy),
                cmocka_unit_test(ratios),
                cmocka_unit_test(free_space),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
