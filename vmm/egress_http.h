/* egress_http.h — the HTTP the egress proxy speaks with a sandbox: one
 * request head read (HTTP CONNECT host:port, or a plain HTTP/1 request in
 * absolute form or with a Host header) and the proxy's own short answers.
 *
 * A request is parsed in place: host, path and eol point into the struct,
 * which is therefore filled where it lives and never copied. Only the head
 * is read here; the bytes after it (the body's start, or a tunnel's first
 * bytes) are head[head_len..len). Nothing here resolves or connects. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#define EGRESS_HEAD_MAX 8192            /* a request's line and headers */

struct egress_request {
        char head[EGRESS_HEAD_MAX + 1]; /* as read, NUL-terminated */
        size_t len;                     /* bytes read */
        size_t head_len;                /* the head's, up to and with its blank line */
        const char *eol;                /* the request line's end in head: the headers follow */
        char method[16];
        char version[16];               /* "HTTP/1.x" */
        char target[EGRESS_HEAD_MAX];
        bool tunnel;                    /* CONNECT */
        char auth[EGRESS_HEAD_MAX];
        char *host;                     /* lower case, in auth */
        int port;
        const char *path;               /* a plain request's origin-form path ("/..."), in target */
};

/* Reads and parses the request head on the sandbox's socket fd (waiting up
 * to 10 s for it). Returns 0, or -EPROTO with *ret_detail the sentence of
 * the 400 answer to give (egress_reply). */
int egress_request_read(int fd, struct egress_request *r, const char **ret_detail);

/* Writes all of buf to the socket fd, waiting up to wait_ms for room each
 * time it is full. 0 or -errno (-ETIMEDOUT). */
int egress_write_all(int fd, const char *buf, size_t len, int wait_ms);

/* Answers status text with detail as a short text/plain body and
 * "Connection: close"; a failure to write is ignored (the caller closes). */
void egress_reply(int fd, int status, const char *text, const char *detail);
