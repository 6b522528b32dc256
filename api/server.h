/* server.h — tally-api's insides, shared by its own files: the settings, the
 * database pool, the workers, the request as handlers see it and the
 * handlers of each area (auth.c, keys.c, sandboxes.c, idempotency.c, ...).
 * The server's own parts have a header each (router.h, dispatch.h, http.h,
 * csrf.h, ratelimit.h, metrics.h, access_log.h, janitor.h, vmm_hosts.h). The
 * read handlers see only api.h: nothing here is part of that contract. */
#pragma once

#include "api.h"

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct api_config {
        char *database_url;
        char *listen_address;
        int64_t port;
        char *vmm_sockets;
        char *vmm_tls_cert;
        char *vmm_tls_key;
        char *vmm_tls_ca;
        int64_t vmm_calls_per_host;
        int64_t vmm_create_timeout_s;
        bool vmm_registry;
        int64_t threads;
        int64_t max_connections;
        int64_t per_ip_connections;
        int64_t connection_timeout_s;
        int64_t body_max_bytes;
        int64_t db_pool_size;
        int64_t statement_timeout_ms;
        int64_t session_ttl_s;
        bool cookie_secure;
        int64_t rate_per_s;
        int64_t rate_burst;
        int64_t signin_max_failures;
        int64_t signin_window_s;
        int64_t idempotency_wait_ms;
        int64_t workers;
        int64_t workers_per_key;
        int64_t workers_per_account;
        int64_t queue_per_account;
        int64_t queue_max;
        char *log_level;
};

/* ---- pool.c: a fixed set of libpq connections shared by the request threads ---- */
struct db_pool;
/* Opens size connections. Returns 0 and *ret, or a negative errno with err filled. */
/* statement_timeout_ms: every statement on the pool's connections is cancelled past it (0: none). */
int db_pool_new(const char *url, int size, int64_t statement_timeout_ms, struct db_pool **ret, char *err,
                size_t errlen);
/* Waits for a free connection (reconnecting one that broke). Never NULL. */
PGconn *db_pool_get(struct db_pool *p);
/* Reconnects c, a connection of p found broken, as a new session of the pool
 * (its statement bound set again). Returns whether it is connected. */
bool db_pool_reset(struct db_pool *p, PGconn *c);
/* Returns c; a connection left inside a transaction is rolled back first. */
void db_pool_put(struct db_pool *p, PGconn *c);
void db_pool_free(struct db_pool *p);
void db_pool_stats(struct db_pool *p, int *ret_size, int *ret_in_use, uint64_t *ret_waits);

/* ---- workers.c: the threads that run requests waiting on a tally-vmm ---- */
struct work_limits {
        int64_t workers;           /* threads */
        int64_t per_key;           /* jobs running at once for one key (or person) ... */
        int64_t per_account;       /* ... and for one account (below workers) */
        int64_t queue_per_account; /* jobs one account may have waiting */
        int64_t queue_max;         /* jobs waiting in all */
};

/* A job: the caller's (account, who) — who is a key id or "person:ID" — and
 * what to run. run is called exactly once, on a worker (cancelled false), or
 * at stop for a job that never started (cancelled true). The job's memory
 * is the submitter's and must live until run returns. */
struct work_job {
        struct work_job *next;
        char account[EVENT_ID_MAX + 1];
        char who[EVENT_ID_MAX + 8];
        void (*run)(struct work_job *j, bool cancelled);
};

struct work_pool;
/* Starts lim->workers threads. Returns 0 and *ret, or a negative errno with err filled. */
int work_pool_new(const struct work_limits *lim, struct work_pool **ret, char *err, size_t errlen);
/* Queues j. Returns 0, or -EBUSY when the account's queue or the whole queue
 * is full (j is not taken), -ENOMEM. */
int work_pool_submit(struct work_pool *p, struct work_job *j);
void work_pool_stats(struct work_pool *p, int *ret_running, int *ret_queued);
/* Cancels what waits, then waits up to wait_ms for what runs. Returns true
 * when p was freed; false when a job still runs (p is left to the process's
 * exit). Accepts NULL. */
bool work_pool_free(struct work_pool *p, int64_t wait_ms);

/* ---- the request as handlers see it ---- */
#define API_MAX_PARAMS 32

struct api_server;

struct api_req {
        struct api_server *srv;
        const char *method;
        const char *path;
        char route[96];            /* "METHOD PATTERN" of the route matched, "" if none */
        char id[EVENT_ID_MAX + 1]; /* the {id} of the route, "" if none */
        const char *body;          /* NUL-terminated, "" when none */
        size_t body_len;
        json_t *json;              /* the parsed body of a POST/PUT, NULL when empty */
        struct api_caller caller;
        char ip[64];
        void *conn;                /* struct MHD_Connection * */
        PGconn *db;                /* held while the request runs; use req_db() */
        int nparams;
        const char *param_names[API_MAX_PARAMS];
        const char *param_values[API_MAX_PARAMS];
        char *joined[API_MAX_PARAMS]; /* repeated parameters joined with commas */
        bool param_used[API_MAX_PARAMS]; /* looked up by the handler (req_param) */
        const char *param_bad;     /* the first parameter holding a NUL or invalid UTF-8, NULL if none */
        bool params_over;          /* more than API_MAX_PARAMS were sent */
};

/* What a handler answers: status and a malloc'd body (the server frees it),
 * plus up to two extra headers ("Set-Cookie: ...", "Retry-After: ..."). */
struct api_reply {
        int status;
        char *body;
        size_t len;
        const char *content_type;
        char headers[2][512];
        /* A top-level field of body holding a secret shown once ("key" of a
         * new API key): never stored for an Idempotency-Key replay. */
        const char *secret_field;
};

typedef int (*api_handler_fn)(struct api_req *r, struct api_reply *out, struct api_error *err);

/* ---- request.c ---- */
/* A connection for r, taken from the pool on first use and held until the
 * request ends (or req_db_release). */
PGconn *req_db(struct api_req *r);
void req_db_release(struct api_req *r);
/* A request header, NULL when absent. */
const char *req_header(struct api_req *r, const char *name);
/* Whether the caller hung up while its request ran (a worker runs it with
 * the connection suspended): nobody will read the answer. */
bool req_client_gone(struct api_req *r);
/* A cookie sent with the request, NULL when absent. */
const char *req_cookie(struct api_req *r, const char *name);
/* One query parameter, repeated ones joined with commas; NULL when absent. */
const char *req_param(void *r, const char *name);
const struct api_config *req_config(struct api_req *r);
/* The hosts' tally-vmm daemons (vmm_hosts.h). */
struct vmm_hosts *req_vmm_hosts(struct api_req *r);

/* Fills out with json (stolen) as the body. Returns 0. */
int reply_json(struct api_reply *out, int status, json_t *json);
/* Fills out (200) with what a read handler made (b's data stolen); a CSV
 * answer is offered as a download named csv_name (Content-Disposition). */
int reply_body(struct api_reply *out, struct api_body *b, const char *csv_name);
/* Refuses a body field that is not in allowed (NULL-terminated). Returns 0 or api_fail. */
int body_check_fields(json_t *body, const char *const *allowed, struct api_error *err);
/* Runs a parameterized statement (text parameters); returns the result when
 * its status is want, else logs "could not <what>", clears it and returns NULL. */
PGresult *db_query(PGconn *db, const char *what, ExecStatusType want, const char *sql, int n,
                   const char *const *params);
/* The ids every tally table uses: [A-Za-z0-9_.:-]{1,64}. */
bool id_valid(const char *s);
/* Whether method writes (anything but GET and HEAD). */
bool req_is_write(const char *method);
/* Reads r's query parameters as libmicrohttpd decoded them into r->param_*
 * (a NUL or invalid UTF-8 in one sets r->param_bad; past API_MAX_PARAMS,
 * r->params_over). */
void req_collect_query(struct api_req *r);

/* ---- server.c: the parts a request reaches, made by api_server_start and
 * read-only after (each part is thread-safe on its own) ---- */
struct api_server {
        const struct api_config *cfg;
        struct db_pool *pool;
        struct work_pool *workers;
        struct vmm_hosts *hosts;       /* vmm_hosts.h */
        struct ratelimit *rate;        /* ratelimit.h */
        struct api_metrics *metrics;   /* metrics.h */
        struct http_server *http;      /* http.h */
        struct janitor *janitor;       /* janitor.h; NULL if its thread could not start */
};

/* Starts the HTTP server. Returns 0 and *ret, or a negative errno with err filled. */
int api_server_start(const struct api_config *cfg, struct api_server **ret, char *err, size_t errlen);
/* The TCP port it listens on (useful with port 0). */
int api_server_port(struct api_server *s);
void api_server_stop(struct api_server *s);

/* ---- router.c ---- */
/* The route table, for the OpenAPI check: the i-th route's pattern (with
 * "{id}") and *ret_method; NULL past the last. */
const char *api_route(size_t i, const char **ret_method);

/* ---- auth.c: secrets, people, sessions ---- */
#define API_KEY_PREFIX_LEN 11 /* "tk_" + 8 characters shown in lists */
/* A fresh secret: n random bytes (OpenSSL RAND_bytes) as lowercase hex into out
 * (2n+1 bytes). Returns 0 or -EIO. */
int secret_hex(char *out, size_t n);
/* SHA-256 of s as 64 hex characters + NUL. */
void sha256_hex(const char *s, size_t len, char out[65]);
/* A new API key "tk_<48 hex>" (192 random bits) into out (at least 52 bytes). */
int api_key_generate(char *out, size_t size);
/* A yescrypt hash of password (malloc'd). Returns 0 or a negative errno. */
int password_hash(const char *password, char **ret);
/* Whether password matches the crypt(3) string stored (constant time; stored may be NULL). */
bool password_verify(const char *password, const char *stored);
/* Finds the caller from Authorization: Bearer or the session cookie. Returns
 * 0 (caller filled), or api_fail with 401. For a session, *ret_csrf_hash gets
 * the CSRF token's hash (65 bytes). */
int auth_resolve(struct api_req *r, char ret_csrf_hash[65], struct api_error *err);
/* Forgets a key's cached verification (call after revoking it). */
void auth_cache_forget_key(const char *key);

int h_session_create(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_session_get(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_session_delete(struct api_req *r, struct api_reply *out, struct api_error *err);

/* ---- keys.c ---- */
/* Creates a key for account (made by actor, "person:ID" or "admin"): fills
 * *ret with its row and the secret (shown once). Runs its own transaction. */
int key_create(PGconn *db, const char *account, const char *actor, const char *name, json_t *limit,
               const char *policy, json_t **ret, struct api_error *err);
/* Reads a limit and a policy (JSON, as a body gives them): the limit an
 * integer in [0, 10^18] or null (ret_limit "" = none), the policy pause, stop
 * or alert_only (ret_policy "" = unchanged). 0 or -errno with err filled. */
int key_limit_parse(json_t *lim, json_t *pol, bool limit_required, char ret_limit[24], char ret_policy[16],
                    struct api_error *err);
/* Sets key_id's daily limit (lim "" = none) and policy (pol "" = unchanged) in
 * account, audited as actor's 'key.limit', and lifts today's block when the key
 * may spend again, in one transaction: *ret is the key with
 * spend_today_nanodollars, block_lifted and blocked_today. */
int key_limit_set(PGconn *db, const char *account, const char *key_id, const char *actor, const char *lim,
                  const char *pol, json_t **ret, struct api_error *err);
int h_keys_list(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_keys_create(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_key_get(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_key_revoke(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_key_limit_put(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_key_limit_delete(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_key_caps_get(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_key_caps_put(struct api_req *r, struct api_reply *out, struct api_error *err);
/* key_caps.c: a key's caps (-1 for none): sandboxes not stopped, their memory
 * summed. Returns 0, or -EAGAIN when the database cannot answer. */
int key_caps_read(PGconn *db, const char *account, const char *key, int64_t *ret_sandboxes, int64_t *ret_memory_mib);
int h_key_internet_put(struct api_req *r, struct api_reply *out, struct api_error *err);

/* ---- account.c ---- */
/* *ret (the caller's to json_decref): the account's time zone, today's date in
 * it, the instants today starts and ends, its hours and the zone's UTC offset now. */
int account_settings_read(PGconn *db, const char *account, json_t **ret, struct api_error *err);
/* Sets the account's time zone (account_set_time_zone, sql/017: validated,
 * the account's days rebuilt, audited as actor) in one transaction; ret_old is
 * the zone it had. 400 for a zone PostgreSQL does not know, 404 for no account. */
int account_time_zone_set(PGconn *db, const char *account, const char *zone, const char *actor, char ret_old[64],
                          struct api_error *err);
int h_account_settings_get(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_account_settings_put(struct api_req *r, struct api_reply *out, struct api_error *err);

/* ---- sandboxes.c ---- */
int h_sandboxes_list(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_sandboxes_create(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_sandbox_get(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_sandbox_delete(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_sandbox_exec(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_sandbox_pause(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_sandbox_resume(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_sandbox_fork(struct api_req *r, struct api_reply *out, struct api_error *err);
int h_sandbox_timeout(struct api_req *r, struct api_reply *out, struct api_error *err);

/* static.c's and destinations.c's handlers: static.h, destinations.h. */

/* ---- idempotency.c ---- */
enum idem_result {
        IDEM_RUN,    /* no earlier request: run it, then idem_finish */
        IDEM_REPLAY, /* out holds the stored answer */
};
/* For a write with an Idempotency-Key: takes the (account, caller, route, key) row as a lock
 * in its own committed transaction, or replays, or refuses (422 another
 * request, 409 still running after the wait). Returns IDEM_RUN, IDEM_REPLAY or
 * a negative errno with err filled. */
int idem_begin(struct api_req *r, const char *key, struct api_reply *out, struct api_error *err);
/* Stores the answer, without its secret_field's value (a 5xx, 402, 409 or
 * 429 deletes the row instead, so a retry runs again). */
void idem_finish(struct api_req *r, const char *key, const struct api_reply *out);
