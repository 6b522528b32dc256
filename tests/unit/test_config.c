/* Unit tests of common/config.c: every source, and every refusal names what it refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cfg {
        char *database_url;
        int64_t tick_ms;
        bool verbose;
        char *name;
};

static const struct setting table[] = {
        SETTING_DATABASE_URL(struct cfg, database_url),
        { "tick_ms", SETTING_INT, "1000", false, offsetof(struct cfg, tick_ms), 1, 60000, "tick" },
        { "verbose", SETTING_BOOL, "false", false, offsetof(struct cfg, verbose), 0, 0, "verbose" },
        { "name", SETTING_STRING, "host", false, offsetof(struct cfg, name), 0, 0, "name" },
        SETTINGS_END,
};

static const struct program_info prog = { "tally-test", "a test", "[options]", NULL };

static int load(struct cfg *c, char *err, int argc, char **argv)
{
        memset(c, 0, sizeof(*c));
        return config_load(&prog, table, c, argc, argv, NULL, err, 256);
}

static char *write_tmp(const char *text)
{
        static char path[64];
        snprintf(path, sizeof(path), "/tmp/tally-config-test.XXXXXX");
        int fd = mkstemp(path);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
        close(fd);
        return path;
}

static void defaults_and_flags(void **state)
{
        struct cfg c;
        char err[256] = "";
        char *argv[] = { "x", "--database-url=postgresql://a", "--tick-ms", "250", "--verbose", "cmd", "--name=zz", NULL };
        int argi = 0;
        memset(&c, 0, sizeof(c));
        assert_int_equal(config_load(&prog, table, &c, 7, argv, &argi, err, sizeof(err)), CONFIG_OK);
        assert_string_equal(c.database_url, "postgresql://a");
        assert_int_equal(c.tick_ms, 250);
        assert_true(c.verbose);
        assert_string_equal(c.name, "host"); /* after the command: not a flag */
        assert_int_equal(argi, 5);
        config_free(table, &c);
        assert_null(c.database_url);
}

static void precedence_file_env_flag(void **state)
{
        char *path = write_tmp("# comment\ndatabase_url = postgresql://file\ntick_ms = 10\n[other-program]\nbogus = 1\n"
                               "[tally-test]\nname = fromfile\n");
        char arg[128];
        snprintf(arg, sizeof(arg), "--config=%s", path);
        setenv("TALLY_TICK_MS", "20", 1);
        char *argv[] = { "x", arg, NULL };
        struct cfg c;
        char err[256] = "";
        assert_int_equal(load(&c, err, 2, argv), CONFIG_OK);
        assert_string_equal(c.database_url, "postgresql://file");
        assert_int_equal(c.tick_ms, 20); /* environment beats the file */
        assert_string_equal(c.name, "fromfile");
        config_free(table, &c);

        char *argv2[] = { "x", arg, "--tick-ms=30", NULL };
        assert_int_equal(load(&c, err, 3, argv2), CONFIG_OK);
        assert_int_equal(c.tick_ms, 30); /* a flag beats the environment */
        config_free(table, &c);
        unsetenv("TALLY_TICK_MS");
        unlink(path);
}

static void unknown_key_in_file_is_refused(void **state)
{
        char *path = write_tmp("database_url = x\n\ntick_msec = 5\n");
        char arg[128];
        snprintf(arg, sizeof(arg), "--config=%s", path);
        char *argv[] = { "x", arg, NULL };
        struct cfg c;
        char err[256] = "";
        assert_true(load(&c, err, 2, argv) < 0);
        assert_non_null(strstr(err, "unknown setting \"tick_msec\""));
        assert_non_null(strstr(err, "line 3"));
        config_free(table, &c);
        unlink(path);
}

static void unknown_flag_is_refused(void **state)
{
        char *argv[] = { "x", "--database-url=a", "--tick=5", NULL };
        struct cfg c;
        char err[256] = "";
        assert_true(load(&c, err, 3, argv) < 0);
        assert_string_equal(err, "unknown option \"--tick\" (try --help)");
        config_free(table, &c);
}

static void bad_number_is_refused(void **state)
{
        struct cfg c;
        char err[256] = "";
        char *argv[] = { "x", "--database-url=a", "--tick-ms=12x", NULL };
        assert_true(load(&c, err, 3, argv) < 0);
        assert_string_equal(err, "invalid value for tick_ms from --tick-ms: \"12x\" is not an integer");
        config_free(table, &c);

        char *argv2[] = { "x", "--database-url=a", "--tick-ms=0", NULL };
        assert_true(load(&c, err, 3, argv2) < 0);
        assert_string_equal(err, "invalid value for tick_ms from --tick-ms: 0 is outside 1..60000");
        config_free(table, &c);

        setenv("TALLY_VERBOSE", "perhaps", 1);
        char *argv3[] = { "x", "--database-url=a", NULL };
        assert_true(load(&c, err, 2, argv3) < 0);
        assert_non_null(strstr(err, "verbose from TALLY_VERBOSE: \"perhaps\" is not a boolean"));
        unsetenv("TALLY_VERBOSE");
        config_free(table, &c);
}

static void missing_required_is_refused(void **state)
{
        struct cfg c;
        char err[256] = "";
        char *argv[] = { "x", NULL };
        unsetenv("TALLY_DATABASE_URL");
        assert_true(load(&c, err, 1, argv) < 0);
        assert_non_null(strstr(err, "missing required setting database_url"));
        assert_non_null(strstr(err, "TALLY_DATABASE_URL"));
        config_free(table, &c);

        setenv("TALLY_DATABASE_URL", "postgresql://env", 1);
        assert_int_equal(load(&c, err, 1, argv), CONFIG_OK);
        assert_string_equal(c.database_url, "postgresql://env");
        unsetenv("TALLY_DATABASE_URL");
        config_free(table, &c);
}

static void missing_file_is_refused(void **state)
{
        struct cfg c;
        char err[256] = "";
        char *argv[] = { "x", "--config", "/nonexistent/tally.ini", NULL };
        assert_true(load(&c, err, 3, argv) < 0);
        assert_non_null(strstr(err, "could not open config file /nonexistent/tally.ini"));
        config_free(table, &c);
}

static void parsers(void **state)
{
        int64_t v;
        bool b;
        assert_int_equal(config_parse_int("-42", &v), 0);
        assert_int_equal(v, -42);
        assert_true(config_parse_int("", &v) < 0);
        assert_true(config_parse_int(" 1", &v) < 0);
        assert_true(config_parse_int("99999999999999999999", &v) < 0);
        assert_int_equal(config_parse_bool("ON", &b), 0);
        assert_true(b);
        assert_int_equal(config_parse_bool("no", &b), 0);
        assert_false(b);
        assert_true(config_parse_bool("2", &b) < 0);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(defaults_and_flags),
                cmocka_unit_test(precedence_file_env_flag),
                cmocka_unit_test(unknown_key_in_file_is_refused),
                cmocka_unit_test(unknown_flag_is_refused),
                cmocka_unit_test(bad_number_is_refused),
                cmocka_unit_test(missing_required_is_refused),
                cmocka_unit_test(missing_file_is_refused),
                cmocka_unit_test(parsers),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
