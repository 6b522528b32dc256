/* migrate.c — see migrate.h. Logs one line per applied migration. */
#include "migrate.h"
#include "db.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int by_version(const void *a, const void *b)
{
        const struct migration *x = a, *y = b;
        return (x->version > y->version) - (x->version < y->version);
}

int migrations_list(const char *dir, struct migration **ret, char *err, size_t errlen)
{
        DIR *d = opendir(dir);
        if (!d) {
                int e = errno;
                snprintf(err, errlen, "could not open migrations folder %s: %s", dir, strerror(e));
                return -e;
        }
        struct migration *list = NULL;
        size_t n = 0, cap = 0;
        int r = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                size_t len = strlen(de->d_name);
                if (len < 4 || strcmp(de->d_name + len - 4, ".sql") != 0)
                        continue;
                char *end;
                long v = strtol(de->d_name, &end, 10);
                if (end - de->d_name != 3 || *end != '_' || v <= 0 || len >= MIGRATION_NAME_MAX) {
                        snprintf(err, errlen, "migration file %s is not named NNN_name.sql", de->d_name);
                        r = -EINVAL;
                        goto fail;
                }
                if (n == cap) {
                        cap = cap ? cap * 2 : 16;
                        struct migration *m = realloc(list, cap * sizeof(*m));
                        if (!m) {
                                r = -ENOMEM;
                                goto fail;
                        }
                        list = m;
                }
                list[n].version = (int)v;
                memcpy(list[n].name, de->d_name, len + 1);
                n++;
        }
        qsort(list, n, sizeof(*list), by_version);
        for (size_t i = 1; i < n; i++)
                if (list[i].version == list[i - 1].version) {
                        snprintf(err, errlen, "two migrations share number %03d: %s and %s", list[i].version,
                                 list[i - 1].name, list[i].name);
                        r = -EINVAL;
                        goto fail;
                }
        closedir(d);
        *ret = list;
        return (int)n;
fail:
        closedir(d);
        free(list);
        return r;
}

static char *read_file(const char *path)
{
        FILE *f = fopen(path, "re");
        if (!f)
                return NULL;
        char *buf = NULL;
        size_t size = 0;
        FILE *mem = open_memstream(&buf, &size);
        char chunk[8192];
        size_t got;
        while (mem && (got = fread(chunk, 1, sizeof(chunk), f)) > 0)
                fwrite(chunk, 1, got, mem);
        bool bad = ferror(f) || !mem;
        fclose(f);
        if (mem)
                fclose(mem);
        if (bad) {
                free(buf);
                return NULL;
        }
        return buf;
}

/* Runs one migration and records it, in one transaction. */
static int apply_one(PGconn *conn, const char *dir, const struct migration *m, char *err, size_t errlen)
{
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, m->name);
        char *sql = read_file(path);
        if (!sql) {
                int e = errno ? errno : EIO;
                snprintf(err, errlen, "could not read %s: %s", path, strerror(e));
                return -e;
        }
        char detail[1024];
        int r = db_exec(conn, "BEGIN", detail, sizeof(detail));
        if (r == 0)
                r = db_exec(conn, sql, detail, sizeof(detail));
        free(sql);
        if (r == 0) {
                char version[16];
                snprintf(version, sizeof(version), "%d", m->version);
                const char *params[] = { version, m->name };
                PGresult *res = PQexecParams(conn,
                                             "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                                             2, NULL, params, NULL, NULL, 0);
                if (PQresultStatus(res) != PGRES_COMMAND_OK) {
                        snprintf(detail, sizeof(detail), "%s", PQerrorMessage(conn));
                        r = -EIO;
                }
                PQclear(res);
        }
        if (r == 0)
                r = db_exec(conn, "COMMIT", detail, sizeof(detail));
        if (r < 0) {
                db_exec(conn, "ROLLBACK", NULL, 0);
                snprintf(err, errlen, "migration %s failed, nothing of it applied: %s", m->name, detail);
                return r;
        }
        log_info("migration applied", "version=%d file=%s", m->version, m->name);
        return 0;
}

int migrations_apply(PGconn *conn, const char *dir, int *ret_applied, char *err, size_t errlen)
{
        struct migration *list = NULL;
        int n = migrations_list(dir, &list, err, errlen);
        if (n < 0)
                return n;
        int applied = 0, r;
        char detail[1024];
        /* One migrator at a time; the lock ends with the session or the unlock below. */
        r = db_exec(conn,
                    "SELECT pg_advisory_lock(8271432001);"
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version integer PRIMARY KEY,"
                    " name text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())",
                    detail, sizeof(detail));
        if (r < 0) {
                snprintf(err, errlen, "could not prepare schema_migrations: %s", detail);
                goto out;
        }
        int known = n ? list[n - 1].version : 0;
        int current = db_schema_version(conn, detail, sizeof(detail));
        if (current < 0) {
                snprintf(err, errlen, "%s", detail);
                r = current;
                goto out;
        }
        if (current > known) {
                snprintf(err, errlen,
                         "database schema is at migration %d, newer than the newest this tally has (%d in %s): "
                         "refusing to touch it; run a tally at least as new as the database",
                         current, known, dir);
                r = -EPROTO;
                goto out;
        }
        for (int i = 0; i < n; i++) {
                char version[16];
                snprintf(version, sizeof(version), "%d", list[i].version);
                const char *params[] = { version };
                PGresult *res = PQexecParams(conn, "SELECT 1 FROM schema_migrations WHERE version = $1", 1,
                                             NULL, params, NULL, NULL, 0);
                if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                        snprintf(err, errlen, "could not read schema_migrations: %s", PQerrorMessage(conn));
                        PQclear(res);
                        r = -EIO;
                        goto out;
                }
                int have = PQntuples(res);
                PQclear(res);
                if (have)
                        continue;
                if ((r = apply_one(conn, dir, &list[i], err, errlen)) < 0)
                        goto out;
                applied++;
        }
        r = 0;
        if (ret_applied)
                *ret_applied = applied;
out:
        db_exec(conn, "SELECT pg_advisory_unlock(8271432001)", NULL, 0);
        free(list);
        return r;
}
