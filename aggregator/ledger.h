/* ledger.h — the aggregator's one connection to PostgreSQL (the ledger).
 *
 * Owns the connection and the text of the last statement the ledger refused.
 * Each session creates the staging tables a batch is copied into (ON COMMIT
 * DELETE ROWS, so a rolled-back batch leaves nothing) and prepares the
 * statements sent once per row (enum stmt). The connection is reopened
 * lazily (db_ensure) after it broke; a caller never holds a PGresult across
 * that.
 *
 * Errors: -EIO for anything the ledger refused or could not be reached for;
 * query_ok logs the failure once and keeps its SQLSTATE and primary message
 * in last_error (what the poison rule compares and a dead letter keeps). */
#pragma once

#include <libpq-fe.h>
#include <stddef.h>

struct ledger {
        const char *url;        /* borrowed: the settings' database_url */
        PGconn *db;             /* NULL while closed */
        char last_error[256];   /* SQLSTATE and message of the last refused statement */
};

/* The statements prepared on every session (ledger.c has their text). */
enum stmt {
        STMT_DEAD_LETTER,       /* partition, offset, raw (binary), reason */
        STMT_SANDBOX_CREATED,   /* a created event's sandboxes row (11 parameters) */
        STMT_SANDBOX_STATE,     /* id, state */
        STMT_HELD_READ,         /* sandbox: its held readings, oldest first */
        STMT_HELD_INSERT,       /* partition, offset, sandbox, raw (binary), reason */
        STMT_HELD_REASON,       /* partition, offset, reason */
        STMT_HELD_DELETE,       /* partition, offset */
        STMTS
};

/* Sends prepared statement s (in the caller's pipeline): 1, or -EIO. */
int ledger_send(struct ledger *l, enum stmt s, int n, const char *const *params, const int *lens, const int *fmts);

/* Runs prepared statement s; the caller checks and clears the result. */
PGresult *ledger_exec(struct ledger *l, enum stmt s, int n, const char *const *params, const int *lens,
                      const int *fmts);

/* Makes sure the connection works, reconnecting if it broke (and checking
 * the schema on each new session). 0, or -EIO, logged. */
int db_ensure(struct ledger *l);

/* 0 if res has the status want; otherwise logs it (what: the statement's
 * name), fills last_error and returns -EIO. Does not clear res. */
int query_ok(struct ledger *l, PGresult *res, ExecStatusType want, const char *what);

/* Runs a COPY ... FROM STDIN with len bytes of rows. 0 or -EIO. */
int copy_rows(struct ledger *l, const char *sql, const char *buf, size_t len);

/* Closes the connection (NULL-safe; a closed ledger may be opened again). */
void ledger_close(struct ledger *l);
