/* Integration: every tally binary answers --help, and a configuration error
 * stops it at start-up with exit status 2 and a message naming the setting. */
#include "support.h"

#include <stdlib.h>
#include <string.h>

static void expect_refusal(char *const argv[], const char *needle)
{
        char *err = NULL;
        int rc = test_run(argv, NULL, &err);
        CHECK(rc == 2, "%s %s: exit %d, wanted 2", argv[0], argv[1] ? argv[1] : "", rc);
        CHECK(strstr(err, needle) != NULL, "%s: message \"%s\" lacks \"%s\"", argv[0], err, needle);
        free(err);
}

int main(void)
{
        /* TALLY_BINARIES: every executable the build installs, separated by ':'. */
        char *list = strdup(test_env("TALLY_BINARIES"));
        int count = 0;
        for (char *save = NULL, *bin = strtok_r(list, ":", &save); bin; bin = strtok_r(NULL, ":", &save)) {
                char *out = NULL;
                char *argv[] = { bin, "--help", NULL };
                int rc = test_run(argv, &out, NULL);
                CHECK(rc == 0, "%s --help exited %d", bin, rc);
                CHECK(strstr(out, "Usage: ") != NULL && strstr(out, "--log-level") != NULL,
                      "%s --help does not describe its options: %s", bin, out);
                free(out);
                char *bad[] = { bin, "--no-such-setting=1", NULL };
                expect_refusal(bad, "unknown option \"--no-such-setting\"");
                count++;
        }
        CHECK(count >= 2, "only %d binaries listed", count);
        free(list);

        const char *migrate = test_env("TALLY_MIGRATE_BIN");
        const char *broker = test_env("TALLY_BROKER_BIN");
        unsetenv("TALLY_DATABASE_URL");
        char *missing[] = { (char *)migrate, NULL };
        expect_refusal(missing, "missing required setting database_url");
        /* tally-admin without a database: the setting named once, as each place spells it */
        const char *admin_bin = strstr(test_env("TALLY_BINARIES"), "/tally-admin");
        CHECK(admin_bin != NULL, "tally-admin is not among TALLY_BINARIES");
        if (admin_bin) {
                const char *all = test_env("TALLY_BINARIES"), *b = admin_bin;
                while (b > all && b[-1] != ':')
                        b--;
                char *path = strndup(b, (size_t)(admin_bin - b) + strlen("/tally-admin"));
                char *argv[] = { path, "invoice", NULL }, *err = NULL;
                int rc = test_run(argv, NULL, &err);
                int names = 0;
                for (const char *p = err; p && (p = strstr(p, "database_url")); p++)
                        names++;
                CHECK(rc == 2 && names == 1 && strstr(err, "TALLY_DATABASE_URL") && strstr(err, "--database-url"),
                      "tally-admin without a database: exit %d, \"%s\" (want database_url named once, "
                      "TALLY_DATABASE_URL and --database-url)", rc, err ? err : "");
                free(err);
                free(path);
        }
        char *bad_number[] = { (char *)broker, "--port=90x", NULL };
        expect_refusal(bad_number, "invalid value for port from --port: \"90x\" is not an integer");
        char *out_of_range[] = { (char *)broker, "--partitions", "0", NULL };
        expect_refusal(out_of_range, "invalid value for partitions from --partitions: 0 is outside 1..1024");
        setenv("TALLY_LOG_LEVEL", "loud", 1);
        char *bad_level[] = { (char *)broker, NULL };
        expect_refusal(bad_level, "invalid value for log_level");
        unsetenv("TALLY_LOG_LEVEL");
        return test_result();
}
