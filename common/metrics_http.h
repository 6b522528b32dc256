/* metrics_http.h — a /metrics page over HTTP (Prometheus text format), served
 * by libmicrohttpd's own thread. The daemons give the page; this module only
 * answers requests and must never change what the page says. */
#pragma once

#include <stddef.h>

/* The largest page any daemon serves (the body buffer of one request). */
#define METRICS_HTTP_PAGE_MAX 16384

/* Writes the page into buf (size bytes); returns its length or a negative
 * errno (-ENOBUFS: it does not fit). Called on the HTTP thread: it may only
 * read what the daemon's loop writes. */
typedef int (*metrics_http_page_fn)(const void *arg, char *buf, size_t size);

struct metrics_http;

/* Listens on address:port (IPv4; port 0: not at all, *ret = NULL) and answers
 * GET or HEAD /metrics with page(arg, buf, page_size), page_size at most
 * METRICS_HTTP_PAGE_MAX. Returns 0 or -EINVAL (address), -ENOMEM, -EADDRINUSE. */
int metrics_http_start(const char *address, int port, metrics_http_page_fn page, const void *arg, size_t page_size,
                       struct metrics_http **ret);
/* Accepts NULL. */
void metrics_http_stop(struct metrics_http *m);
