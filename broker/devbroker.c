/* devbroker.c — see devbroker.h.
 *
 * librdkafka's mock brokers listen on ports they pick. To offer a port the
 * user chooses, a small relay listens there and forwards each connection to
 * broker 1; after bootstrap, clients follow the metadata to the brokers' own
 * addresses, all on 127.0.0.1. */
#include "devbroker.h"
#include "kafka.h"
#include "log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct devbroker {
        rd_kafka_t *rk; /* bookkeeping handle the mock cluster needs */
        rd_kafka_mock_cluster_t *mc;
        int brokers;
        int partitions;
        char bootstrap[64];
        int64_t keep_bytes, keep_batches; /* limits in force per partition */
        int64_t *low;              /* first offset last seen per usage partition */
        bool down;                 /* a `down` fault is in force: no watermark queries until `up` */
        struct sockaddr_in target; /* broker 1's own listener */
        int listen_fd;
        pthread_t relay_thread;
        atomic_bool stopping;
};

static const char *const topics[] = { TOPIC_USAGE, TOPIC_CONTROL };

/* ---- the mock's per-partition limits ----
 *
 * librdkafka 2.0.2's mock cluster keeps DEVBROKER_KEEP_BYTES / _BATCHES per
 * partition and offers no call to change them (later versions neither). The
 * structures below mirror the start of its private ones (rdkafka_mock_int.h
 * at v2.0.2) exactly as far as the limits; they are used only on that very
 * version, and only after every partition of both topics is found where and
 * as expected (its id, its topic, the default limits). Anything else leaves
 * the mock untouched and the broker says the mock's own limits. */
struct mock202_list { /* rd_list_t */
        int size, cnt;
        void **elems;
        void (*free_cb)(void *);
        int flags, elemsize;
        void *p;
};
struct mock202_partition { /* rd_kafka_mock_partition_t */
        void *link_next, **link_prev;
        int32_t id;
        int64_t start_offset, end_offset, follower_start_offset, follower_end_offset;
        uint8_t update_follower_start_offset, update_follower_end_offset; /* rd_bool_t */
        void *msgsets_first, **msgsets_last;
        size_t size, cnt, max_size, max_cnt;
        void *committed_first, **committed_last;
        void *leader, **replicas;
        int replica_cnt;
        struct mock202_list pidstates;
        int32_t follower_id;
        struct mock202_topic *topic;
};
struct mock202_topic { /* rd_kafka_mock_topic_t */
        struct mock202_topic *link_next, **link_prev;
        char *name;
        struct mock202_partition *partitions;
        int partition_cnt;
};
struct mock202_cluster { /* rd_kafka_mock_cluster_t, its start */
        char id[32];
        rd_kafka_t *rk;
        int32_t controller_id;
        void *brokers_first, **brokers_last;
        int broker_cnt;
        struct mock202_topic *topics_first, **topics_last;
        int topic_cnt;
};

/* Sets every partition of tally's topics to keep bytes / batches. Returns 0,
 * or -ENOTSUP (nothing changed) when the mock is not the one mirrored above. */
static int set_limits(struct devbroker *b, int64_t bytes, int64_t batches)
{
        if (rd_kafka_version() != 0x020002ff)
                return -ENOTSUP;
        struct mock202_cluster *c = (struct mock202_cluster *)b->mc;
        if (c->rk != b->rk || c->topic_cnt != (int)(sizeof(topics) / sizeof(topics[0])))
                return -ENOTSUP;
        int found = 0;
        /* Checked whole before anything is written. */
        for (int pass = 0; pass < 2; pass++) {
                int i = 0;
                for (struct mock202_topic *t = c->topics_first; t && i < c->topic_cnt; t = t->link_next, i++) {
                        bool ours = false;
                        for (size_t k = 0; t->name && k < sizeof(topics) / sizeof(topics[0]); k++)
                                ours = ours || strcmp(t->name, topics[k]) == 0;
                        if (!ours || t->partition_cnt != b->partitions || !t->partitions)
                                return -ENOTSUP;
                        for (int p = 0; p < t->partition_cnt; p++) {
                                struct mock202_partition *mp = &t->partitions[p];
                                if (pass == 0 && (mp->id != p || mp->topic != t ||
                                                  mp->max_size != DEVBROKER_KEEP_BYTES ||
                                                  mp->max_cnt != DEVBROKER_KEEP_BATCHES))
                                        return -ENOTSUP;
                                if (pass == 1) {
                                        /* Aligned word stores: the mock thread reads them at its next append. */
                                        __atomic_store_n(&mp->max_size, (size_t)bytes, __ATOMIC_RELAXED);
                                        __atomic_store_n(&mp->max_cnt, (size_t)batches, __ATOMIC_RELAXED);
                                }
                        }
                        found += pass == 0;
                }
                if (found != c->topic_cnt)
                        return -ENOTSUP;
        }
        return 0;
}

void devbroker_limits(const struct devbroker *b, int64_t *bytes, int64_t *batches)
{
        *bytes = b->keep_bytes;
        *batches = b->keep_batches;
}

/* Copies bytes both ways until either side closes. */
static void *relay_connection(void *arg)
{
        int *fds = arg;
        struct pollfd p[2] = { { fds[0], POLLIN, 0 }, { fds[1], POLLIN, 0 } };
        char buf[65536];
        for (;;) {
                if (poll(p, 2, -1) < 0) {
                        if (errno == EINTR)
                                continue;
                        break;
                }
                bool done = false;
                for (int i = 0; i < 2 && !done; i++) {
                        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                                continue;
                        ssize_t n = read(p[i].fd, buf, sizeof(buf));
                        if (n <= 0) {
                                done = true;
                                break;
                        }
                        for (ssize_t off = 0; off < n;) {
                                ssize_t w = write(p[1 - i].fd, buf + off, (size_t)(n - off));
                                if (w <= 0) {
                                        done = true;
                                        break;
                                }
                                off += w;
                        }
                }
                if (done)
                        break;
        }
        close(fds[0]);
        close(fds[1]);
        free(fds);
        return NULL;
}

static void *relay_accept(void *arg)
{
        struct devbroker *b = arg;
        while (!atomic_load(&b->stopping)) {
                int c = accept4(b->listen_fd, NULL, NULL, SOCK_CLOEXEC);
                if (c < 0) {
                        if (errno == EINTR || errno == ECONNABORTED)
                                continue;
                        break; /* the listener was shut down */
                }
                int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (s < 0 || connect(s, (struct sockaddr *)&b->target, sizeof(b->target)) < 0) {
                        if (s >= 0)
                                close(s);
                        close(c); /* broker down: the client sees a refused bootstrap */
                        continue;
                }
                int *fds = malloc(2 * sizeof(int));
                pthread_t t;
                if (!fds) {
                        close(c);
                        close(s);
                        continue;
                }
                fds[0] = c;
                fds[1] = s;
                if (pthread_create(&t, NULL, relay_connection, fds) != 0) {
                        close(c);
                        close(s);
                        free(fds);
                        continue;
                }
                pthread_detach(t);
        }
        return NULL;
}

static int start_relay(struct devbroker *b, int port, char *err, size_t errlen)
{
        /* The mock's bootstrap list starts with broker 1: "127.0.0.1:NNNNN,..." */
        const char *boot = rd_kafka_mock_cluster_bootstraps(b->mc);
        const char *colon = strchr(boot, ':');
        if (!colon) {
                snprintf(err, errlen, "unexpected mock bootstrap list \"%s\"", boot);
                return -EPROTO;
        }
        b->target.sin_family = AF_INET;
        b->target.sin_port = htons((uint16_t)atoi(colon + 1));
        b->target.sin_addr.s_addr = htonl(INADDR_LOOPBACK);

        b->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (b->listen_fd < 0)
                return -errno;
        int one = 1;
        setsockopt(b->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        if (bind(b->listen_fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(b->listen_fd, 128) < 0) {
                int e = errno;
                snprintf(err, errlen, "could not listen on 127.0.0.1:%d: %s", port, strerror(e));
                return -e;
        }
        if (pthread_create(&b->relay_thread, NULL, relay_accept, b) != 0) {
                snprintf(err, errlen, "could not start the relay thread");
                return -EAGAIN;
        }
        snprintf(b->bootstrap, sizeof(b->bootstrap), "127.0.0.1:%d", port);
        return 0;
}

int devbroker_start(const struct devbroker_options *opt, struct devbroker **ret, char *err, size_t errlen)
{
        struct devbroker *b = calloc(1, sizeof(*b));
        if (!b)
                return -ENOMEM;
        b->listen_fd = -1;
        b->brokers = opt->brokers;
        b->partitions = opt->partitions;
        int r;
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set(conf, "log_level", "3", NULL, 0);
        b->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, errlen);
        if (!b->rk) {
                rd_kafka_conf_destroy(conf);
                r = -EINVAL;
                goto fail;
        }
        b->mc = rd_kafka_mock_cluster_new(b->rk, opt->brokers);
        if (!b->mc) {
                snprintf(err, errlen, "could not create the mock cluster");
                r = -EIO;
                goto fail;
        }
        for (size_t i = 0; i < sizeof(topics) / sizeof(topics[0]); i++) {
                rd_kafka_resp_err_t e = rd_kafka_mock_topic_create(b->mc, topics[i], opt->partitions,
                                                                   opt->brokers < 3 ? opt->brokers : 3);
                if (e) {
                        snprintf(err, errlen, "could not create topic %s: %s", topics[i], rd_kafka_err2str(e));
                        r = -EIO;
                        goto fail;
                }
        }
        b->keep_bytes = DEVBROKER_KEEP_BYTES;
        b->keep_batches = DEVBROKER_KEEP_BATCHES;
        if ((opt->keep_bytes && opt->keep_bytes != DEVBROKER_KEEP_BYTES) ||
            (opt->keep_batches && opt->keep_batches != DEVBROKER_KEEP_BATCHES)) {
                int64_t bytes = opt->keep_bytes ? opt->keep_bytes : DEVBROKER_KEEP_BYTES;
                int64_t batches = opt->keep_batches ? opt->keep_batches : DEVBROKER_KEEP_BATCHES;
                if (set_limits(b, bytes, batches) == 0) {
                        b->keep_bytes = bytes;
                        b->keep_batches = batches;
                } else {
                        log_warn("could not change the development broker's limits: this librdkafka's mock cluster"
                                 " is not the one tally knows; its own limits stay",
                                 "librdkafka=%s keep_bytes_per_partition=%d keep_batches_per_partition=%d",
                                 rd_kafka_version_str(), DEVBROKER_KEEP_BYTES, DEVBROKER_KEEP_BATCHES);
                }
        }
        /* The bookkeeping handle also reads the cluster's watermarks (devbroker_watch). */
        rd_kafka_brokers_add(b->rk, rd_kafka_mock_cluster_bootstraps(b->mc));
        b->low = calloc((size_t)opt->partitions, sizeof(*b->low));
        if (!b->low) {
                r = -ENOMEM;
                goto fail;
        }
        if (opt->port > 0) {
                if ((r = start_relay(b, opt->port, err, errlen)) < 0)
                        goto fail;
        } else {
                snprintf(b->bootstrap, sizeof(b->bootstrap), "%s", rd_kafka_mock_cluster_bootstraps(b->mc));
        }
        *ret = b;
        return 0;
fail:
        devbroker_free(b);
        return r;
}

const char *devbroker_bootstrap(const struct devbroker *b) { return b->bootstrap; }

int devbroker_command(struct devbroker *b, const char *line, char *reply, size_t replylen)
{
        char cmd[32] = "";
        long a1 = -1, a2 = -1, a3 = -1;
        int n = sscanf(line, "%31s %ld %ld %ld", cmd, &a1, &a2, &a3);
        rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR_NO_ERROR;
        if (n >= 1 && strcmp(cmd, "ping") == 0) {
                snprintf(reply, replylen, "ok");
                return 0;
        }
        if (n >= 1 && strcmp(cmd, "topics") == 0) {
                snprintf(reply, replylen, "ok %s=%d %s=%d", TOPIC_USAGE, b->partitions, TOPIC_CONTROL,
                         b->partitions);
                return 0;
        }
        if (n >= 1 && strcmp(cmd, "watermarks") == 0) {
                size_t len = (size_t)snprintf(reply, replylen, "ok");
                for (int32_t p = 0; p < b->partitions && len < replylen; p++) {
                        int64_t lo = -1, hi = -1;
                        rd_kafka_query_watermark_offsets(b->rk, TOPIC_USAGE, p, &lo, &hi, 5000);
                        len += (size_t)snprintf(reply + len, replylen - len, " %d=%lld..%lld", p, (long long)lo,
                                                (long long)hi);
                }
                return 0;
        }
        if (n >= 1 && (strcmp(cmd, "down") == 0 || strcmp(cmd, "up") == 0)) {
                int32_t id = n >= 2 ? (int32_t)a1 : -1;
                /* rd_kafka_mock_broker_set_down(-1) is documented but 2.0 only
                 * matches real ids, so walk them. */
                for (int32_t i = 1; i <= b->brokers && !e; i++)
                        if (id < 0 || id == i)
                                e = cmd[0] == 'd' ? rd_kafka_mock_broker_set_down(b->mc, i)
                                                  : rd_kafka_mock_broker_set_up(b->mc, i);
                b->down = cmd[0] == 'd';
        } else if (n == 4 && strcmp(cmd, "error") == 0 && a3 > 0) {
                rd_kafka_resp_err_t errs[1000];
                size_t cnt = a3 > 1000 ? 1000 : (size_t)a3;
                for (size_t i = 0; i < cnt; i++)
                        errs[i] = (rd_kafka_resp_err_t)a2;
                rd_kafka_mock_push_request_errors_array(b->mc, (int16_t)a1, cnt, errs);
        } else if (n == 2 && strcmp(cmd, "clear") == 0) {
                rd_kafka_mock_clear_request_errors(b->mc, (int16_t)a1);
        } else if (n >= 2 && strcmp(cmd, "rtt") == 0 && a1 >= 0) {
                for (int32_t i = 1; i <= b->brokers && !e; i++)
                        if (n < 3 || a2 == i)
                                e = rd_kafka_mock_broker_set_rtt(b->mc, i, (int)a1);
        } else {
                snprintf(reply, replylen,
                         "error unknown command (down [ID], up [ID], error APIKEY ERRCODE COUNT, clear APIKEY, "
                         "rtt MS [ID], topics, watermarks, ping)");
                return -EINVAL;
        }
        if (e) {
                snprintf(reply, replylen, "error %s", rd_kafka_err2str(e));
                return -EINVAL;
        }
        snprintf(reply, replylen, "ok");
        return 0;
}

void devbroker_watch(struct devbroker *b)
{
        /* While a fault holds a broker down, a query would only wait out its
         * timeout and hold up the next fault command (the test's `up`). */
        if (b->down)
                return;
        for (int32_t p = 0; p < b->partitions; p++) {
                int64_t lo = -1, hi = -1;
                if (rd_kafka_query_watermark_offsets(b->rk, TOPIC_USAGE, p, &lo, &hi, 200) != 0 || lo <= b->low[p])
                        continue;
                log_warn("development broker dropped messages to stay within its memory limit",
                         "topic=%s partition=%d dropped_from=%lld dropped_to=%lld keep_bytes=%lld keep_batches=%lld",
                         TOPIC_USAGE, p, (long long)b->low[p], (long long)lo - 1, (long long)b->keep_bytes,
                         (long long)b->keep_batches);
                b->low[p] = lo;
        }
}

void devbroker_free(struct devbroker *b)
{
        if (!b)
                return;
        atomic_store(&b->stopping, true);
        if (b->listen_fd >= 0) {
                shutdown(b->listen_fd, SHUT_RDWR);
                if (b->relay_thread)
                        pthread_join(b->relay_thread, NULL);
                close(b->listen_fd);
        }
        if (b->mc)
                rd_kafka_mock_cluster_destroy(b->mc);
        if (b->rk)
                rd_kafka_destroy(b->rk);
        free(b->low);
        free(b);
}
