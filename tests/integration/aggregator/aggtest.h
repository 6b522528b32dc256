/* aggtest.h — what the aggregator's integration tests share: a private
 * development broker (faults and streams of one test never reach another), a
 * migrated ledger database, a producer of real usage messages, and running
 * tally-aggregator as a real process. */
#pragma once

#include "event.h"
#include "support.h"

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct aggtest_id;

struct aggtest {
        char *dir;          /* scratch folder */
        char *db_url;
        PGconn *db;
        struct test_kafka kafka; /* the development broker, or Apache Kafka (support.h) */
        char *bootstrap;
        rd_kafka_t *producer;
        int spawned;        /* aggregators started, for log names */
        struct aggtest_id *created[4096]; /* sandboxes whose `created` event was produced (hash set) */
        int64_t kafka_timestamp_ms; /* the Kafka timestamp messages are produced with; 0: the producer's clock */
};

/* Starts a private broker with `partitions`, creates and migrates a database. */
void aggtest_start(struct aggtest *t, const char *name, int partitions);
/* Stops everything it started, drops the database. */
void aggtest_stop(struct aggtest *t);
/* Restarts the development broker with `partitions`, as ./scripts/up does: its
 * messages (kept in memory) are gone, its topics start again at offset 0.
 * Aggregators spawned afterwards (and the producer) use the new one. */
void aggtest_restart_broker(struct aggtest *t, int partitions);

/* The `created` event an honest vmm would have sent before a sandbox's first
 * reading ev: same host, account, key, size and epoch, dated early enough for
 * everything the reading carries (its CPU at its vCPUs, its held time) —
 * never after the aggregator's clock. */
struct usage_event aggtest_created_for(const struct usage_event *first);
/* True once per sandbox id (then *ret is its `created` event, to be produced
 * before ev): for a sample or `stopped` of a sandbox with a key whose
 * `created` the test has not produced. A `created` ev marks its sandbox. */
bool aggtest_needs_created(struct aggtest *t, const struct usage_event *ev, struct usage_event *ret);

/* Fills ids[0..n) with accounts "PREFIX-K", n / partitions on each of the
 * partitions by librdkafka's partitioner for keyed messages (the producer's
 * and the collector's: crc32 of the key modulo the partitions). */
void aggtest_accounts_on_partitions(char (*ids)[32], int n, int partitions, const char *prefix);

/* Produces one message with key = account (raw bytes as given). */
void aggtest_produce_raw(struct aggtest *t, const char *account, const void *buf, size_t len);
/* Produces ev; before a sandbox's first reading, its `created` event
 * (aggtest_needs_created), as the vmm does. */
void aggtest_produce(struct aggtest *t, const struct usage_event *ev);
/* Waits until every produced message is acknowledged. */
void aggtest_flush(struct aggtest *t);
/* Messages in the usage topic (sum of high watermarks). */
int64_t aggtest_topic_end(struct aggtest *t);

/* Starts tally-aggregator with extra "--name=value" arguments (NULL-terminated). */
pid_t aggtest_spawn(struct aggtest *t, const char *const *extra);
/* Waits until the ledger's offsets (group "tally-aggregator") reach the end of the topic. */
int aggtest_wait_caught_up(struct aggtest *t, int timeout_s);
/* Messages the ledger's offsets say are done (group "tally-aggregator"). */
int64_t aggtest_committed(struct aggtest *t);
/* SIGTERM and wait; returns the exit status. */
int aggtest_terminate(pid_t pid);

/* Runs a query expecting one row, one column; returns the text (malloc'd) or NULL. */
char *aggtest_query(struct aggtest *t, const char *sql);
void aggtest_exec(struct aggtest *t, const char *sql);

/* A sample with the fields billing needs. */
struct usage_event aggtest_sample(const char *account, const char *key, const char *sandbox, uint64_t epoch,
                                  uint64_t seq, int64_t wall_ns, enum sandbox_state state, uint64_t cpu_ns,
                                  uint64_t mem_size_bytes, uint64_t disk_bytes, uint32_t vcpus);

/* Unix ns of a UTC date and time. */
int64_t aggtest_utc(int year, int mon, int day, int hour, int min, int sec);

/* The same sample with cumulative held counters (docs/events.md, "Held time"). */
struct usage_event aggtest_held(struct usage_event ev, uint64_t running_ns, uint64_t paused_ns);
/* The vmm's stopped event: final CPU counter and held counters. */
struct usage_event aggtest_stopped(const char *account, const char *key, const char *sandbox, uint64_t epoch,
                                   int64_t wall_ns, uint64_t cpu_ns, uint64_t running_ns, uint64_t paused_ns,
                                   uint64_t mem_size_bytes, uint32_t vcpus);
/* A sandbox's billed totals and rows in usage_hourly: "cpu_ns/mem_byte_ns/storage_byte_ns/rows" (malloc'd). */
char *aggtest_billed(struct aggtest *t, const char *sandbox);
/* Checks a sandbox's billed totals (not its row count) against want, "cpu_ns/mem_byte_ns/storage_byte_ns"
 * worked out by hand; what names the case in the failure. */
void aggtest_expect_billed(struct aggtest *t, const char *sandbox, const char *want, const char *what);
/* Waits until the ledger's offsets reach `end` messages; 0 or -1 at the timeout. */
int aggtest_wait_committed(struct aggtest *t, int64_t end, int timeout_ms);
