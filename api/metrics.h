/* metrics.h — tally-api's /metrics: requests answered by route and status, a
 * latency histogram per route, and the gauges of the parts it reads when
 * asked (the database pool, the workers, the alert outbox). Counting is
 * lock-free: any HTTP thread or worker counts as it answers. */
#pragma once

#include "server.h"

#include <stddef.h>
#include <stdint.h>

struct api_metrics;

/* Counters for nroutes routes plus one slot for requests that matched none
 * (index nroutes). Returns 0 and *ret, or -ENOMEM. */
int api_metrics_new(size_t nroutes, struct api_metrics **ret);
/* Accepts NULL. */
void api_metrics_free(struct api_metrics *m);
/* One request answered: route index ri (nroutes: none), its status and its
 * time from the first byte to the answer. */
void api_metrics_count(struct api_metrics *m, size_t ri, int status, int64_t us);

/* GET /metrics: the Prometheus text. Takes no database connection. */
int h_metrics(struct api_req *r, struct api_reply *out, struct api_error *err);
