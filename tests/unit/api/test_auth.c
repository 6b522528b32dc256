/* Unit tests of api/auth.c and the id check: key format, hashing, passwords,
 * and the in-memory rate limits (sign-in failures, request budget). */
#include "ratelimit.h"
#include "server.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static void key_format(void **state)
{
        (void)state;
        char a[64], b[64];
        assert_int_equal(api_key_generate(a, sizeof(a)), 0);
        assert_int_equal(api_key_generate(b, sizeof(b)), 0);
        assert_int_equal(strlen(a), 3 + 48); /* 192 bits as hex */
        assert_memory_equal(a, "tk_", 3);
        for (const char *p = a + 3; *p; p++)
                assert_true((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'));
        assert_string_not_equal(a, b);
        assert_int_not_equal(api_key_generate(a, 40), 0); /* too small a buffer is refused */
}

static void sha256_vector(void **state)
{
        (void)state;
        char h[65];
        sha256_hex("abc", 3, h); /* FIPS 180-2, appendix B.1 */
        assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

static void passwords(void **state)
{
        (void)state;
        char *h = NULL;
        assert_int_equal(password_hash("correct horse", &h), 0);
        assert_memory_equal(h, "$y$", 3); /* yescrypt */
        assert_true(password_verify("correct horse", h));
        assert_false(password_verify("correct hors", h));
        assert_false(password_verify("", h));
        assert_false(password_verify("correct horse", NULL));
        char *h2 = NULL;
        assert_int_equal(password_hash("correct horse", &h2), 0);
        assert_string_not_equal(h, h2); /* salted */
        free(h);
        free(h2);
}

static void ids(void **state)
{
        (void)state;
        assert_true(id_valid("sbx-0123:a_b.c"));
        assert_false(id_valid(""));
        assert_false(id_valid("a b"));
        assert_false(id_valid("a/b"));
        assert_false(id_valid("a$"));
        char long_id[70];
        memset(long_id, 'a', 65);
        long_id[65] = '\0';
        assert_false(id_valid(long_id));
        long_id[64] = '\0';
        assert_true(id_valid(long_id));
}

static void request_budget(void **state)
{
        (void)state;
        struct ratelimit *rl;
        assert_int_equal(ratelimit_new(1, 3, &rl), 0);
        int64_t retry = -1;
        for (int i = 0; i < 3; i++)
                assert_true(ratelimit_allow(rl, "key_budget", &retry));
        assert_false(ratelimit_allow(rl, "key_budget", &retry));
        assert_true(retry >= 1 && retry <= 2);
        assert_true(ratelimit_allow(rl, "key_other", &retry)); /* per caller */
        ratelimit_free(rl);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(key_format), cmocka_unit_test(sha256_vector), cmocka_unit_test(passwords),
                cmocka_unit_test(ids),        cmocka_unit_test(request_budget),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
