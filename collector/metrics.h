/* metrics.h — /metrics over HTTP (Prometheus text format) for tally-collector,
 * served by libmicrohttpd's own thread; it only reads the engine's counters. */
#pragma once

#include <stdint.h>

struct collector;
struct metrics_server;

/* Listens on address:port (port 0: not at all, *ret = NULL). Returns 0 or -errno. */
int metrics_server_start(const struct collector *c, const char *address, int port, struct metrics_server **ret);
void metrics_server_stop(struct metrics_server *m);
