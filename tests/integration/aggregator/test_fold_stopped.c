/* Integration: a `stopped` event carrying only what docs/events.md requires
 * of it (no key, vcpus, mem_size_bytes, epoch or host) bills a sandbox no
 * collector ever sampled in full — its CPU and its held time — with the size
 * its `created` event gave, whether the `created` event came in the same
 * batch or was committed before an aggregator restart; and the collector's
 * final sample arriving after such an event bills nothing twice, even
 * when the event said no epoch and the sample says one.
 *
 * Through the real development broker and a real tally-aggregator writing to
 * PostgreSQL. Before, the ledger's check on sandboxes.vcpus refused the batch
 * and the poison rule dead-lettered the event: the sandbox was billed
 * nothing. Expected totals are worked out by hand (2 GiB = 2147483648 bytes):
 *   CPU 1.5 s, running 3 s, paused 1 s:
 *   memory  2147483648 × 3e9 = 6442450944000000000 byte-ns
 *   storage 2147483648 × 1e9 = 2147483648000000000 byte-ns (no disk bytes). */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEC NS_PER_SEC

static void created(struct aggtest *t, const char *sb, int64_t wall)
{
        char buf[512];
        int n = snprintf(buf, sizeof(buf),
                         "{\"v\":1,\"type\":\"created\",\"host\":\"host-fs\",\"sandbox\":\"%s\",\"account\":\"acct-fs\","
                         "\"key\":\"key-fs\",\"wall_ns\":%" PRId64 ",\"mem_size_bytes\":2147483648,\"vcpus\":2}",
                         sb, wall);
        aggtest_produce_raw(t, "acct-fs", buf, (size_t)n);
        /* (so that the harness does not send one of its own before the final sample) */
        struct usage_event ev = { .type = EVENT_CREATED }, none;
        snprintf(ev.sandbox, sizeof(ev.sandbox), "%s", sb);
        snprintf(ev.key, sizeof(ev.key), "key-fs");
        aggtest_needs_created(t, &ev, &none);
}

/* The vmm's stopped event with only the required fields and the held
 * counters, and `extra` fields (each starting with a comma). */
static void stopped_with(struct aggtest *t, const char *sb, int64_t wall, const char *extra)
{
        char buf[512];
        int n = snprintf(buf, sizeof(buf),
                         "{\"v\":1,\"type\":\"stopped\",\"sandbox\":\"%s\",\"account\":\"acct-fs\",\"wall_ns\":%" PRId64
                         ",\"cpu_ns\":1500000000,\"running_ns\":3000000000,\"paused_ns\":1000000000%s}",
                         sb, wall, extra);
        aggtest_produce_raw(t, "acct-fs", buf, (size_t)n);
}

static void stopped(struct aggtest *t, const char *sb, int64_t wall)
{
        stopped_with(t, sb, wall, "");
}

/* The collector's final sample (epoch 1), the same counters. */
static void final_sample(struct aggtest *t, const char *sb, int64_t wall)
{
        struct usage_event fin = aggtest_held(aggtest_sample("acct-fs", "key-fs", sb, 1, 1, wall, STATE_STOPPED,
                                                             1500000000, UINT64_C(2147483648), 0, 2),
                                              3 * NS_PER_SEC, 1 * NS_PER_SEC);
        snprintf(fin.host, sizeof(fin.host), "host-fs"); /* the host that created it */
        fin.final = true;
        aggtest_produce(t, &fin);
}

static const char *const full = "1500000000/6442450944000000000/2147483648000000000";

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_fold_stopped", 2);
        int64_t base = time_wall_ns() - 600 * SEC;

        /* 1. created and stopped in one batch. */
        created(&t, "sb-fs-one", base);
        stopped(&t, "sb-fs-one", base + 4 * SEC);
        /* 2. The same, then the collector's final sample (epoch 1, the
         * stopped event said none) after the event: billed once. */
        created(&t, "sb-fs-final", base);
        stopped(&t, "sb-fs-final", base + 4 * SEC);
        final_sample(&t, "sb-fs-final", base + 4 * SEC);
        /* 3. With the key but no size: the ledger's check on sandboxes.vcpus
         * once refused the batch, and the event became a dead letter. */
        created(&t, "sb-fs-key", base);
        stopped_with(&t, "sb-fs-key", base + 4 * SEC, ",\"key\":\"key-fs\"");
        /* 4. With key and size but no epoch, then the collector's final
         * sample (epoch 1): a higher epoch after the stop is not a restart
         * of the counter (it once billed the CPU twice). */
        created(&t, "sb-fs-noepoch", base);
        stopped_with(&t, "sb-fs-noepoch", base + 4 * SEC,
                     ",\"key\":\"key-fs\",\"vcpus\":2,\"mem_size_bytes\":2147483648");
        final_sample(&t, "sb-fs-noepoch", base + 4 * SEC);
        /* 5. created now, stopped after an aggregator restart (the spec read
         * back from the ledger). */
        created(&t, "sb-fs-restart", base);
        aggtest_flush(&t);

        pid_t agg = aggtest_spawn(&t, NULL);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up");
        CHECK(aggtest_terminate(agg) == 0, "unclean stop");
        stopped(&t, "sb-fs-restart", base + 4 * SEC);
        aggtest_flush(&t);
        agg = aggtest_spawn(&t, NULL);
        CHECK(aggtest_wait_caught_up(&t, 60) == 0, "not caught up after the restart");

        aggtest_expect_billed(&t, "sb-fs-one", full, "stopped with only the required fields, created in the same batch");
        aggtest_expect_billed(&t, "sb-fs-final", full, "the collector's final sample after it bills nothing twice");
        aggtest_expect_billed(&t, "sb-fs-key", full, "stopped with the key but no size");
        aggtest_expect_billed(&t, "sb-fs-noepoch", full, "stopped without an epoch, then the final sample of epoch 1: billed once");
        aggtest_expect_billed(&t, "sb-fs-restart", full, "stopped with only the required fields, created before a restart");
        char *v = aggtest_query(&t, "SELECT count(*) FROM sandboxes WHERE account_id = 'acct-fs' AND state = 'stopped'"
                                    " AND vcpus = 2 AND mem_size_bytes = 2147483648 AND key_id = 'key-fs'");
        CHECK(v && strcmp(v, "5") == 0, "every sandbox stopped in the ledger with its size: %s of 5", v ? v : "?");
        free(v);
        v = aggtest_query(&t, "SELECT count(*) || ' ' || coalesce(string_agg(reason, '; '), '') FROM dead_letters");
        CHECK(v && strcmp(v, "0 ") == 0, "no dead letters: %s", v ? v : "?");
        free(v);
        v = aggtest_query(&t, "SELECT sum(cpu_rated + memory_rated + storage_rated) > 0 FROM spend_daily"
                              " WHERE key_id = 'key-fs'");
        CHECK(v && strcmp(v, "t") == 0, "the key's spend counts the usage: %s", v ? v : "?");
        free(v);

        CHECK(aggtest_terminate(agg) == 0, "unclean stop");
        aggtest_stop(&t);
        return test_result();
}
