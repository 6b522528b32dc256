/* publish.c — see publish.h. */
#include "publish.h"
#include "encode.h"
#include "log.h"
#include "metrics.h"
#include "timeutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static int produce(struct publisher *p, const char *account, const char *payload, size_t len, void *opaque)
{
        rd_kafka_resp_err_t e = rd_kafka_producev(
                p->rk, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_KEY(account, strlen(account)),
                RD_KAFKA_V_VALUE((void *)payload, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                RD_KAFKA_V_OPAQUE(opaque), RD_KAFKA_V_END);
        if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                return -ENOBUFS;
        if (e) {
                M_ADD(p->m, publish_errors_total, 1);
                log_warn("could not queue a sample", "error=\"%s\"", rd_kafka_err2str(e));
                return -EIO;
        }
        p->outq++;
        return 0;
}

/* An epoch of the collector's own (raised over the record's when the counter
 * went back) is announced with a `restarted` event before any sample under it
 * and again each ANNOUNCE_EVERY_NS while it lasts, so that one announcement
 * lost in a broker outage costs nothing for long: an aggregator bills no epoch
 * the sandbox's host did not announce (docs/events.md, "Provenance"). The
 * vmm announces the record's own epochs. Returns 0, or the -errno of a produce
 * that failed (then the sample waits too). */
#define ANNOUNCE_EVERY_NS (60 * NS_PER_SEC)
static int announce_epoch(struct publisher *p, struct sandbox *s)
{
        if (!epoch_track_is_local(&s->track))
                return 0;
        int64_t now = time_mono_ns();
        if (s->announced_epoch == s->track.epoch && now - s->announced_mono_ns < ANNOUNCE_EVERY_NS)
                return 0;
        char buf[2048];
        int len = encoder_restarted(s, p->host_id, buf, sizeof(buf));
        if (len < 0)
                return len;
        int r = produce(p, s->account, buf, (size_t)len, NULL);
        if (r < 0)
                return r;
        if (s->announced_epoch != s->track.epoch)
                log_info("new epoch announced", "sandbox=%s epoch=%llu reason=%s", s->id,
                         (unsigned long long)s->track.epoch, s->epoch_reason ? s->epoch_reason : "counter_back");
        s->announced_epoch = s->track.epoch;
        s->announced_mono_ns = now;
        return 0;
}

/* Samples waiting for the broker: v1 messages are one each; a batch counts its samples. */
static bool queue_has_room(struct publisher *p)
{
        int64_t waiting = (int64_t)p->outq - (int64_t)p->batch_messages + (int64_t)p->batch_samples +
                          (int64_t)p->batched;
        return waiting < p->queue_max;
}

/* A batch's delivery-report opaque: its sample count, tagged with the low bit
 * (a spool entry's pointer, the other opaque, is aligned). */
#define BATCH_OPAQUE(n) ((void *)(((uintptr_t)(n) << 1) | 1))
#define IS_BATCH_OPAQUE(o) (((uintptr_t)(o)) & 1)
#define BATCH_OPAQUE_COUNT(o) ((size_t)((uintptr_t)(o) >> 1))

static void produce_batch(struct publisher *p, struct batch_out *b)
{
        if (!b->count)
                return;
        int r = produce(p, b->key, (const char *)b->buf, b->len, BATCH_OPAQUE(b->count));
        if (r == 0) {
                p->batch_messages++;
                p->batch_samples += b->count;
        } else {
                M_ADD(p->m, publish_errors_total, 1);
                log_warn("a batch of samples was not queued: the next tick's samples carry the truth",
                         "samples=%zu error=\"%s\"", b->count, strerror(-r));
        }
        p->batched -= b->count;
        b->len = b->count = 0;
}

int publish_batched(struct publisher *p, struct sandbox *s, const struct usage_event *ev)
{
        int32_t n = atomic_load_explicit(&p->partitions, memory_order_relaxed);
        if (n <= 0 || !queue_has_room(p))
                return -EAGAIN;
        if (n > p->nout) {
                struct batch_out *out = realloc(p->out, (size_t)n * sizeof(*out));
                if (!out)
                        return -EAGAIN;
                memset(out + p->nout, 0, (size_t)(n - p->nout) * sizeof(*out));
                p->out = out;
                p->nout = n;
        }
        if (s->partition_of != n) {
                /* librdkafka's own default partitioner (the v1 messages' key goes through it) */
                s->partition = rd_kafka_msg_partitioner_consistent_random(NULL, s->account, strlen(s->account), n,
                                                                           NULL, NULL);
                s->partition_of = n;
        }
        if (announce_epoch(p, s) < 0)
                return -EAGAIN;
        struct batch_out *b = &p->out[s->partition];
        if (!b->buf && !(b->buf = malloc(SAMPLE_BATCH_MAX_BYTES)))
                return -EAGAIN;
        if (b->count && (strcmp(b->host, ev->host) != 0 || b->len + SAMPLE_BATCH_RECORD_MAX > SAMPLE_BATCH_MAX_BYTES))
                produce_batch(p, b);
        if (!b->count) {
                int h = sample_batch_begin(b->buf, SAMPLE_BATCH_MAX_BYTES, ev->host, ev->wall_ns, ev->mono_ns);
                if (h < 0)
                        return -EAGAIN;
                b->len = (size_t)h;
                b->wall_base = ev->wall_ns;
                b->mono_base = ev->mono_ns;
                memcpy(b->host, ev->host, sizeof(b->host));
                memcpy(b->key, s->account, sizeof(b->key));
        }
        int r = sample_batch_record(b->buf + b->len, SAMPLE_BATCH_MAX_BYTES - b->len, b->wall_base, b->mono_base, ev);
        if (r < 0)
                return -EAGAIN;
        b->len += (size_t)r;
        b->count++;
        p->batched++;
        if (s->pending) {
                /* An older sample waited; this newer one carries the truth. */
                s->pending = false;
                p->npending--;
        }
        return 0;
}

void publish_batches(struct publisher *p)
{
        for (int32_t i = 0; i < p->nout; i++)
                produce_batch(p, &p->out[i]);
}

/* librdkafka's default partitioner for keyed messages (consistent_random:
 * CRC-32 of the key modulo the count), noting the count it is given: v2
 * batches group samples by it. Runs on librdkafka's threads too. */
static int32_t partition_by_key(const rd_kafka_topic_t *rkt, const void *key, size_t keylen, int32_t partition_cnt,
                                void *rkt_opaque, void *msg_opaque)
{
        struct publisher *p = rkt_opaque;
        atomic_store_explicit(&p->partitions, partition_cnt, memory_order_relaxed);
        return rd_kafka_msg_partitioner_consistent_random(rkt, key, keylen, partition_cnt, rkt_opaque, msg_opaque);
}

void publish_sample(struct publisher *p, struct sandbox *s, const char *buf, int len)
{
        if (queue_has_room(p) && announce_epoch(p, s) != -ENOBUFS &&
            produce(p, s->account, buf, (size_t)len, NULL) != -ENOBUFS) {
                if (s->pending) {
                        /* An older sample waited; this newer one carries the truth. */
                        s->pending = false;
                        p->npending--;
                }
                return;
        }
        memcpy(s->pending_buf, buf, (size_t)len);
        s->pending_len = len;
        if (!s->pending) {
                s->pending = true;
                p->npending++;
        }
}

void publish_pending(struct publisher *p, const struct sandbox_table *t)
{
        /* Round robin from where the last call stopped: starting at the list's head every tick
         * would let the first queue_max sandboxes take all the room and starve the rest. */
        for (size_t k = 0; k < t->n && p->npending > 0; k++) {
                size_t i = (p->pending_next + k) % t->n;
                struct sandbox *s = t->list[i];
                if (!s->pending)
                        continue;
                if (!queue_has_room(p) || announce_epoch(p, s) == -ENOBUFS ||
                    produce(p, s->account, s->pending_buf, (size_t)s->pending_len, NULL) == -ENOBUFS) {
                        p->pending_next = i;
                        break;
                }
                s->pending = false;
                p->npending--;
                p->pending_next = i + 1;
        }
        M_SET(p->m, pending_newest, p->npending);
}

void publish_spool(struct publisher *p, const struct sandbox_table *t)
{
        for (struct spool_entry *e = p->spool.head; e; e = e->next) {
                if (e->in_flight)
                        continue;
                struct sandbox *s = table_find(t, e->sandbox);
                if (s && announce_epoch(p, s) < 0)
                        continue;
                if (produce(p, e->account, e->payload, e->len, e) == 0)
                        e->in_flight = true;
        }
        M_SET(p->m, spool_entries, p->spool.count);
        M_SET(p->m, spool_bytes, p->spool.bytes);
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
        struct publisher *p = opaque;
        if (IS_BATCH_OPAQUE(msg->_private)) {
                size_t n = BATCH_OPAQUE_COUNT(msg->_private);
                p->batch_messages--;
                p->batch_samples -= n;
                if (msg->err) {
                        M_ADD(p->m, publish_errors_total, 1);
                        log_warn("a batch of samples was not delivered: the next samples carry the truth",
                                 "samples=%zu error=\"%s\"", n, rd_kafka_err2str(msg->err));
                } else {
                        M_ADD(p->m, deliveries_total, 1);
                }
                return;
        }
        struct spool_entry *e = msg->_private;
        if (msg->err) {
                M_ADD(p->m, publish_errors_total, 1);
                log_warn("a sample was not delivered", "error=\"%s\" final=%s", rd_kafka_err2str(msg->err),
                         e ? "true" : "false");
                if (e)
                        e->in_flight = false; /* re-sent on the next tick */
                return;
        }
        M_ADD(p->m, deliveries_total, 1);
        if (e) {
                log_debug("final sample acknowledged", "sandbox=%s", e->sandbox);
                int r = spool_done(&p->spool, e);
                if (r < 0)
                        log_error("could not delete an acknowledged spool entry", "error=\"%s\"", strerror(-r));
        }
}

/* A fatal producer error (the idempotence guarantee cannot hold) leaves the
 * producer unusable: stop, so the service manager restarts us with the spool. */
static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
        struct publisher *p = opaque;
        if (err != RD_KAFKA_RESP_ERR__FATAL) {
                log_debug("kafka client reports", "error=\"%s\"", reason);
                return;
        }
        char why[512];
        rd_kafka_fatal_error(rk, why, sizeof(why));
        log_error("fatal producer error; stopping", "error=\"%s\"", why);
        p->fatal = true;
}

void publish_final(struct publisher *p, struct sandbox *s, struct spool_entry *e)
{
        if (e && !e->in_flight && announce_epoch(p, s) == 0 && produce(p, e->account, e->payload, e->len, e) == 0)
                e->in_flight = true;
}

void publish_forget(struct publisher *p, struct sandbox *s)
{
        if (s->pending)
                p->npending--;
}

int publisher_open_spool(struct publisher *p, const char *state_dir, const char *host_id,
                         struct collector_metrics *m)
{
        p->wake_fd = -1;
        p->host_id = host_id;
        p->m = m;
        return spool_open(&p->spool, state_dir);
}

int publisher_connect(struct publisher *p, const struct collector_options *opt, char *err, size_t errlen)
{
        char kerr[512], timeout[64], qmax[64];
        p->queue_max = opt->queue_max;
        snprintf(timeout, sizeof(timeout), "message.timeout.ms=%lld", (long long)opt->delivery_timeout_ms);
        /* The queue holds ordinary samples up to queue_max plus every final in the spool. */
        snprintf(qmax, sizeof(qmax), "queue.buffering.max.messages=%lld", (long long)opt->queue_max + 100000);
        const char *const pairs[] = { timeout, qmax, "client.id=tally-collector", NULL };
        p->v2 = opt->usage_format && strcmp(opt->usage_format, "v2") == 0;
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        /* First, so that topic settings given later land in this topic configuration. */
        rd_kafka_topic_conf_t *tconf = rd_kafka_topic_conf_new();
        rd_kafka_topic_conf_set_partitioner_cb(tconf, partition_by_key);
        rd_kafka_topic_conf_set_opaque(tconf, p);
        rd_kafka_conf_set_default_topic_conf(conf, tconf);
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        rd_kafka_conf_set_error_cb(conf, on_error);
        rd_kafka_conf_set_opaque(conf, p);
        /* Partitions added to usage are produced to within 30 s, not
         * librdkafka's 5 min (docs/kafka.md, "Adding partitions"); set before
         * kafka_settings, which may change it. */
        static const char *const defaults[] = { KAFKA_METADATA_REFRESH, NULL };
        if (kafka_conf_set_all(conf, defaults, kerr, sizeof(kerr)) < 0 ||
            kafka_conf_set_client(conf, opt->kafka, kerr, sizeof(kerr)) < 0) {
                rd_kafka_conf_destroy(conf);
                snprintf(err, errlen, "could not apply kafka_settings: %s", kerr);
                return -EINVAL;
        }
        p->rk = kafka_producer_new(opt->brokers, conf, pairs, kerr, sizeof(kerr));
        if (!p->rk) {
                snprintf(err, errlen, "could not create the Kafka producer: %s", kerr);
                return -EINVAL;
        }
        if ((p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
                int e = errno; /* (before snprintf, which may set it) */
                snprintf(err, errlen, "could not make an eventfd: %s", strerror(e));
                return -e;
        }
        static const uint64_t one = 1; /* what an eventfd takes: 8 bytes, added to its count */
        rd_kafka_queue_t *q = rd_kafka_queue_get_main(p->rk);
        rd_kafka_queue_io_event_enable(q, p->wake_fd, &one, sizeof(one));
        rd_kafka_queue_destroy(q);
        p->outq = (size_t)rd_kafka_outq_len(p->rk);
        if (p->spool.count)
                log_info("re-sending final samples left in the spool", "count=%zu", p->spool.count);
        return 0;
}

void publisher_close(struct publisher *p)
{
        if (p->rk)
                rd_kafka_destroy(p->rk);
        p->rk = NULL;
        if (p->wake_fd >= 0) /* (after the producer: it writes to it until destroyed) */
                close(p->wake_fd);
        p->wake_fd = -1;
        for (int32_t i = 0; i < p->nout; i++)
                free(p->out[i].buf);
        free(p->out);
        p->out = NULL;
        p->nout = 0;
        spool_close(&p->spool);
}

void publisher_poll(struct publisher *p)
{
        uint64_t n;
        if (p->wake_fd >= 0 && read(p->wake_fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
                log_warn("could not read the producer's eventfd", "error=\"%s\"", strerror(errno));
        rd_kafka_poll(p->rk, 0); /* (after the read: what comes meanwhile writes it again) */
        p->outq = (size_t)rd_kafka_outq_len(p->rk);
        M_SET(p->m, queue_depth, p->outq);
        M_SET(p->m, spool_entries, p->spool.count);
        M_SET(p->m, spool_bytes, p->spool.bytes);
}

void publisher_flush(struct publisher *p, int timeout_ms)
{
        log_info("collector stopping", "queued=%d spool=%zu", rd_kafka_outq_len(p->rk), p->spool.count);
        if (rd_kafka_flush(p->rk, timeout_ms) != RD_KAFKA_RESP_ERR_NO_ERROR)
                log_warn("stopped before the broker acknowledged everything; the spool keeps final samples",
                         "queued=%d spool=%zu", rd_kafka_outq_len(p->rk), p->spool.count);
}
