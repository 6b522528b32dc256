/* storetest.h — what the store's integration tests (test_store_*.c) add to
 * aggtest: reading an aggregator's log and its /metrics page. */
#pragma once

#include "aggtest.h"

#include <stdbool.h>
#include <stdint.h>

/* Does aggregator number n's log (aggregator.N.log) contain what? */
bool store_log_has(struct aggtest *t, int n, const char *what);
/* GET http://127.0.0.1:port/metrics (test_get_metrics): the answer (malloc'd) or NULL. */
char *store_metrics(int port);
/* The value of one sample line ("name" or "name{labels}") on a metrics page, or -1. */
int64_t store_metric(const char *page, const char *series);
/* Runs a query returning one integer (NULL reads as -1). */
int64_t store_int(struct aggtest *t, const char *sql);
/* Produces ev (encoded) or raw bytes (ev NULL) to one partition of usage, keyed by account. */
void store_produce_to(struct aggtest *t, int32_t partition, const struct usage_event *ev);
void store_produce_raw_to(struct aggtest *t, int32_t partition, const char *account, const void *buf, size_t len);
/* Prints the last `bytes` of aggregator n's log to stderr (for a failure). */
void store_log_dump(struct aggtest *t, int n, size_t bytes);
