/* Integration: who may connect to tally's PostgreSQL, and what each role may do
 * (docs/security.md; sql/roles/roles.sql makes the roles, sql/013_roles.sql
 * grants). Against the test cluster scripts/test starts (SCRAM only):
 *   - a connection without a password, or with a wrong one, is refused, for
 *     every role and for the cluster's superuser;
 *   - no role of tally's is a superuser, may create roles or databases, bypass
 *     row-level security or replicate, or is a member of any other role (the
 *     owner, pg_read_server_files, pg_execute_server_program, ...);
 *   - each role's table and column rights are listed, and every right to
 *     change a table is one the list below allows; every other INSERT, UPDATE
 *     (column by column), DELETE, TRUNCATE, REFERENCES and TRIGGER on every
 *     table and view is tried as the role and must be refused;
 *   - every role, the owner too, is refused COPY ... TO PROGRAM, reading a
 *     server file, SET ROLE to another, DDL on tally's tables, CREATE in the
 *     database and its schemas, making roles and granting itself more;
 *   - the forbidden writes of a real attack (UPDATE usage_hourly and
 *     spend_daily as tally-api, DELETE of ledger rows) leave the rows as they
 *     were; the row-level policies let tally-api lift only a block whose key
 *     is under its limit, and tally-notifier prune only past days;
 *   - the host registry (sql/021): tally-vmm registers and beats but never
 *     sets a host's state nor dates its heartbeat; tally-api only reads. */
#include "support.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* What each role may change: "table:PRIV" (every column) or "table:PRIV(col,col)"
 * for INSERT and UPDATE; DELETE, TRUNCATE, REFERENCES and TRIGGER are whole-table.
 * Written from what each program's SQL does (grep its source), not from 013. */
static const struct {
        const char *role;
        const char *may[24];
} allowed[] = {
        { "tally_aggregator",
          { "fold_state:INSERT", "fold_state:UPDATE", "sandboxes:INSERT", "sandboxes:UPDATE", "usage_hourly:INSERT",
            "usage_hourly:UPDATE", "spend_daily:INSERT", "spend_daily:UPDATE", "hosts:INSERT", "hosts:UPDATE",
            "consumer_offsets:INSERT", "consumer_offsets:UPDATE", "key_blocks:INSERT", "alerts:INSERT",
            "dead_letters:INSERT", "offset_gaps:INSERT", "rating_gaps:INSERT", "held_readings:INSERT",
            "held_readings:DELETE", "held_readings:UPDATE(reason)", "limit_waivers:INSERT", NULL } },
        { "tally_api",
          { "sessions:INSERT", "sessions:DELETE", "idempotency_keys:INSERT", "idempotency_keys:DELETE",
            "idempotency_keys:UPDATE(status,body)", "signin_attempts:INSERT", "signin_attempts:DELETE",
            "signin_attempts:UPDATE(attempts,window_start)",
            "api_keys:INSERT(id,account_id,name,key_hash,prefix,daily_limit_nanodollars,limit_policy,created_by)",
            "api_keys:UPDATE(revoked_at,daily_limit_nanodollars,limit_policy,max_sandboxes,max_memory_mib,internet)",
            "audit_log:INSERT(account_id,actor,action,object_id,old_value,new_value)",
            "alert_destinations:INSERT(id,account_id,kind,url,email,secret,created_by)",
            "alert_destinations:UPDATE(enabled,disabled_at)",
            "alert_deliveries:INSERT(alert_id,destination_id,account_id,event_id,type,payload,resend_of,requested_by)",
            "alert_deliveries:UPDATE(state,last_error)", "key_blocks:DELETE", NULL } },
        { "tally_admin",
          { "accounts:INSERT(id,name,plan_id)", "accounts:UPDATE(plan_id)", "people:INSERT(id,account_id,email)",
            "people:DELETE", "people:UPDATE(password_hash)",
            "api_keys:INSERT(id,account_id,name,key_hash,prefix,daily_limit_nanodollars,limit_policy,created_by)",
            "api_keys:UPDATE(daily_limit_nanodollars,limit_policy)", "key_blocks:DELETE",
            "audit_log:INSERT(account_id,actor,action,object_id,old_value,new_value)",
            "host_registry:UPDATE(state,state_changed_by)", "host_registry:DELETE", NULL } },
        { "tally_vmm",
          { "host_registry:INSERT(host_id,address,capacity_vcpus,capacity_memory_mib,capacity_disk_mib,vcpu_overcommit_percent,"
            "memory_overcommit_percent,disk_overcommit_percent,promised_vcpus,promised_memory_mib,promised_disk_mib,live_sandboxes)",
            "host_registry:UPDATE(address,capacity_vcpus,capacity_memory_mib,capacity_disk_mib,vcpu_overcommit_percent,"
            "memory_overcommit_percent,disk_overcommit_percent,promised_vcpus,promised_memory_mib,promised_disk_mib,"
            "live_sandboxes,heartbeat_at)", NULL } },
        { "tally_notifier",
          { "alert_deliveries:UPDATE(state,attempts,last_error,next_attempt_at,delivered_at)",
            "alerts:UPDATE(delivered_at)", "spend_rate_points:DELETE", NULL } },
        { "tally_close_due", { NULL } },
        { "tally_finance", { NULL } },
};
#define NROLES (sizeof(allowed) / sizeof(allowed[0]))

static char *db_url;

static PGconn *connect_as(const char *role)
{
        char *url = test_role_url(db_url, role);
        PGconn *c = PQconnectdb(url);
        if (PQstatus(c) != CONNECTION_OK) {
                fprintf(stderr, "FAIL: could not connect as %s: %s", role, PQerrorMessage(c));
                exit(1);
        }
        free(url);
        return c;
}

static void exec_ok(PGconn *c, const char *sql)
{
        PGresult *r = PQexec(c, sql);
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
                fprintf(stderr, "FAIL: %s: %s", sql, PQerrorMessage(c));
                exit(1);
        }
        PQclear(r);
}

static char *one(PGconn *c, const char *sql)
{
        PGresult *r = PQexec(c, sql);
        char *v = strdup(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && PQnfields(r) == 1
                                 ? PQgetvalue(r, 0, 0)
                                 : "<error>");
        if (strcmp(v, "<error>") == 0)
                fprintf(stderr, "query failed: %s: %s", sql, PQerrorMessage(c));
        PQclear(r);
        return v;
}

/* Runs sql in a transaction that is rolled back; returns its SQLSTATE ("00000": it ran)
 * and, in *ret_rows, the rows it changed. */
static char state_buf[8];
static const char *attempt(PGconn *c, const char *sql, long *ret_rows)
{
        exec_ok(c, "BEGIN");
        PGresult *r = PQexec(c, sql);
        ExecStatusType st = PQresultStatus(r);
        const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        snprintf(state_buf, sizeof(state_buf), "%s",
                 st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_COPY_OUT ? "00000"
                 : code                                                             ? code
                                                                                    : "?????");
        if (ret_rows)
                *ret_rows = atol(PQcmdTuples(r));
        PQclear(r);
        if (st == PGRES_COPY_OUT) { /* drain it */
                char *buf;
                while (PQgetCopyData(c, &buf, 0) > 0)
                        PQfreemem(buf);
                PQclear(PQgetResult(c));
        }
        exec_ok(c, "ROLLBACK");
        return state_buf;
}

/* The statement must be refused for lack of a right (SQLSTATE 42501). */
static void refused(PGconn *c, const char *role, const char *sql)
{
        const char *st = attempt(c, sql, NULL);
        CHECK(strcmp(st, "42501") == 0, "%s may: %s (SQLSTATE %s, want 42501 insufficient_privilege)", role, sql, st);
}

/* A write into a view: PostgreSQL refuses one it cannot apply (a view with joins or
 * aggregates, 55000 or 0A000) before it checks rights, so the right is read too. */
static void refused_view(PGconn *admin, PGconn *c, const char *role, const char *sql, const char *view,
                         const char *column, const char *priv)
{
        const char *st = attempt(c, sql, NULL);
        CHECK(strcmp(st, "00000") != 0, "%s may: %s", role, sql);
        char q[512];
        if (column)
                snprintf(q, sizeof(q), "SELECT has_column_privilege('%s', '%s', '%s', '%s')", role, view, column, priv);
        else
                snprintf(q, sizeof(q), "SELECT has_table_privilege('%s', '%s', '%s')", role, view, priv);
        char *v = one(admin, q);
        CHECK(strcmp(v, "f") == 0, "%s has %s on %s%s%s", role, priv, view, column ? "." : "", column ? column : "");
        free(v);
}

static bool may(size_t ri, const char *table, const char *priv, const char *column)
{
        for (int i = 0; allowed[ri].may[i]; i++) {
                const char *e = allowed[ri].may[i];
                size_t tl = strlen(table), pl = strlen(priv);
                if (strncmp(e, table, tl) != 0 || e[tl] != ':' || strncmp(e + tl + 1, priv, pl) != 0)
                        continue;
                const char *rest = e + tl + 1 + pl;
                if (!*rest)
                        return true;
                if (*rest != '(' || !column)
                        continue;
                char cols[512];
                snprintf(cols, sizeof(cols), ",%.*s,", (int)(strlen(rest) - 2), rest + 1);
                char want[160];
                snprintf(want, sizeof(want), ",%s,", column);
                if (strstr(cols, want))
                        return true;
        }
        return false;
}

/* Every table and view of public and finance: schema, name, kind, its columns but the generated ones. */
static PGresult *relations(PGconn *admin)
{
        PGresult *r = PQexec(admin,
                             "SELECT n.nspname, c.relname, c.relkind::text,"
                             "       string_agg(quote_ident(a.attname), ',' ORDER BY a.attnum)"
                             "  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                             "  JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
                             "   AND a.attgenerated = ''" /* nobody writes a generated column */
                             " WHERE n.nspname IN ('public', 'finance') AND c.relkind IN ('r', 'p', 'v')"
                             " GROUP BY 1, 2, 3 ORDER BY 1, 2");
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
                fprintf(stderr, "FAIL: listing relations: %s", PQerrorMessage(admin));
                exit(1);
        }
        return r;
}

static void list_grants(PGconn *admin, const char *role)
{
        char sql[1024];
        snprintf(sql, sizeof(sql),
                 "SELECT coalesce(string_agg(t || ' ' || p, '; ' ORDER BY t, p), '(none)') FROM ("
                 " SELECT table_schema || '.' || table_name AS t, string_agg(privilege_type, ',' ORDER BY privilege_type) AS p"
                 "   FROM information_schema.role_table_grants WHERE grantee IN ('%s', 'finance')"
                 "    AND ('%s' = 'tally_finance' OR grantee = '%s')"
                 "  GROUP BY 1"
                 " UNION ALL"
                 " SELECT table_schema || '.' || table_name || '(' || string_agg(DISTINCT column_name, ',') || ')',"
                 "        privilege_type"
                 "   FROM information_schema.column_privileges c WHERE grantee = '%s'"
                 "    AND NOT EXISTS (SELECT FROM information_schema.role_table_grants g WHERE g.grantee = c.grantee"
                 "                     AND g.table_name = c.table_name AND g.privilege_type = c.privilege_type)"
                 "  GROUP BY table_schema, table_name, privilege_type) x",
                 role, role, role, role);
        char *g = one(admin, sql);
        fprintf(stderr, "grants of %s: %s\n", role, g);
        free(g);
}

/* Every change a role's list does not allow, tried as the role: refused. */
static int forbidden_writes(PGconn *admin, size_t ri, PGconn *c)
{
        const char *role = allowed[ri].role;
        PGresult *rel = relations(admin);
        int tried = 0;
        char sql[8192], q[256];
        for (int i = 0; i < PQntuples(rel); i++) {
                const char *nsp = PQgetvalue(rel, i, 0), *name = PQgetvalue(rel, i, 1);
                bool view = PQgetvalue(rel, i, 2)[0] == 'v';
                char *cols = strdup(PQgetvalue(rel, i, 3));
                snprintf(q, sizeof(q), "%s.%s", nsp, name);
                bool pub = strcmp(nsp, "public") == 0;
                static const char *whole[] = { "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER" };
                for (size_t w = 0; w < 4; w++) {
                        if (pub && may(ri, name, whole[w], NULL))
                                continue;
                        if (view && strcmp(whole[w], "TRUNCATE") == 0)
                                continue; /* not a right a view has */
                        if (strcmp(whole[w], "DELETE") == 0)
                                snprintf(sql, sizeof(sql), "DELETE FROM %s WHERE false", q);
                        else if (strcmp(whole[w], "TRUNCATE") == 0)
                                snprintf(sql, sizeof(sql), "TRUNCATE %s", q);
                        else if (strcmp(whole[w], "REFERENCES") == 0) {
                                snprintf(sql, sizeof(sql), "SELECT has_table_privilege('%s', '%s', 'REFERENCES')", role,
                                         q);
                                char *v = one(admin, sql);
                                CHECK(strcmp(v, "f") == 0, "%s has REFERENCES on %s", role, q);
                                free(v);
                                tried++;
                                continue;
                        } else {
                                snprintf(sql, sizeof(sql), "SELECT has_table_privilege('%s', '%s', 'TRIGGER')", role, q);
                                char *v = one(admin, sql);
                                CHECK(strcmp(v, "f") == 0, "%s has TRIGGER on %s", role, q);
                                free(v);
                                tried++;
                                continue;
                        }
                        if (view)
                                refused_view(admin, c, role, sql, q, NULL, whole[w]);
                        else
                                refused(c, role, sql);
                        tried++;
                }
                char *save = NULL;
                for (char *col = strtok_r(cols, ",", &save); col; col = strtok_r(NULL, ",", &save)) {
                        if (!(pub && may(ri, name, "INSERT", col))) {
                                snprintf(sql, sizeof(sql), "INSERT INTO %s (%s) SELECT NULL WHERE false", q, col);
                                if (view)
                                        refused_view(admin, c, role, sql, q, col, "INSERT");
                                else
                                        refused(c, role, sql);
                                tried++;
                        }
                        if (!(pub && may(ri, name, "UPDATE", col))) {
                                snprintf(sql, sizeof(sql), "UPDATE %s SET %s = NULL WHERE false", q, col);
                                if (view)
                                        refused_view(admin, c, role, sql, q, col, "UPDATE");
                                else
                                        refused(c, role, sql);
                                tried++;
                        }
                }
                free(cols);
        }
        PQclear(rel);
        return tried;
}

/* What no role of tally's may do, the owner included. */
static void never(PGconn *c, const char *role)
{
        static const char *const sql[] = {
                "COPY (SELECT 1) TO PROGRAM 'touch /tmp/tally-pg-roles-pwned'",
                "COPY public.usage_hourly TO PROGRAM 'cat >/dev/null'",
                "COPY (SELECT 1) TO '/tmp/tally-pg-roles-file'",
                "CREATE TEMP TABLE t_read (line text); COPY t_read FROM '/etc/passwd'",
                "SELECT pg_read_file('/etc/passwd')",
                "SELECT pg_read_binary_file('postgresql.conf')",
                "SELECT pg_ls_dir('.')",
                "SELECT lo_import('/etc/passwd')",
                "SET ROLE tally",
                "SET SESSION AUTHORIZATION tally",
                "CREATE ROLE tally_pg_roles_intruder",
                "ALTER ROLE CURRENT_USER SUPERUSER",
                "ALTER ROLE CURRENT_USER BYPASSRLS",
                "GRANT pg_execute_server_program TO CURRENT_USER",
                "GRANT pg_read_server_files TO CURRENT_USER",
                "GRANT tally_owner TO CURRENT_USER",
                "SELECT pg_reload_conf()",
                "CREATE EXTENSION IF NOT EXISTS dblink",
                "LOAD 'passwordcheck'",
        };
        for (size_t i = 0; i < sizeof(sql) / sizeof(sql[0]); i++) {
                const char *st = attempt(c, sql[i], NULL);
                /* 42501 insufficient_privilege; 0A000 or 58P01 would be a file or
                 * feature error after the check, which a right already passed. */
                CHECK(strcmp(st, "42501") == 0, "%s may: %s (SQLSTATE %s)", role, sql[i], st);
        }
        /* SET ROLE to another of tally's roles. */
        static const char *const others[] = { "tally_owner", "tally_aggregator", "tally_api", "finance" };
        for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
                if (strcmp(others[i], role) == 0 || (strcmp(role, "tally_finance") == 0 && strcmp(others[i], "finance") == 0))
                        continue;
                char set[64];
                snprintf(set, sizeof(set), "SET ROLE %s", others[i]);
                const char *st = attempt(c, set, NULL);
                CHECK(strcmp(st, "42501") == 0, "%s may: %s (SQLSTATE %s)", role, set, st);
        }
        /* These run outside a transaction block only. */
        static const char *const bare[] = {
                "CREATE DATABASE tally_pg_roles_intruder",
                "ALTER SYSTEM SET log_statement = 'none'",
        };
        for (size_t i = 0; i < sizeof(bare) / sizeof(bare[0]); i++) {
                PGresult *r = PQexec(c, bare[i]);
                const char *code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
                CHECK(code && strcmp(code, "42501") == 0, "%s may: %s (SQLSTATE %s)", role, bare[i], code ? code : "00000");
                PQclear(r);
        }
}

/* sql/021: a host beats (dated by the database), never sets the state; tally-api reads (other logins: vmm-registry). */
static const char REGISTER[] =
        "INSERT INTO host_registry (host_id, address, capacity_vcpus, capacity_memory_mib, capacity_disk_mib, vcpu_overcommit_percent,"
        " memory_overcommit_percent, disk_overcommit_percent) VALUES ('host-r', 'https://10.0.0.1:7443', 4, 8192, 10240, 1600, 100,"
        " 100) ON CONFLICT (host_id) DO UPDATE SET promised_vcpus = 2, heartbeat_at = now()";

static void host_registry_rights(PGconn *admin, PGconn *vmm)
{
        exec_ok(vmm, REGISTER), exec_ok(vmm, REGISTER); /* registers, then beats: the same upsert */
        char *v = one(admin, "SELECT registered_by || '/' || state || '/' || promised_vcpus FROM host_registry");
        CHECK(strcmp(v, "tally_vmm/ready/2") == 0, "host-r registered as %s, want tally_vmm/ready/2", v);
        free(v);
        refused(vmm, "tally_vmm", "UPDATE host_registry SET state = 'draining' WHERE host_id = 'host-r'");
        exec_ok(vmm, "UPDATE host_registry SET heartbeat_at = now() + interval '1 year' WHERE host_id = 'host-r'");
        v = one(admin, "SELECT heartbeat_at <= now() + interval '5 seconds' FROM host_registry WHERE host_id = 'host-r'");
        CHECK(strcmp(v, "t") == 0, "tally_vmm dated its heartbeat in the future");
        free(v);
        PGconn *api = connect_as("tally_api");
        v = one(api, "SELECT effective_state || '/' || free_vcpus FROM host_states WHERE host_id = 'host-r'");
        CHECK(strcmp(v, "ready/62") == 0, "tally_api reads host-r as %s, want ready/62", v);
        free(v);
        PQfinish(api);
}

/* DDL on tally's tables and CREATE anywhere: only the owner. */
static void no_ddl(PGconn *c, const char *role)
{
        static const char *const sql[] = {
                "ALTER TABLE public.usage_hourly ADD COLUMN intruder int",
                "ALTER TABLE public.closed_invoices DISABLE TRIGGER USER",
                "ALTER TABLE public.key_blocks DISABLE ROW LEVEL SECURITY",
                "DROP TABLE public.spend_daily",
                "DROP TRIGGER usage_rollup_insert ON public.usage_hourly",
                "CREATE OR REPLACE FUNCTION public.rate_at(p_plan text, p_meter text, p_at timestamptz) RETURNS bigint"
                " LANGUAGE sql AS 'SELECT 0::bigint'",
                "CREATE TABLE public.intruder (a int)",
                "CREATE FUNCTION public.intruder() RETURNS int LANGUAGE sql AS 'SELECT 1'",
                "CREATE SCHEMA intruder",
                "CREATE TABLE finance.intruder (a int)",
                "CREATE POLICY intruder ON public.key_blocks USING (true)",
        };
        for (size_t i = 0; i < sizeof(sql) / sizeof(sql[0]); i++) {
                const char *st = attempt(c, sql[i], NULL);
                CHECK(strcmp(st, "42501") == 0, "%s may: %s (SQLSTATE %s)", role, sql[i], st);
        }
}

/* GRANT by a role without the grant option is refused, or (a role with some right on the
 * table) "succeeds" with a warning and grants nothing: what PUBLIC may do is unchanged. */
static void no_grant(PGconn *admin, PGconn *c, const char *role)
{
        PGresult *r = PQexec(c, "GRANT ALL ON public.usage_hourly, public.spend_daily TO PUBLIC");
        PQclear(r);
        r = PQexec(c, "GRANT ALL ON public.usage_hourly, public.spend_daily TO tally_vmm");
        PQclear(r);
        char *v = one(admin, "SELECT has_table_privilege('public', 'public.usage_hourly', 'UPDATE')"
                             " OR has_table_privilege('public', 'public.spend_daily', 'DELETE')"
                             " OR has_table_privilege('tally_vmm', 'public.usage_hourly', 'UPDATE')"
                             " OR has_table_privilege('tally_vmm', 'public.spend_daily', 'INSERT')");
        CHECK(strcmp(v, "f") == 0, "%s granted rights on usage_hourly or spend_daily to others", role);
        free(v);
}

static void passwordless_refused(const char *role)
{
        static char *empty; /* no password anywhere: libpq's pgpass file is an empty one */
        if (!empty) {
                char *dir = test_tmpdir("pgroles");
                if (asprintf(&empty, "%s/empty.pgpass", dir) < 0)
                        abort();
                fclose(fopen(empty, "w"));
                chmod(empty, 0600);
                free(dir);
        }
        char *url = test_role_url(db_url, role), conninfo[1024];
        snprintf(conninfo, sizeof(conninfo), "%s%spassfile=%s", url, strchr(url, '?') ? "&" : "?", empty);
        PGconn *c = PQconnectdb(conninfo);
        CHECK(PQstatus(c) != CONNECTION_OK, "%s connected without a password", role);
        PQfinish(c);
        snprintf(conninfo, sizeof(conninfo), "%s%spassfile=%s&password=wrong", url, strchr(url, '?') ? "&" : "?", empty);
        c = PQconnectdb(conninfo);
        CHECK(PQstatus(c) != CONNECTION_OK, "%s connected with a wrong password", role);
        if (PQstatus(c) != CONNECTION_OK)
                CHECK(strstr(PQerrorMessage(c), "password authentication failed") != NULL,
                      "%s with a wrong password: %s", role, PQerrorMessage(c));
        PQfinish(c);
        free(url);
}

int main(void)
{
        /* First what needs no role of tally's: the cluster's superuser needs a password too,
         * and pg_hba.conf trusts nobody. */
        const char *cluster = test_env("TALLY_TEST_PG_URL");
        db_url = (char *)cluster;
        passwordless_refused("tally");
        PGconn *sup = PQconnectdb(cluster);
        char *hba = one(sup, "SELECT string_agg(DISTINCT auth_method, ',' ORDER BY auth_method) FROM pg_hba_file_rules");
        CHECK(strcmp(hba, "scram-sha-256") == 0, "pg_hba.conf's methods are %s, want scram-sha-256 only", hba);
        free(hba);
        char *super = one(sup, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user");
        PQfinish(sup);

        db_url = test_db_create("pgroles");
        char *margv[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", db_url, "apply", NULL };
        char *err = NULL;
        if (test_run(margv, NULL, &err) != 0) {
                fprintf(stderr, "FAIL: tally-migrate as tally_owner: %s\n", err ? err : "");
                return 1;
        }
        free(err);
        PGconn *admin = PQconnectdb(db_url);
        if (PQstatus(admin) != CONNECTION_OK) {
                fprintf(stderr, "FAIL: %s", PQerrorMessage(admin));
                return 1;
        }

        /* Connections: SCRAM for every role. */
        passwordless_refused("tally_owner");
        for (size_t i = 0; i < NROLES; i++)
                passwordless_refused(allowed[i].role);
        /* The programs' own connections are no superuser's (test_run gave tally-migrate its role). */
        char *migrated_by = one(admin, "SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'usage_hourly'");
        CHECK(strcmp(super, "t") == 0 && strcmp(migrated_by, "tally_owner") == 0,
              "tally-migrate ran as %s (the test's own connection is a superuser: %s)", migrated_by, super);
        free(migrated_by);
        free(super);

        /* The roles' attributes and memberships. */
        char *bad = one(admin,
                        "SELECT coalesce(string_agg(rolname, ','), '') FROM pg_roles"
                        " WHERE rolname IN ('tally_owner', 'tally_aggregator', 'tally_api', 'tally_admin', 'tally_vmm',"
                        "                   'tally_notifier', 'tally_close_due', 'tally_finance', 'finance')"
                        "   AND (rolsuper OR rolcreaterole OR rolcreatedb OR rolreplication OR rolbypassrls)");
        CHECK(strcmp(bad, "") == 0, "roles with superuser, createrole, createdb, replication or bypassrls: %s", bad);
        free(bad);
        char *member = one(admin,
                           "SELECT coalesce(string_agg(m.rolname || ' in ' || g.rolname, ', '), '')"
                           "  FROM pg_auth_members a JOIN pg_roles m ON m.oid = a.member JOIN pg_roles g ON g.oid = a.roleid"
                           " WHERE m.rolname LIKE 'tally\\_%' AND NOT (m.rolname = 'tally_finance' AND g.rolname = 'finance')");
        CHECK(strcmp(member, "") == 0, "memberships beyond tally_finance in finance: %s", member);
        free(member);
        char *owners = one(admin,
                           "SELECT coalesce(string_agg(DISTINCT pg_get_userbyid(c.relowner), ','), '')"
                           "  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                           " WHERE n.nspname IN ('public', 'finance')");
        CHECK(strcmp(owners, "tally_owner") == 0, "tally's tables are owned by %s, want tally_owner alone", owners);
        free(owners);
        char *dbowner = one(admin, "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()");
        CHECK(strcmp(dbowner, "tally_owner") == 0, "the database is owned by %s", dbowner);
        free(dbowner);
        char *pub = one(admin,
                        "SELECT coalesce(string_agg(p.oid::regprocedure::text, ', '), '') FROM pg_proc p"
                        " WHERE p.pronamespace = 'public'::regnamespace AND p.prosecdef"
                        "   AND has_function_privilege('public', p.oid, 'EXECUTE')");
        CHECK(strcmp(pub, "") == 0, "SECURITY DEFINER functions anyone may run: %s", pub);
        free(pub);

        /* Seed what the attacks aim at (as the superuser). */
        exec_ok(admin, "INSERT INTO accounts (id, name) VALUES ('acct_r', 'r');"
                       "INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars)"
                       "  VALUES ('key_r', 'acct_r', sha256('r'), 1000), ('key_u', 'acct_r', sha256('u'), 1000);"
                       "INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns)"
                       "  VALUES ('sb_r', date_trunc('hour', now()), 'acct_r', 'key_r', 260000000);"
                       "INSERT INTO spend_daily (key_id, day, account_id, cpu_rated)"
                       "  VALUES ('key_r', (now() AT TIME ZONE 'UTC')::date, 'acct_r', 18000000000000000);"
                       "INSERT INTO key_blocks (key_id, day, account_id, policy) VALUES"
                       "  ('key_r', (now() AT TIME ZONE 'UTC')::date, 'acct_r', 'pause'),"
                       "  ('key_u', (now() AT TIME ZONE 'UTC')::date, 'acct_r', 'pause');"
                       "INSERT INTO spend_rate_points (key_id, day, b_at, b_nanodollars) VALUES"
                       "  ('key_r', (now() AT TIME ZONE 'UTC')::date, now(), 1),"
                       "  ('key_r', (now() AT TIME ZONE 'UTC')::date - 5, now(), 1)"
                       /* (today's row: the spend above moved its points already, sql/016) */
                       "  ON CONFLICT (key_id, day) DO NOTHING");
        char *before = one(admin, "SELECT (SELECT cpu_ns FROM usage_hourly WHERE sandbox_id = 'sb_r') || '/' ||"
                                  " (SELECT nanodollars FROM spend_daily WHERE key_id = 'key_r')");

        PGconn *owner = connect_as("tally_owner");
        never(owner, "tally_owner");
        PQfinish(owner);

        int tried = 0;
        for (size_t i = 0; i < NROLES; i++) {
                const char *role = allowed[i].role;
                list_grants(admin, role);
                PGconn *c = connect_as(role);
                tried += forbidden_writes(admin, i, c);
                never(c, role);
                no_ddl(c, role);
                no_grant(admin, c, role);
                if (strcmp(role, "tally_aggregator") != 0) {
                        refused(c, role, "CREATE TEMP TABLE intruder (a int)");
                        long rows = -1;
                        /* the attack as it was made: a bill rewritten to 1 ns */
                        refused(c, role, "UPDATE public.usage_hourly SET cpu_ns = 1 WHERE sandbox_id = 'sb_r'");
                        refused(c, role, "UPDATE public.spend_daily SET cpu_rated = 1 WHERE key_id = 'key_r'");
                        (void)rows;
                }
                refused(c, role, "DELETE FROM public.usage_hourly WHERE sandbox_id = 'sb_r'");
                refused(c, role, "DELETE FROM public.spend_daily");
                refused(c, role, "DELETE FROM public.fold_state");
                refused(c, role, "TRUNCATE public.usage_hourly");
                PQfinish(c);
        }
        fprintf(stderr, "forbidden writes tried: %d\n", tried);
        CHECK(tried > 1000, "only %d forbidden writes tried: the relation list is short", tried);

        /* Row-level security: tally-api lifts a block only when the key is under its
         * limit; tally-notifier prunes only points of past days. */
        PGconn *api = connect_as("tally_api");
        long rows = -1;
        const char *st = attempt(api, "DELETE FROM key_blocks WHERE key_id = 'key_r'", &rows);
        CHECK(strcmp(st, "00000") == 0 && rows == 0, "tally_api lifted the block of a key over its limit: %s, %ld rows",
              st, rows);
        st = attempt(api, "DELETE FROM key_blocks WHERE key_id = 'key_u'", &rows);
        CHECK(strcmp(st, "00000") == 0 && rows == 1, "tally_api could not lift the block of a key under its limit: %s, %ld",
              st, rows);
        PQfinish(api);
        PGconn *notifier = connect_as("tally_notifier");
        st = attempt(notifier, "DELETE FROM spend_rate_points", &rows);
        CHECK(strcmp(st, "00000") == 0 && rows == 1, "tally_notifier deleted %ld spend points (%s), want 1: the past day's",
              rows, st);
        PQfinish(notifier);
        PGconn *vmm = connect_as("tally_vmm");
        char *seen = one(vmm, "SELECT count(*) FROM key_blocks WHERE key_id = 'key_r'");
        CHECK(strcmp(seen, "1") == 0, "tally_vmm does not see the block: %s", seen);
        free(seen);
        refused(vmm, "tally_vmm", "SELECT key_hash FROM api_keys");
        refused(vmm, "tally_vmm", "SELECT * FROM usage_hourly");
        host_registry_rights(admin, vmm);
        PQfinish(vmm);
        PGconn *agg = connect_as("tally_aggregator");
        refused(agg, "tally_aggregator", "SELECT key_hash FROM api_keys");
        refused(agg, "tally_aggregator", "SELECT secret FROM alert_destinations");
        refused(agg, "tally_aggregator", "SELECT password_hash FROM people");
        PQfinish(agg);
        PGconn *close_due = connect_as("tally_close_due");
        refused(close_due, "tally_close_due", "SELECT * FROM close_month('2020-01-01', 'intruder')");
        refused(close_due, "tally_close_due", "SELECT * FROM accounts");
        st = attempt(close_due, "SELECT * FROM close_due('72 hours', 'test')", NULL);
        CHECK(strcmp(st, "00000") == 0, "tally_close_due cannot run close_due(): %s", st);
        PQfinish(close_due);

        char *after = one(admin, "SELECT (SELECT cpu_ns FROM usage_hourly WHERE sandbox_id = 'sb_r') || '/' ||"
                                 " (SELECT nanodollars FROM spend_daily WHERE key_id = 'key_r')");
        CHECK(strcmp(before, "260000000/5000") == 0 && strcmp(after, before) == 0,
              "the ledger changed: %s, then %s (want 260000000/5000)", before, after);
        free(before);
        free(after);
        PQfinish(admin);
        test_db_drop(db_url);
        return test_result();
}
