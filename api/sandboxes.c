/* sandboxes.c — the sandbox lifecycle an agent drives, forwarded to the
 * hosts' tally-vmm (HTTP on a unix socket or over mutual TLS, docs/vmm.md).
 *
 * The vmm trusts tally-api whole, so tenancy is checked here: the
 * account and key of a create come from the caller, never the body, and a
 * sandbox of another account answers 404 exactly like one that does not
 * exist. What spends — create, exec, fork, resume, and timeout (which may
 * extend a lease) — is refused with 402 while the key that would pay is
 * blocked today (key_blocks): the sandbox's key, and the caller's own key
 * when an API key acts on a sibling's sandbox. Pause and delete always run:
 * they stop spending. Create and fork are refused with 409 past the key's
 * caps (key_caps.c), and 507 when the host's capacity is short (its tally-vmm
 * says). A create goes to the next ready host in turn, a sandbox is found
 * through the ledger's sandboxes.host (vmm_hosts.h), and a create whose
 * caller hung up is stopped. */
#include "log.h"
#include "server.h"
#include "vmm_hosts.h"

#include <errno.h>
#include <pthread.h>

/* tally-vmm's exec_timeout_ms default (docs/vmm.md). */
#define EXEC_TIMEOUT_DEFAULT_MS 60000
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* Asks host h for sandbox r->id: 0 with *ret when it is there and the
 * caller's, else the error (404 for another account's). */
static int ask(struct api_req *r, int h, json_t **ret, struct api_error *err)
{
        char path[128];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", r->id);
        json_t *j = NULL;
        long st = vmm_hosts_call(req_vmm_hosts(r), h, "GET", path, NULL, VMM_CALL_SHORT_MS, &j);
        if (st == 200 && j) {
                const char *acct = json_string_value(json_object_get(j, "account"));
                if (acct && strcmp(acct, r->caller.account) == 0) {
                        *ret = j;
                        return 0;
                }
                json_decref(j);
                return api_fail(err, 404, "not_found", "id", "no sandbox %s", r->id);
        }
        int rc = st == 200 ? api_fail(err, 502, "vmm_error", NULL, "the sandbox host's answer is not JSON")
                           : vmm_hosts_error(st, j, err);
        json_decref(j);
        return rc;
}

/* Finds sandbox r->id; it must belong to the caller's account. The ledger
 * says which host made it (sandboxes.host, the aggregator writes it from the
 * created event) and only that host is asked. Until the ledger has the
 * sandbox (its created event not folded yet), the hosts not known down are
 * asked in turn. So one host down costs only its own sandboxes: a missing id
 * stays 404, and 502 means the ledger puts the sandbox on a host that does not
 * answer. No database connection is held while a host is asked. Returns 0
 * with *ret_host and *ret (the sandbox), or an error. */
static int find(struct api_req *r, int *ret_host, json_t **ret, struct api_error *err)
{
        const char *p[] = { r->id };
        PGresult *res = db_query(req_db(r), "find a sandbox's host", PGRES_TUPLES_OK,
                                 "SELECT account_id, host FROM sandboxes WHERE id = $1", 1, p);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not look the sandbox up");
        char host[128] = "";
        bool known = PQntuples(res) == 1;
        bool theirs = known && strcmp(PQgetvalue(res, 0, 0), r->caller.account) == 0;
        if (known)
                snprintf(host, sizeof(host), "%s", PQgetvalue(res, 0, 1));
        PQclear(res);
        req_db_release(r);
        if (known && !theirs)
                return api_fail(err, 404, "not_found", "id", "no sandbox %s", r->id);
        struct vmm_hosts *hosts = req_vmm_hosts(r);
        int h = known ? vmm_hosts_find(hosts, host) : -1;
        if (h >= 0) {
                int rc = ask(r, h, ret, err);
                if (rc == 0)
                        *ret_host = h;
                return rc;
        }
        for (h = 0; h < vmm_hosts_count(hosts); h++) {
                if (!vmm_hosts_ready(hosts, h))
                        continue;
                json_t *sb = NULL;
                struct api_error e = { 0 };
                if (ask(r, h, &sb, &e) == 0) {
                        *ret_host = h;
                        *ret = sb;
                        return 0;
                }
        }
        /* The ledger names a host none of ours has answered as (down since we started). */
        if (known && *host)
                return api_fail(err, 502, "vmm_unavailable", NULL, "the sandbox's host (%s) does not answer", host);
        return api_fail(err, 404, "not_found", "id", "no sandbox %s", r->id);
}

/* 402 while key is blocked today; names the limit. */
static int check_block(struct api_req *r, const char *key, struct api_error *err)
{
        const char *p[] = { key, r->caller.account };
        PGresult *res = db_query(req_db(r), "check a block", PGRES_TUPLES_OK,
                                 "SELECT k.daily_limit_nanodollars, k.limit_policy, "
                                 "       coalesce((SELECT nanodollars FROM spend_daily WHERE key_id = $1 "
                                 "                 AND day = account_day($2, now())), 0) "
                                 "FROM key_blocks b LEFT JOIN api_keys k ON k.id = b.key_id "
                                 "WHERE b.key_id = $1 AND b.account_id = $2 AND b.day = account_day($2, now())",
                                 2, p);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not check the key's daily limit");
        int rc = 0;
        if (PQntuples(res) > 0)
                rc = api_fail(err, 402, "limit_reached", NULL,
                              "key %s reached its daily spend limit of %s nano-dollars today (the account's day; spent %s): no "
                              "sandbox may start or resume for it until a person raises the limit or the day ends",
                              key, PQgetisnull(res, 0, 0) ? "(removed)" : PQgetvalue(res, 0, 0),
                              PQgetvalue(res, 0, 2));
        PQclear(res);
        return rc;
}

/* ---- per-key caps (key_caps.c): sandboxes not stopped, and their memory ---- */

/* A key's check and its create or fork run under one of these, so two requests
 * of one key cannot both take its last place. (Several tally-api instances
 * each have their own: a key's requests spread over N of them at the same
 * instant can pass a cap by at most N - 1 sandboxes.) */
#define CAP_STRIPES 64
static pthread_mutex_t cap_locks[CAP_STRIPES] = { [0 ... CAP_STRIPES - 1] = PTHREAD_MUTEX_INITIALIZER };

static pthread_mutex_t *cap_lock(const char *key)
{
        unsigned h = 2166136261u;
        for (const char *p = key; *p; p++)
                h = (h ^ (unsigned char)*p) * 16777619u;
        return &cap_locks[h % CAP_STRIPES];
}

static int count_against_caps(struct api_req *r, const char *key, int64_t max_n, int64_t max_mem, int64_t add_n,
                              int64_t add_mem_mib, struct api_error *err)
{
        char path[160];
        snprintf(path, sizeof(path), "/v1/sandboxes?account=%s", r->caller.account);
        int64_t n = 0, mem = 0;
        struct vmm_hosts *hosts = req_vmm_hosts(r);
        for (int h = 0; h < vmm_hosts_count(hosts); h++) {
                if (vmm_hosts_retired(hosts, h))
                        continue;
                json_t *j = NULL, *sb;
                long st = vmm_hosts_call(hosts, h, "GET", path, NULL, VMM_CALL_SHORT_MS, &j);
                if (st != 200) {
                        json_decref(j);
                        if (st == -EBUSY)
                                return vmm_hosts_error(st, NULL, err);
                        return api_fail(err, 502, "vmm_unavailable", NULL,
                                        "a sandbox host does not answer: the key's caps cannot be checked");
                }
                size_t i;
                json_array_foreach(json_object_get(j, "sandboxes"), i, sb) {
                        const char *k = json_string_value(json_object_get(sb, "key"));
                        const char *state = json_string_value(json_object_get(sb, "state"));
                        if (!k || strcmp(k, key) != 0 || !state || strcmp(state, "stopped") == 0)
                                continue;
                        n++;
                        mem += json_integer_value(json_object_get(sb, "memory_mib"));
                }
                json_decref(j);
        }
        if (max_n >= 0 && n + add_n > max_n)
                return api_fail(err, 409, "cap_reached", "max_sandboxes",
                                "key %s may hold at most %lld sandboxes at once (a cap a person of the account set); "
                                "it holds %lld, and this asks for %lld more",
                                key, (long long)max_n, (long long)n, (long long)add_n);
        if (max_mem >= 0 && mem + add_mem_mib > max_mem)
                return api_fail(err, 409, "cap_reached", "max_memory_mib",
                                "key %s may hold at most %lld MiB of sandbox memory at once (a cap a person of the "
                                "account set); it holds %lld MiB, and this asks for %lld MiB more",
                                key, (long long)max_mem, (long long)mem, (long long)add_mem_mib);
        return 0;
}

/* 409 when the key's sandboxes not stopped (on every host), plus add_n more of
 * add_mem_mib memory in all, would pass a cap a person set. A key with a cap
 * gets its cap_lock in *ret_lock, held: the caller unlocks it once the create
 * or fork has answered (NULL for a key without caps). */
static int check_caps(struct api_req *r, const char *key, int64_t add_n, int64_t add_mem_mib,
                      pthread_mutex_t **ret_lock, struct api_error *err)
{
        int64_t max_n, max_mem;
        *ret_lock = NULL;
        if (key_caps_read(req_db(r), r->caller.account, key, &max_n, &max_mem) < 0)
                return api_fail(err, 503, "database_unavailable", NULL, "could not read the key's caps");
        if (max_n < 0 && max_mem < 0)
                return 0;
        pthread_mutex_t *lock = cap_lock(key);
        pthread_mutex_lock(lock);
        int rc = count_against_caps(r, key, max_n, max_mem, add_n, add_mem_mib, err);
        if (rc < 0)
                pthread_mutex_unlock(lock);
        else
                *ret_lock = lock;
        return rc;
}

/* Whether a create's (or a sandbox's) "network" asks for internet: true, or
 * {"internet": true, ...}. The vmm checks the rest of its form. */
static bool wants_internet(const json_t *net)
{
        return json_is_true(net) || (json_is_object(net) && json_is_true(json_object_get(net, "internet")));
}

/* 403 unless a person of the account allowed key's sandboxes internet. */
static int check_internet(struct api_req *r, const char *key, struct api_error *err)
{
        const char *p[] = { key, r->caller.account };
        PGresult *res = db_query(req_db(r), "check a key's internet permission", PGRES_TUPLES_OK,
                                 "SELECT internet FROM api_keys WHERE id = $1 AND account_id = $2", 2, p);
        if (!res)
                return api_fail(err, 503, "database_unavailable", NULL, "could not check the key's internet permission");
        bool ok = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
        PQclear(res);
        if (ok)
                return 0;
        return api_fail(err, 403, "internet_not_allowed", "network",
                        "key %s may not give its sandboxes internet: a person of the account allows it per key "
                        "(PUT /v1/keys/%s/internet); without it a sandbox's network is its loopback only",
                        key, key);
}

/* Drops what only the host should know (its folders, pids, cgroup paths)
 * from a sandbox, or from each sandbox of a {"sandboxes": [...]} answer. */
static void scrub(json_t *j)
{
        static const char *const host_only[] = { "dir", "pid", "cgroup_cpu", "cgroup_memory", "cgroup_version", NULL };
        json_t *list = json_object_get(j, "sandboxes");
        if (json_is_array(list)) {
                size_t i;
                json_t *sb;
                json_array_foreach(list, i, sb) scrub(sb);
                return;
        }
        for (const char *const *k = host_only; *k; k++)
                json_object_del(j, *k);
}

/* The answer for a vmm call: its body on success (status ok), else the error. */
static int forward(long st, json_t *j, int ok, struct api_reply *out, struct api_error *err)
{
        if (st != ok) {
                int rc = vmm_hosts_error(st, j, err);
                json_decref(j);
                return rc;
        }
        if (j)
                scrub(j);
        return reply_json(out, ok, j ? j : json_object());
}

static int check_type(json_t *body, const char *name, json_type t, struct api_error *err, const char *what)
{
        json_t *v = json_object_get(body, name);
        if (v && json_typeof(v) != t && !(t == JSON_TRUE && json_is_boolean(v)))
                return api_fail(err, 400, "invalid_field", name, "%s must be %s", name, what);
        return 0;
}

/* A create whose caller hung up while it ran (a client that gave up on a
 * slow host) made a sandbox whose id nobody received: it is stopped at once,
 * never left running and billed. With an Idempotency-Key the answer is kept
 * for the caller's retry (idempotency.c), which gets this very sandbox: it
 * stays. Returns whether it was stopped. */
static bool stop_if_abandoned(struct api_req *r, struct vmm_hosts *hosts, int h, json_t *created)
{
        const char *id = json_string_value(json_object_get(created, "id"));
        if (!id || req_header(r, "Idempotency-Key") || !req_client_gone(r))
                return false;
        char path[160];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        json_t *j = NULL;
        long st = vmm_hosts_call(hosts, h, "DELETE", path, NULL, VMM_CALL_SHORT_MS, &j);
        json_decref(j);
        log_warn("create abandoned by its client: its sandbox is stopped", "sandbox=%s account=%s key=%s status=%ld",
                 id, r->caller.account, r->caller.key, st);
        return true;
}

int h_sandboxes_create(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "vcpus", "memory_mib", "disk_mib", "labels", "timeout_s", "network",
                                               "command", "image", "backend", NULL };
        int rc;
        if ((rc = body_check_fields(r->json, allowed, err)) < 0 ||
            (rc = check_type(r->json, "vcpus", JSON_INTEGER, err, "an integer")) < 0 ||
            (rc = check_type(r->json, "memory_mib", JSON_INTEGER, err, "an integer")) < 0 ||
            (rc = check_type(r->json, "disk_mib", JSON_INTEGER, err, "an integer")) < 0 ||
            (rc = check_type(r->json, "timeout_s", JSON_INTEGER, err, "an integer")) < 0 ||
            (rc = check_type(r->json, "labels", JSON_OBJECT, err, "an object of strings")) < 0 ||
            (rc = check_type(r->json, "image", JSON_STRING, err, "a string")) < 0 ||
            (rc = check_type(r->json, "backend", JSON_STRING, err, "a string")) < 0)
                return rc;
        json_t *cmd = json_object_get(r->json, "command");
        if (cmd && !json_is_string(cmd) && !json_is_array(cmd))
                return api_fail(err, 400, "invalid_field", "command", "command must be a string or an array of strings");
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(r->json, "labels"), k, v) {
                if (!json_is_string(v))
                        return api_fail(err, 400, "invalid_field", "labels", "label %.64s must be a string", k);
        }
        json_t *net = json_object_get(r->json, "network");
        if (net && !json_is_boolean(net) && !json_is_object(net))
                return api_fail(err, 400, "invalid_field", "network",
                                "network must be false, true or {\"internet\": bool, \"allow\": [names]}");
        if ((rc = check_block(r, r->caller.key, err)) < 0)
                return rc;
        if (wants_internet(net) && (rc = check_internet(r, r->caller.key, err)) < 0)
                return rc;
        /* the vmm's default size when none is asked (the most it gives) */
        json_t *m = json_object_get(r->json, "memory_mib");
        pthread_mutex_t *lock;
        if ((rc = check_caps(r, r->caller.key, 1, m ? json_integer_value(m) : 512, &lock, err)) < 0)
                return rc;
        req_db_release(r); /* a create may take a while: no connection held meanwhile */
        json_t *spec = r->json ? json_deep_copy(r->json) : json_object();
        json_object_set_new(spec, "account", json_string(r->caller.account));
        json_object_set_new(spec, "key", json_string(r->caller.key));
        /* The create's id on its host: a call that ends with no answer is
         * cancelled there by it (vmm_hosts_cancel_create). */
        char rid[40] = "";
        unsigned char raw[16];
        if (getrandom(raw, sizeof(raw), 0) == (ssize_t)sizeof(raw)) {
                for (size_t i = 0; i < sizeof(raw); i++)
                        snprintf(rid + 2 * i, 3, "%02x", raw[i]);
                json_object_set_new(spec, "request_id", json_string(rid));
        }
        const int64_t bound_ms = req_config(r)->vmm_create_timeout_s * 1000;
        /* A host known down is skipped; a create that failed before its sandbox
         * could exist (nothing sent, or the host refused for capacity or
         * readiness) goes once more to another ready host. */
        struct vmm_hosts *hosts = req_vmm_hosts(r);
        json_t *j = NULL;
        json_t *vc = json_object_get(r->json, "vcpus"), *dm = json_object_get(r->json, "disk_mib");
        const struct vmm_want want = { vc ? json_integer_value(vc) : 1, m ? json_integer_value(m) : 512,
                                       dm ? json_integer_value(dm) : 1024 };
        int h = vmm_hosts_next(hosts, -1, &want);
        long st = h < 0 ? -EHOSTDOWN : vmm_hosts_call(hosts, h, "POST", "/v1/sandboxes", spec, bound_ms, &j);
        if (h >= 0 && (st == -EBUSY || st == -ENOTCONN || st == 503 || st == 507)) {
                int other = vmm_hosts_next(hosts, h, &want);
                if (other >= 0) {
                        log_info("create retried on another host", "from=%d to=%d status=%ld", h, other, st);
                        json_decref(j);
                        j = NULL;
                        st = vmm_hosts_call(hosts, other, "POST", "/v1/sandboxes", spec, bound_ms, &j);
                        h = other;
                }
        }
        if (lock)
                pthread_mutex_unlock(lock);
        json_decref(spec);
        if ((st == -ETIMEDOUT || st == -EIO) && *rid)
                vmm_hosts_cancel_create(hosts, h, rid);
        if (st == -EHOSTDOWN)
                return api_fail(err, 503, "no_host", NULL,
                                "no sandbox host takes creates now (each is down or draining); retry later");
        if (st == 201)
                vmm_hosts_promise(hosts, h, &want);
        if (st == 201)
                log_info("sandbox created", "sandbox=%s account=%s key=%s",
                         json_string_value(json_object_get(j, "id")), r->caller.account, r->caller.key);
        if (st == 201 && stop_if_abandoned(r, hosts, h, j)) {
                /* (a client that only half-closed still reads this: never a 201 for a stopped sandbox) */
                json_decref(j);
                return api_fail(err, 409, "abandoned", NULL,
                                "the caller hung up before the sandbox was ready: it was stopped");
        }
        return forward(st, j, 201, out, err);
}

static bool label_match(json_t *labels, const char *filter)
{
        char buf[512];
        snprintf(buf, sizeof(buf), "%s", filter);
        char *eq = strchr(buf, '=');
        if (eq)
                *eq = '\0';
        const char *v = json_string_value(json_object_get(labels, buf));
        return v && (!eq || strcmp(v, eq + 1) == 0);
}

static int by_id(const void *a, const void *b)
{
        const char *x = json_string_value(json_object_get(*(json_t *const *)a, "id"));
        const char *y = json_string_value(json_object_get(*(json_t *const *)b, "id"));
        return strcmp(x ? x : "", y ? y : "");
}

int h_sandboxes_list(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        const char *state = req_param(r, "state"), *cursor = req_param(r, "cursor"), *limit = req_param(r, "limit");
        long n = 100;
        if (limit) {
                char *end;
                n = strtol(limit, &end, 10);
                if (*end || n < 1 || n > 1000)
                        return api_fail(err, 400, "invalid_field", "limit", "limit must be an integer from 1 to 1000");
        }
        if (cursor && !id_valid(cursor))
                return api_fail(err, 400, "invalid_field", "cursor", "cursor is not one this server gave");
        if (state) {
                char buf[256];
                snprintf(buf, sizeof(buf), "%s", state);
                char *save = NULL;
                for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
                        if (strcmp(t, "running") != 0 && strcmp(t, "paused") != 0 && strcmp(t, "stopped") != 0)
                                return api_fail(err, 400, "invalid_field", "state",
                                                "state must be running, paused or stopped (several: comma-separated)");
        }
        /* every label=K=V given must match (repeated parameters come joined with commas) */
        const char *labels = req_param(r, "label");
        req_db_release(r);
        char path[160];
        snprintf(path, sizeof(path), "/v1/sandboxes?account=%s", r->caller.account);
        /* A host down or not answering is left out and named in
         * hosts_not_answering: the others' sandboxes are still listed. */
        json_t *all = json_array(), *missing = json_array();
        struct vmm_hosts *hosts = req_vmm_hosts(r);
        for (int h = 0; h < vmm_hosts_count(hosts); h++) {
                if (vmm_hosts_retired(hosts, h))
                        continue;
                json_t *j = NULL;
                long st = vmm_hosts_ready(hosts, h) ? vmm_hosts_call(hosts, h, "GET", path, NULL, VMM_CALL_SHORT_MS, &j)
                                                    : -ENOTCONN;
                if (st != 200) {
                        json_decref(j);
                        json_array_append_new(missing, vmm_hosts_describe(hosts, h));
                        continue;
                }
                size_t i;
                json_t *sb;
                json_array_foreach(json_object_get(j, "sandboxes"), i, sb) {
                        const char *acct = json_string_value(json_object_get(sb, "account"));
                        const char *id = json_string_value(json_object_get(sb, "id"));
                        if (!acct || strcmp(acct, r->caller.account) != 0 || !id)
                                continue;
                        /* an API key lists what it created (api.h's rule for every list); a person, the account's */
                        const char *key = json_string_value(json_object_get(sb, "key"));
                        if (r->caller.key[0] && (!key || strcmp(key, r->caller.key) != 0))
                                continue;
                        if (cursor && strcmp(id, cursor) <= 0)
                                continue;
                        if (state) {
                                const char *s = json_string_value(json_object_get(sb, "state"));
                                char buf[256];
                                snprintf(buf, sizeof(buf), ",%s,", state);
                                char want[32];
                                snprintf(want, sizeof(want), ",%s,", s ? s : "");
                                if (!strstr(buf, want))
                                        continue;
                        }
                        bool ok = true;
                        if (labels) {
                                char buf[1024];
                                snprintf(buf, sizeof(buf), "%s", labels);
                                char *save = NULL;
                                for (char *t = strtok_r(buf, ",", &save); t && ok; t = strtok_r(NULL, ",", &save))
                                        ok = label_match(json_object_get(sb, "labels"), t);
                        }
                        if (ok) {
                                scrub(sb);
                                json_array_append(all, sb);
                        }
                }
                json_decref(j);
        }
        size_t total = json_array_size(all);
        json_t **items = calloc(total ? total : 1, sizeof(json_t *));
        for (size_t i = 0; i < total; i++)
                items[i] = json_array_get(all, i);
        qsort(items, total, sizeof(json_t *), by_id);
        json_t *page = json_array();
        for (size_t i = 0; i < total && i < (size_t)n; i++)
                json_array_append(page, items[i]);
        json_t *next = total > (size_t)n ? json_string(json_string_value(json_object_get(items[n - 1], "id")))
                                         : json_null();
        free(items);
        json_decref(all);
        return reply_json(out, 200, json_pack("{s:o, s:o, s:o}", "sandboxes", page, "next_cursor", next,
                                              "hosts_not_answering", missing));
}

int h_sandbox_get(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        int h, rc;
        json_t *sb;
        if ((rc = find(r, &h, &sb, err)) < 0)
                return rc;
        /* Its cost so far, from the ledger: each meter's usage times the rate in
         * force for its hour, summed exactly over one common denominator (the
         * vCPU-hour base divides the GiB-hour base 2^30 times) and rounded once
         * by tally_round_div (sql/006), as spend_daily is. */
        const char *p[] = { r->id, r->caller.account };
        PGresult *res = db_query(req_db(r), "cost a sandbox", PGRES_TUPLES_OK,
                                 "SELECT coalesce(tally_round_div("
                                 "  sum(cpu_ns::numeric * rate_at(account_plan(account_id), 'cpu', hour))"
                                 "    * 1073741824 * meter_unit_base('storage')"
                                 "+ sum(mem_byte_ns * rate_at(account_plan(account_id), 'memory', hour)) * meter_unit_base('storage')"
                                 "+ sum(storage_byte_ns * rate_at(account_plan(account_id), 'storage', hour))"
                                 "    * meter_unit_base('memory'),"
                                 "  meter_unit_base('memory') * meter_unit_base('storage')), 0)::bigint "
                                 "FROM usage_hourly WHERE sandbox_id = $1 AND account_id = $2",
                                 2, p);
        if (res) {
                json_object_set_new(sb, "cost_nanodollars", json_integer(strtoll(PQgetvalue(res, 0, 0), NULL, 10)));
                PQclear(res);
        } else {
                json_object_set_new(sb, "cost_nanodollars", json_null());
        }
        scrub(sb);
        return reply_json(out, 200, sb);
}

/* Finds the sandbox, then runs an action on its host. check: the action
 * spends, refused while the sandbox's key or the calling key is blocked
 * today; copies: a fork of that many copies, within its key's caps. */
static int act(struct api_req *r, const char *method, const char *action, json_t *body, int ok, bool check,
               int copies, struct api_reply *out, struct api_error *err)
{
        int h, rc;
        json_t *sb;
        if ((rc = find(r, &h, &sb, err)) < 0)
                return rc;
        char key[EVENT_ID_MAX + 1];
        snprintf(key, sizeof(key), "%s", json_string_value(json_object_get(sb, "key")) ?: "");
        if (check && ((rc = check_block(r, key, err)) < 0 ||
                      (r->caller.key[0] && strcmp(r->caller.key, key) != 0 &&
                       (rc = check_block(r, r->caller.key, err)) < 0))) {
                json_decref(sb);
                return rc;
        }
        /* A fork's copies get the source's network and its key: the key must still have the permission. */
        if (check && strcmp(action, "fork") == 0 && wants_internet(json_object_get(sb, "network")) &&
            (rc = check_internet(r, key, err)) < 0) {
                json_decref(sb);
                return rc;
        }
        pthread_mutex_t *lock = NULL;
        if (copies > 0 &&
            (rc = check_caps(r, key, copies, copies * json_integer_value(json_object_get(sb, "memory_mib")), &lock,
                             err)) < 0) {
                json_decref(sb);
                return rc;
        }
        json_decref(sb);
        req_db_release(r);
        char path[160];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s%s%s", r->id, *action ? "/" : "", action);
        int64_t bound = VMM_CALL_SHORT_MS;
        if (strcmp(action, "exec") == 0)
                bound = json_integer_value(json_object_get(body, "timeout_ms")) + VMM_CALL_EXEC_MARGIN_MS;
        else if (strcmp(action, "fork") == 0)
                bound = VMM_CALL_FORK_MS;
        json_t *j = NULL;
        long st = vmm_hosts_call(req_vmm_hosts(r), h, method, path, body, bound, &j);
        if (lock)
                pthread_mutex_unlock(lock);
        return forward(st, j, ok, out, err);
}

int h_sandbox_delete(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        if (r->json)
                return api_fail(err, 400, "unknown_field", "body", "DELETE takes no body");
        return act(r, "DELETE", "", NULL, 200, false, 0, out, err);
}

int h_sandbox_pause(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { NULL };
        int rc = body_check_fields(r->json, allowed, err);
        return rc < 0 ? rc : act(r, "POST", "pause", NULL, 200, false, 0, out, err);
}

int h_sandbox_resume(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { NULL };
        int rc = body_check_fields(r->json, allowed, err);
        return rc < 0 ? rc : act(r, "POST", "resume", NULL, 200, true, 0, out, err);
}

int h_sandbox_exec(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "command", "stdin", "timeout_ms", "output_cap", NULL };
        int rc;
        if (!r->json)
                return api_fail(err, 400, "missing_field", "command", "command is required");
        if ((rc = body_check_fields(r->json, allowed, err)) < 0 ||
            (rc = check_type(r->json, "stdin", JSON_STRING, err, "a string")) < 0 ||
            (rc = check_type(r->json, "timeout_ms", JSON_INTEGER, err, "an integer")) < 0 ||
            (rc = check_type(r->json, "output_cap", JSON_INTEGER, err, "an integer")) < 0)
                return rc;
        json_t *cmd = json_object_get(r->json, "command");
        if (!cmd || (!json_is_string(cmd) && !json_is_array(cmd)))
                return api_fail(err, 400, "invalid_field", "command", "command must be a string or an array of strings");
        /* tally-api bounds its wait by the exec's own timeout: one it does not
         * give is the vmm's default exec_timeout_ms, said explicitly. */
        if (!json_object_get(r->json, "timeout_ms"))
                json_object_set_new(r->json, "timeout_ms", json_integer(EXEC_TIMEOUT_DEFAULT_MS));
        return act(r, "POST", "exec", r->json, 200, true, 0, out, err);
}

int h_sandbox_fork(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "count", NULL };
        int rc;
        if ((rc = body_check_fields(r->json, allowed, err)) < 0)
                return rc;
        json_t *c = json_object_get(r->json, "count");
        if (c && (!json_is_integer(c) || json_integer_value(c) < 1 || json_integer_value(c) > 10))
                return api_fail(err, 400, "invalid_field", "count", "count must be an integer from 1 to 10");
        return act(r, "POST", "fork", r->json, 201, true, c ? (int)json_integer_value(c) : 1, out, err);
}

int h_sandbox_timeout(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "timeout_s", NULL };
        int rc;
        if ((rc = body_check_fields(r->json, allowed, err)) < 0)
                return rc;
        json_t *t = json_object_get(r->json, "timeout_s");
        if (!t || !json_is_integer(t) || json_integer_value(t) < 1 || json_integer_value(t) > 31536000)
                return api_fail(err, 400, "invalid_field", "timeout_s", "timeout_s must be an integer from 1 to 31536000");
        return act(r, "POST", "timeout", r->json, 200, true, 0, out, err);
}
