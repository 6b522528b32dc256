/* Integration: the collector's loop sleeps until its tick and wakes for
 * librdkafka only when it has something to serve (collector.c, publish.h's
 * wake_fd). Against the development broker: the publisher's eventfd turns
 * readable when a delivery report is waiting, publisher_poll serves the
 * report and drains it, and it turns readable again for the next one (the
 * queue writes once until it is served). Without the eventfd wired to
 * librdkafka's queue the poll below waits its whole 10 s for nothing. */
#include "collector.h"
#include "metrics.h"
#include "publish.h"
#include "state.h"
#include "support.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Produces one message (no opaque: an ordinary sample as far as the delivery report goes). */
static void produce_one(struct publisher *p, int n)
{
        char value[64];
        int len = snprintf(value, sizeof(value), "{\"wake_test\":%d}", n);
        rd_kafka_resp_err_t e =
                rd_kafka_producev(p->rk, RD_KAFKA_V_TOPIC("usage"), RD_KAFKA_V_KEY("acct_wake", 9),
                                  RD_KAFKA_V_VALUE(value, (size_t)len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                  RD_KAFKA_V_END);
        CHECK(e == RD_KAFKA_RESP_ERR_NO_ERROR, "could not produce: %s", rd_kafka_err2str(e));
}

static bool readable(int fd, int timeout_ms)
{
        struct pollfd pfd = { fd, POLLIN, 0 };
        return poll(&pfd, 1, timeout_ms) == 1 && (pfd.revents & POLLIN);
}

int main(void)
{
        const char *brokers = test_env("TALLY_TEST_BROKERS");
        char *dir = test_tmpdir("collector-wake");
        char state[600], spool[700], err[512];
        snprintf(state, sizeof(state), "%s/state", dir);
        snprintf(spool, sizeof(spool), "%s/" COLLECTOR_DIR, state);
        mkdir(state, 0755);
        mkdir(spool, 0755);
        strcat(spool, "/spool"); /* (where the collector keeps final samples: state.c makes it) */
        mkdir(spool, 0755);
        struct collector_metrics m = { 0 };
        struct publisher p;
        memset(&p, 0, sizeof(p));
        CHECK(publisher_open_spool(&p, state, "host-wake", &m) == 0, "could not open the spool in %s", state);
        CHECK(p.wake_fd == -1, "wake_fd is %d before the producer exists, want -1", p.wake_fd);
        struct collector_options opt = { .brokers = brokers, .state_dir = state, .queue_max = 1000,
                                         .delivery_timeout_ms = 30000, .usage_format = "v1" };
        CHECK(publisher_connect(&p, &opt, err, sizeof(err)) == 0, "could not connect: %s", err);
        CHECK(p.wake_fd >= 0, "no wake_fd after publisher_connect");
        CHECK(!readable(p.wake_fd, 0), "wake_fd readable before anything was produced");

        for (int round = 1; round <= 3; round++) {
                produce_one(&p, round);
                CHECK(readable(p.wake_fd, 10000), "round %d: no wake within 10 s of a produce", round);
                /* The report may be a little behind the wake-up (the write comes with the first item queued). */
                for (int i = 0; i < 100 && M_GET(&m, deliveries_total) < (uint64_t)round; i++) {
                        publisher_poll(&p);
                        if (M_GET(&m, deliveries_total) < (uint64_t)round)
                                readable(p.wake_fd, 100);
                }
                CHECK(M_GET(&m, deliveries_total) == (uint64_t)round, "round %d: %llu delivery reports served",
                      round, (unsigned long long)M_GET(&m, deliveries_total));
                CHECK(M_GET(&m, publish_errors_total) == 0, "round %d: a publish error", round);
                CHECK(!readable(p.wake_fd, 0), "round %d: wake_fd still readable once served", round);
        }
        publisher_close(&p);
        CHECK(p.wake_fd == -1, "wake_fd %d left open after publisher_close", p.wake_fd);
        test_remove_tree(dir);
        free(dir);
        return test_result();
}
