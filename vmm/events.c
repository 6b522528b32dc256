/* events.c — see events.h. */
#include "events.h"
#include "kafka.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct delivery {
        char id[EVENT_ID_MAX + 1];       /* set for a stopped event: who waits for the acknowledgement */
};

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
        struct events *e = opaque;
        struct delivery *d = m->_private;
        if (m->err)
                log_warn("could not deliver a lifecycle event", "error=\"%s\"", rd_kafka_err2str(m->err));
        if (!d)
                return;
        struct sandbox *sb = records_get(e->table, d->id);
        if (sb) {
                pthread_mutex_lock(&e->table->lock);
                if (m->err)
                        sb->stop_published = false; /* the tick publishes it again */
                else
                        sb->stop_acked = true;
                pthread_mutex_unlock(&e->table->lock);
                sandbox_unref(e->table, sb);
        }
        free(d);
        (void)rk;
}

void event_from_record(struct usage_event *ev, enum event_type type, const struct sandbox_record *rec,
                       const struct moment *m)
{
        memset(ev, 0, sizeof(*ev));
        ev->type = type;
        snprintf(ev->host, sizeof(ev->host), "%s", rec->host);
        snprintf(ev->sandbox, sizeof(ev->sandbox), "%s", rec->id);
        snprintf(ev->account, sizeof(ev->account), "%s", rec->account);
        snprintf(ev->key, sizeof(ev->key), "%s", rec->key);
        ev->wall_ns = m->wall;
        ev->mono_ns = m->mono;
        ev->state = rec->state;
        ev->vcpus = rec->vcpus;
        ev->mem_size_bytes = rec->mem_size_bytes;
        ev->epoch = rec->epoch;
}

int events_publish(struct events *e, const struct usage_event *ev, bool track_stop)
{
        /* Room for 32 labels at their longest, every byte escaped. */
        size_t size = 128 * 1024;
        char *buf = malloc(size);
        if (!buf)
                return -ENOMEM;
        int n = event_encode(ev, buf, size);
        if (n < 0) {
                free(buf);
                log_error("could not encode a lifecycle event", "sandbox=%s type=%s", ev->sandbox,
                          event_type_name(ev->type));
                return n;
        }
        struct delivery *d = NULL;
        if (track_stop) {
                if (!(d = calloc(1, sizeof(*d)))) {
                        free(buf);
                        return -ENOMEM;
                }
                snprintf(d->id, sizeof(d->id), "%s", ev->sandbox);
        }
        for (int tries = 0;; tries++) {
                rd_kafka_resp_err_t ke = rd_kafka_producev(
                        e->producer, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_KEY(ev->account, strlen(ev->account)),
                        RD_KAFKA_V_VALUE(buf, (size_t)n), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                        RD_KAFKA_V_OPAQUE(d), RD_KAFKA_V_END);
                if (ke == RD_KAFKA_RESP_ERR_NO_ERROR) {
                        free(buf);
                        return 0;
                }
                if (ke != RD_KAFKA_RESP_ERR__QUEUE_FULL || tries > 100) {
                        log_error("could not queue a lifecycle event", "sandbox=%s type=%s error=\"%s\"",
                                  ev->sandbox, event_type_name(ev->type), rd_kafka_err2str(ke));
                        free(d);
                        free(buf);
                        return -EIO;
                }
                rd_kafka_poll(e->producer, 10);
        }
}

void events_publish_simple(struct events *e, struct sandbox *sb, enum event_type type)
{
        struct usage_event ev;
        pthread_mutex_lock(&e->table->lock);
        event_from_record(&ev, type, &sb->rec, &sb->moment);
        pthread_mutex_unlock(&e->table->lock);
        events_publish(e, &ev, false);
}

void events_publish_created(struct events *e, struct sandbox *sb)
{
        struct usage_event ev;
        pthread_mutex_lock(&e->table->lock);
        event_from_record(&ev, EVENT_CREATED, &sb->rec, &sb->moment);
        if (sb->rec.created_ns > 0)
                ev.wall_ns = sb->rec.created_ns; /* the created moment, also when published again */
        snprintf(ev.parent, sizeof(ev.parent), "%s", sb->rec.parent);
        snprintf(ev.backend, sizeof(ev.backend), "%s", sb->rec.backend);
        ev.disk_size_bytes = sb->rec.disk_size_bytes;
        for (size_t i = 0; i < sb->rec.nlabels; i++)
                event_add_label(&ev, sb->rec.labels[i].key, sb->rec.labels[i].value);
        pthread_mutex_unlock(&e->table->lock);
        events_publish(e, &ev, false);
        event_clear(&ev);
}

void events_publish_stopped(struct events *e, struct sandbox *sb)
{
        struct usage_event ev;
        pthread_mutex_lock(&e->table->lock);
        event_from_record(&ev, EVENT_STOPPED, &sb->rec, &sb->moment);
        /* Everything the aggregator needs to close the bill without the
         * collector: the final counter, its epoch, and the final held totals. */
        ev.cpu_ns = sb->rec.final_cpu_ns;
        ev.final = true;
        ev.held_known = true;
        registry_held_at(&sb->rec, sb->moment.boot, &ev.running_ns, &ev.paused_ns);
        sb->stop_published = true;
        pthread_mutex_unlock(&e->table->lock);
        if (events_publish(e, &ev, true) < 0) {
                pthread_mutex_lock(&e->table->lock);
                sb->stop_published = false;
                pthread_mutex_unlock(&e->table->lock);
        }
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *parts, void *opaque)
{
        struct events *e = opaque;
        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
                rd_kafka_assign(rk, parts);
                atomic_store(&e->control_ready, true);
                log_info("control topic assigned", "partitions=%d", parts->cnt);
        } else {
                rd_kafka_assign(rk, NULL);
                atomic_store(&e->control_ready, false);
        }
}

static void *control_loop(void *arg)
{
        struct events *e = arg;
        while (!atomic_load(&e->quit)) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(e->consumer, 100);
                if (!m)
                        continue;
                if (m->err) {
                        if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                                log_warn("control topic error", "error=\"%s\"", rd_kafka_message_errstr(m));
                        rd_kafka_message_destroy(m);
                        continue;
                }
                struct control_command c;
                char why[256];
                if (control_decode(m->payload, m->len, &c, why, sizeof(why)) < 0)
                        log_warn("refusing a control message", "partition=%d offset=%lld reason=\"%s\"",
                                 (int)m->partition, (long long)m->offset, why);
                else
                        e->apply(e->apply_arg, &c);
                rd_kafka_topic_partition_list_t *pos = rd_kafka_topic_partition_list_new(1);
                rd_kafka_topic_partition_list_add(pos, rd_kafka_topic_name(m->rkt), m->partition)->offset =
                        m->offset + 1;
                rd_kafka_commit(e->consumer, pos, 1);
                rd_kafka_topic_partition_list_destroy(pos);
                rd_kafka_message_destroy(m);
        }
        return NULL;
}

/* A client configuration for the producer or the consumer, with e as the
 * callbacks' opaque; NULL with err when kafka_settings do not apply. */
static rd_kafka_conf_t *conf_new(const struct vmm_settings *s, struct events *e, char *err, size_t errlen)
{
        char kerr[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set_opaque(conf, e);
        /* Partitions added to usage or control are followed within 30 s (a pause
         * command on a new control partition must not wait 5 min). */
        static const char *const refresh[] = { KAFKA_METADATA_REFRESH, NULL };
        if (kafka_conf_set_all(conf, refresh, kerr, sizeof(kerr)) < 0 ||
            kafka_conf_set_client(conf, s->kafka, kerr, sizeof(kerr)) < 0) {
                rd_kafka_conf_destroy(conf);
                snprintf(err, errlen, "could not apply kafka_settings: %s", kerr);
                return NULL;
        }
        return conf;
}

int events_open(struct events *e, const struct vmm_settings *s, struct records *table, events_apply_fn apply,
                void *apply_arg, char *err, size_t errlen)
{
        memset(e, 0, sizeof(*e));
        e->table = table;
        e->apply = apply;
        e->apply_arg = apply_arg;
        atomic_init(&e->quit, false);
        atomic_init(&e->control_ready, false);
        int r;
        char kerr[512];
        rd_kafka_conf_t *conf = conf_new(s, e, err, errlen);
        if (!conf) {
                r = -EINVAL;
                goto fail;
        }
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        /* Lifecycle events are never given up on: delivery retries until the broker takes them. */
        static const char *const producer_pairs[] = { "message.timeout.ms=0", "linger.ms=1", NULL };
        if (!(e->producer = kafka_producer_new(s->kafka_brokers, conf, producer_pairs, kerr, sizeof(kerr)))) {
                snprintf(err, errlen, "could not create the Kafka producer: %s", kerr);
                r = -EINVAL;
                goto fail;
        }
        char group[128];
        snprintf(group, sizeof(group), "tally-vmm-%s", s->host_id);
        if (!(conf = conf_new(s, e, err, errlen))) {
                r = -EINVAL;
                goto fail;
        }
        rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
        static const char *const consumer_pairs[] = { "session.timeout.ms=6000", "heartbeat.interval.ms=500",
                                                      "fetch.wait.max.ms=50", NULL };
        if (!(e->consumer = kafka_consumer_new(s->kafka_brokers, group, conf, consumer_pairs, kerr, sizeof(kerr)))) {
                snprintf(err, errlen, "could not create the Kafka consumer: %s", kerr);
                r = -EINVAL;
                goto fail;
        }
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, TOPIC_CONTROL, RD_KAFKA_PARTITION_UA);
        rd_kafka_resp_err_t ke = rd_kafka_subscribe(e->consumer, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        if (ke) {
                snprintf(err, errlen, "could not subscribe to the control topic: %s", rd_kafka_err2str(ke));
                r = -EIO;
                goto fail;
        }
        return 0;
fail:
        if (e->consumer) {
                rd_kafka_consumer_close(e->consumer);
                rd_kafka_destroy(e->consumer);
        }
        if (e->producer)
                rd_kafka_destroy(e->producer);
        e->consumer = e->producer = NULL;
        return r;
}

int events_start_control(struct events *e)
{
        if (pthread_create(&e->control_thread, NULL, control_loop, e) != 0)
                return -EAGAIN;
        e->control_started = true;
        return 0;
}

void events_stop_control(struct events *e)
{
        atomic_store(&e->quit, true);
        if (e->control_started)
                pthread_join(e->control_thread, NULL);
        e->control_started = false;
        if (e->consumer) {
                rd_kafka_consumer_close(e->consumer);
                rd_kafka_destroy(e->consumer);
                e->consumer = NULL;
        }
}

void events_poll(struct events *e, int timeout_ms)
{
        rd_kafka_poll(e->producer, timeout_ms);
}

void events_flush(struct events *e, int64_t timeout_ms)
{
        int r = rd_kafka_flush(e->producer, timeout_ms > 0 ? (int)timeout_ms : 0);
        if (r != RD_KAFKA_RESP_ERR_NO_ERROR)
                log_warn("lifecycle events still queued at exit", "count=%d", rd_kafka_outq_len(e->producer));
}

void events_flush_or_purge(struct events *e, int64_t timeout_ms)
{
        if (rd_kafka_flush(e->producer, timeout_ms > 0 ? (int)timeout_ms : 0) != RD_KAFKA_RESP_ERR_NO_ERROR) {
                log_warn("lifecycle events still queued at exit", "count=%d", rd_kafka_outq_len(e->producer));
                rd_kafka_purge(e->producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
                rd_kafka_poll(e->producer, 0);
        }
}

void events_free(struct events *e)
{
        if (e->producer)
                rd_kafka_destroy(e->producer);
        e->producer = NULL;
}
