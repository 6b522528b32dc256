/* db.h — PostgreSQL plumbing every component shares: connecting, running a
 * statement with its result checked and cleared, and the schema version check
 * that keeps a daemon off a database it does not understand. */
#pragma once

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

/* Connects; on failure returns NULL with libpq's reason in err. The caller owns
 * the connection (PQfinish). */
PGconn *db_connect(const char *url, char *err, size_t errlen);

/* Runs sql (possibly several statements, no parameters) and expects success.
 * Returns 0, or -EIO with the server's message in err. */
int db_exec(PGconn *conn, const char *sql, char *err, size_t errlen);

/* Runs sql like db_exec; a failure is logged at error with the statement and
 * the server's message. Returns whether it succeeded. */
bool db_exec_logged(PGconn *conn, const char *sql);

/* The newest migration applied to the database, 0 if none; negative on error. */
int db_schema_version(PGconn *conn, char *err, size_t errlen);

/* Refuses a database whose schema is older than `need` or newer than `known`
 * (both migration numbers). Returns 0 or -EPROTO with the reason in err. */
int db_check_schema(PGconn *conn, int need, int known, char *err, size_t errlen);
