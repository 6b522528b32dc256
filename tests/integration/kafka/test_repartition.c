/* Integration, Apache Kafka: the usage topic grows from 4 to 8 partitions for
 * real (CreatePartitions, an operator's call) while two tally-aggregators in
 * one group bill a stream exactly once. Samples come from two independent
 * producers keyed by account with librdkafka's default partitioner, as the
 * collectors produce them: an early one that learns the new partition count
 * within half a second of the growth, before the group has rebalanced, and a
 * late one that learns only after the group has (a collector whose metadata
 * refresh comes last; the test triggers it). An account whose key hashes to
 * partition p at 4 partitions goes to p or p + 4 at 8: the test works out
 * with librdkafka's own partitioner which accounts move, and checks each
 * message's partition in its delivery report.
 *
 * Fold state follows the sandbox (fold_state by sandbox id, fenced by its
 * version), so a moved account is billed by the aggregator that owns its new
 * partition from what the old one committed, and what the old one still
 * holds in memory is fenced, never billed again. The test makes that race
 * happen on purpose: the owner of the late accounts' old partitions is
 * frozen (SIGSTOP, a slow aggregator) with one of their samples unread; they
 * move, the other aggregator bills their next sample from the ledger, and
 * the thawed one must be fenced. At the end every sandbox's billed CPU
 * (usage_hourly, summed) equals its final cumulative counter to the
 * nanosecond, and its held memory and paused storage equal its held counters
 * times its sizes; each aggregator owned partitions before and after the
 * growth; every moved account was billed on both sides of it. */
#include "aggtest.h"
#include "kafka.h"
#include "kafkatest.h"
#include "storetest.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ACCOUNTS 24
#define AGGS 2
#define ROUND_NS (10 * NS_PER_SEC) /* a sample every 10 s of the sandboxes' time */
#define MAX_ROUNDS 400
#define MIB (UINT64_C(1) << 20)

enum phase { BEFORE, GROWING, SWITCHED, PHASES }; /* before the growth; until the late producer knows; after */
static const char *const phase_name[] = { "before the growth", "growing", "after the switch" };

struct account {
        char id[32], key[32], sb[32];
        int late;        /* produced by the late producer */
        int32_t p4, p8;  /* librdkafka's partitioner at 4 and 8 partitions */
        uint32_t vcpus;
        uint64_t mem, disk;
        uint64_t seq, cpu, running, paused; /* what the test produced: cumulative, the truth */
        int state;                          /* of the last sample */
        uint64_t billed_before;             /* CPU billed when the growth began */
        uint64_t billed_growing;            /* ... when the late producer switched */
};

struct sent {
        int account;
        enum phase phase;
        uint64_t cpu;
        int32_t partition; /* from the delivery report */
        int done, err;
};

static struct account accts[ACCOUNTS];
static struct sent sent[ACCOUNTS * (MAX_ROUNDS + 1)];
static size_t nsent;
static uint64_t rng = 88172645463325252ull;

static uint64_t next_random(void)
{
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        return rng;
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
        struct sent *s = m->_private;
        if (!s)
                return; /* a created event: not counted */
        s->done = 1;
        s->err = m->err;
        s->partition = m->partition;
}

static rd_kafka_t *producer(struct aggtest *t, const char *refresh_ms)
{
        char err[512], refresh[96];
        snprintf(refresh, sizeof(refresh), "topic.metadata.refresh.interval.ms=%s", refresh_ms);
        const char *const extra[] = { refresh, "message.timeout.ms=120000", NULL };
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        rd_kafka_t *rk = kafka_producer_new(t->bootstrap, test_kafka_conf(conf), extra, err, sizeof(err));
        if (!rk) {
                fprintf(stderr, "FAIL: producer: %s\n", err);
                exit(1);
        }
        return rk;
}

static struct aggtest *harness; /* its record of the sandboxes whose created event went */
static int64_t created_sent;

static void produce(rd_kafka_t *rk, const struct usage_event *ev, struct sent *s)
{
        /* A sandbox's created event first, as its vmm sends it (the aggregator holds
         * readings until it has one), from the same producer with the same key. */
        struct usage_event created;
        if (s && aggtest_needs_created(harness, ev, &created)) {
                produce(rk, &created, NULL);
                created_sent++;
        }
        char buf[8192];
        int n = event_encode(ev, buf, sizeof(buf));
        CHECK(n > 0, "encode");
        rd_kafka_resp_err_t e;
        while ((e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_KEY(ev->account, strlen(ev->account)),
                                      RD_KAFKA_V_VALUE(buf, (size_t)n), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                      RD_KAFKA_V_OPAQUE(s), RD_KAFKA_V_END)) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(rk, 10);
        CHECK(e == 0, "produce: %s", rd_kafka_err2str(e));
        rd_kafka_poll(rk, 0);
}

/* One sample of every account (each from its producer): 10 s more of its life. */
static void round_of(rd_kafka_t *late, rd_kafka_t *early, enum phase phase, int64_t t0)
{
        for (int i = 0; i < ACCOUNTS; i++) {
                struct account *a = &accts[i];
                if (nsent >= (size_t)ACCOUNTS * MAX_ROUNDS) { /* the last ACCOUNTS are stop_all's */
                        CHECK(0, "more than %d rounds", MAX_ROUNDS);
                        return;
                }
                a->seq++;
                a->state = next_random() % 5 == 0 ? STATE_PAUSED : STATE_RUNNING;
                if (a->state == STATE_RUNNING) {
                        a->cpu += next_random() % ((uint64_t)a->vcpus * ROUND_NS + 1);
                        a->running += ROUND_NS;
                } else {
                        a->paused += ROUND_NS;
                }
                struct usage_event ev = aggtest_held(
                        aggtest_sample(a->id, a->key, a->sb, 1, a->seq, t0 + (int64_t)a->seq * ROUND_NS, a->state,
                                       a->cpu, a->mem, a->disk, a->vcpus),
                        a->running, a->paused);
                struct sent *s = &sent[nsent++];
                *s = (struct sent){ .account = i, .phase = phase, .cpu = a->cpu, .partition = -1 };
                produce(a->late ? late : early, &ev, s);
        }
}

/* The vmm's stopped event of every sandbox, 5 s after its last sample: the final counters. */
static void stop_all(rd_kafka_t *late, rd_kafka_t *early, int64_t t0)
{
        for (int i = 0; i < ACCOUNTS; i++) {
                struct account *a = &accts[i];
                a->cpu += next_random() % ((uint64_t)a->vcpus * 5 * NS_PER_SEC + 1);
                if (a->state == STATE_RUNNING)
                        a->running += 5 * NS_PER_SEC;
                else
                        a->paused += 5 * NS_PER_SEC;
                struct usage_event ev = aggtest_stopped(a->id, a->key, a->sb, 1,
                                                        t0 + (int64_t)a->seq * ROUND_NS + 5 * NS_PER_SEC, a->cpu,
                                                        a->running, a->paused, a->mem, a->vcpus);
                struct sent *s = &sent[nsent++];
                *s = (struct sent){ .account = i, .phase = SWITCHED, .cpu = a->cpu, .partition = -1 };
                produce(a->late ? late : early, &ev, s);
        }
}

static void flush(rd_kafka_t *rk)
{
        CHECK(rd_kafka_flush(rk, 60000) == 0, "producer flush timed out");
}

/* The highest claim generation of partition p in aggregator n's log ("partition assigned"), or 0. */
static long claimed(struct aggtest *t, int n, int p)
{
        char path[1024], what[96];
        snprintf(path, sizeof(path), "%s/aggregator.%d.log", t->dir, n);
        snprintf(what, sizeof(what), "msg=\"partition assigned\" partition=%d ", p);
        char *text = test_read_file(path);
        long best = 0;
        for (const char *s = text; s && (s = strstr(s, what)); s += strlen(what)) {
                const char *g = strstr(s, "generation="), *eol = strchr(s, '\n');
                if (g && (!eol || g < eol) && strtol(g + 11, NULL, 10) > best)
                        best = strtol(g + 11, NULL, 10);
        }
        free(text);
        return best;
}

/* Who owns each of the first n partitions: the aggregator whose latest claim
 * is the ledger's generation for it, above base[p] (a claim since the moment
 * base was taken); -1 while none is. Returns how many have an owner; gen[p]
 * gets the generation. */
static int owners(struct aggtest *t, int n, const long *base, int *own, long *gen)
{
        int owned = 0;
        for (int p = 0; p < n; p++) {
                char q[256];
                snprintf(q, sizeof(q), "SELECT coalesce(max(generation), 0) FROM consumer_offsets"
                                       " WHERE group_id = 'tally-aggregator' AND topic = 'usage' AND partition = %d", p);
                long db = (long)store_int(t, q);
                own[p] = -1;
                gen[p] = db;
                for (int k = 0; k < AGGS; k++)
                        if (db > (base ? base[p] : 0) && claimed(t, k, p) == db)
                                own[p] = k;
                owned += own[p] >= 0;
        }
        return owned;
}

static bool both_own(const int *own, int n)
{
        bool has[AGGS] = { false };
        for (int p = 0; p < n; p++)
                if (own[p] >= 0)
                        has[own[p]] = true;
        return has[0] && has[1];
}

static void print_owners(const char *when, const int *own, const long *gen, int n)
{
        fprintf(stderr, "owners %s:", when);
        for (int p = 0; p < n; p++)
                fprintf(stderr, " p%d=aggregator %d (generation %ld)", p, own[p], gen[p]);
        fputc('\n', stderr);
}

/* The group's assignment of n partitions, settled (each claimed after base,
 * both aggregators holding some) and unchanged for 2 s; while waiting, a
 * round every 250 ms when the producers are given. *since gets the moment
 * (monotonic) it was first seen. Returns false at the timeout. */
static bool settle(struct aggtest *t, int n, const long *base, int *own, long *gen, rd_kafka_t *late,
                   rd_kafka_t *early, enum phase phase, int64_t t0, int timeout_s, int64_t *since)
{
        int64_t end = time_mono_ns() + (int64_t)timeout_s * NS_PER_SEC, stable_since = 0;
        long last[8] = { 0 };
        while (time_mono_ns() < end) {
                if (late)
                        round_of(late, early, phase, t0);
                bool ok = owners(t, n, base, own, gen) == n && both_own(own, n);
                if (ok && memcmp(last, gen, sizeof(*gen) * (size_t)n) == 0) {
                        if (time_mono_ns() - stable_since >= 2 * NS_PER_SEC) {
                                *since = stable_since;
                                return true;
                        }
                } else {
                        stable_since = time_mono_ns();
                        memcpy(last, gen, sizeof(*gen) * (size_t)n);
                }
                time_sleep_ns(250 * NS_PER_MS);
        }
        return false;
}

static void grow_usage(rd_kafka_t *rk, int partitions)
{
        char err[256];
        rd_kafka_NewPartitions_t *np = rd_kafka_NewPartitions_new(TOPIC_USAGE, (size_t)partitions, err, sizeof(err));
        CHECK(np, "NewPartitions: %s", err);
        rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
        rd_kafka_AdminOptions_t *opt = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_CREATEPARTITIONS);
        rd_kafka_AdminOptions_set_operation_timeout(opt, 30000, err, sizeof(err));
        rd_kafka_AdminOptions_set_request_timeout(opt, 30000, err, sizeof(err));
        rd_kafka_CreatePartitions(rk, &np, 1, opt, q);
        rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 60000);
        const char *why = !ev ? "no answer" : rd_kafka_event_error(ev) ? rd_kafka_event_error_string(ev) : NULL;
        if (ev && !why) {
                size_t n = 0;
                const rd_kafka_topic_result_t **r =
                        rd_kafka_CreatePartitions_result_topics(rd_kafka_event_CreatePartitions_result(ev), &n);
                if (n != 1 || rd_kafka_topic_result_error(r[0]))
                        why = n == 1 ? rd_kafka_topic_result_error_string(r[0]) : "no result";
        }
        CHECK(why == NULL, "could not add partitions to usage: %s", why ? why : "");
        if (ev)
                rd_kafka_event_destroy(ev);
        rd_kafka_AdminOptions_destroy(opt);
        rd_kafka_queue_destroy(q);
        rd_kafka_NewPartitions_destroy(np);
}

/* A metadata request for usage: what the producer's periodic refresh does. */
static void refresh_metadata(rd_kafka_t *rk)
{
        const struct rd_kafka_metadata *md = NULL;
        rd_kafka_topic_t *topic = rd_kafka_topic_new(rk, TOPIC_USAGE, NULL);
        rd_kafka_resp_err_t e = rd_kafka_metadata(rk, 0, topic, &md, 10000);
        CHECK(e == 0, "metadata: %s", rd_kafka_err2str(e));
        if (md)
                rd_kafka_metadata_destroy(md);
        rd_kafka_topic_destroy(topic);
}

static uint64_t billed_cpu(struct aggtest *t, const char *sb)
{
        char q[256];
        snprintf(q, sizeof(q), "SELECT coalesce(sum(cpu_ns), 0) FROM usage_hourly WHERE sandbox_id = '%s'", sb);
        int64_t v = store_int(t, q);
        return v > 0 ? (uint64_t)v : 0;
}

/* Waits until process pid is stopped (state T in /proc/pid/stat): SIGSTOP has taken hold. */
static bool wait_stopped(pid_t pid)
{
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        for (int i = 0; i < 200; i++) {
                char *st = test_read_file(path);
                const char *paren = st ? strrchr(st, ')') : NULL;
                bool stopped = paren && paren[1] == ' ' && paren[2] == 'T';
                free(st);
                if (stopped)
                        return true;
                time_sleep_ns(5 * NS_PER_MS);
        }
        return false;
}

/* Waits until the ledger's offset of every partition aggregator k owns is the partition's end. */
static int wait_owned_caught_up(struct aggtest *t, rd_kafka_t *rk, const int *own, int k, int timeout_s)
{
        for (int i = 0; i < timeout_s * 10; i++) {
                bool done = true;
                for (int p = 0; p < 8 && done; p++) {
                        if (own[p] != k)
                                continue;
                        int64_t lo, hi;
                        char q[256];
                        snprintf(q, sizeof(q), "SELECT coalesce(max(next_offset), 0) FROM consumer_offsets WHERE"
                                               " group_id = 'tally-aggregator' AND topic = 'usage' AND partition = %d", p);
                        done = rd_kafka_query_watermark_offsets(rk, TOPIC_USAGE, p, &lo, &hi, 10000) == 0 &&
                               store_int(t, q) == hi;
                }
                if (done)
                        return 0;
                time_sleep_ns(100 * NS_PER_MS);
        }
        return -1;
}

int main(void)
{
        int64_t started = time_mono_ns();
        struct aggtest t;
        aggtest_start(&t, "kafka_repartition", 4);
        harness = &t;
        CHECK(t.kafka.apache, "not Apache Kafka (the development broker cannot add partitions)");
        int64_t kafka_up = time_mono_ns();
        /* The late producer learns of new partitions only when the test says
         * (its own refresh, 10 min, is beyond the test; not more: with
         * 3600000 librdkafka 2.0 expired its topic metadata every second and
         * refreshed it); the early one within 0.5 s. */
        rd_kafka_t *late = producer(&t, "600000"), *early = producer(&t, "500");
        rd_kafka_topic_t *rkt = rd_kafka_topic_new(late, TOPIC_USAGE, NULL);
        int moved = 0, moved_late = 0;
        for (int i = 0; i < ACCOUNTS; i++) {
                struct account *a = &accts[i];
                snprintf(a->id, sizeof(a->id), "acct_grow%02d", i);
                snprintf(a->key, sizeof(a->key), "key_grow%02d", i);
                snprintf(a->sb, sizeof(a->sb), "sb_grow%02d", i);
                a->late = i % 2 == 0;
                a->vcpus = 1 + (uint32_t)(i % 4);
                a->mem = (uint64_t)(256 << (i % 3)) * MIB;
                a->disk = (uint64_t)(i + 1) * 100 * MIB;
                a->p4 = rd_kafka_msg_partitioner_consistent_random(rkt, a->id, strlen(a->id), 4, NULL, NULL);
                a->p8 = rd_kafka_msg_partitioner_consistent_random(rkt, a->id, strlen(a->id), 8, NULL, NULL);
                moved += a->p4 != a->p8;
                moved_late += a->p4 != a->p8 && a->late;
        }
        rd_kafka_topic_destroy(rkt);
        fprintf(stderr, "%d accounts, %d move when usage grows to 8 partitions (%d of the late producer's):", ACCOUNTS,
                moved, moved_late);
        for (int i = 0; i < ACCOUNTS; i++)
                if (accts[i].p4 != accts[i].p8)
                        fprintf(stderr, " %s p%d->p%d%s", accts[i].id, accts[i].p4, accts[i].p8,
                                accts[i].late ? " (late)" : "");
        fputc('\n', stderr);
        CHECK(moved_late > 0 && moved > moved_late, "no account of one of the producers moves");

        /* A short metadata refresh through --consumer-settings: the group finds
         * the new partitions within a second (the default is 30 s). A session
         * longer than the freeze below. */
        const char *extra[] = { "--batch-messages", "100", "--batch-ms", "30", "--consumer-settings",
                                "session.timeout.ms=30000,heartbeat.interval.ms=500,"
                                "topic.metadata.refresh.interval.ms=1000",
                                NULL };
        pid_t agg[AGGS];
        for (int k = 0; k < AGGS; k++)
                agg[k] = aggtest_spawn(&t, extra);
        int own4[8], own8[8];
        long gen4[8] = { 0 }, gen8[8]; /* gen4[4..7] stay 0: any claim of a new partition is after the growth */
        int64_t since = 0;
        bool settled = settle(&t, 4, NULL, own4, gen4, NULL, NULL, BEFORE, 0, 90, &since);
        print_owners("at 4 partitions", own4, gen4, 4);
        CHECK(settled, "the two aggregators did not share the 4 partitions");
        int64_t t0 = time_wall_ns() - 2 * 3600 * NS_PER_SEC;

        /* Before the growth: 5 rounds, all billed. */
        for (int r = 0; r < 5; r++)
                round_of(late, early, BEFORE, t0);
        flush(late);
        flush(early);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the samples before the growth were not billed");
        for (int i = 0; i < ACCOUNTS; i++)
                accts[i].billed_before = billed_cpu(&t, accts[i].sb);

        /* The growth, while both producers go on (a round every 250 ms) until
         * the group has rebalanced onto 8 partitions. */
        int64_t grow_at = time_mono_ns();
        grow_usage(t.producer, 8);
        fprintf(stderr, "usage grown to 8 partitions (CreatePartitions took %" PRId64 " ms)\n",
                (time_mono_ns() - grow_at) / NS_PER_MS);
        settled = settle(&t, 8, gen4, own8, gen8, late, early, GROWING, t0, 90, &since);
        print_owners("at 8 partitions", own8, gen8, 8);
        CHECK(settled, "the group did not rebalance onto 8 partitions in 90 s");
        if (settled)
                fprintf(stderr, "the group held all 8 partitions %" PRId64 " ms after the growth (seen within 250 ms,"
                                " then unchanged for 2 s)\n", (since - grow_at) / NS_PER_MS);
        /* Two more rounds on the old partitions for the late producer's
         * accounts, billed by the old partitions' owners after the growth. */
        round_of(late, early, GROWING, t0);
        round_of(late, early, GROWING, t0);
        flush(late);
        flush(early);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the samples of the growth were not billed");

        /* The race, made: the aggregator that owns the late accounts' old
         * partitions is frozen with their next sample unread; they move; the
         * other bills their next sample from the ledger; thawed, the frozen
         * one must be fenced, not bill from what it holds in memory. */
        int from_count[AGGS] = { 0 };
        for (int i = 0; i < ACCOUNTS; i++)
                if (accts[i].late && accts[i].p4 != accts[i].p8 && own8[accts[i].p4] >= 0 &&
                    own8[accts[i].p4] != own8[accts[i].p8])
                        from_count[own8[accts[i].p4]]++;
        int o = from_count[1] > from_count[0] ? 1 : 0, n = 1 - o;
        fprintf(stderr, "%d late accounts move from aggregator %d to aggregator %d\n", from_count[o], o, n);
        CHECK(from_count[o] > 0, "no late account moves to the other aggregator");
        for (int i = 0; i < ACCOUNTS; i++)
                accts[i].billed_growing = billed_cpu(&t, accts[i].sb);
        int fenced_before = kt_log_count(&t, o, "sandbox fenced");
        kill(agg[o], SIGSTOP);
        CHECK(wait_stopped(agg[o]), "aggregator %d did not stop on SIGSTOP", o);
        int64_t frozen = time_mono_ns();
        round_of(late, early, GROWING, t0);
        flush(late);
        refresh_metadata(late);
        round_of(late, early, SWITCHED, t0);
        flush(late);
        flush(early);
        int rc = wait_owned_caught_up(&t, t.producer, own8, n, 60);
        CHECK(rc == 0, "aggregator %d did not bill its partitions while %d was frozen", n, o);
        kill(agg[o], SIGCONT);
        fprintf(stderr, "aggregator %d frozen %" PRId64 " ms\n", o, (time_mono_ns() - frozen) / NS_PER_MS);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the thawed aggregator did not catch up");
        int fenced = kt_log_count(&t, o, "sandbox fenced") - fenced_before;
        fprintf(stderr, "aggregator %d, thawed: \"sandbox fenced\" %d times\n", o, fenced);
        CHECK(fenced > 0, "the thawed aggregator was not fenced for the sandboxes billed meanwhile elsewhere");

        /* After: 3 rounds, then every sandbox stops. */
        for (int r = 0; r < 3; r++)
                round_of(late, early, SWITCHED, t0);
        stop_all(late, early, t0);
        flush(late);
        flush(early);
        CHECK(aggtest_wait_caught_up(&t, 90) == 0, "the samples after the growth were not billed");
        int own_end[8];
        long gen_end[8];
        owners(&t, 8, NULL, own_end, gen_end);
        print_owners("at the end", own_end, gen_end, 8);
        CHECK(both_own(own_end, 8), "one aggregator holds no partition at the end");

        /* Where every message went, by its delivery report. */
        int on_old[PHASES] = { 0 }, on_new[PHASES] = { 0 }, undelivered = 0, wrong = 0, back = 0;
        uint64_t old_max[ACCOUNTS] = { 0 };
        int old_after[ACCOUNTS] = { 0 }, new_count[ACCOUNTS] = { 0 };
        for (size_t i = 0; i < nsent; i++) {
                const struct sent *s = &sent[i];
                const struct account *a = &accts[s->account];
                if (!s->done || s->err) {
                        undelivered++;
                        continue;
                }
                bool is_moved = a->p4 != a->p8;
                if (is_moved && s->partition == a->p8) {
                        on_new[s->phase]++;
                        new_count[s->account]++;
                } else if (s->partition != a->p4) {
                        wrong++;
                } else if (is_moved && new_count[s->account] > 0) {
                        back++; /* produced after one that went to the new partition */
                } else {
                        on_old[s->phase]++;
                        if (is_moved && s->cpu > old_max[s->account])
                                old_max[s->account] = s->cpu;
                        if (is_moved && s->phase == GROWING)
                                old_after[s->account]++;
                }
        }
        int sw_old_moved = 0;
        for (size_t i = 0; i < nsent; i++)
                if (sent[i].phase == SWITCHED && sent[i].done && !sent[i].err &&
                    accts[sent[i].account].p4 != accts[sent[i].account].p8 &&
                    sent[i].partition != accts[sent[i].account].p8)
                        sw_old_moved++;
        for (int ph = 0; ph < PHASES; ph++)
                fprintf(stderr, "messages %s: %d on the account's partition at 4 partitions, %d on its new one\n", phase_name[ph],
                        on_old[ph], on_new[ph]);
        CHECK(undelivered == 0, "%d messages were not delivered", undelivered);
        CHECK(wrong == 0, "%d messages went to a partition the partitioner does not give their key", wrong);
        CHECK(back == 0, "%d messages went back to the old partition after the new one", back);
        CHECK(on_new[BEFORE] == 0, "messages before the growth went to partitions 4-7");
        CHECK(sw_old_moved == 0, "%d messages of moved accounts went to the old partition after the switch",
              sw_old_moved);

        /* Every sandbox: billed equals produced, CPU to the nanosecond, held
         * time times its sizes; the moved ones billed on both sides. */
        uint64_t cpu_truth = 0, cpu_billed = 0;
        int both_sides = 0, both_sides_late = 0, mismatched = 0;
        for (int i = 0; i < ACCOUNTS; i++) {
                const struct account *a = &accts[i];
                char q[512];
                snprintf(q, sizeof(q),
                         "SELECT coalesce(sum(cpu_ns), 0) || ' ' || (coalesce(sum(mem_byte_ns), 0) = %" PRIu64
                         "::numeric * %" PRIu64 ") || ' ' || (coalesce(sum(storage_byte_ns), 0) = %" PRIu64
                         "::numeric * %" PRIu64 ") FROM usage_hourly WHERE sandbox_id = '%s'",
                         a->running, a->mem, a->paused, a->mem + a->disk, a->sb);
                char *v = aggtest_query(&t, q), want[96];
                snprintf(want, sizeof(want), "%" PRIu64 " true true", a->cpu);
                uint64_t cpu = v ? strtoull(v, NULL, 10) : 0;
                cpu_truth += a->cpu;
                cpu_billed += cpu;
                if (!v || strcmp(v, want) != 0) {
                        mismatched++;
                        CHECK(0, "%s (p%d->p%d%s) billed %s (cpu_ns, memory held, storage held), want %s", a->sb,
                              a->p4, a->p8, a->late ? ", late" : "", v ? v : "?", want);
                }
                free(v);
                if (a->p4 == a->p8)
                        continue;
                bool ok = a->billed_before > 0 && new_count[i] > 0 && a->cpu > old_max[i] && cpu == a->cpu;
                both_sides += ok;
                both_sides_late += ok && a->late && old_after[i] > 0 && a->billed_growing > a->billed_before;
                CHECK(ok, "%s moved p%d->p%d but was not billed on both sides (before %" PRIu64 ", %d messages on"
                          " p%d, last counter on p%d %" PRIu64 ", final %" PRIu64 ")",
                      a->sb, a->p4, a->p8, a->billed_before, new_count[i], a->p8, a->p4, old_max[i], a->cpu);
        }
        int64_t produced = (int64_t)nsent + created_sent, end = aggtest_topic_end(&t), committed = aggtest_committed(&t);
        fprintf(stderr, "messages produced %" PRId64 " (%" PRId64 " of them created events), end of topic %" PRId64 ", offsets committed %" PRId64 "\n",
                produced, created_sent, end, committed);
        fprintf(stderr, "cpu_ns: billed %" PRIu64 ", produced %" PRIu64 "; %d of %d sandboxes mismatched\n",
                cpu_billed, cpu_truth, mismatched, ACCOUNTS);
        fprintf(stderr, "moved accounts billed on both sides of the growth: %d of %d (%d late ones also on the old"
                        " partition after it)\n", both_sides, moved, both_sides_late);
        CHECK(end == produced, "the topic holds %" PRId64 " messages, %" PRId64 " were produced", end, produced);
        CHECK(committed == end, "offsets committed %" PRId64 ", end of topic %" PRId64, committed, end);
        CHECK(cpu_billed == cpu_truth, "CPU billed %" PRIu64 ", produced %" PRIu64, cpu_billed, cpu_truth);
        CHECK(both_sides_late > 0, "no late account was billed on its old partition after the growth");
        CHECK(store_int(&t, "SELECT count(*) FROM dead_letters") == 0, "samples were dead-lettered");
        for (int k = 0; k < AGGS; k++)
                CHECK(aggtest_terminate(agg[k]) == 0, "aggregator %d did not stop cleanly", k);
        rd_kafka_flush(late, 10000);
        rd_kafka_flush(early, 10000);
        rd_kafka_destroy(late);
        rd_kafka_destroy(early);
        fprintf(stderr, "the test took %" PRId64 " s, %" PRId64 " s of them starting Kafka\n",
                (time_mono_ns() - started) / NS_PER_SEC, (kafka_up - started) / NS_PER_SEC);
        aggtest_stop(&t);
        return test_result();
}
