/* client.h — the one client of a tally-vmm's HTTP API (docs/vmm.md), over the
 * daemon's unix socket or over TCP with mutual TLS: `tally-vmm COMMAND`
 * (cli.c) and tally-api (api/vmm_hosts.c) both speak to the daemon through it.
 *
 * How a daemon is reached — its address, how long a connect may take — lives
 * here and only here: a client is made once per daemon with its options and
 * used for every call to it. The client never logs or prints: it returns the
 * reason a call failed, and each caller reports it its own way (the CLI on
 * stderr, tally-api in its log) and maps the daemon's answers to its own
 * errors. Calls on one client may run on several threads at once. */
#pragma once

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct vmm_client_options {
        /* A daemon that does not accept a connection within this is down
         * (0: libcurl's own bound). An answer itself may take as long as the
         * command it runs: the daemon bounds an exec's time, not the client. */
        int64_t connect_timeout_ms;
        /* An https:// address only (all three required there; paths, copied):
         * the client's certificate and key, and the CA that signs the
         * daemons' certificates — the only CA trusted, never the system's. */
        const char *tls_cert;
        const char *tls_key;
        const char *tls_ca;
        /* The name the daemon's certificate must carry (its host_id), copied;
         * NULL: the address's host. The connection goes to the address all
         * the same: the name is only checked. */
        const char *tls_name;
        /* The whole call — connect, request, answer — within this (0: no
         * bound); vmm_client_call_within sets it per call. */
        int64_t timeout_ms;
};

struct vmm_client;

/* A client of the daemon at address (copied): a unix socket's path, or
 * https://ADDRESS:PORT ([IPV6]:PORT) with opt's TLS files. Returns 0 and
 * *ret (vmm_client_free it), -EINVAL for an empty path, a malformed https
 * address or one without the TLS files, or -ENOMEM. */
int vmm_client_new(const char *address, const struct vmm_client_options *opt, struct vmm_client **ret);
/* Accepts NULL. */
void vmm_client_free(struct vmm_client *c);
/* The address the client was made with (for the caller's messages). */
const char *vmm_client_address(const struct vmm_client *c);

/* One request: method, path from the root ("/v1/sandboxes?account=a") and a
 * JSON body (borrowed; NULL sends none). Returns the daemon's HTTP status
 * with *ret its decoded JSON answer — NULL when the answer is empty or not
 * JSON; strings may hold NUL (an exec's output) — yours to json_decref. When
 * the call fails, returns with why filled (libcurl's reason) -ENOTCONN when
 * nothing was sent (the daemon refused or did not accept: it did nothing),
 * -ETIMEDOUT when the request went but no answer came within the total
 * bound, -EIO for another failure after sending, or -ENOMEM; *ret is then
 * not written. */
long vmm_client_call(struct vmm_client *c, const char *method, const char *path, const json_t *body, json_t **ret,
                     char *why, size_t whylen);
/* The same with the whole call bounded by timeout_ms (0: none) instead of
 * the client's timeout_ms option. */
long vmm_client_call_within(struct vmm_client *c, int64_t timeout_ms, const char *method, const char *path,
                            const json_t *body, json_t **ret, char *why, size_t whylen);
