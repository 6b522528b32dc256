/* ratelimit.h — tally-api's per-caller request budget: a token bucket for
 * each authenticated key or person, in memory, per process (the callers are
 * ones the database vouched for, which no stranger can make up; sign-in
 * attempts are counted in PostgreSQL instead, api/auth.c).
 *
 * A fixed table: a caller past its probes takes over the slot it hashes to,
 * which starts full again — a table flooded with callers forgets budgets, it
 * never refuses one caller for another's requests. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct ratelimit;

/* per_s requests a second (at least 1), burst at once. Returns 0 and *ret, or
 * -EINVAL, -ENOMEM. */
int ratelimit_new(int64_t per_s, int64_t burst, struct ratelimit **ret);
/* Accepts NULL. */
void ratelimit_free(struct ratelimit *rl);
/* Takes one request of who's budget. Returns true when allowed; else false
 * with *ret_retry_s, the whole seconds until one is. Thread-safe. */
bool ratelimit_allow(struct ratelimit *rl, const char *who, int64_t *ret_retry_s);
