/* spend_limits.h — the spend-limit check a create, a fork and a resume make: is this
 * key blocked for today (invariant 5)? One PostgreSQL connection (common/db.c),
 * made on first use with the limits database URL as given (its user, password
 * and TLS settings: tally-vmm connects as the role that URL names, which needs
 * only SELECT on key_blocks), and made again once when it broke. */
#pragma once

#include <libpq-fe.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* The blocked_key_query setting's default: tally's own key_blocks, on the
 * account's day (sql/017). With it, each new connection's schema is checked
 * (db_check_schema) like every program's; an operator's own query is its own
 * contract with its database. */
#define SPEND_LIMITS_DEFAULT_QUERY                                                                  \
        "SELECT 1 FROM key_blocks WHERE account_id = $1 AND key_id = $2 AND day = account_day($1, now())"

struct spend_limits {
        const char *url;                 /* "" or NULL: no check; borrowed from the settings */
        const char *query;               /* $1 account, $2 key: a row means blocked; borrowed */
        pthread_mutex_t lock;            /* one check at a time on the connection */
        PGconn *db;                      /* NULL until the first check */
};

void spend_limits_init(struct spend_limits *l, const char *url, const char *query);
/* Closes the connection. Accepts a check never used. */
void spend_limits_free(struct spend_limits *l);
/* Whether a database to check against was given. */
bool spend_limits_enabled(const struct spend_limits *l);
/* 0: the key may start sandboxes (or no check is set up); -EACCES: blocked
 * for today; -EAGAIN: unknown (the database is unreachable or the query
 * failed). why says which. */
int spend_limits_check_key(struct spend_limits *l, const char *account, const char *key, char *why, size_t whylen);
