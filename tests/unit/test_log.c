/* Unit tests of common/log.c: values substituted into key=value lines are
 * escaped, so a value (a label key, an error text) cannot add fields or lines. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *fields(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *fields(const char *fmt, ...)
{
        static char buf[512];
        va_list ap;
        va_start(ap, fmt);
        log_format_fields(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        return buf;
}

/* The line log_event writes, captured (malloc'd). */
static char *line_of(const char *key)
{
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        log_set_stream(f);
        log_info("label seen", "label=%s sandbox=%s", key, "sb1");
        log_set_stream(NULL);
        fclose(f);
        return text;
}

/* Counts the top-level key=value fields of a line by a simple reader of the
 * format: bare tokens split at spaces, quoted values end at an unescaped quote. */
static int count_fields(const char *line, const char *want_key, const char **ret_value)
{
        int n = 0;
        const char *p = line;
        while (*p && *p != '\n') {
                while (*p == ' ')
                        p++;
                const char *key = p;
                while (*p && *p != '=' && *p != ' ' && *p != '\n')
                        p++;
                if (*p != '=')
                        return -1; /* a token that is not key=value */
                size_t klen = (size_t)(p - key);
                p++;
                const char *value = p;
                if (*p == '"') {
                        for (p++; *p && *p != '"'; p++)
                                if (*p == '\\' && p[1])
                                        p++;
                        if (*p != '"')
                                return -1;
                        p++;
                } else {
                        while (*p && *p != ' ' && *p != '\n')
                                p++;
                }
                if (want_key && strlen(want_key) == klen && strncmp(key, want_key, klen) == 0)
                        *ret_value = value;
                n++;
        }
        return n;
}

static void bare_values_pass(void **state)
{
        assert_string_equal(fields("sandbox=%s n=%d big=%llu", "sb-1_a.b:c", -3, 18446744073709551615ULL),
                            "sandbox=sb-1_a.b:c n=-3 big=18446744073709551615");
        assert_string_equal(fields("a=%zu b=%ld c=%u d=%.2s%%", (size_t)7, 8L, 9u, "xyz"), "a=7 b=8 c=9 d=xy%");
        assert_string_equal(fields("w=%*d p=%.*s", 4, 42, 2, "abcdef"), "w=  42 p=ab");
}

static void injections_are_quoted(void **state)
{
        assert_string_equal(fields("label=%s", "a b"), "label=\"a b\"");
        assert_string_equal(fields("label=%s", "x admin=true"), "label=\"x admin=true\"");
        assert_string_equal(fields("label=%s", "k=v"), "label=\"k=v\"");
        assert_string_equal(fields("label=%s", ""), "label=\"\"");
        assert_string_equal(fields("label=%s", "line\nts=forged level=error"),
                            "label=\"line\\nts=forged level=error\"");
        assert_string_equal(fields("label=%s", "cr\r tab\t bell\a del\x7f"),
                            "label=\"cr\\r tab\\t bell\\x07 del\\x7f\"");
        assert_string_equal(fields("label=%s", "q\"x\\"), "label=\"q\\\"x\\\\\"");
        /* Inside the format's own quotes: escaped, not quoted twice. */
        assert_string_equal(fields("error=\"%s\" next=%d", "bad \" injected=\"1", 5),
                            "error=\"bad \\\" injected=\\\"1\" next=5");
        /* A value log_quote made stays as it is; a fake one is quoted again. */
        char q[64];
        assert_string_equal(fields("error=%s", log_quote(q, sizeof(q), "no \"such\" file")),
                            "error=\"no \\\"such\\\" file\"");
        assert_string_equal(fields("error=%s", "\"x\" forged=\"y\""), "error=\"\\\"x\\\" forged=\\\"y\\\"\"");
        assert_string_equal(fields("error=%s", "\"ends with backslash\\\""), "error=\"\\\"ends with backslash\\\\\\\"\"");
}

static void a_line_stays_one_line(void **state)
{
        const char *evil[] = { "k\" forged=\"1", "k\nts=x level=error msg=\"forged\"", "k forged=1", "a=b",
                               "\x1b[31mred", "\\", "\"" };
        for (size_t i = 0; i < sizeof(evil) / sizeof(evil[0]); i++) {
                char *line = line_of(evil[i]);
                size_t len = strlen(line);
                assert_true(len > 0 && line[len - 1] == '\n');
                assert_null(memchr(line, '\n', len - 1)); /* one line */
                const char *value = NULL;
                /* ts level component msg label sandbox: six fields, no more. */
                assert_int_equal(count_fields(line, "sandbox", &value), 6);
                assert_non_null(value);
                assert_memory_equal(value, "sb1\n", 4);
                free(line);
        }
}

static void quote_escapes_controls(void **state)
{
        char q[64];
        assert_string_equal(log_quote(q, sizeof(q), "a\"b\\c\nd\te\x01"), "\"a\\\"b\\\\c\\nd\\te\\x01\"");
        /* Cut short, still closed and never in the middle of an escape. */
        assert_string_equal(log_quote(q, 6, "\"\"\"\""), "\"\\\"\"");
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(bare_values_pass),
                cmocka_unit_test(injections_are_quoted),
                cmocka_unit_test(a_line_stays_one_line),
                cmocka_unit_test(quote_escapes_controls),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
