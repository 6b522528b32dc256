/* http.h — tally-api's HTTP server: libmicrohttpd listening on the configured
 * address, the request's bytes (URL, header and body bounds: 414, 431, 413
 * before the body is read), the hand-off of slow requests to the workers, the
 * answer with its headers, and each answer counted (metrics.h) and logged
 * (access_log.h). What a request means is dispatch.h's.
 *
 * The server reads srv (its settings, pool, workers, metrics, rate limit) for
 * its whole life: srv must outlive it. */
#pragma once

#include "server.h"

#include <stddef.h>

struct http_server;

/* Listens on cfg's listen_address and port with cfg's limits. Returns 0 and
 * *ret, or a negative errno with err filled (-EINVAL: not an IPv4 or IPv6
 * address; -EADDRINUSE: could not listen). */
int http_start(struct api_server *srv, struct http_server **ret, char *err, size_t errlen);
/* The TCP port it listens on (useful with port 0). */
int http_port(const struct http_server *h);
/* Stops listening and closes every connection, then frees h. Only when no
 * request is on a worker: libmicrohttpd cannot stop with a connection
 * suspended (http_abandon then). Accepts NULL. */
void http_stop(struct http_server *h);
/* Frees h and leaves its libmicrohttpd daemon to the process's exit (a
 * request still runs on a worker). Accepts NULL. */
void http_abandon(struct http_server *h);
