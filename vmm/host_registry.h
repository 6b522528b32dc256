/* host_registry.h — tally-vmm's heartbeat into PostgreSQL's host registry
 * (sql/021_host_registry.sql): every HOST_REGISTRY_INTERVAL_MS it upserts this
 * host's row — where tally-api reaches it, its capacity and ratios, what it
 * has promised now, its live sandboxes — and PostgreSQL dates it (now()). A
 * host silent for host_heartbeat_bound() (15 s) counts as down.
 *
 * It must never slow the host's real work: it runs on a thread of its own
 * with a connection of its own (never the spend-limit check's), each statement
 * bounded (statement_timeout, connect_timeout, TCP keepalives), reconnecting
 * with a growing pause while the database is away, and it logs a failure at
 * most once a minute. It never writes the operator's state (draining): its
 * role may not (sql/021's grants). A stopped tally-vmm marks nothing: its
 * heartbeat ages and the host reads `down`. */
#pragma once

#include "capacity.h"

#include <stdint.h>

/* Every beat: one upsert. Three missed beats are host_heartbeat_bound(). */
#define HOST_REGISTRY_INTERVAL_MS 5000
/* While the database fails: 1 s after the first failure, doubling, at most this. */
#define HOST_REGISTRY_BACKOFF_MAX_MS 30000

/* What one beat reports, filled by the caller's sample function. */
struct host_registry_report {
        struct capacity capacity;       /* host capacity (before the ratios) and the ratios */
        struct capacity_use promised;   /* live sandboxes' and creates under way */
        int live;                       /* sandboxes running or paused */
};

/* Fills *ret with the host's figures now. Called on the heartbeat's thread,
 * never after host_registry_stop has returned. */
typedef void (*host_registry_sample_fn)(void *arg, struct host_registry_report *ret);

struct host_registry_settings {
        const char *database_url; /* the registry's database (role tally_vmm or a member) */
        const char *host_id;
        const char *address;      /* what tally-api dials (https://ADDRESS:PORT); NULL or "": none said */
};

struct host_registry;

/* Starts the heartbeat; the first beat is at once. Strings are copied.
 * Returns 0 or -errno. */
int host_registry_start(const struct host_registry_settings *s, host_registry_sample_fn sample, void *arg,
                        struct host_registry **ret);

/* Ends the heartbeat, waiting for its thread until deadline_mono_ns: a thread
 * stuck in a database call past it is left (and its memory with it), but
 * calls sample no more. Marks nothing in the database. Accepts NULL. */
void host_registry_stop(struct host_registry *r, int64_t deadline_mono_ns);

/* The address tally-api should dial, from the settings: host_registry_address
 * when given, else https://TLS_LISTEN when tls_listen names an address (a
 * wildcard such as 0.0.0.0 or [::] names none), else "" (the host says none).
 * Writes at most size bytes into buf; returns buf. */
const char *host_registry_address(const char *setting, const char *tls_listen, char *buf, size_t size);
