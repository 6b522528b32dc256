/* aggtest.c — see aggtest.h. */
#include "aggtest.h"

#include "kafka.h"
#include "support.h"
#include "timeutil.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int delivery_errors;

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
        if (m->err)
                delivery_errors++;
}

struct aggtest_id {
        struct aggtest_id *next;
        char id[EVENT_ID_MAX + 1];
};

static void producer_start(struct aggtest *t)
{
        char errbuf[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        /* Producer batches stay well below the aggregator's fetch sizes. */
        const char *const extra[] = { "message.timeout.ms=120000", "batch.size=262144", NULL };
        t->producer = kafka_producer_new(t->bootstrap, test_kafka_conf(conf), extra, errbuf, sizeof(errbuf));
        if (!t->producer) {
                fprintf(stderr, "FAIL: producer: %s\n", errbuf);
                exit(1);
        }
}

void aggtest_start(struct aggtest *t, const char *name, int partitions)
{
        memset(t, 0, sizeof(*t));
        t->dir = test_tmpdir(name);
        /* The development broker, or Apache Kafka under TALLY_TEST_KAFKA=apache (TALLY_TEST_KAFKA_NODES nodes). */
        test_kafka_start(&t->kafka, t->dir, partitions, 0);
        t->bootstrap = strdup(t->kafka.bootstrap);

        t->db_url = test_db_create(name);
        char *out = NULL, *err = NULL;
        char *margv[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", t->db_url, "apply", NULL };
        if (test_run(margv, &out, &err) != 0) {
                fprintf(stderr, "FAIL: tally-migrate: %s\n", err ? err : "");
                exit(1);
        }
        free(out);
        free(err);
        t->db = PQconnectdb(t->db_url);
        if (PQstatus(t->db) != CONNECTION_OK) {
                fprintf(stderr, "FAIL: connect: %s\n", PQerrorMessage(t->db));
                exit(1);
        }
        producer_start(t);
}

void aggtest_restart_broker(struct aggtest *t, int partitions)
{
        CHECK(!t->kafka.apache, "aggtest_restart_broker: the development broker only");
        rd_kafka_flush(t->producer, 10000);
        rd_kafka_destroy(t->producer);
        test_kafka_stop(&t->kafka);
        char file[1024];
        snprintf(file, sizeof(file), "%s/broker.bootstrap", t->dir); /* the new one's address, once it is up */
        unlink(file);
        test_kafka_start(&t->kafka, t->dir, partitions, 0);
        free(t->bootstrap);
        t->bootstrap = strdup(t->kafka.bootstrap);
        producer_start(t);
}

void aggtest_stop(struct aggtest *t)
{
        for (size_t i = 0; i < sizeof(t->created) / sizeof(t->created[0]); i++)
                for (struct aggtest_id *n = t->created[i], *next; n; n = next) {
                        next = n->next;
                        free(n);
                }
        if (t->producer) {
                rd_kafka_flush(t->producer, 10000);
                rd_kafka_destroy(t->producer);
        }
        PQfinish(t->db);
        test_kafka_stop(&t->kafka);
        test_db_drop(t->db_url);
        free(t->bootstrap);
        free(t->dir);
}

void aggtest_accounts_on_partitions(char (*ids)[32], int n, int partitions, const char *prefix)
{
        int on[64] = { 0 }, got = 0;
        CHECK(partitions > 0 && partitions <= 64 && n % partitions == 0, "accounts: %d over %d partitions", n,
              partitions);
        for (int i = 0; got < n && i < 100000 && partitions <= 64; i++) {
                char id[32];
                snprintf(id, sizeof(id), "%.20s-%d", prefix, i);
                int32_t p = rd_kafka_msg_partitioner_consistent(NULL, id, strlen(id), partitions, NULL, NULL);
                if (p >= 0 && p < partitions && on[p] < n / partitions) {
                        on[p]++;
                        snprintf(ids[got++], 32, "%s", id);
                }
        }
        CHECK(got == n, "accounts for every partition: %d of %d", got, n);
}

void aggtest_produce_raw(struct aggtest *t, const char *account, const void *buf, size_t len)
{
        rd_kafka_resp_err_t e;
        while ((e = rd_kafka_producev(t->producer, RD_KAFKA_V_TOPIC(TOPIC_USAGE),
                                      RD_KAFKA_V_KEY(account, strlen(account)), RD_KAFKA_V_VALUE((void *)buf, len),
                                      RD_KAFKA_V_TIMESTAMP(t->kafka_timestamp_ms),
                                      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)) ==
               RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(t->producer, 10);
        CHECK(e == 0, "produce: %s", rd_kafka_err2str(e));
        rd_kafka_poll(t->producer, 0);
}

struct usage_event aggtest_created_for(const struct usage_event *first)
{
        struct usage_event ev = { .type = EVENT_CREATED, .epoch = first->epoch ? first->epoch : 1,
                                  .vcpus = first->vcpus ? first->vcpus : 1, .mem_size_bytes = first->mem_size_bytes,
                                  .state = STATE_RUNNING };
        memcpy(ev.host, first->host, sizeof(ev.host));
        memcpy(ev.sandbox, first->sandbox, sizeof(ev.sandbox));
        memcpy(ev.account, first->account, sizeof(ev.account));
        memcpy(ev.key, first->key, sizeof(ev.key));
        snprintf(ev.backend, sizeof(ev.backend), "process");
        uint64_t life = first->cpu_ns / ev.vcpus + 1;
        if (first->held_known && first->running_ns + first->paused_ns > life)
                life = first->running_ns + first->paused_ns;
        int64_t at = first->wall_ns < time_wall_ns() ? first->wall_ns : time_wall_ns();
        int64_t min = INT64_C(1577836800000000000); /* the codec's earliest: 2020-01-01 */
        ev.wall_ns = life < (uint64_t)(at - min) ? at - (int64_t)life - NS_PER_SEC : min;
        if (ev.wall_ns < min)
                ev.wall_ns = min;
        return ev;
}

bool aggtest_needs_created(struct aggtest *t, const struct usage_event *ev, struct usage_event *ret)
{
        bool reading = ev->type == EVENT_SAMPLE || ev->type == EVENT_STOPPED;
        if ((!reading && ev->type != EVENT_CREATED) || !ev->key[0])
                return false;
        unsigned h = 5381;
        for (const char *c = ev->sandbox; *c; c++)
                h = h * 33 + (unsigned char)*c;
        struct aggtest_id **b = &t->created[h % (sizeof(t->created) / sizeof(t->created[0]))];
        for (struct aggtest_id *i = *b; i; i = i->next)
                if (strcmp(i->id, ev->sandbox) == 0)
                        return false;
        struct aggtest_id *n = calloc(1, sizeof(*n));
        CHECK(n != NULL, "out of memory");
        if (!n)
                return false;
        memcpy(n->id, ev->sandbox, sizeof(n->id));
        n->next = *b;
        *b = n;
        if (!reading)
                return false;
        *ret = aggtest_created_for(ev);
        return true;
}

static void produce_event(struct aggtest *t, const struct usage_event *ev)
{
        char buf[8192];
        int n = event_encode(ev, buf, sizeof(buf));
        if (n < 0) {
                fprintf(stderr, "FAIL: event_encode refused a test event\n");
                exit(1);
        }
        aggtest_produce_raw(t, ev->account, buf, (size_t)n);
}

void aggtest_produce(struct aggtest *t, const struct usage_event *ev)
{
        struct usage_event created;
        if (aggtest_needs_created(t, ev, &created))
                produce_event(t, &created);
        produce_event(t, ev);
}

void aggtest_flush(struct aggtest *t)
{
        CHECK(rd_kafka_flush(t->producer, 60000) == 0, "producer flush timed out");
        CHECK(delivery_errors == 0, "%d messages were not delivered", delivery_errors);
}

int64_t aggtest_topic_end(struct aggtest *t)
{
        const struct rd_kafka_metadata *md;
        rd_kafka_topic_t *topic = rd_kafka_topic_new(t->producer, TOPIC_USAGE, NULL);
        int64_t total = 0;
        if (rd_kafka_metadata(t->producer, 0, topic, &md, 10000) != 0) {
                fprintf(stderr, "FAIL: no metadata from the broker\n");
                exit(1);
        }
        for (int i = 0; i < md->topics[0].partition_cnt; i++) {
                int64_t lo, hi;
                if (rd_kafka_query_watermark_offsets(t->producer, TOPIC_USAGE, md->topics[0].partitions[i].id, &lo, &hi,
                                                     10000) == 0)
                        total += hi;
        }
        rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(topic);
        return total;
}

pid_t aggtest_spawn(struct aggtest *t, const char *const *extra)
{
        char log[1024];
        snprintf(log, sizeof(log), "%s/aggregator.%d.log", t->dir, t->spawned++);
        const char *argv[32];
        int n = 0;
        argv[n++] = test_env("TALLY_AGGREGATOR_BIN");
        argv[n++] = "--database-url";
        argv[n++] = t->db_url;
        argv[n++] = "--kafka-brokers";
        argv[n++] = t->bootstrap;
        for (; extra && *extra && n < 30; extra++)
                argv[n++] = *extra;
        argv[n] = NULL;
        pid_t pid = test_spawn((char *const *)argv, NULL, log);
        /* Wait until it is running (its signal handlers installed), so a quick
         * SIGTERM tests a clean stop rather than racing the start. */
        bool up = false;
        for (int i = 0; i < 1200 && !up; i++) {
                char *text = test_read_file(log);
                up = text && strstr(text, "aggregator started");
                free(text);
                if (!up)
                        time_sleep_ns(25 * NS_PER_MS);
        }
        if (!up) {
                char *text = test_read_file(log);
                fprintf(stderr, "FAIL: the aggregator did not say it started in 30 s; its log:\n%s\n", text ? text : "");
                free(text);
                kill(pid, SIGKILL);
                exit(1);
        }
        return pid;
}

int64_t aggtest_committed(struct aggtest *t)
{
        char *v = aggtest_query(t, "SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets"
                                   " WHERE group_id = 'tally-aggregator' AND topic = 'usage'");
        int64_t done = v ? strtoll(v, NULL, 10) : -1;
        free(v);
        return done;
}

int aggtest_wait_caught_up(struct aggtest *t, int timeout_s)
{
        int64_t end = aggtest_topic_end(t);
        for (int i = 0; i < timeout_s * 10; i++) {
                if (aggtest_committed(t) == end)
                        return 0;
                time_sleep_ns(100 * NS_PER_MS);
        }
        fprintf(stderr, "FAIL: the aggregator did not reach the end of the topic (%lld messages) in %d s\n",
                (long long)end, timeout_s);
        return -1;
}

int aggtest_terminate(pid_t pid)
{
        int st = 0;
        kill(pid, SIGTERM);
        waitpid(pid, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

char *aggtest_query(struct aggtest *t, const char *sql)
{
        PGresult *r = PQexec(t->db, sql);
        char *v = NULL;
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && PQnfields(r) >= 1)
                v = strdup(PQgetisnull(r, 0, 0) ? "" : PQgetvalue(r, 0, 0));
        else
                CHECK(0, "query %s: %s (rows %d)", sql, PQresultErrorMessage(r), PQntuples(r));
        PQclear(r);
        return v;
}

void aggtest_exec(struct aggtest *t, const char *sql)
{
        PGresult *r = PQexec(t->db, sql);
        if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
                fprintf(stderr, "FAIL: %s: %s\n", sql, PQresultErrorMessage(r));
                exit(1);
        }
        PQclear(r);
}

struct usage_event aggtest_sample(const char *account, const char *key, const char *sandbox, uint64_t epoch,
                                  uint64_t seq, int64_t wall_ns, enum sandbox_state state, uint64_t cpu_ns,
                                  uint64_t mem_size_bytes, uint64_t disk_bytes, uint32_t vcpus)
{
        struct usage_event ev = { .type = EVENT_SAMPLE, .epoch = epoch, .seq = seq, .wall_ns = wall_ns,
                                  .state = state, .cpu_ns = cpu_ns, .mem_size_bytes = mem_size_bytes,
                                  .disk_bytes = disk_bytes, .vcpus = vcpus };
        snprintf(ev.host, sizeof(ev.host), "host-1");
        snprintf(ev.account, sizeof(ev.account), "%s", account);
        snprintf(ev.key, sizeof(ev.key), "%s", key);
        snprintf(ev.sandbox, sizeof(ev.sandbox), "%s", sandbox);
        return ev;
}

int64_t aggtest_utc(int year, int mon, int day, int hour, int min, int sec)
{
        struct tm tm = { .tm_year = year - 1900, .tm_mon = mon - 1, .tm_mday = day, .tm_hour = hour,
                         .tm_min = min, .tm_sec = sec };
        return (int64_t)timegm(&tm) * NS_PER_SEC;
}

struct usage_event aggtest_held(struct usage_event ev, uint64_t running_ns, uint64_t paused_ns)
{
        ev.held_known = true;
        ev.running_ns = running_ns;
        ev.paused_ns = paused_ns;
        return ev;
}

struct usage_event aggtest_stopped(const char *account, const char *key, const char *sandbox, uint64_t epoch,
                                   int64_t wall_ns, uint64_t cpu_ns, uint64_t running_ns, uint64_t paused_ns,
                                   uint64_t mem_size_bytes, uint32_t vcpus)
{
        struct usage_event ev = aggtest_sample(account, key, sandbox, epoch, 0, wall_ns, STATE_STOPPED, cpu_ns,
                                               mem_size_bytes, 0, vcpus);
        ev.type = EVENT_STOPPED;
        ev.final = true;
        return aggtest_held(ev, running_ns, paused_ns);
}

void aggtest_expect_billed(struct aggtest *t, const char *sandbox, const char *want, const char *what)
{
        char *got = aggtest_billed(t, sandbox);
        char *slash = strrchr(got, '/');
        if (slash)
                *slash = '\0';
        CHECK(strcmp(got, want) == 0, "%s (%s): billed %s, want %s (cpu_ns/mem_byte_ns/storage_byte_ns)", what,
              sandbox, got, want);
        free(got);
}

char *aggtest_billed(struct aggtest *t, const char *sandbox)
{
        const char *params[] = { sandbox };
        PGresult *r = PQexecParams(t->db,
                                   "SELECT coalesce(sum(cpu_ns), 0) || '/' || coalesce(sum(mem_byte_ns), 0) || '/' ||"
                                   " coalesce(sum(storage_byte_ns), 0) || '/' || count(*)"
                                   " FROM usage_hourly WHERE sandbox_id = $1",
                                   1, NULL, params, NULL, NULL, 0);
        char *v = NULL;
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1)
                v = strdup(PQgetvalue(r, 0, 0));
        else
                CHECK(0, "billed totals of %s: %s", sandbox, PQresultErrorMessage(r));
        PQclear(r);
        return v ? v : strdup("");
}

int aggtest_wait_committed(struct aggtest *t, int64_t end, int timeout_ms)
{
        for (int i = 0; i <= timeout_ms / 20; i++) {
                if (aggtest_committed(t) >= end)
                        return 0;
                time_sleep_ns(20 * NS_PER_MS);
        }
        return -1;
}
