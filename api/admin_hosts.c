/* admin_hosts.c — `tally-admin host list|drain|resume|forget`: the host
 * registry (sql/021) as an operator sees and steers it. Each host's effective
 * state (down when its heartbeat is older than host_heartbeat_bound(), else
 * ready or draining), where tally-api reaches it, what it may promise and has
 * promised, and, from the aggregator's side, its last sample and any metering
 * gap. drain and resume set the operator's state only — never a host's
 * figures — and each change is written to audit_log (account '', actor
 * 'admin', action host.drain / host.resume / host.forget, object the host). */
#include "admin.h"

#include <errno.h>
#include <jansson.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every host the registry or the aggregator knows: one row each. */
#define HOSTS_FROM                                                                                      \
        " FROM host_states r FULL JOIN hosts h ON h.host = r.host_id"                                 \
        " LEFT JOIN metering_gaps g ON g.host = coalesce(r.host_id, h.host)"

static const char LIST_TABLE[] =
        "SELECT coalesce(r.host_id, h.host), coalesce(r.effective_state, 'unregistered'),"
        "       floor(extract(epoch FROM r.heartbeat_age))::bigint || ' s', r.address,"
        "       r.promised_vcpus || '/' || r.promisable_vcpus, r.promised_memory_mib || '/' || r.promisable_memory_mib,"
        "       r.promised_disk_mib || '/' || r.promisable_disk_mib, r.live_sandboxes,"
        "       coalesce(floor(extract(epoch FROM now() - h.last_sample_at))::bigint || ' s ago', 'never'),"
        "       CASE WHEN g.host IS NOT NULL THEN 'GAP: silent ' || floor(extract(epoch FROM g.silent_for))::bigint"
        "            || ' s' ELSE 'ok' END,"
        "       r.state_changed_by || ' ' || to_char(r.state_changed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI\"Z\"')"
        HOSTS_FROM " ORDER BY 1";

static const char LIST_JSON[] =
        "SELECT coalesce(json_agg(x ORDER BY x.host_id), '[]') FROM ("
        " SELECT coalesce(r.host_id, h.host) AS host_id, coalesce(r.effective_state, 'unregistered') AS effective_state,"
        "        r.state, r.state_changed_by, r.state_changed_at,"
        "        round(extract(epoch FROM r.heartbeat_age), 3) AS heartbeat_age_s, r.heartbeat_at, r.registered_at,"
        "        r.address, r.capacity_vcpus, r.capacity_memory_mib, r.capacity_disk_mib,"
        "        r.vcpu_overcommit_percent, r.memory_overcommit_percent, r.disk_overcommit_percent,"
        "        r.promisable_vcpus, r.promisable_memory_mib, r.promisable_disk_mib,"
        "        r.promised_vcpus, r.promised_memory_mib, r.promised_disk_mib,"
        "        r.free_vcpus, r.free_memory_mib, r.free_disk_mib, r.live_sandboxes,"
        "        h.last_sample_at, (g.host IS NOT NULL) AS metering_gap,"
        "        floor(extract(epoch FROM g.silent_for))::bigint AS metering_silent_s"
        HOSTS_FROM ") x";

static int host_list(PGconn *db, bool json)
{
        PGresult *res = admin_query(db, "read the host registry", json ? LIST_JSON : LIST_TABLE, 0, NULL);
        if (!res)
                return -EIO;
        if (json) {
                json_t *j = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
                json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
                fputc('\n', stdout);
                json_decref(j);
        } else {
                static const char *const heads[] = { "host",      "state",   ">heartbeat", "address",
                                                     ">vcpus",    ">memory MiB", ">disk MiB", ">live",
                                                     ">last sample", "metering", "state set by" };
                printf("Hosts (registry: state, heartbeat age, address, promised/may promise, live sandboxes; "
                       "aggregator: last sample, metering)\n");
                admin_print(res, heads, false);
        }
        PQclear(res);
        return 0;
}

/* Who runs tally-admin: "admin:USER" (the login behind sudo, else this user). */
static void operator_name(char *buf, size_t size)
{
        const char *user = getenv("SUDO_USER");
        struct passwd *pw = (!user || !*user) ? getpwuid(getuid()) : NULL;
        if (pw)
                user = pw->pw_name;
        snprintf(buf, size, "admin:%s", user && *user ? user : "unknown");
}

/* Sets host's state to want (ready or draining), audited; nothing when it is
 * that already. -ENOENT for a host the registry does not hold. */
static int host_set_state(PGconn *db, const char *verb, const char *host, const char *want, bool json)
{
        char by[128];
        operator_name(by, sizeof(by));
        const char *p[] = { host, want, by, verb };
        PGresult *res = admin_query(
                db, "set the host's state",
                "WITH cur AS (SELECT host_id, state FROM host_registry WHERE host_id = $1),"
                " upd AS (UPDATE host_registry r SET state = $2, state_changed_by = $3 FROM cur"
                "         WHERE r.host_id = cur.host_id AND cur.state <> $2 RETURNING r.host_id),"
                " aud AS (INSERT INTO audit_log (account_id, actor, action, object_id, old_value, new_value)"
                "         SELECT '', 'admin', 'host.' || $4, cur.host_id, jsonb_build_object('state', cur.state),"
                "                jsonb_build_object('state', $2::text, 'by', $3::text)"
                "           FROM cur JOIN upd USING (host_id))"
                " SELECT cur.state, (SELECT count(*) FROM upd) FROM cur",
                4, p);
        if (!res)
                return -EIO;
        if (PQntuples(res) == 0) {
                PQclear(res);
                fprintf(stderr, "tally-admin: no host %s in the host registry (tally-admin host list shows them)\n",
                        host);
                return -ENOENT;
        }
        char previous[32];
        snprintf(previous, sizeof(previous), "%s", PQgetvalue(res, 0, 0));
        bool changed = strcmp(PQgetvalue(res, 0, 1), "0") != 0;
        PQclear(res);
        res = admin_query(db, "read the host's state",
                          "SELECT json_build_object('host_id', host_id, 'state', state, 'previous_state', $2::text,"
                          " 'changed', $3::boolean, 'effective_state', effective_state,"
                          " 'state_changed_by', state_changed_by, 'state_changed_at', state_changed_at,"
                          " 'live_sandboxes', live_sandboxes,"
                          " 'heartbeat_age_s', round(extract(epoch FROM heartbeat_age), 3))"
                          " FROM host_states WHERE host_id = $1",
                          3, (const char *const[]){ host, previous, changed ? "true" : "false" });
        if (!res)
                return -EIO;
        json_t *j = PQntuples(res) == 1 ? json_loads(PQgetvalue(res, 0, 0), 0, NULL) : NULL;
        PQclear(res);
        if (!j)
                return -EIO;
        const char *by_now = json_string_value(json_object_get(j, "state_changed_by"));
        if (json) {
                json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
                fputc('\n', stdout);
        } else {
                printf("host=%s state=%s previous_state=%s changed=%s effective_state=%s live_sandboxes=%lld "
                       "state_changed_by=%s\n",
                       host, json_string_value(json_object_get(j, "state")), previous, changed ? "true" : "false",
                       json_string_value(json_object_get(j, "effective_state")),
                       (long long)json_integer_value(json_object_get(j, "live_sandboxes")),
                       by_now ? by_now : "—");
        }
        json_decref(j);
        return 0;
}

/* Removes a host's row (a retired host, or one re-provisioned under another
 * login, whose heartbeats the row's login binding now refuses); a host still
 * beating registers again at its next beat, as ready. */
static int host_forget(PGconn *db, const char *host)
{
        char by[128];
        operator_name(by, sizeof(by));
        const char *p[] = { host, by };
        PGresult *res = admin_query(
                db, "forget the host",
                "WITH del AS (DELETE FROM host_registry WHERE host_id = $1 RETURNING host_id, state, registered_by),"
                " aud AS (INSERT INTO audit_log (account_id, actor, action, object_id, old_value, new_value)"
                "         SELECT '', 'admin', 'host.forget', host_id,"
                "                jsonb_build_object('state', state, 'registered_by', registered_by),"
                "                jsonb_build_object('by', $2::text) FROM del)"
                " SELECT host_id FROM del",
                2, p);
        if (!res)
                return -EIO;
        int n = PQntuples(res);
        PQclear(res);
        if (n == 0) {
                fprintf(stderr, "tally-admin: no host %s in the host registry\n", host);
                return -ENOENT;
        }
        printf("host=%s forgotten\n", host);
        return 0;
}

int admin_host(PGconn *db, int argc, char **argv)
{
        const char *verb = argc >= 1 ? argv[0] : NULL, *host = NULL;
        bool json = false;
        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--json") == 0)
                        json = true;
                else if (argv[i][0] == '-' || host) {
                        fprintf(stderr, "tally-admin: host %s: unexpected %s (see host --help)\n", verb, argv[i]);
                        return -EDOM; /* said: not "unknown command" */
                } else
                        host = argv[i];
        }
        if (verb && strcmp(verb, "list") == 0 && !host)
                return host_list(db, json);
        bool drain = verb && strcmp(verb, "drain") == 0, resume = verb && strcmp(verb, "resume") == 0;
        bool forget = verb && strcmp(verb, "forget") == 0;
        if ((drain || resume || forget) && !host) {
                fprintf(stderr, "tally-admin: host %s needs a HOST_ID\n", verb);
                return -EDOM;
        }
        if (drain || resume)
                return host_set_state(db, verb, host, drain ? "draining" : "ready", json);
        if (forget)
                return host_forget(db, host);
        return -EINVAL;
}
