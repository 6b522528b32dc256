/* devbroker.h — the Kafka development broker: librdkafka's mock cluster, which
 * speaks the real Kafka protocol on localhost, with tally's topics created.
 *
 * For development and tests only. It keeps everything in memory and forgets it
 * when it exits; production points every daemon at a real Kafka cluster. */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct devbroker;

/* What librdkafka 2.0's mock cluster keeps per partition (rdkafka_mock.c,
 * not configurable through its API): beyond either limit the oldest producer
 * batches are dropped. With ~250-byte samples that is about 20,000 messages
 * per partition. devbroker_options.keep_bytes / keep_batches raise it (see
 * devbroker_start); devbroker_watch says when messages are dropped. */
#define DEVBROKER_KEEP_BYTES   (5 * 1024 * 1024)
#define DEVBROKER_KEEP_BATCHES 100000

struct devbroker_options {
        int port;          /* bootstrap port on 127.0.0.1; 0: use the mock's own listener */
        int brokers;       /* brokers in the cluster, ids 1..brokers */
        int partitions;    /* partitions of each tally topic */
        int64_t keep_bytes;   /* per partition; 0: the mock's own DEVBROKER_KEEP_BYTES */
        int64_t keep_batches; /* per partition; 0: the mock's own DEVBROKER_KEEP_BATCHES */
};

/* Starts the cluster and creates the usage and control topics.
 * Returns 0 and *ret, or -errno with the reason in err. */
int devbroker_start(const struct devbroker_options *opt, struct devbroker **ret, char *err, size_t errlen);

/* The limits each partition keeps in force (bytes, producer batches): the
 * options' when the mock cluster could be set to them, else the mock's own. */
void devbroker_limits(const struct devbroker *b, int64_t *bytes, int64_t *batches);

/* The bootstrap address clients use, "127.0.0.1:port". Owned by b. */
const char *devbroker_bootstrap(const struct devbroker *b);

/* Carries out one fault-injection command and writes a one-line reply:
 *   down [ID]                 every broker (or broker ID) refuses connections
 *   up [ID]                   they accept connections again
 *   error APIKEY ERRCODE CNT  the next CNT requests of protocol APIKEY fail with ERRCODE
 *   clear APIKEY              drop queued request errors of APIKEY
 *   rtt MS [ID]               delay every response by MS milliseconds
 *   topics                    list the topics and their partition counts
 *   watermarks                each usage partition's first and next offsets: "ok 0=LO..HI 1=LO..HI ..."
 *   ping                      replies "ok"
 * Returns 0 or -EINVAL. */
int devbroker_command(struct devbroker *b, const char *line, char *reply, size_t replylen);

/* Reads each partition's first offset and logs at warning, once per move,
 * when the broker dropped messages to stay within its memory limit
 * (partition, offsets dropped). Call every second or so. */
void devbroker_watch(struct devbroker *b);

/* Stops everything. Accepts NULL. */
void devbroker_free(struct devbroker *b);
