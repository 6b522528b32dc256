/* ledger.c — see ledger.h. */
#include "ledger.h"

#include "db.h"
#include "log.h"
#include "text.h"

#include <errno.h>
#include <stdio.h>

/* Each session's staging tables (emptied at every commit or rollback). */
static const char *const session_sql =
        "SET TIME ZONE 'UTC';"
        "CREATE TEMP TABLE IF NOT EXISTS stage_usage (sandbox_id text, hour timestamptz, account_id text,"
        " key_id text, cpu_ns bigint, mem_byte_ns numeric, storage_byte_ns numeric, mem_peak_bytes bigint,"
        " storage_waived_byte_ns numeric NOT NULL DEFAULT 0)"
        " ON COMMIT DELETE ROWS;"
        "CREATE TEMP TABLE IF NOT EXISTS stage_fold (sandbox_id text, account_id text, key_id text, host text,"
        " vcpus integer, fold text, version bigint, stopped boolean, state text, mem_size_bytes bigint,"
        " wall timestamptz, sync boolean, net_rx bigint, net_tx bigint, sampled boolean) ON COMMIT DELETE ROWS;"
        "CREATE TEMP TABLE IF NOT EXISTS stage_created (sandbox_id text, account_id text, key_id text, host text,"
        " parent_id text, backend text, vcpus integer, mem_size_bytes bigint, disk_size_bytes bigint, labels jsonb,"
        " created_at timestamptz) ON COMMIT DELETE ROWS;";

/* The statements a batch sends once per row (or per sandbox), prepared once
 * per session: parsed and planned once, not once per row (a batch of 10,000
 * created events planned the upsert 10,000 times). Indexed by enum stmt. */
static const struct {
        const char *name;
        const char *sql;
} prepared[STMTS] = {
        [STMT_DEAD_LETTER] = { "dead_letter", "INSERT INTO dead_letters (topic, partition, \"offset\", raw, reason)"
                                              " VALUES ('usage', $1, $2, $3, $4) ON CONFLICT DO NOTHING" },
        [STMT_SANDBOX_CREATED] = { "sandbox_created",
                                   "INSERT INTO sandboxes AS s (id, account_id, key_id, host, parent_id, backend, vcpus,"
                                   "  mem_size_bytes, disk_size_bytes, labels, state, created_at)"
                                   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, 'running', $11)"
                                   " ON CONFLICT (id) DO UPDATE SET parent_id = EXCLUDED.parent_id,"
                                   "  backend = EXCLUDED.backend, vcpus = EXCLUDED.vcpus,"
                                   "  mem_size_bytes = EXCLUDED.mem_size_bytes, disk_size_bytes = EXCLUDED.disk_size_bytes,"
                                   "  labels = EXCLUDED.labels, created_at = EXCLUDED.created_at, updated_at = now()" },
        [STMT_SANDBOX_STATE] = { "sandbox_state",
                                 "UPDATE sandboxes SET state = $2, updated_at = now() WHERE id = $1" },
        [STMT_HELD_READ] = { "held_read", "SELECT partition, \"offset\", raw, reason FROM held_readings"
                                          " WHERE sandbox_id = $1 ORDER BY held_at, partition, \"offset\"" },
        [STMT_HELD_INSERT] = { "held_insert",
                               "INSERT INTO held_readings (partition, \"offset\", sandbox_id, raw, reason)"
                               " VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING" },
        [STMT_HELD_REASON] = { "held_reason",
                               "UPDATE held_readings SET reason = $3 WHERE partition = $1 AND \"offset\" = $2" },
        [STMT_HELD_DELETE] = { "held_delete", "DELETE FROM held_readings WHERE partition = $1 AND \"offset\" = $2" },
};

static int db_session(PGconn *db, char *err, size_t errlen)
{
        int r = db_check_schema(db, err, errlen); /* the schema this build was made for */
        if (r < 0)
                return r;
        if (db_exec(db, session_sql, err, errlen) < 0)
                return -EIO;
        for (int i = 0; i < STMTS; i++) {
                PGresult *res = PQprepare(db, prepared[i].name, prepared[i].sql, 0, NULL);
                r = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : -EIO;
                PQclear(res);
                if (r < 0) {
                        snprintf(err, errlen, "could not prepare %s: %s", prepared[i].name, PQerrorMessage(db));
                        return r;
                }
        }
        return 0;
}

int ledger_send(struct ledger *l, enum stmt s, int n, const char *const *params, const int *lens, const int *fmts)
{
        return PQsendQueryPrepared(l->db, prepared[s].name, n, params, lens, fmts, 0) == 1 ? 1 : -EIO;
}

PGresult *ledger_exec(struct ledger *l, enum stmt s, int n, const char *const *params, const int *lens,
                      const int *fmts)
{
        return PQexecPrepared(l->db, prepared[s].name, n, params, lens, fmts, 0);
}

/* Makes sure the connection works, reconnecting if it broke. */
int db_ensure(struct ledger *l)
{
        char err[1024];
        if (l->db && PQstatus(l->db) == CONNECTION_OK)
                return 0;
        PQfinish(l->db);
        l->db = db_connect(l->url, err, sizeof(err));
        if (!l->db || db_session(l->db, err, sizeof(err)) < 0) {
                log_error("could not open the ledger", "error=\"%s\"", err);
                PQfinish(l->db);
                l->db = NULL;
                return -EIO;
        }
        return 0;
}

int query_ok(struct ledger *l, PGresult *res, ExecStatusType want, const char *what)
{
        if (PQresultStatus(res) == want)
                return 0;
        /* The server's message, on one line and without quotes, for the log. */
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(res));
        for (char *c = msg; *c; c++)
                if (*c == '\n' || *c == '"')
                        *c = *c == '\n' ? ' ' : '\'';
        log_error("ledger statement failed", "what=%s error=\"%s\"", what, msg);
        /* What the poison rule compares and a dead letter keeps: the SQLSTATE
         * and the primary message (no statement text, no line numbers). */
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        const char *primary = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
        char e[sizeof(l->last_error)];
        snprintf(e, sizeof(e), "%s %s: %s", state ? state : "?????", what,
                 primary ? primary : PQerrorMessage(l->db));
        utf8_copy(l->last_error, sizeof(l->last_error), e);
        return -EIO;
}

int copy_rows(struct ledger *l, const char *sql, const char *buf, size_t len)
{
        PGresult *res = PQexec(l->db, sql);
        int r = query_ok(l, res, PGRES_COPY_IN, "copy");
        PQclear(res);
        if (r < 0)
                return r;
        if (len && PQputCopyData(l->db, buf, (int)len) != 1)
                r = -EIO;
        if (PQputCopyEnd(l->db, r < 0 ? "failed" : NULL) != 1)
                r = -EIO;
        res = PQgetResult(l->db);
        if (query_ok(l, res, PGRES_COMMAND_OK, "copy end") < 0)
                r = -EIO;
        PQclear(res);
        while ((res = PQgetResult(l->db)))
                PQclear(res);
        return r;
}

void ledger_close(struct ledger *l)
{
        PQfinish(l->db);
        l->db = NULL;
}
