/* tally-migrate — applies the schema migrations in sql/ to the database. */
#include "config.h"
#include "db.h"
#include "log.h"
#include "migrate.h"
#include "tally_build.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct migrate_config {
        char *database_url;
        char *sql_dir;
        char *log_level;
};

static const struct setting settings[] = {
        SETTING_DATABASE_URL(struct migrate_config, database_url),
        { "sql_dir", SETTING_STRING, "", false, offsetof(struct migrate_config, sql_dir), 0, 0,
          "Folder of NNN_name.sql migrations (default: the source tree's sql/, else the installed one)" },
        SETTING_LOG_LEVEL(struct migrate_config, log_level),
        SETTINGS_END,
};

static const struct program_info program = {
        .name = "tally-migrate",
        .summary = "Apply tally's database migrations, in order, each in one transaction.",
        .usage = "[options] [apply|status]",
        .details = "Commands:\n"
                   "  apply   apply every migration the database lacks (the default); twice is a no-op\n"
                   "  status  print the database's migration number and the newest this tally has\n"
                   "A database newer than this tally's migrations is refused.",
};

int main(int argc, char **argv)
{
        struct migrate_config cfg = { 0 };
        int argi, r = config_main(&program, settings, &cfg, argc, argv, &argi);
        if (r >= 0)
                return r;
        const char *cmd = argi < argc ? argv[argi] : "apply";
        if (strcmp(cmd, "apply") != 0 && strcmp(cmd, "status") != 0) {
                fprintf(stderr, "tally-migrate: unknown command \"%s\" (apply or status)\n", cmd);
                config_free(settings, &cfg);
                return 2;
        }
        const char *dir = cfg.sql_dir;
        if (!dir || !*dir)
                dir = access(TALLY_SOURCE_SQL_DIR, R_OK) == 0 ? TALLY_SOURCE_SQL_DIR : TALLY_INSTALLED_SQL_DIR;

        char err[1024], quoted[1100];
        int status = 1;
        PGconn *conn = db_connect(cfg.database_url, err, sizeof(err));
        if (!conn) {
                log_error("could not connect", "error=%s", log_quote(quoted, sizeof(quoted), err));
                goto out;
        }
        if (strcmp(cmd, "status") == 0) {
                struct migration *list = NULL;
                int n = migrations_list(dir, &list, err, sizeof(err));
                int v = n < 0 ? n : db_schema_version(conn, err, sizeof(err));
                if (v < 0) {
                        log_error("could not read status", "error=%s", log_quote(quoted, sizeof(quoted), err));
                } else {
                        printf("database=%d newest=%d\n", v, n ? list[n - 1].version : 0);
                        status = 0;
                }
                free(list);
                goto out;
        }
        int applied = 0;
        r = migrations_apply(conn, dir, &applied, err, sizeof(err));
        if (r < 0) {
                log_error("migrations refused", "error=%s", log_quote(quoted, sizeof(quoted), err));
                goto out;
        }
        log_info("schema up to date", "applied=%d dir=%s", applied, dir);
        status = 0;
out:
        PQfinish(conn);
        config_free(settings, &cfg);
        return status;
}
