/* egress_http.c — the egress proxy's HTTP (see egress_http.h). */
#include "egress_http.h"
#include "netpolicy.h"
#include "timeutil.h"

#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define HEAD_WAIT_MS 10000

int egress_write_all(int fd, const char *buf, size_t len, int wait_ms)
{
        while (len > 0) {
                ssize_t w = send(fd, buf, len, MSG_NOSIGNAL);
                if (w > 0) {
                        buf += w;
                        len -= (size_t)w;
                        continue;
                }
                if (w < 0 && errno != EAGAIN && errno != EINTR)
                        return -errno;
                struct pollfd p = { fd, POLLOUT, 0 };
                int pr = poll(&p, 1, wait_ms);
                if (pr == 0)
                        return -ETIMEDOUT;
                if (pr < 0 && errno != EINTR)
                        return -errno;
        }
        return 0;
}

void egress_reply(int fd, int status, const char *text, const char *detail)
{
        char buf[512];
        int n = snprintf(buf, sizeof(buf),
                         "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: %zu\r\n"
                         "\r\n%s\n",
                         status, text, strlen(detail) + 1, detail);
        if (n > 0 && (size_t)n < sizeof(buf))
                egress_write_all(fd, buf, (size_t)n, 1000);
}

/* Splits "host:port" (IPv6 as "[addr]:port"); def_port when no port. */
static bool split_authority(char *auth, char **ret_host, int *ret_port, int def_port)
{
        char *host = auth, *colon;
        if (*auth == '[') {
                char *end = strchr(auth, ']');
                if (!end)
                        return false;
                *end = '\0';
                host = auth + 1;
                colon = end[1] == ':' ? end + 1 : NULL;
                if (!colon && end[1])
                        return false;
        } else {
                colon = strrchr(auth, ':');
        }
        int port = def_port;
        if (colon) {
                *colon = '\0';
                char *endp;
                long p = strtol(colon + 1, &endp, 10);
                if (*endp || p < 1 || p > 65535)
                        return false;
                port = (int)p;
        }
        if (!*host || strlen(host) > NET_NAME_MAX)
                return false;
        for (char *c = host; *c; c++)
                *c = (char)tolower((unsigned char)*c);
        *ret_host = host;
        *ret_port = port;
        return true;
}

/* Reads the request's head (up to the blank line). Returns its length (the
 * bytes after it, *ret_len - head, are the body's start), or -1. */
static ssize_t read_head(int fd, char *buf, size_t cap, size_t *ret_len)
{
        size_t len = 0;
        int64_t until = time_mono_ns() / NS_PER_MS + HEAD_WAIT_MS;
        while (len < cap - 1) {
                int left = (int)(until - time_mono_ns() / NS_PER_MS);
                if (left <= 0)
                        return -1;
                struct pollfd p = { fd, POLLIN, 0 };
                if (poll(&p, 1, left) <= 0)
                        continue;
                ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
                if (n <= 0) {
                        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                                continue;
                        return -1;
                }
                len += (size_t)n;
                buf[len] = '\0';
                char *end = strstr(buf, "\r\n\r\n");
                if (end) {
                        *ret_len = len;
                        return end + 4 - buf;
                }
        }
        return -1;
}

/* A header's value in the head (case-insensitive name), copied to out. */
static bool header(const char *head, const char *name, char *out, size_t outlen)
{
        size_t nl = strlen(name);
        for (const char *l = strstr(head, "\r\n"); l && l[2] != '\r'; l = strstr(l + 2, "\r\n")) {
                const char *s = l + 2;
                if (strncasecmp(s, name, nl) == 0 && s[nl] == ':') {
                        s += nl + 1;
                        while (*s == ' ' || *s == '\t')
                                s++;
                        const char *e = strstr(s, "\r\n");
                        size_t n = e ? (size_t)(e - s) : strlen(s);
                        if (n >= outlen)
                                return false;
                        memcpy(out, s, n);
                        out[n] = '\0';
                        while (n > 0 && (out[n - 1] == ' ' || out[n - 1] == '\t'))
                                out[--n] = '\0';
                        return true;
                }
        }
        return false;
}


int egress_request_read(int fd, struct egress_request *r, const char **ret_detail)
{
        r->len = 0;
        ssize_t hl = read_head(fd, r->head, sizeof(r->head), &r->len);
        if (hl < 0) {
                *ret_detail = "tally egress: no complete request head";
                return -EPROTO;
        }
        r->head_len = (size_t)hl;
        r->eol = strstr(r->head, "\r\n");
        size_t line_len = (size_t)(r->eol - r->head);
        char line[EGRESS_HEAD_MAX];
        memcpy(line, r->head, line_len);
        line[line_len] = '\0';
        if (sscanf(line, "%15s %8191s %15s", r->method, r->target, r->version) != 3 ||
            strncmp(r->version, "HTTP/1.", 7) != 0) {
                *ret_detail = "tally egress: not an HTTP/1 request";
                return -EPROTO;
        }
        r->tunnel = strcmp(r->method, "CONNECT") == 0;
        r->host = NULL;
        r->path = "/";
        r->port = 0;
        if (r->tunnel) {
                snprintf(r->auth, sizeof(r->auth), "%s", r->target);
                if (!strchr(r->auth, ':') || !split_authority(r->auth, &r->host, &r->port, 0) || r->port == 0) {
                        *ret_detail = "tally egress: CONNECT needs host:port";
                        return -EPROTO;
                }
        } else if (strncasecmp(r->target, "http://", 7) == 0) {
                char *a = r->target + 7, *slash = strchr(a, '/');
                size_t al = slash ? (size_t)(slash - a) : strlen(a);
                memcpy(r->auth, a, al);
                r->auth[al] = '\0';
                r->path = slash ? slash : "/";
                if (strchr(r->auth, '@') || !split_authority(r->auth, &r->host, &r->port, 80)) {
                        *ret_detail = "tally egress: a bad URL";
                        return -EPROTO;
                }
        } else if (r->target[0] == '/' && header(r->head, "Host", r->auth, sizeof(r->auth))) {
                r->path = r->target;
                if (!split_authority(r->auth, &r->host, &r->port, 80)) {
                        *ret_detail = "tally egress: a bad Host header";
                        return -EPROTO;
                }
        } else {
                *ret_detail = "tally egress: CONNECT host:port, or http:// requests only";
                return -EPROTO;
        }
        return 0;
}
