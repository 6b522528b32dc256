/* storetest.c — see storetest.h. */
#include "storetest.h"

#include "support.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

bool store_log_has(struct aggtest *t, int n, const char *what)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/aggregator.%d.log", t->dir, n);
        char *text = test_read_file(path);
        bool found = text && strstr(text, what);
        free(text);
        return found;
}

int store_free_port(void)
{
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        socklen_t len = sizeof(a);
        int port = -1;
        if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
            getsockname(fd, (struct sockaddr *)&a, &len) == 0)
                port = ntohs(a.sin_port);
        if (fd >= 0)
                close(fd);
        return port;
}

char *store_metrics(int port)
{
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
                if (fd >= 0)
                        close(fd);
                return NULL;
        }
        const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        if (write(fd, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1)) {
                close(fd);
                return NULL;
        }
        size_t cap = 65536, len = 0;
        char *buf = malloc(cap);
        ssize_t n;
        while (buf && (n = read(fd, buf + len, cap - len - 1)) > 0) {
                len += (size_t)n;
                if (len + 1 == cap) {
                        char *b = realloc(buf, cap * 2);
                        if (!b) {
                                free(buf);
                                buf = NULL;
                                break;
                        }
                        buf = b;
                        cap *= 2;
                }
        }
        close(fd);
        if (!buf)
                return NULL;
        buf[len] = '\0';
        char *body = strstr(buf, "\r\n\r\n");
        if (!body || strncmp(buf, "HTTP/1.", 7) != 0 || strncmp(buf + 9, "200", 3) != 0) {
                free(buf);
                return NULL;
        }
        char *out = strdup(body + 4);
        free(buf);
        return out;
}

int64_t store_metric(const char *page, const char *series)
{
        size_t n = strlen(series);
        for (const char *l = page; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
                if (strncmp(l, series, n) == 0 && l[n] == ' ')
                        return strtoll(l + n + 1, NULL, 10);
        return -1;
}

int64_t store_int(struct aggtest *t, const char *sql)
{
        char *v = aggtest_query(t, sql);
        int64_t x = v && *v ? strtoll(v, NULL, 10) : -1;
        free(v);
        return x;
}
