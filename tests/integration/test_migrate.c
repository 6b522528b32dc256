/* Integration: tally-migrate against a real PostgreSQL. Applying twice changes
 * nothing; a database newer than the code is refused; a failing migration
 * leaves nothing of itself behind; every program that touches the database
 * refuses one a migration behind the sql/ it was built with. */
#include "support.h"
#include "tally_build.h"

#include <dirent.h>
#include <errno.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>


static char *query1(const char *url, const char *sql)
{
        PGconn *c = PQconnectdb(url);
        PGresult *r = PQexec(c, sql);
        char *v = NULL;
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
                v = strdup(PQgetvalue(r, 0, 0));
        else
                fprintf(stderr, "query failed: %s: %s\n", sql, PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
        return v ? v : strdup("<error>");
}

/* A fingerprint of the schema and the data that migrations write. */
static char *fingerprint(const char *url)
{
        return query1(url,
                      "SELECT md5(string_agg(table_name || '.' || column_name || ':' || data_type, ',' "
                      "ORDER BY table_name, column_name)) || '/' || "
                      "(SELECT count(*) FROM schema_migrations) || '/' || "
                      "(SELECT string_agg(plan_id || meter || nanodollars_per_unit, ',' ORDER BY meter) FROM plan_rates)"
                      " FROM information_schema.columns WHERE table_schema = 'public'");
}

static int migrate(const char *url, const char *dir, char **err)
{
        char *argv[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", (char *)url,
                         dir ? "--sql-dir" : NULL, (char *)dir, NULL };
        return test_run(argv, NULL, err);
}

/* The path of tally program `name` among TALLY_BINARIES (malloc'd). */
static char *binary(const char *name)
{
        char *list = strdup(test_env("TALLY_BINARIES")), *save = NULL, *found = NULL;
        for (char *p = strtok_r(list, ":", &save); p && !found; p = strtok_r(NULL, ":", &save)) {
                const char *base = strrchr(p, '/');
                if (strcmp(base ? base + 1 : p, name) == 0)
                        found = strdup(p);
        }
        free(list);
        if (!found) {
                fprintf(stderr, "FAIL: %s is not among TALLY_BINARIES\n", name);
                exit(1);
        }
        return found;
}

/* Every program that touches the database, against one a migration behind the
 * newest in sql/: each exits non-zero at start, saying which migration the
 * database is at and which it was built for. */
static void check_one_behind(void)
{
        /* The newest migration, read from sql/'s file names here. */
        DIR *d = opendir(TALLY_SOURCE_SQL_DIR);
        CHECK(d, "cannot list %s", TALLY_SOURCE_SQL_DIR);
        if (!d)
                return;
        int newest = 0;
        for (struct dirent *e; (e = readdir(d));) {
                int v, n = 0;
                if (sscanf(e->d_name, "%3d_%*[^.].sql%n", &v, &n) == 1 && n > 0 && v > newest)
                        newest = v;
        }
        /* sql/ without the newest migration: a database one behind. */
        char *dir = test_tmpdir("sql-behind");
        rewinddir(d);
        for (struct dirent *e; (e = readdir(d));) {
                int v, n = 0;
                if (sscanf(e->d_name, "%3d_%*[^.].sql%n", &v, &n) != 1 || n == 0 || v == newest)
                        continue;
                char from[1024], to[1024];
                snprintf(from, sizeof(from), "%s/%s", TALLY_SOURCE_SQL_DIR, e->d_name);
                snprintf(to, sizeof(to), "%s/%s", dir, e->d_name);
                CHECK(symlink(from, to) == 0, "symlink %s: %s", to, strerror(errno));
        }
        closedir(d);
        char *url = test_db_create("migrate_behind");
        char *err = NULL;
        CHECK(migrate(url, dir, &err) == 0, "migrating to one behind failed: %s", err);
        free(err);
        char *at = query1(url, "SELECT max(version)::text FROM schema_migrations");
        char want_at[16];
        snprintf(want_at, sizeof(want_at), "%d", newest - 1);
        CHECK(strcmp(at, want_at) == 0, "the database is at %s, not %s", at, want_at);
        free(at);

        char want[128];
        snprintf(want, sizeof(want), "database schema is at migration %d, this tally was built for %d: run tally-migrate",
                 newest - 1, newest);
        struct {
                const char *name;
                char *extra[6];
        } progs[] = {
                { "tally-aggregator", { "--kafka-brokers", "127.0.0.1:1", "--metrics-port", "0", NULL } },
                { "tally-notifier", { "--metrics-port", "0", NULL } },
                { "tally-api", { "--port", "0", "--listen-address", "127.0.0.1", NULL } },
                { "tally-admin", { "account", "create", "a-behind", NULL } },
        };
        /* All at once, each given 30 s: one that starts instead of refusing is killed then. */
        enum { N = sizeof(progs) / sizeof(progs[0]) };
        pid_t pids[N];
        int rcs[N];
        char err_paths[N][1024];
        for (size_t i = 0; i < N; i++) {
                char *bin = binary(progs[i].name);
                char *argv[12] = { bin, "--database-url", url };
                int k = 3;
                for (int j = 0; progs[i].extra[j]; j++)
                        argv[k++] = progs[i].extra[j];
                argv[k] = NULL;
                snprintf(err_paths[i], sizeof(err_paths[i]), "%s/%s.err", dir, progs[i].name);
                pids[i] = test_spawn(argv, NULL, err_paths[i]);
                rcs[i] = -1;
                free(bin);
        }
        for (int t = 0, left = N; t < 300 && left > 0; t++) {
                for (size_t i = 0; i < N; i++) {
                        int st;
                        if (rcs[i] == -1 && waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                                rcs[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                                left--;
                        }
                }
                nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
        }
        for (size_t i = 0; i < N; i++) {
                if (rcs[i] == -1) {
                        kill(pids[i], SIGKILL);
                        waitpid(pids[i], NULL, 0);
                }
                char *out = test_read_file(err_paths[i]);
                CHECK(rcs[i] > 0, "%s against a database one migration behind: %s (stderr: %s)", progs[i].name,
                      rcs[i] < 0 ? "still running after 30 s" : "exit 0", out ? out : "");
                CHECK(out && strstr(out, want), "%s did not say \"%s\": %s", progs[i].name, want, out ? out : "");
                free(out);
        }
        test_db_drop(url);
        free(dir);
}

int main(void)
{
        char *url = test_db_create("migrate");
        char *err = NULL;

        CHECK(migrate(url, NULL, &err) == 0, "first apply failed: %s", err);
        free(err);
        char *one = fingerprint(url);
        CHECK(strstr(one, "/0/") == NULL, "expected the source tree's migrations recorded, got %s", one);
        CHECK(strstr(one, "default" "cpu" "25000000") != NULL, "default plan missing: %s", one);

        /* One rounding of the exact quotient (sql/006), figures worked by hand.
         * 3,600,000,000,001,799,999,999,999 rated CPU-ns x nd / 3.6e12 is
         * 1,000,000,000,000.4999999999997222...: one rounding gives
         * 1,000,000,000,000; numeric's round(a / b) cuts the quotient to 16
         * digits (…000.5000) first and gives …001 — the control shows the case
         * really is one where rounding twice goes wrong. */
        char *twice = query1(url, "SELECT round(3600000000001799999999999::numeric / 3600000000000)");
        CHECK(strcmp(twice, "1000000000001") == 0, "control: round(a / b) gave %s", twice);
        free(twice);
        static const struct {
                const char *sql, *want;
        } exact[] = {
                { "SELECT tally_round_div(3600000000001799999999999, 3600000000000)", "1000000000000" },
                { "SELECT tally_round_div(3600000000001800000000000, 3600000000000)", "1000000000001" },
                { "SELECT tally_round_div(5, 2)", "3" },
                { "SELECT tally_round_div(-5, 2)", "-3" },
                { "SELECT tally_round_div(5, -2)", "-3" },
                { "SELECT tally_round_div(7, 3)", "2" },
                { "SELECT tally_round_div(0, 3)", "0" },
                /* A key's day: 7,200 CPU-s at $0.025 per vCPU-hour ($0.05) and 4 GiB-hours at
                 * $0.0075 ($0.03) is 80,000,000 nd; the second key's CPU alone is the case above. */
                { "WITH i AS (INSERT INTO spend_daily (key_id, day, account_id, cpu_rated, memory_rated) VALUES "
                  "('k-round-1', '2026-01-01', 'a-round', 7200000000000 * 25000000::numeric,"
                  " 4::numeric * 1073741824 * 3600000000000 * 7500000), "
                  "('k-round-2', '2026-01-01', 'a-round', 3600000000001799999999999, 0) RETURNING 1)"
                  " SELECT count(*)::text FROM i", "2" },
                { "SELECT string_agg(nanodollars::text, ',' ORDER BY key_id) FROM spend_daily "
                  "WHERE account_id = 'a-round'", "80000000,1000000000000" },
        };
        for (size_t i = 0; i < sizeof(exact) / sizeof(exact[0]); i++) {
                char *got = query1(url, exact[i].sql);
                CHECK(strcmp(got, exact[i].want) == 0, "%s: got %s, want %s", exact[i].sql, got, exact[i].want);
                free(got);
        }
        /* Ids (sql/024: the check without a counted repetition): one to 64
         * characters of [A-Za-z0-9_.:-], nothing else — in the table every
         * created event inserts into and in one the API does. The lengths of
         * the ids each table took. */
        char *ids = query1(url,
                           "CREATE FUNCTION pg_temp.ids_taken(t text) RETURNS text LANGUAGE plpgsql AS $$"
                           " DECLARE i text; taken text := '';"
                           " BEGIN"
                           "  FOREACH i IN ARRAY ARRAY[repeat('a', 64), repeat('a', 65), '', 'a b', U&'\\00e9',"
                           "                           E'ab\\n', E'\\nab', 'Az09_.:-'] LOOP"
                           "   BEGIN"
                           "    IF t = 'sandboxes' THEN"
                           "     INSERT INTO sandboxes (id, account_id, key_id, vcpus, mem_size_bytes, state)"
                           "     VALUES (i, 'a-ids', 'k-ids', 1, 0, 'running');"
                           "    ELSE"
                           "     INSERT INTO accounts (id, name) VALUES (i, 'ids');"
                           "    END IF;"
                           "    taken := taken || length(i) || ' ';"
                           "    RAISE EXCEPTION 'taken: undone';"
                           "   EXCEPTION WHEN check_violation OR raise_exception THEN NULL;"
                           "   END;"
                           "  END LOOP;"
                           "  RETURN taken;"
                           " END $$;"
                           " SELECT pg_temp.ids_taken('sandboxes') || '/' || pg_temp.ids_taken('accounts')");
        CHECK(strcmp(ids, "64 8 /64 8 ") == 0, "ids taken (lengths), sandboxes/accounts: %s, want \"64 8 /64 8 \"", ids);
        free(ids);
        PGconn *clean = PQconnectdb(url);
        PQclear(PQexec(clean, "DELETE FROM spend_daily WHERE account_id = 'a-round'"));
        PQfinish(clean);

        CHECK(migrate(url, NULL, &err) == 0, "second apply failed: %s", err);
        CHECK(strstr(err, "applied=0") != NULL, "second apply should apply nothing: %s", err);
        free(err);
        char *two = fingerprint(url);
        CHECK(strcmp(one, two) == 0, "applying twice changed the database: %s vs %s", one, two);

        /* A database that has a migration this code lacks. */
        PGconn *c = PQconnectdb(url);
        PQclear(PQexec(c, "INSERT INTO schema_migrations (version, name) VALUES (999, '999_future.sql')"));
        PQfinish(c);
        int rc = migrate(url, NULL, &err);
        CHECK(rc != 0, "a newer database was accepted");
        CHECK(strstr(err, "newer than the newest this tally has") != NULL, "unclear refusal: %s", err);
        free(err);

        /* A failing migration applies nothing of itself. */
        char *dir = test_tmpdir("sql");
        char path[512];
        snprintf(path, sizeof(path), "%s/001_a.sql", dir);
        FILE *f = fopen(path, "w");
        fputs("CREATE TABLE a (x int);", f);
        fclose(f);
        snprintf(path, sizeof(path), "%s/002_b.sql", dir);
        f = fopen(path, "w");
        fputs("CREATE TABLE b (x int); SELECT no_such_function();", f);
        fclose(f);
        char *url2 = test_db_create("migrate_fail");
        rc = migrate(url2, dir, &err);
        CHECK(rc != 0, "a failing migration was reported as success");
        CHECK(strstr(err, "002_b.sql failed, nothing of it applied") != NULL, "unclear failure: %s", err);
        free(err);
        char *tables = query1(url2, "SELECT string_agg(table_name, ',' ORDER BY table_name) FROM "
                                    "information_schema.tables WHERE table_schema = 'public'");
        CHECK(strcmp(tables, "a,schema_migrations") == 0, "partial migration left behind: %s", tables);

        /* A badly named file is refused before anything runs. */
        snprintf(path, sizeof(path), "%s/3_c.sql", dir);
        f = fopen(path, "w");
        fputs("SELECT 1;", f);
        fclose(f);
        rc = migrate(url2, dir, &err);
        CHECK(rc != 0 && strstr(err, "3_c.sql is not named NNN_name.sql"), "bad name not refused: %s", err);
        free(err);

        check_one_behind();

        free(one);
        free(two);
        free(tables);
        free(dir);
        test_db_drop(url);
        test_db_drop(url2);
        return test_result();
}
