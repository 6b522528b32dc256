/* Integration: usage batches (format v2, docs/events.md "Usage batches")
 * beside v1 messages, through the real development broker and a real
 * tally-aggregator writing to PostgreSQL.
 *
 *   1. A rolling upgrade: each sandbox's samples come one as a v1 message,
 *      the next inside a v2 batch, and so on (a collector upgraded, or two
 *      hosts' collectors on different formats): billed exactly as if all
 *      were v1.
 *   2. A batch of four samples: one refused by the fold (more CPU than its
 *      vCPUs could run), one record that does not decode. Those two make one
 *      dead letter of the message holding just them; the other two bill.
 *   3. A batch whose header does not decode is one dead letter, billing
 *      nothing; the messages after it bill.
 *   4. A batch of two samples whose sandboxes' `created` events come after
 *      it: the first waits in held_readings and is billed when its event
 *      comes; the second cannot wait there too (one row a message) and is a
 *      dead letter; its sandbox's next sample bills the truth.
 *   5. A host sending usage batches only is metered (hosts.last_sample_at):
 *      a batch's samples count for the metering gap as v1 samples do.
 *   6. The commit latency histogram (tally_aggregator_commit_lag_seconds)
 *      counts a usage batch once per sample it carries, as its help says,
 *      not once per message: 6 batches of 15 records in all add 9 to the
 *      message count.
 *   7. One poll holding many batches (24 batches of a sample of each of
 *      2,000 sandboxes, all waiting before the aggregator starts: one
 *      partition's messages come in one poll), batch_ms 1: the open batch
 *      goes to the writer in the middle of the poll once it is due, so they
 *      commit in two batches or more (the batch was looked at between polls
 *      only: one; a rest of a quarter of the batch or less would join it,
 *      hence 24 and not 8: the batch is looked at once a millisecond, and
 *      seven had been folded by then), every sample billed once; the sandboxes, in the ledger
 *      but not in this aggregator's memory, have their fold states read a
 *      poll at a time (their ids peeked out of the batches), not one query
 *      each.
 *
 * Expected totals are worked out by hand from the counters the messages
 * carry (1 GiB = 1073741824 bytes of memory, running all along: memory is
 * 1073741824 x the last running_ns). */
#include "aggtest.h"
#include "sample_batch.h"
#include "support.h"
#include "timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GiB UINT64_C(1073741824)
#define SEC NS_PER_SEC
#define ACCOUNT "acct-v2"
#define KEY "key-v2"

static struct usage_event tick(const char *sb, uint64_t seq, int64_t wall, uint64_t cpu, uint64_t run)
{
        struct usage_event ev = aggtest_sample(ACCOUNT, KEY, sb, 1, seq, wall, STATE_RUNNING, cpu, GiB, 0, 2);
        strcpy(ev.host, "host-v2");
        return aggtest_held(ev, run, 0);
}

/* A v2 batch being put together by the test. */
struct out {
        uint8_t buf[SAMPLE_BATCH_MAX_BYTES];
        size_t len;
        int64_t wall, mono;
};

static void begin(struct out *o, int64_t wall)
{
        o->wall = wall;
        o->mono = 1000;
        int n = sample_batch_begin(o->buf, sizeof(o->buf), "host-v2", wall, o->mono);
        CHECK(n > 0, "batch header: %d", n);
        o->len = n > 0 ? (size_t)n : 0;
}

static void add(struct aggtest *t, struct out *o, struct usage_event ev)
{
        struct usage_event created;
        if (aggtest_needs_created(t, &ev, &created))
                aggtest_produce(t, &created);
        ev.mono_ns = o->mono;
        int n = sample_batch_record(o->buf + o->len, sizeof(o->buf) - o->len, o->wall, o->mono, &ev);
        CHECK(n > 0, "batch record of %s: %d", ev.sandbox, n);
        o->len += n > 0 ? (size_t)n : 0;
}

/* Without the sandbox's created event first. */
static void add_bare(struct out *o, struct usage_event ev)
{
        ev.mono_ns = o->mono;
        int n = sample_batch_record(o->buf + o->len, sizeof(o->buf) - o->len, o->wall, o->mono, &ev);
        CHECK(n > 0, "batch record of %s: %d", ev.sandbox, n);
        o->len += n > 0 ? (size_t)n : 0;
}

static void send_batch(struct aggtest *t, struct out *o)
{
        aggtest_produce_raw(t, ACCOUNT, o->buf, o->len);
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_usage_v2", 2);
        int64_t base = time_wall_ns() - 3600 * SEC;
        struct out o;

        /* 1. Mixed formats, one account, so one partition in order: A and B
         * alternate v1 and v2; C only v2, D only v1. */
        struct usage_event a1 = tick("sb-v2-a", 1, base, 1 * SEC, 2 * SEC);
        aggtest_produce(&t, &a1);
        begin(&o, base + 10 * SEC);
        add(&t, &o, tick("sb-v2-a", 2, base + 10 * SEC, 5 * SEC, 12 * SEC));
        add(&t, &o, tick("sb-v2-b", 1, base + 10 * SEC, 3 * SEC, 10 * SEC));
        add(&t, &o, tick("sb-v2-c", 1, base + 10 * SEC, 7 * SEC, 10 * SEC));
        send_batch(&t, &o);
        struct usage_event d1 = tick("sb-v2-d", 1, base + 10 * SEC, 2 * SEC, 10 * SEC);
        aggtest_produce(&t, &d1);
        struct usage_event a3 = tick("sb-v2-a", 3, base + 20 * SEC, 9 * SEC, 22 * SEC);
        struct usage_event b2 = tick("sb-v2-b", 2, base + 20 * SEC, 4 * SEC, 20 * SEC);
        aggtest_produce(&t, &a3);
        aggtest_produce(&t, &b2);
        begin(&o, base + 30 * SEC);
        add(&t, &o, tick("sb-v2-b", 3, base + 30 * SEC, 15 * SEC, 30 * SEC));
        add(&t, &o, tick("sb-v2-c", 2, base + 30 * SEC, 8 * SEC, 30 * SEC));
        add(&t, &o, tick("sb-v2-a", 2, base + 10 * SEC, 5 * SEC, 12 * SEC)); /* a duplicate: changes nothing */
        send_batch(&t, &o);
        struct usage_event d2 = tick("sb-v2-d", 2, base + 30 * SEC, 6 * SEC, 30 * SEC);
        aggtest_produce(&t, &d2);

        /* 2. One batch, four records: E billed, F impossible (6 h of CPU in
         * 10 s on 2 vCPUs, beyond the hour of slack: at most 7,220 s), a
         * record that does not decode, G billed. */
        begin(&o, base + 10 * SEC);
        add(&t, &o, tick("sb-v2-e", 1, base + 10 * SEC, 1 * SEC, 10 * SEC));
        add(&t, &o, tick("sb-v2-f", 1, base + 10 * SEC, 1 * SEC, 10 * SEC));
        send_batch(&t, &o);
        begin(&o, base + 20 * SEC);
        add(&t, &o, tick("sb-v2-e", 2, base + 20 * SEC, 6 * SEC, 20 * SEC));
        add(&t, &o, tick("sb-v2-f", 2, base + 20 * SEC, 1 * SEC + 3 * 3600 * SEC * 2, 20 * SEC));
        o.buf[o.len++] = 0x01; /* a record of one byte: flags with unknown bits */
        o.buf[o.len++] = 0xe0;
        add(&t, &o, tick("sb-v2-g", 1, base + 20 * SEC, 2 * SEC, 20 * SEC));
        send_batch(&t, &o);

        /* 3. A batch whose header is cut: one dead letter; then E goes on in v1. */
        static const uint8_t cut[] = { SAMPLE_BATCH_VERSION, 7, 'h' };
        aggtest_produce_raw(&t, ACCOUNT, cut, sizeof(cut));
        struct usage_event e3 = tick("sb-v2-e", 3, base + 30 * SEC, 8 * SEC, 30 * SEC);
        aggtest_produce(&t, &e3);

        /* 4. Two samples of sandboxes not created yet, in one batch. */
        struct usage_event h1 = tick("sb-v2-h1", 1, base + 10 * SEC, 1 * SEC, 10 * SEC);
        struct usage_event h2 = tick("sb-v2-h2", 1, base + 10 * SEC, 1 * SEC, 10 * SEC);
        struct usage_event h2b = tick("sb-v2-h2", 2, base + 20 * SEC, 2 * SEC, 20 * SEC);
        begin(&o, base + 10 * SEC);
        add_bare(&o, h1);
        add_bare(&o, h2);
        send_batch(&t, &o);
        struct usage_event c1 = aggtest_created_for(&h1), c2 = aggtest_created_for(&h2b);
        aggtest_produce(&t, &c1);
        aggtest_produce(&t, &c2);
        aggtest_produce(&t, &h2b);

        /* 5. A host whose collector sends usage batches only: its samples
         * say it is metered (hosts.last_sample_at), as v1 samples do. */
        struct usage_event k1 = tick("sb-v2-k", 1, base + 10 * SEC, 1 * SEC, 10 * SEC);
        strcpy(k1.host, "host-v2-only");
        o.wall = base + 10 * SEC;
        o.mono = 1000;
        int hn = sample_batch_begin(o.buf, sizeof(o.buf), "host-v2-only", o.wall, o.mono);
        CHECK(hn > 0, "batch header: %d", hn);
        o.len = hn > 0 ? (size_t)hn : 0;
        add(&t, &o, k1);
        send_batch(&t, &o);
        aggtest_flush(&t);

        int port = test_free_port();
        char ports[16];
        snprintf(ports, sizeof(ports), "%d", port);
        const char *extra[] = { "--metrics-port", ports, NULL };
        pid_t agg = aggtest_spawn(&t, extra);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the aggregator did not catch up");
        /* 6: every message taken once; the batches' records (3 + 3 + 2 + 4
         * + 2 + 1, the cut header's batch counting as one message) once each. */
        char *messages = aggtest_query(&t, "SELECT sum(next_offset) FROM consumer_offsets");
        int64_t m = messages ? strtoll(messages, NULL, 10) : -1, timed = -1;
        /* (A commit is counted once the loop takes the writer's result: a few ms after the ledger has it.) */
        for (int tries = 0; tries < 100 && timed < m - 6 + 15; tries++) {
                if (tries)
                        time_sleep_ns(NS_PER_SEC / 10);
                char *page = test_get_metrics(port);
                timed = page ? test_metric(page, "tally_aggregator_commit_lag_seconds_count", false) : -1;
                free(page);
        }
        CHECK(m > 0 && timed == m - 6 + 15, "commit latency counted %lld, want %lld (%lld messages, 6 batches of 15 samples)",
              (long long)timed, (long long)(m - 6 + 15), (long long)m);
        free(messages);
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not exit cleanly");

        /* 1: the last counters of each, whichever format carried them. */
        aggtest_expect_billed(&t, "sb-v2-a", "9000000000/23622320128000000000/0", "v1, v2, v1");
        aggtest_expect_billed(&t, "sb-v2-b", "15000000000/32212254720000000000/0", "v2, v1, v2");
        aggtest_expect_billed(&t, "sb-v2-c", "8000000000/32212254720000000000/0", "v2 only");
        aggtest_expect_billed(&t, "sb-v2-d", "6000000000/32212254720000000000/0", "v1 only");
        /* 2: F's first sample bills; its impossible second does not. */
        aggtest_expect_billed(&t, "sb-v2-e", "8000000000/32212254720000000000/0", "beside a poison sample");
        aggtest_expect_billed(&t, "sb-v2-f", "1000000000/10737418240000000000/0", "the poison sample's sandbox");
        aggtest_expect_billed(&t, "sb-v2-g", "2000000000/21474836480000000000/0", "after a record that does not decode");

        /* 4: h1 from held_readings once created; h2 from its next sample. */
        aggtest_expect_billed(&t, "sb-v2-h1", "1000000000/10737418240000000000/0", "held from a batch");
        aggtest_expect_billed(&t, "sb-v2-h2", "2000000000/21474836480000000000/0", "held second in a batch");
        /* 5: the batch-only host is in hosts, with its sample's time. */
        char *metered = aggtest_query(&t, "SELECT count(*) FROM hosts WHERE host = 'host-v2-only'"
                                          " AND last_sample_at > now() - interval '10 minutes'");
        CHECK(metered && strcmp(metered, "1") == 0, "a host sending usage batches only has no last sample (%s)",
              metered ? metered : "?");
        free(metered);
        char *held = aggtest_query(&t, "SELECT count(*) FROM held_readings");
        CHECK(held && strcmp(held, "0") == 0, "held readings left: %s", held ? held : "?");
        free(held);
        char *twice = aggtest_query(&t, "SELECT reason FROM dead_letters WHERE raw::text LIKE '%' || "
                                        "encode('sb-v2-h2', 'hex') || '%'");
        CHECK(twice && strncmp(twice, "held, but another sample of this batch waits already: no created event", 70) == 0,
              "the second held sample's dead letter says %s", twice ? twice : "?");
        free(twice);

        char *n = aggtest_query(&t, "SELECT count(*) FROM dead_letters");
        CHECK(n && strcmp(n, "3") == 0,
              "dead letters: %s, want 3 (the batch's two refused samples, the cut header, the second held)",
              n ? n : "?");
        free(n);
        char *reason = aggtest_query(&t, "SELECT reason FROM dead_letters WHERE reason LIKE '%2 of the usage batch''s 4%'");
        CHECK(reason && strncmp(reason, "impossible sample", 17) == 0 && strstr(reason, "(record 2, sandbox sb-v2-f)"),
              "the batch's dead letter says %s", reason ? reason : "(none with '2 of the usage batch's 4')");
        free(reason);
        /* Its raw holds the refused sample's v1 JSON and the record's bytes, and nothing of E or G. */
        char *raw = aggtest_query(&t, "SELECT convert_from(raw, 'UTF8') FROM dead_letters WHERE reason LIKE '%2 of the usage batch''s 4%'");
        CHECK(raw && strstr(raw, "\"sandbox\":\"sb-v2-f\"") && strstr(raw, "\n01e0\n") && !strstr(raw, "sb-v2-e") &&
                      !strstr(raw, "sb-v2-g"),
              "the batch's dead letter holds: %s", raw ? raw : "?");
        free(raw);
        char *hdr = aggtest_query(&t, "SELECT reason FROM dead_letters WHERE reason LIKE 'usage batch%'");
        CHECK(hdr && strstr(hdr, "usage batch: bad host"), "the cut batch's dead letter says %s", hdr ? hdr : "?");
        free(hdr);

        /* 7. Many batches in one poll, batch_ms 1: first the sandboxes'
         * created events and first samples, committed; then eight batches of
         * a sample of each, all waiting before the aggregator starts. */
        enum { POLL_SANDBOXES = 2000, POLL_ROUNDS = 25 };
        for (int k = 1; k <= POLL_ROUNDS; k++) {
                begin(&o, base + k * 10 * SEC);
                for (int i = 0; i < POLL_SANDBOXES; i++) {
                        char sb[32];
                        snprintf(sb, sizeof(sb), "sb-v2-poll-%d", i);
                        add(&t, &o, tick(sb, (uint64_t)k, base + k * 10 * SEC, (uint64_t)k * SEC, (uint64_t)k * 10 * SEC));
                }
                send_batch(&t, &o);
                if (k > 1)
                        continue;
                aggtest_flush(&t);
                agg = aggtest_spawn(&t, extra);
                CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the aggregator did not catch up on the first round");
                CHECK(aggtest_terminate(agg) == 0, "the aggregator did not exit cleanly");
        }
        aggtest_flush(&t);
        const char *fast[] = { "--metrics-port", ports, "--batch-ms", "1", NULL };
        agg = aggtest_spawn(&t, fast);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "the aggregator did not catch up on the poll's batches");
        int64_t taken = -1, batches = -1, reads = -1;
        for (int tries = 0; tries < 100 && taken < POLL_ROUNDS - 1; tries++) {
                if (tries)
                        time_sleep_ns(NS_PER_SEC / 10);
                char *page = test_get_metrics(port);
                taken = page ? test_metric(page, "tally_aggregator_messages_total", false) : -1;
                batches = page ? test_metric(page, "tally_aggregator_batches_committed_total", false) : -1;
                reads = page ? test_metric(page, "tally_aggregator_state_reads_total", false) : -1;
                free(page);
        }
        CHECK(taken == POLL_ROUNDS - 1 && batches >= 2,
              "%d batches waiting in one poll committed in %lld batches (%lld messages taken)", POLL_ROUNDS - 1,
              (long long)batches, (long long)taken);
        /* The 2,000 sandboxes are in the ledger, not in this aggregator's
         * memory: their fold states are read a poll at a time (the ids
         * peeked out of the batches' records), not one query each. */
        CHECK(reads >= 1 && reads <= POLL_ROUNDS, "fold states read in %lld queries for %d sandboxes in %d batches",
              (long long)reads, POLL_SANDBOXES, POLL_ROUNDS - 1);
        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not exit cleanly");
        char *exact = aggtest_query(&t, "SELECT count(*) FROM (SELECT sandbox_id FROM usage_hourly"
                                        " WHERE sandbox_id LIKE 'sb-v2-poll-%' GROUP BY sandbox_id"
                                        " HAVING sum(cpu_ns) = 25000000000 AND sum(mem_byte_ns) = 268435456000000000000"
                                        " AND sum(storage_byte_ns) = 0) s");
        CHECK(exact && atoi(exact) == POLL_SANDBOXES, "sandboxes of the poll's batches billed exactly: %s of %d",
              exact ? exact : "?", POLL_SANDBOXES);
        free(exact);
        aggtest_stop(&t);
        return test_result();
}
