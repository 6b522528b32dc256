/* janitor.h — tally-api's housekeeping thread: every 2 s it reads the host
 * registry's states (a draining host takes no create), and once a minute it
 * removes expired sessions, Idempotency-Key answers older than 24 hours and
 * sign-in windows that ended, and refreshes the alert outbox's gauges for
 * /metrics. It borrows one connection of the pool for each round. */
#pragma once

#include "server.h"

struct janitor;

/* Starts the thread; cfg and pool must outlive it. Returns 0 and *ret, or a
 * negative errno. */
int janitor_start(const struct api_config *cfg, struct db_pool *pool, struct vmm_hosts *hosts, struct janitor **ret);
/* Wakes the thread, waits for its round to end, and frees it. Accepts NULL. */
void janitor_stop(struct janitor *j);
