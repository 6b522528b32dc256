/* Unit tests of a batch's usage (aggregator/batch.c): what the fold reports
 * is summed per (sandbox, hour) as it comes, so a batch holds one piece per
 * sandbox-hour it touched, whatever the readings, and forgets them when
 * cleared. Expected sums are worked out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "batch.h"
#include "timeutil.h"

#define H0 (INT64_C(1780000000) * NS_PER_SEC - INT64_C(1780000000) % 3600 * NS_PER_SEC) /* an hour start */

static struct fold_usage use(int64_t hour, uint64_t cpu, uint64_t mem, uint64_t sto, uint64_t peak)
{
        return (struct fold_usage){ .hour_ns = hour, .cpu_ns = cpu, .mem_byte_ns = mem, .storage_byte_ns = sto,
                                    .mem_peak_bytes = peak };
}

static const struct piece *piece_of(const struct batch *b, const struct sandbox *sb, int64_t hour)
{
        const struct piece *found = NULL;
        for (size_t i = 0; i < b->npieces; i++)
                if (b->pieces[i].sb == sb && b->pieces[i].u.hour_ns == hour) {
                        assert_null(found); /* one piece per sandbox-hour */
                        found = &b->pieces[i];
                }
        assert_non_null(found);
        return found;
}

/* Two sandboxes, readings interleaved, one of them across an hour and back
 * to the first hour (a reading placed at the aggregator's clock, say). */
static void test_summed_per_sandbox_hour(void **state)
{
        (void)state;
        struct batch b = { 0 };
        struct sandbox a = { .id = "sb-a" }, z = { .id = "sb-z" };
        const int64_t H1 = H0 + NS_PER_HOUR;
        struct fold_usage in[] = { use(H0, 700, 10, 0, 5), use(H0, 300, 0, 7, 0), use(H1, 50, 1, 0, 9),
                                   use(H0, 1, 2, 3, 4) };
        assert_int_equal(batch_add_piece(&b, &a, &in[0]), 0);
        assert_int_equal(batch_add_piece(&b, &z, &in[1]), 0);
        assert_int_equal(batch_add_piece(&b, &a, &in[2]), 0);
        assert_int_equal(batch_add_piece(&b, &a, &in[3]), 0);
        assert_int_equal(batch_add_piece(&b, &z, &in[0]), 0);
        assert_int_equal(batch_add_piece(&b, &a, &in[1]), 0);
        assert_int_equal(b.npieces, 3); /* (a, H0), (z, H0), (a, H1) */
        const struct piece *p = piece_of(&b, &a, H0);
        assert_int_equal(p->u.cpu_ns, 700 + 1 + 300);
        assert_true(p->u.mem_byte_ns == 10 + 2 && p->u.storage_byte_ns == 3 + 7);
        assert_int_equal(p->u.mem_peak_bytes, 5); /* the highest, not a sum */
        p = piece_of(&b, &z, H0);
        assert_int_equal(p->u.cpu_ns, 300 + 700);
        assert_true(p->u.mem_byte_ns == 10 && p->u.storage_byte_ns == 7);
        assert_int_equal(p->u.mem_peak_bytes, 5);
        p = piece_of(&b, &a, H1);
        assert_int_equal(p->u.cpu_ns, 50);
        assert_int_equal(p->u.mem_peak_bytes, 9);

        /* Cleared, the next batch starts from nothing for the same sandboxes. */
        batch_clear(&b);
        assert_int_equal(b.npieces, 0);
        assert_int_equal(batch_add_piece(&b, &a, &in[2]), 0);
        assert_int_equal(batch_add_piece(&b, &z, &in[2]), 0);
        assert_int_equal(b.npieces, 2);
        assert_int_equal(piece_of(&b, &a, H1)->u.cpu_ns, 50);
        batch_free(&b);
}

/* A sandbox's many readings in one hour (a backlog) stay one piece. */
static void test_many_readings_one_piece(void **state)
{
        (void)state;
        struct batch b = { 0 };
        struct sandbox s[3] = { { .id = "s0" }, { .id = "s1" }, { .id = "s2" } };
        for (int k = 0; k < 100000; k++) {
                struct fold_usage u = use(H0, 7, 1, 0, (uint64_t)k);
                assert_int_equal(batch_add_piece(&b, &s[k % 3], &u), 0);
        }
        assert_int_equal(b.npieces, 3);
        assert_int_equal(piece_of(&b, &s[0], H0)->u.cpu_ns, 7 * 33334);
        assert_int_equal(piece_of(&b, &s[2], H0)->u.cpu_ns, 7 * 33333);
        assert_int_equal(piece_of(&b, &s[1], H0)->u.mem_peak_bytes, 99997);
        batch_free(&b);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_summed_per_sandbox_hour),
                cmocka_unit_test(test_many_readings_one_piece),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
