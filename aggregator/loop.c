/* loop.c — tally-aggregator's main loop (see aggregator.h).
 *
 * Poll messages, fold each into the in-memory state of its sandbox (which
 * produces usage per (sandbox, hour)), and every few thousand messages or
 * batch_ms commit the batch in ONE transaction (store.h). Only after the
 * commit are control commands published (enforce.h).
 *
 * In-memory fold state is always "the database plus this batch": when a
 * commit fails (database error or fenced partition) the batch is thrown away
 * and the state and positions are read back from the database (resync).
 *
 * The modules, each owning its state: ledger.h (the connection), cache.h
 * (sandboxes in memory), partitions.h (ownership and offsets), batch.h,
 * intake.h (messages into the batch, with held.h), store.h (the commit),
 * poison.h (batches the ledger keeps refusing), enforce.h (commands). This
 * file holds what ties them: the commit's before and after, the rebalance
 * callback, and the loop's timing rules. */
#include "aggregator.h"

#include "announce.h"
#include "batch.h"
#include "cache.h"
#include "enforce.h"
#include "held.h"
#include "intake.h"
#include "kafka.h"
#include "ledger.h"
#include "log.h"
#include "metrics.h"
#include "metrics_http.h"
#include "partitions.h"
#include "poison.h"
#include "store.h"
#include "timeutil.h"
#include "writer.h"

#include <errno.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAG_BUCKETS 60000                    /* 1 ms each: commit latency histogram up to 60 s */
#define HOLD_MAX 4096                        /* messages taken from the consumer at once */
#define DEFER_MAX HOLD_MAX                   /* messages of other commit groups waiting, at most */
#define GROUPS_BEHIND_MIN 32                 /* messages behind never too many for commit groups */
#define ABSENT_MAX 20000                     /* new sandboxes remembered while messages wait */
#define GROUPS_LATE_MS 1000                  /* a batch's first message older: the consumer is behind */
#define METERING_CHECK_NS (5 * NS_PER_SEC)   /* how often the metering_gaps view is read */

/* A batch of a consumer that is behind may grow past batch_ms, up to this
 * many times batch_ms or CATCHUP_BATCH_NS, whichever is longer (see
 * commit_due): batch_ms is chosen for commit latency when the consumer keeps
 * up; catching up, larger batches write fewer rows per sample (a row per
 * sandbox-hour per batch), and the samples waiting are late already. */
#ifndef CATCHUP_BATCH_FACTOR
#define CATCHUP_BATCH_FACTOR 10
#endif
#define CATCHUP_BATCH_NS (5 * NS_PER_SEC)

struct agg {
        const struct aggregator_config *cfg;
        volatile sig_atomic_t *stop;
        struct agg_metrics *metrics;
        rd_kafka_t *consumer;

        struct ledger ledger;           /* reads: fold states, held readings, positions */
        struct sandbox_cache cache;
        struct partitions parts;
        struct batch batches[2];
        struct batch *batch;            /* the batch being folded: one of batches */
        struct batch *inflight;         /* the other, while the writer commits it; NULL: none */
        struct ledger wledger;          /* every commit's connection */
        struct ledger watch;            /* the metering gaps' (check_metering_gaps) */
        struct writer writer;
        struct announcer announcer;     /* created rows the writer commits ahead of their batch */
        int64_t due_asked_ns;           /* monotonic: when due_mid_poll last asked */
        /* Messages polled and not folded yet, in the order polled, with the
         * monotonic time of their poll: a poll's, and those of commit groups
         * other than the open batch's, waiting for a batch of their own
         * (see "Commit groups" below). Polled before seek_gen moved: stale. */
        rd_kafka_message_t **pend;
        int64_t *pend_at;
        size_t npend;
        uint64_t pend_gen;
        size_t prefetched;              /* pend's first messages prefetch has looked at... */
        uint64_t prefetch_commits;      /* ...since the commit that made committed_batches this */
        int open_group;                 /* the open batch's commit group, or PARTITION_GROUP_ALL */
        int groups_were_off;            /* groups_off's last answer, for the log (-1: none yet) */
        size_t held_rest;               /* messages polled not folded yet (take_held) */
        rd_kafka_queue_t *fetched;      /* the consumer's queue: messages fetched, not polled */
        struct intake intake;
        struct poison poison;
        struct enforce enforce;

        uint64_t *lag_hist;
        uint64_t committed_messages, committed_batches, fenced, dead_total;
        int64_t last_sweep_ns, last_gap_check_ns, last_held_check_ns;
};

/* ---- commit latency ---- */

static void record_latency(struct agg *a, const struct batch *b)
{
        int64_t now_ms = time_wall_ns() / NS_PER_MS;
        for (size_t i = 0; i < b->nstamps; i++) {
                int64_t lag = now_ms - b->stamps[i].kafka_ms;
                if (lag < 0)
                        lag = 0;
                a->lag_hist[lag < LAG_BUCKETS ? lag : LAG_BUCKETS - 1] += b->stamps[i].samples;
                metrics_histogram_add_n_us(&a->metrics->lag, lag * 1000, b->stamps[i].samples);
        }
}

static int64_t lag_quantile(const struct agg *a, uint64_t num, uint64_t den)
{
        uint64_t total = 0, seen = 0;
        for (int i = 0; i < LAG_BUCKETS; i++)
                total += a->lag_hist[i];
        if (!total)
                return -1;
        uint64_t want = (total * num + den - 1) / den;
        for (int i = 0; i < LAG_BUCKETS; i++) {
                seen += a->lag_hist[i];
                if (seen >= want)
                        return i;
        }
        return LAG_BUCKETS - 1;
}

/* ---- the batch's end ---- */

/* Forgets the open batch, committed or not. */
static void batch_drop(struct agg *a)
{
        batch_clear(a->batch);
        partitions_untouch(&a->parts);
}

/* A commit that went through: what it decided is published, counted, logged. */
static void committed(struct agg *a, struct batch *b, const struct commit_report *rep)
{
        int64_t now_mono = rep->at[sizeof(rep->at) / sizeof(rep->at[0]) - 1];
        sandboxes_forget_unheld(&a->cache); /* the batch may have stored held readings */
        record_latency(a, b);
        metrics_histogram_add_us(&a->metrics->commit, (now_mono - rep->t0) / NS_PER_US);
        enforce_publish(&a->enforce, rep->cmds, rep->ncmds, rep->blocked != 0);
        a->committed_messages += b->messages;
        a->committed_batches++;
        a->dead_total += b->ndead;
        atomic_fetch_add_explicit(&a->metrics->messages_committed, b->messages, memory_order_relaxed);
        atomic_fetch_add_explicit(&a->metrics->batches_committed, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&a->metrics->dead_letters[AGG_DEAD_DECODE], b->ndead, memory_order_relaxed);
        poison_committed(&a->poison, b->messages);
        store_log_committed(rep, b);
        batch_clear(b);
}

/* A commit that failed: the batch is dropped and the state read back from
 * the ledger (resync); a failure that repeats is narrowed down to its
 * message (poison_step). */
static void failed(struct agg *a, struct batch *b, int r)
{
        if (r == -ESTALE || r == -EBUSY) {
                a->fenced++;
                atomic_fetch_add_explicit(&a->metrics->batches_fenced, 1, memory_order_relaxed);
                if (r == -EBUSY)
                        atomic_fetch_add_explicit(&a->metrics->sandboxes_fenced, 1, memory_order_relaxed);
                log_warn(r == -ESTALE ? "partition fenced: another aggregator owns it now; batch dropped"
                                      : "sandbox fenced: another aggregator billed it meanwhile; batch read again",
                         "messages=%zu", b->messages);
        } else {
                atomic_fetch_add_explicit(&a->metrics->batches_failed, 1, memory_order_relaxed);
                log_error("could not commit a batch; it will be read again", "messages=%zu", b->messages);
                if (content_error(&a->wledger, r)) /* the database will say the same again: no need to wait */
                        a->dead_total += (uint64_t)poison_step(&a->poison, &a->wledger, b, &a->parts, a->metrics);
                else
                        time_sleep_ns(NS_PER_SEC / 2); /* do not spin on a database that keeps refusing */
        }
        batch_clear(b);
        partitions_untouch(&a->parts);
        resync(&a->parts);
}

/* Takes the result of the commit the writer holds, waiting for it. On
 * failure the open batch goes too: it was folded on top of the failed one.
 * Returns that commit's result (0 when there was none). */
static int settle(struct agg *a)
{
        announce_settle(&a->announcer, &a->writer);
        if (!a->inflight)
                return 0;
        int r = writer_wait(&a->writer);
        struct batch *b = a->inflight;
        a->inflight = NULL;
        if (r == 0) {
                committed(a, b, &a->writer.rep);
        } else {
                if (a->batch->messages)
                        log_info("the batch folded during a failed commit is dropped too; both are read again",
                                 "messages=%zu", a->batch->messages);
                batch_clear(a->batch);
                failed(a, b, r);
        }
        free(a->writer.rep.cmds);
        a->writer.rep.cmds = NULL;
        return r;
}

/* Writes out the open batch's rows (store_prepare, on this thread: they read
 * the cache's sandboxes) and hands its commit to the writer; the other batch
 * becomes the open one. The writer must be idle. */
static int start_commit(struct agg *a)
{
        struct batch *b = a->batch;
        if (b->messages == 0)
                return 0;
        struct writer *w = &a->writer;
        int r = writer_positions(w, &a->parts);
        if (r == 0)
                r = store_prepare(b, &w->rep);
        if (r < 0) {
                failed(a, b, r);
                return r;
        }
        for (int32_t p = 0; p < w->positions.nparts; p++)
                w->rep.partitions += w->positions.parts[p].touched;
        batch_written(b, &a->cache, time_mono_ns());
        partitions_untouch(&a->parts);
        w->ledger = &a->wledger;
        w->batch = b;
        w->metrics = a->metrics;
        a->inflight = b;
        a->batch = a->intake.batch = b == &a->batches[0] ? &a->batches[1] : &a->batches[0];
        writer_submit(w);
        return 0;
}

/* Commits the open batch and waits for it (after the writer's, if any).
 * On failure the state is read back from the ledger. */
static int commit_batch(struct agg *a)
{
        int r = settle(a);
        if (r < 0 || a->batch->messages == 0)
                return r;
        r = start_commit(a);
        return r < 0 ? r : settle(a);
}

/* The open batch is full or due in the middle of a poll's messages: its
 * commit starts once the writer's is through. One that holds readings waiting for
 * their sandbox's announcement (held.h) is waited for: the announcement may
 * be among the messages that follow, and must find them in the ledger. */
static void hand_off(struct agg *a)
{
        if (settle(a) == 0 && start_commit(a) == 0 && a->inflight && a->inflight->nwaiting)
                settle(a);
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *parts,
                         void *opaque)
{
        struct agg *a = opaque;
        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
                commit_batch(a); /* claiming replaces sandboxes the batch may point to */
                a->parts.seek_gen++;
                while (claim(&a->parts, parts) < 0 && !*a->stop) {
                        log_error("could not claim partitions; retrying", NULL);
                        time_sleep_ns(NS_PER_SEC);
                }
                partitions_group(&a->parts, (int)a->cfg->commit_groups);
                rd_kafka_assign(rk, parts);
        } else {
                /* Revoked or lost: what we hold commits only if our generation
                 * still owns the partitions; then the state is dropped. */
                commit_batch(a);
                release(&a->parts, parts);
                partitions_group(&a->parts, (int)a->cfg->commit_groups);
                rd_kafka_assign(rk, NULL);
        }
}

/* ---- the loop ---- */

static bool commit_due(struct agg *a, bool quiet);

/* Between two messages of a poll: one poll can hold millions of samples
 * (usage batches: HOLD_MAX messages of thousands each), so the batch's age
 * is looked at as it is folded, not only between polls. A due batch goes
 * only to an idle writer; while the writer is busy it grows, as it would
 * between polls. A batch not due gives an idle writer its new created rows
 * (announce.h): a poll of 4,096 created events takes the loop 50-80 ms. */
static bool due_mid_poll(struct agg *a)
{
        int64_t now = time_mono_ns();
        /* Asked at most once a millisecond: the writer's state takes its lock and
         * commit_due asks every partition's watermarks, too much for each message
         * of a backlog of one-sample messages while a grown batch waits. */
        if (now - a->due_asked_ns < NS_PER_MS)
                return false;
        a->due_asked_ns = now;
        if ((a->inflight || a->announcer.running) && !writer_finished(&a->writer))
                return false;
        if (now - a->batch->started_ns >= a->cfg->batch_ms * NS_PER_MS && commit_due(a, false))
                return true;
        if (!a->inflight) {
                announce_settle(&a->announcer, &a->writer);
                announce_start(&a->announcer, &a->writer, &a->wledger, a->batch);
        }
        return false;
}

/* ---- commit groups ----
 *
 * Every batch of a consumer that keeps up holds a row per sandbox it
 * touched, whatever the batch's length, and a sample waits for the commit
 * under way and then for its own: two commits of every sandbox. With
 * commit_groups G > 1 the partitions owned are numbered in order and
 * grouped by number modulo G (partitions_group), and a batch takes the
 * messages of one group only: a sample then waits for the commits of the
 * other groups and its own, each of 1/G of the sandboxes, about (1 + 1/G)
 * commits of all instead of two. A message of another group waits in pend
 * for a batch of its group; the groups take turns oldest first (the empty
 * batch takes the group of the oldest message waiting). A partition's
 * messages are folded in order, its position moves only as they are, and
 * the waiting ones go with any seek (they come again from the ledger's
 * position), so what a batch holds changes, never what is billed.
 *
 * Batches take every partition (PARTITION_GROUP_ALL) unless the consumer
 * keeps up: while more than GROUPS_BEHIND_MIN messages are behind and the
 * message that opens the batch was produced more than GROUPS_LATE_MS ago by
 * its Kafka timestamp (catching up, where larger batches write fewer rows a
 * sample, see commit_due; a burst of fresh messages, such as a fleet's
 * created events at once, is not); while more than DEFER_MAX messages wait;
 * and while the poison rule searches a failing batch. A producer's clock
 * set wrong moves only this choice, never what is billed: behind, batches
 * take every partition (a sample waits for commits of all the sandboxes, as
 * with commit_groups 1); ahead, a backlog is caught up a group at a time
 * (more commits, each of fewer sandboxes). */

static bool groups_off(struct agg *a, const rd_kafka_message_t *m)
{
        if (a->cfg->commit_groups <= 1)
                return true;
        int64_t behind = backlog(&a->parts, PARTITION_GROUP_ALL);
        int64_t produced_ms = rd_kafka_message_timestamp(m, NULL), age_ms = -1;
        if (produced_ms >= 0)
                age_ms = time_wall_ns() / NS_PER_MS - produced_ms;
        bool late = produced_ms < 0 || age_ms > GROUPS_LATE_MS;
        bool off = poison_searching(&a->poison) || (behind > GROUPS_BEHIND_MIN && late);
        if ((int)off != a->groups_were_off) { /* (the first answer too) */
                a->groups_were_off = off;
                log_debug(off ? "batches take every partition" : "batches take one commit group",
                          "behind=%" PRId64 " age_ms=%" PRId64, behind, age_ms);
        }
        return off;
}

/* The commit group of m: its partition's; PARTITION_GROUP_ALL for one no batch
 * keeps (a partition not owned, or none: the consumer's own errors). */
static int group_of(struct agg *a, const rd_kafka_message_t *m)
{
        if (m->partition < 0 || m->partition >= a->parts.nparts || !a->parts.parts[m->partition].owned)
                return PARTITION_GROUP_ALL;
        return a->parts.parts[m->partition].group;
}

static void drop_pending(struct agg *a)
{
        for (size_t i = 0; i < a->npend; i++)
                rd_kafka_message_destroy(a->pend[i]);
        a->npend = a->prefetched = 0;
        a->pend_gen = a->parts.seek_gen;
}

/* Has prefetch look at the messages waiting that it has not seen since the
 * last commit (a commit forgets which sandboxes have no held readings):
 * those polled since, or all of them. */
static void prefetch_pending(struct agg *a)
{
        size_t from = a->prefetch_commits == a->committed_batches && a->prefetched <= a->npend ? a->prefetched : 0;
        prefetch(&a->cache, a->pend + from, a->npend - from);
        a->prefetched = a->npend;
        a->prefetch_commits = a->committed_batches;
}

/* Folds one message into the open batch (and destroys it), committing when
 * the batch reaches its limit or is due (due_mid_poll). at_ns: when it was
 * polled; a commit group's batch is as old as its first message's poll. */
static void take_one(struct agg *a, rd_kafka_message_t *m, int64_t at_ns)
{
        if (!m->err) {
                size_t before = a->batch->messages;
                if (take_message(&a->intake, m) < 0) {
                        log_error("could not take a message (memory, or the ledger unreadable);"
                                  " dropping the batch to read it again", NULL);
                        if (settle(a) == 0) { /* (a failure there resynced already) */
                                batch_drop(a);
                                resync(&a->parts);
                        }
                        time_sleep_ns(NS_PER_SEC / 2);
                } else if (before == 0 && a->batch->messages == 1) {
                        keep_first(a->batch, &(struct raw){ .partition = m->partition, .offset = m->offset,
                                                             .payload = m->payload, .len = m->len });
                        if (a->open_group != PARTITION_GROUP_ALL && at_ns < a->batch->started_ns)
                                a->batch->started_ns = at_ns; /* (it may have waited for its group) */
                }
        } else if (m->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET) {
                /* Commit first: the gap moves the offset in the ledger. */
                struct partition *p = part(&a->parts, m->partition);
                if (p && p->owned && commit_batch(a) == 0)
                        offset_reset(&a->parts, m->partition);
        } else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                log_warn("consumer error", "error=\"%s\"", rd_kafka_message_errstr(m));
        }
        rd_kafka_message_destroy(m);
        if (a->batch->messages && ((int64_t)a->batch->messages >= batch_limit(&a->poison, a->cfg->batch_messages) ||
                                   due_mid_poll(a)))
                hand_off(a);
}

/* Folds the messages waiting in order, those of the open batch's commit
 * group (or all), and keeps the others in order at pend's head. When the
 * open batch changes group (a commit started, or groups went off), the ones
 * kept come first again. A commit that fails resyncs: every message waiting
 * is stale then and dropped (the consumer delivers them again). */
static void take_held(struct agg *a)
{
        uint64_t gen = a->parts.seek_gen;
        if (a->pend_gen != gen) {
                drop_pending(a);
                return;
        }
        /* Held readings the writer's commit stores or deletes: read back only
         * once it is through (a failure resyncs: these messages are stale). */
        if (a->npend && a->inflight && a->inflight->nwaiting)
                settle(a);
        prefetch_pending(a);
        size_t kept = 0;
        size_t i;
        for (i = 0; i < a->npend && a->parts.seek_gen == gen; i++) {
                rd_kafka_message_t *m = a->pend[i];
                int g = group_of(a, m);
                if (a->batch->messages == 0)
                        a->open_group = groups_off(a, m) ? PARTITION_GROUP_ALL : g;
                if (g != PARTITION_GROUP_ALL && a->open_group != PARTITION_GROUP_ALL && g != a->open_group) {
                        a->pend_at[kept] = a->pend_at[i]; /* (kept <= i: the slot is free) */
                        a->pend[kept++] = m;
                        if (kept < DEFER_MAX)
                                continue;
                        a->open_group = PARTITION_GROUP_ALL; /* too many waiting: this batch takes all */
                } else {
                        int64_t at = a->pend_at[i];
                        a->held_rest = a->npend - i - 1 + kept;
                        take_one(a, m, at);
                }
                if (kept && (a->batch->messages == 0 || a->open_group == PARTITION_GROUP_ALL)) {
                        /* The ones kept may be taken now, before the rest. */
                        size_t rest = a->npend - i - 1;
                        memmove(a->pend + kept, a->pend + i + 1, rest * sizeof(*a->pend));
                        memmove(a->pend_at + kept, a->pend_at + i + 1, rest * sizeof(*a->pend_at));
                        a->npend = kept + rest;
                        kept = 0;
                        i = (size_t)-1;
                        a->prefetched = a->npend; /* (looked at, all of them: again after a commit) */
                        prefetch_pending(a);
                }
        }
        a->held_rest = 0;
        if (a->parts.seek_gen != gen) { /* what waits was polled before the seek */
                for (; i < a->npend; i++)
                        a->pend[kept++] = a->pend[i];
                a->npend = kept;
                drop_pending(a);
                return;
        }
        a->npend = a->prefetched = kept;
        /* What prefetch found new goes with the messages it looked at (and
         * is looked up again past ABSENT_MAX ids: memory). */
        if (!kept || a->cache.absent.n > ABSENT_MAX) {
                sandboxes_forget_absent(&a->cache);
                a->prefetched = 0;
        }
}

/* Creates the consumer (offsets kept in the ledger, never committed to
 * Kafka; a position the broker lost reported, never reset) and subscribes. */
static int consumer_open(struct agg *a)
{
        const struct aggregator_config *cfg = a->cfg;
        char err[1024];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
        rd_kafka_conf_set_opaque(conf, a);
        /* topic.metadata.refresh.interval.ms: partitions added to usage are
         * found (and the group rebalanced onto them) within 30 s, not
         * librdkafka's 5 min (docs/kafka.md, "Adding partitions");
         * consumer_settings, applied after, may change it. */
        /* fetch.error.backoff.ms: librdkafka 2.0 puts a partition's next fetch off
         * by it (500 ms by default) after a fetch error and while the partition's
         * local queue is over the queued.* limits. Catching up on a backlog, the
         * last 40 messages of scripts/bench aggregator's preload came 260-530 ms
         * after the rest, the broker's high watermark already past them; at
         * 10 and 20 ms they came at once in four runs of five (e2e 0.82 M
         * samples/s in five runs before, 1.21-1.28 M in those four). Later
         * librdkafka calls the wait for a full queue fetch.queue.backoff.ms
         * (1 s by default): set where it is known.
         * queued.max.messages.kbytes: librdkafka 2.0 stops fetching every
         * partition once the local queue holds this much (64 MiB by default)
         * and looks again only when its broker thread next wakes, up to 1 s
         * later. Usage batches of 2,500 samples filled 64 MiB 120 ms into
         * scripts/bench aggregator's preload, and fetching stood still for
         * 880 ms while the loop ran dry (librdkafka's debug=fetch). 256 MiB
         * holds more than the loop folds in that second. */
        static const char *const consumer_settings[] = {
                "fetch.max.bytes=16777216", "max.partition.fetch.bytes=4194304", "fetch.wait.max.ms=20",
                "queued.min.messages=200000", "queued.max.messages.kbytes=262144", "fetch.error.backoff.ms=20",
                KAFKA_METADATA_REFRESH, NULL };
        if (rd_kafka_conf_set(conf, "fetch.queue.backoff.ms", "20", err, sizeof(err)) == RD_KAFKA_CONF_INVALID) {
                rd_kafka_conf_destroy(conf);
                log_error("bad consumer setting", "error=\"%s\"", err);
                return -EIO;
        }
        if (kafka_conf_set_client(conf, &cfg->kafka, err, sizeof(err)) < 0 ||
            kafka_conf_set_all(conf, consumer_settings, err, sizeof(err)) < 0 ||
            kafka_conf_set_list(conf, cfg->consumer_settings, err, sizeof(err)) < 0) {
                rd_kafka_conf_destroy(conf);
                log_error("bad consumer setting", "error=\"%s\"", err);
                return -EIO;
        }
        /* A stored offset the broker no longer has is reported, never silently
         * reset (offset_reset): the error setting wins over any other. */
        static const char *const consumer_fixed[] = { "auto.offset.reset=error", NULL };
        a->consumer = kafka_consumer_new(cfg->kafka_brokers, cfg->group, conf, consumer_fixed, err, sizeof(err));
        if (!a->consumer) {
                log_error("could not create the consumer", "error=\"%s\"", err);
                return -EIO;
        }
        a->parts.consumer = a->consumer;
        a->fetched = rd_kafka_queue_get_consumer(a->consumer);
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, TOPIC_USAGE, RD_KAFKA_PARTITION_UA);
        rd_kafka_resp_err_t e = rd_kafka_subscribe(a->consumer, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        if (e) {
                log_error("could not subscribe", "error=\"%s\"", rd_kafka_err2str(e));
                return -EIO;
        }
        return 0;
}

/* Takes what is waiting (up to HOLD_MAX messages) into pend, after those
 * waiting there already, so that the fold state of the sandboxes among them
 * not in memory is read in one query before any is folded. Messages taken
 * before a rebalance or a seek are stale: dropped, delivered again. Returns
 * how many it took. */
static size_t poll_held(struct agg *a)
{
        if (a->pend_gen != a->parts.seek_gen)
                drop_pending(a);
        /* Messages waiting that the empty open batch can take: no wait. */
        int wait_ms = a->npend && !a->batch->messages ? 0 : a->batch->messages || a->inflight ? 5 : 100;
        size_t n = 0;
        rd_kafka_message_t *m = rd_kafka_consumer_poll(a->consumer, wait_ms);
        while (m) {
                if (a->parts.seek_gen != a->pend_gen)
                        drop_pending(a);
                a->pend_at[a->npend] = time_mono_ns();
                a->pend[a->npend++] = m;
                if (++n == HOLD_MAX)
                        break;
                m = rd_kafka_consumer_poll(a->consumer, 0);
        }
        if (a->parts.seek_gen != a->pend_gen)
                drop_pending(a);
        return n;
}

/* Messages here and not folded yet: the poll's rest and librdkafka's queue. */
static int64_t fetched(const struct agg *a)
{
        return (int64_t)(a->held_rest + (a->fetched ? rd_kafka_queue_length(a->fetched) : 0));
}

/* Commit when the batch is full, old enough, or nothing more is waiting:
 * when idle a sample is committed without delay. Unless the consumer is
 * behind: a quiet poll while the broker holds more for us is the fetcher
 * between two fetches, not the end of the stream; and while at least as
 * many messages wait as the batch holds, the batch grows to batch_messages
 * (up to CATCHUP_BATCH_FACTOR x batch_ms, and at least 5 s): the ledger's work per batch is
 * per sandbox and hour, so larger batches catch up faster, and the samples
 * waiting are late already. Nor while what is behind is a quarter of the
 * batch or less and here already (the poll's rest and librdkafka's queue):
 * folding it takes less than the commit a batch of it alone would cost (the
 * end of a backlog: 62 usage batches left over made a fifth commit of all
 * 10,000 sandboxes, 152 ms, in scripts/bench aggregator); more than that is
 * a poll of many batches, which goes on in the next one (due_mid_poll).
 * A batch of one commit group is taken only while the consumer keeps up
 * (groups_off): it commits once batch_ms old, or sooner when quiet with
 * nothing of its group behind, and not before it has looked at every
 * message polled (a burst of thousands of fresh messages, each waiting
 * since its poll, made a batch of each few hundred, a commit each).
 * quiet: nothing came within the first poll's wait (not merely an empty
 * queue between fetches). */
static bool commit_due(struct agg *a, bool quiet)
{
        int64_t age = time_mono_ns() - a->batch->started_ns, batch_ns = a->cfg->batch_ms * NS_PER_MS;
        int64_t catchup_ns = CATCHUP_BATCH_FACTOR * batch_ns > CATCHUP_BATCH_NS ? CATCHUP_BATCH_FACTOR * batch_ns
                                                                                : CATCHUP_BATCH_NS;
        bool commit = (int64_t)a->batch->messages >= batch_limit(&a->poison, a->cfg->batch_messages);
        if (!commit && (quiet || age >= batch_ns)) {
                int64_t behind = backlog(&a->parts, a->open_group);
                if (age >= catchup_ns)
                        commit = true;
                else if (age >= batch_ns)
                        commit = a->open_group != PARTITION_GROUP_ALL ? a->held_rest == 0 :
                                 (behind < (int64_t)a->batch->messages &&
                                 !(behind > 0 && behind * 4 <= (int64_t)a->batch->messages && behind <= fetched(a)));
                else
                        commit = behind == 0;
        }
        return commit;
}

/* Between polls: evict idle sandboxes, watch for metering gaps, expire held
 * readings (the first and last only while no commit is under way; held
 * readings only while the open batch holds none). */
static void housekeeping(struct agg *a)
{
        const struct aggregator_config *cfg = a->cfg;
        int64_t now_mono = time_mono_ns();
        int64_t sweep_every = cfg->keep_stopped_ms * NS_PER_MS < 5 * NS_PER_SEC ? cfg->keep_stopped_ms * NS_PER_MS
                                                                               : 5 * NS_PER_SEC;
        /* Not while a commit is under way (a sandbox it writes, evicted, would be
         * read back from the ledger as it was before); the open batch's
         * sandboxes are kept (sandboxes_sweep). */
        if (!a->inflight && now_mono - a->last_sweep_ns >= sweep_every) {
                a->last_sweep_ns = now_mono;
                if (sandboxes_sweep(&a->cache, cfg->keep_idle_ms, cfg->keep_stopped_ms))
                        a->prefetched = 0; /* (what it found absent is forgotten: looked up again) */
        }
        bool gaps_due = now_mono - a->last_gap_check_ns >= METERING_CHECK_NS;
        if (gaps_due)
                a->last_gap_check_ns = now_mono;
        check_metering_gaps(&a->parts, gaps_due);
        int64_t held_every = cfg->provenance_grace_ms * NS_PER_MS / 4;
        if (held_every > METERING_CHECK_NS)
                held_every = METERING_CHECK_NS;
        if (!a->inflight && !a->batch->nwaiting && now_mono - a->last_held_check_ns >= held_every) {
                a->last_held_check_ns = now_mono;
                a->dead_total += expire_held(&a->ledger, cfg->provenance_grace_ms, a->metrics);
        }
}

int aggregator_run(const struct aggregator_config *cfg, volatile sig_atomic_t *stop)
{
        struct agg a = { .cfg = cfg, .stop = stop, .open_group = PARTITION_GROUP_ALL,
                         .groups_were_off = -1 };
        int r = -EIO;
        struct metrics_http *ms = NULL;
        a.lag_hist = calloc(LAG_BUCKETS, sizeof(*a.lag_hist));
        a.metrics = calloc(1, sizeof(*a.metrics));
        if (!a.lag_hist || !a.metrics) {
                free(a.lag_hist);
                free(a.metrics);
                return -ENOMEM;
        }
        a.ledger = (struct ledger){ .url = cfg->database_url };
        a.cache = (struct sandbox_cache){ .ledger = &a.ledger, .metrics = a.metrics };
        a.parts = (struct partitions){ .group = cfg->group, .ledger = &a.ledger, .cache = &a.cache,
                                       .metrics = a.metrics, .stop = stop };
        a.wledger = (struct ledger){ .url = cfg->database_url };
        a.watch = (struct ledger){ .url = cfg->database_url };
        a.parts.watch = &a.watch;
        a.batch = &a.batches[0];
        a.intake = (struct intake){ .cache = &a.cache, .batch = a.batch, .parts = &a.parts, .ledger = &a.ledger,
                                    .metrics = a.metrics, .max_ahead_ns = cfg->max_clock_ahead_ms * NS_PER_MS,
                                    .max_behind_ns = cfg->max_clock_behind_ms * NS_PER_MS };
        if ((r = metrics_http_start(cfg->metrics_address ? cfg->metrics_address : "127.0.0.1",
                                    (int)cfg->metrics_port, agg_metrics_page, a.metrics, METRICS_HTTP_PAGE_MAX, &ms)) < 0) {
                log_error("could not serve /metrics", "port=%" PRId64 " error=\"%s\"", cfg->metrics_port,
                          strerror(-r));
                r = -EIO;
                goto out;
        }
        r = -EIO;
        if (ms)
                log_info("metrics served", "url=http://%s:%" PRId64 "/metrics",
                         cfg->metrics_address ? cfg->metrics_address : "127.0.0.1", cfg->metrics_port);
        if (db_ensure(&a.ledger) < 0 || db_ensure(&a.wledger) < 0 ||
            enforce_open(&a.enforce, cfg->kafka_brokers, &cfg->kafka) < 0)
                goto out;
        store_warm(&a.wledger); /* (a failure costs the first commit the time) */
        sandboxes_warm(&a.cache);
        if (writer_start(&a.writer) < 0) {
                log_error("could not start the writer thread", NULL);
                goto out;
        }
        if (consumer_open(&a) < 0)
                goto out;
        log_info("aggregator started", "group=%s batch_messages=%" PRId64 " batch_ms=%" PRId64, cfg->group,
                 cfg->batch_messages, cfg->batch_ms);
        int64_t last_report = time_mono_ns();
        a.pend = calloc(DEFER_MAX + HOLD_MAX, sizeof(*a.pend));
        a.pend_at = calloc(DEFER_MAX + HOLD_MAX, sizeof(*a.pend_at));
        if (!a.pend || !a.pend_at) {
                r = -ENOMEM;
                goto out;
        }
        while (!*stop) {
                size_t n = poll_held(&a);
                take_held(&a);
                if ((a.inflight || a.announcer.running) && writer_finished(&a.writer))
                        settle(&a);
                housekeeping(&a); /* (here: between a commit's end and the next one's start) */
                if (a.batch->messages && !a.inflight && !a.announcer.running) {
                        if (commit_due(&a, n == 0))
                                start_commit(&a);
                        else
                                announce_start(&a.announcer, &a.writer, &a.wledger, a.batch);
                }
                enforce_poll(&a.enforce);
                if (time_mono_ns() - last_report >= 10 * NS_PER_SEC) {
                        last_report = time_mono_ns();
                        log_info("progress", "messages=%" PRIu64 " batches=%" PRIu64 " sandboxes=%zu dead=%" PRIu64
                                             " fenced=%" PRIu64 " commit_lag_ms_p50=%" PRId64 " commit_lag_ms_p99=%" PRId64,
                                 a.committed_messages, a.committed_batches, a.cache.nsandboxes, a.dead_total, a.fenced,
                                 lag_quantile(&a, 50, 100), lag_quantile(&a, 99, 100));
                }
        }
        commit_batch(&a);
        r = 0;
out:
        drop_pending(&a);
        free(a.pend);
        free(a.pend_at);
        metrics_http_stop(ms);
        if (a.fetched)
                rd_kafka_queue_destroy(a.fetched);
        if (a.consumer) {
                rd_kafka_consumer_close(a.consumer); /* (its revocation commits through the writer) */
                rd_kafka_destroy(a.consumer);
        }
        settle(&a);
        writer_stop(&a.writer);
        enforce_close(&a.enforce);
        agg_log_lag_histogram(a.lag_hist, LAG_BUCKETS);
        if (r == 0)
                log_info("aggregator stopped", "messages=%" PRIu64 " batches=%" PRIu64 " dead=%" PRIu64 " fenced=%" PRIu64
                                               " commit_lag_ms_p50=%" PRId64 " commit_lag_ms_p99=%" PRId64,
                         a.committed_messages, a.committed_batches, a.dead_total, a.fenced, lag_quantile(&a, 50, 100),
                         lag_quantile(&a, 99, 100));
        batch_free(&a.batches[0]);
        batch_free(&a.batches[1]);
        sandbox_cache_free(&a.cache);
        partitions_free(&a.parts);
        free(a.lag_hist);
        free(a.metrics);
        ledger_close(&a.ledger);
        ledger_close(&a.wledger);
        ledger_close(&a.watch);
        return r;
}
