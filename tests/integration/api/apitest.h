/* apitest.h — what the tally-api integration suites share (test_api.c holds
 * it): a real tally-api over TCP in front of a real tally-vmm (process
 * backend) and PostgreSQL, accounts A and B made with tally-admin, HTTP with
 * libcurl, and the database read directly. */
#pragma once

#include <jansson.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

#include "vmmtest.h"

extern char parent[64], acct_a[64], acct_b[64], email_a[128], email_b[128], email_c[128];
extern char *work, *state, *sock, *db_url, *pwfile;
extern int port;
extern pid_t vmm_pid; /* the tally-vmm at sock (host A) */
extern __thread const char *source_ip; /* this thread's client address on loopback (127.0.0.0/8), NULL: default */
extern __thread long http_timeout_s;    /* this thread's bound on one request (60 s unless set) */
extern PGconn *db;
extern char *api_vmm_sockets; /* tally-api's --vmm-sockets (NULL: sock alone) */

/* keys: id and secret */
struct key {
        char id[64];
        char secret[128];
};
extern struct key key_a, key_a2, key_b, key_rate;

struct session {
        char token[128];
        char csrf[128];
};

struct resp {
        long status;
        char *body;
        json_t *json;
        char retry_after[32];
        char cookie[256];
        bool replayed;
        long ms; /* how long the answer took */
};

size_t on_body(char *p, size_t size, size_t n, void *ud);
/* One request. key (a secret) or s (a session) authenticates; csrf says
 * whether the session's CSRF header goes along; idem: an Idempotency-Key. */
struct resp http_full(const char *method, const char *path, const char *key, const struct session *s, bool csrf,
                      const char *body, const char *idem);
struct resp http(const char *method, const char *path, const char *key, const struct session *s, const char *body);
void resp_free(struct resp *r);
const char *err_code(struct resp *r);
const char *err_field(struct resp *r);
long long sql_int(const char *sql, const char *p1);
void sql_exec(const char *sql, const char *p1, const char *p2);
int admin(char **out, ...);
void make_key(const char *account, const char *name, struct key *k);
struct session sign_in(const char *email, const char *password, long *ret_status);
void create_sandbox(const struct key *k, char *id, size_t size);
/* sandboxes of acct not stopped, as tally-vmm itself lists them */
int vmm_count(const char *acct);
/* GET path of the tally-vmm at socket s, on the socket itself: the HTTP status
 * (0: no answer in 10 s), and the body (malloc'd) in *body when body is not NULL. */
long vmm_get(const char *s, const char *path, char **body);

/* hostile.c: each way one tenant tried to hurt the others, as an attack */
extern const struct test_case hostile_cases[];
extern const size_t hostile_ncases;

/* hosts.c: two tally-vmm hosts, one of which hangs. hosts_prepare starts
 * host B (after test_api.c's host A, before tally-api) and sets
 * api_vmm_sockets; hosts_cases then run. */
void hosts_prepare(void);
/* Before test_api.c starts host A: certificates (scripts/ca) and A's TLS settings. */
void hosts_tls_prepare(void);
extern const struct test_case hosts_cases[];
extern const size_t hosts_ncases;
