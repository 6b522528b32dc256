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
        return test_get_metrics(port);
}

int64_t store_metric(const char *page, const char *series)
{
        return test_metric(page, series, false);
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
