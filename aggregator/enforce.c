/* enforce.c — see enforce.h. */
#include "enforce.h"

#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool throttled(struct enforce *e, const char *key, int64_t now)
{
        for (size_t i = 0; i < e->nthrottle; i++)
                if (strcmp(e->throttle[i].key, key) == 0) {
                        if (now - e->throttle[i].last_ns < NS_PER_SEC)
                                return true;
                        e->throttle[i].last_ns = now;
                        return false;
                }
        struct key_throttle *t = realloc(e->throttle, (e->nthrottle + 1) * sizeof(*t));
        if (!t)
                return false;
        e->throttle = t;
        snprintf(t[e->nthrottle].key, sizeof(t->key), "%s", key);
        t[e->nthrottle++].last_ns = now;
        return false;
}

static void publish(struct enforce *e, const struct command *c)
{
        struct control_command cmd = { .action = c->action, .issued_ns = time_wall_ns() };
        snprintf(cmd.account, sizeof(cmd.account), "%s", c->account);
        snprintf(cmd.key, sizeof(cmd.key), "%s", c->key);
        snprintf(cmd.reason, sizeof(cmd.reason), "daily_limit");
        char buf[1024];
        int n = control_encode(&cmd, buf, sizeof(buf));
        if (n < 0) {
                log_error("could not encode a control command", "key=%s", c->key);
                return;
        }
        rd_kafka_resp_err_t err;
        while ((err = rd_kafka_producev(e->producer, RD_KAFKA_V_TOPIC(TOPIC_CONTROL),
                                      RD_KAFKA_V_KEY(cmd.account, strlen(cmd.account)),
                                      RD_KAFKA_V_VALUE(buf, (size_t)n), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                      RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(e->producer, 10);
        if (err)
                log_error("could not publish a control command", "key=%s error=\"%s\"", c->key, rd_kafka_err2str(err));
        else
                log_info("daily limit reached: command published", "key=%s account=%s action=%s", c->key, c->account,
                         control_action_name(c->action));
}

int enforce_open(struct enforce *e, const char *brokers, const struct kafka_client_settings *kafka)
{
        char err[1024];
        rd_kafka_conf_t *pconf = rd_kafka_conf_new();
        static const char *const refresh[] = { KAFKA_METADATA_REFRESH, NULL };
        if (kafka_conf_set_all(pconf, refresh, err, sizeof(err)) < 0 ||
            kafka_conf_set_client(pconf, kafka, err, sizeof(err)) < 0) {
                rd_kafka_conf_destroy(pconf);
                log_error("bad kafka_settings", "error=\"%s\"", err);
                return -EIO;
        }
        e->producer = kafka_producer_new(brokers, pconf, NULL, err, sizeof(err));
        if (!e->producer) {
                log_error("could not create the control producer", "error=\"%s\"", err);
                return -EIO;
        }
        e->control = rd_kafka_topic_new(e->producer, TOPIC_CONTROL, NULL);
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_resp_err_t ke = e->control ? rd_kafka_metadata(e->producer, 0, e->control, &md, 2000)
                                            : rd_kafka_last_error();
        if (ke)
                log_warn("control topic not looked up yet: a first command may wait for it", "error=\"%s\"",
                         rd_kafka_err2str(ke));
        if (md)
                rd_kafka_metadata_destroy(md);
        return 0;
}

void enforce_publish(struct enforce *e, const struct command *cmds, int n, bool blocked)
{
        int64_t now = time_wall_ns();
        for (int i = 0; i < n; i++)
                if (blocked || !throttled(e, cmds[i].key, now))
                        publish(e, &cmds[i]);
}

void enforce_poll(struct enforce *e)
{
        rd_kafka_poll(e->producer, 0);
}

void enforce_close(struct enforce *e)
{
        if (e->control)
                rd_kafka_topic_destroy(e->control);
        e->control = NULL;
        if (e->producer) {
                rd_kafka_flush(e->producer, 10000);
                rd_kafka_destroy(e->producer);
                e->producer = NULL;
        }
        free(e->throttle);
        e->throttle = NULL;
        e->nthrottle = 0;
}
