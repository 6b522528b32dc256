/* db.c — see db.h. */
#include "db.h"
#include "log.h"
#include "schema_version.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void copy_error(char *err, size_t errlen, const char *what, const char *msg)
{
        if (!err || !errlen)
                return;
        snprintf(err, errlen, "%s: %s", what, msg);
        size_t n = strlen(err);
        while (n && (err[n - 1] == '\n' || err[n - 1] == ' '))
                err[--n] = '\0';
}

PGconn *db_connect(const char *url, char *err, size_t errlen)
{
        PGconn *c = PQconnectdb(url);
        if (!c) {
                copy_error(err, errlen, "could not connect to PostgreSQL", "out of memory");
                return NULL;
        }
        if (PQstatus(c) != CONNECTION_OK) {
                copy_error(err, errlen, "could not connect to PostgreSQL", PQerrorMessage(c));
                PQfinish(c);
                return NULL;
        }
        PQsetErrorVerbosity(c, PQERRORS_DEFAULT);
        return c;
}

int db_exec(PGconn *conn, const char *sql, char *err, size_t errlen)
{
        PGresult *res = PQexec(conn, sql);
        ExecStatusType st = PQresultStatus(res);
        int r = 0;
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
                copy_error(err, errlen, "statement failed", PQerrorMessage(conn));
                r = -EIO;
        }
        PQclear(res);
        return r;
}

bool db_exec_logged(PGconn *conn, const char *sql)
{
        char err[512];
        if (db_exec(conn, sql, err, sizeof(err)) == 0)
                return true;
        log_error("could not run a statement", "sql=\"%s\" error=\"%s\"", sql, err);
        return false;
}

int db_schema_version(PGconn *conn, char *err, size_t errlen)
{
        PGresult *res = PQexec(conn,
                               "SELECT CASE WHEN to_regclass('schema_migrations') IS NULL THEN 0 "
                               "ELSE (SELECT coalesce(max(version), 0) FROM schema_migrations) END");
        int r;
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                copy_error(err, errlen, "could not read the schema version", PQerrorMessage(conn));
                r = -EIO;
        } else {
                r = atoi(PQgetvalue(res, 0, 0));
        }
        PQclear(res);
        return r;
}

int db_check_schema(PGconn *conn, char *err, size_t errlen)
{
        int v = db_schema_version(conn, err, errlen);
        if (v < 0)
                return v;
        if (v > TALLY_SCHEMA_VERSION) {
                snprintf(err, errlen,
                         "database schema is at migration %d, newer than this tally was built for (%d): "
                         "upgrade tally before running it against this database", v, TALLY_SCHEMA_VERSION);
                return -EPROTO;
        }
        if (v < TALLY_SCHEMA_VERSION) {
                snprintf(err, errlen,
                         "database schema is at migration %d, this tally was built for %d: run tally-migrate", v,
                         TALLY_SCHEMA_VERSION);
                return -EPROTO;
        }
        return 0;
}

int db_ensure_conn(PGconn **conn, const char *url, db_setup_fn setup, void *arg, char *err, size_t errlen)
{
        if (*conn && PQstatus(*conn) == CONNECTION_OK)
                return 0;
        PQfinish(*conn);
        *conn = db_connect(url, err, errlen);
        if (!*conn)
                return -EIO;
        int r = db_check_schema(*conn, err, errlen);
        if (r == 0 && setup)
                r = setup(*conn, arg, err, errlen) < 0 ? -EIO : 0;
        if (r < 0) {
                PQfinish(*conn);
                *conn = NULL;
        }
        return r;
}
