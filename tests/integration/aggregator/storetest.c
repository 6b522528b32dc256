/* storetest.c — see storetest.h. */
#include "storetest.h"

#include "kafka.h"
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

void store_produce_raw_to(struct aggtest *t, int32_t partition, const char *account, const void *buf, size_t len)
{
        rd_kafka_resp_err_t e;
        while ((e = rd_kafka_producev(t->producer, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_PARTITION(partition),
                                      RD_KAFKA_V_KEY(account, strlen(account)), RD_KAFKA_V_VALUE((void *)buf, len),
                                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)) ==
               RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(t->producer, 10);
        CHECK(e == 0, "produce: %s", rd_kafka_err2str(e));
        rd_kafka_poll(t->producer, 0);
}

void store_produce_to(struct aggtest *t, int32_t partition, const struct usage_event *ev)
{
        char buf[8192];
        struct usage_event created;
        if (aggtest_needs_created(t, ev, &created)) {
                int c = event_encode(&created, buf, sizeof(buf));
                CHECK(c > 0, "encode");
                if (c > 0)
                        store_produce_raw_to(t, partition, created.account, buf, (size_t)c);
        }
        int n = event_encode(ev, buf, sizeof(buf));
        CHECK(n > 0, "encode");
        if (n > 0)
                store_produce_raw_to(t, partition, ev->account, buf, (size_t)n);
}

void store_log_dump(struct aggtest *t, int n, size_t bytes)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/aggregator.%d.log", t->dir, n);
        char *text = test_read_file(path);
        size_t len = text ? strlen(text) : 0;
        fprintf(stderr, "--- %s (last %zu bytes)\n%s\n---\n", path, bytes, text ? text + (len > bytes ? len - bytes : 0) : "");
        free(text);
}
