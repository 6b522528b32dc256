/* Integration: provenance. Beside an honest stream, a test client forges what
 * any process that can produce to the usage topic could send:
 *  - a `sample` of a sandbox that never existed (no `created` event), with a
 *    first reading of a million CPU-seconds: held, then dead-lettered;
 *  - a first reading of a sandbox created 10 s ago carrying an hour of CPU:
 *    more than 2 vCPUs could use since its created moment, dead-lettered;
 *  - a `stopped` under epoch + 1 with 1 % of the counter, and one from another
 *    host: dead-lettered (before, the first closed the bill at 1 %);
 *  - a `sample` under epoch + 1 with counter 0: held, then dead-lettered
 *    (before, every later real sample and the vmm's `stopped` billed nothing).
 * An honest epoch change, announced by a `restarted` event from the sandbox's
 * host after its first sample arrived (held meanwhile, across batches), bills.
 * The ledger then holds exactly what the honest stream alone bills, worked
 * out by hand below; each forged message is a dead letter with its reason.
 *
 * Through the real development broker and a real tally-aggregator writing to
 * PostgreSQL. */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GiB (UINT64_C(1) << 30)
#define SEC NS_PER_SEC

/* What a forger sends: the message only, never a `created` first. */
static void forge(struct aggtest *t, const struct usage_event *ev)
{
        char buf[8192];
        int n = event_encode(ev, buf, sizeof(buf));
        CHECK(n > 0, "encode");
        if (n > 0)
                aggtest_produce_raw(t, ev->account, buf, (size_t)n);
}

static struct usage_event created(const char *key, const char *sb, int64_t wall, uint32_t vcpus)
{
        struct usage_event ev = aggtest_sample("acct-pv", key, sb, 1, 0, wall, STATE_RUNNING, 0, GiB, 0, vcpus);
        ev.type = EVENT_CREATED;
        snprintf(ev.backend, sizeof(ev.backend), "process");
        return ev;
}

static struct usage_event reading(const char *key, const char *sb, uint64_t epoch, uint64_t seq, int64_t wall,
                                  uint64_t cpu_s, uint64_t running_s)
{
        struct usage_event ev = aggtest_sample("acct-pv", key, sb, epoch, seq, wall, STATE_RUNNING, cpu_s * SEC, GiB,
                                               0, 2);
        return aggtest_held(ev, running_s * SEC, 0);
}

/* The honest life of a 2 vCPU / 1 GiB sandbox created at t0: samples at
 * +100 s (50 CPU-s), +200 s (120), +300 s (200), then the vmm's `stopped` at
 * +310 s with 205 CPU-s; running all along. forged(i) is sent after the first. */
static void honest(struct aggtest *t, const char *sb, int64_t t0, void (*forged)(struct aggtest *, const char *, int64_t))
{
        struct usage_event c = created("key-pv", sb, t0, 2);
        aggtest_produce(t, &c);
        struct usage_event s1 = reading("key-pv", sb, 1, 1, t0 + 100 * SEC, 50, 100);
        aggtest_produce(t, &s1);
        forged(t, sb, t0);
        struct usage_event s2 = reading("key-pv", sb, 1, 2, t0 + 200 * SEC, 120, 200),
                           s3 = reading("key-pv", sb, 1, 3, t0 + 300 * SEC, 200, 300);
        aggtest_produce(t, &s2);
        aggtest_produce(t, &s3);
        struct usage_event stop = aggtest_stopped("acct-pv", "key-pv", sb, 1, t0 + 310 * SEC, 205 * SEC, 310 * SEC, 0,
                                                  GiB, 2);
        aggtest_produce(t, &stop);
}

static void forged_epoch(struct aggtest *t, const char *sb, int64_t t0)
{
        struct usage_event f = reading("key-pv", sb, 2, 1, t0 + 150 * SEC, 0, 150);
        forge(t, &f);
}

static void forged_stops(struct aggtest *t, const char *sb, int64_t t0)
{
        /* 1 % of the 50 CPU-s billed so far, under epoch + 1 */
        struct usage_event f = aggtest_stopped("acct-pv", "key-pv", sb, 2, t0 + 150 * SEC, SEC / 2, 150 * SEC, 0,
                                               GiB, 2);
        forge(t, &f);
        /* the right epoch and a plausible counter, from a host that did not create it */
        struct usage_event g = aggtest_stopped("acct-pv", "key-pv", sb, 1, t0 + 150 * SEC, 60 * SEC, 150 * SEC, 0,
                                               GiB, 2);
        snprintf(g.host, sizeof(g.host), "host-evil");
        forge(t, &g);
}

static void expect(struct aggtest *t, const char *sb, const char *want, const char *what)
{
        char *got = aggtest_billed(t, sb);
        size_t n = strlen(want);
        CHECK(got && strncmp(got, want, n) == 0 && got[n] == '/',
              "%s (%s): billed %s, want cpu_ns/mem_byte_ns/storage_byte_ns %s", what, sb, got ? got : "?", want);
        free(got);
}

static int64_t count(struct aggtest *t, const char *sql)
{
        char *v = aggtest_query(t, sql);
        int64_t n = v && *v ? strtoll(v, NULL, 10) : -1;
        free(v);
        return n;
}

int main(void)
{
        struct aggtest t;
        aggtest_start(&t, "agg_provenance", 2);
        int64_t now = time_wall_ns();
        int64_t t0 = now - 600 * SEC;

        honest(&t, "sb-pv-epoch", t0, forged_epoch);
        honest(&t, "sb-pv-stop", t0, forged_stops);

        /* A sandbox that never existed, billed a million CPU-seconds (4 vCPUs:
         * within 366 days x vCPUs, the only bound before). */
        struct usage_event ghost = aggtest_sample("acct-pv", "key-pv", "sb-pv-ghost", 1, 1, now - 5 * SEC,
                                                  STATE_RUNNING, UINT64_C(1000000) * SEC, GiB, 0, 4);
        forge(&t, &ghost);

        /* Created 10 s ago with 2 vCPUs: a first reading of 3,600 CPU-s is
         * forged; the honest one (5 CPU-s, 5 s running) bills. */
        struct usage_event yc = created("key-pv2", "sb-pv-young", now - 10 * SEC, 2);
        aggtest_produce(&t, &yc);
        struct usage_event yf = reading("key-pv2", "sb-pv-young", 1, 1, now, 3600, 10);
        forge(&t, &yf);
        struct usage_event yh = reading("key-pv2", "sb-pv-young", 1, 1, now - 5 * SEC, 5, 5);
        aggtest_produce(&t, &yh);

        /* An honest new epoch whose sample comes before its announcement. */
        struct usage_event rc = created("key-pv2", "sb-pv-restart", t0, 2);
        aggtest_produce(&t, &rc);
        struct usage_event r1 = reading("key-pv2", "sb-pv-restart", 1, 1, t0 + 100 * SEC, 50, 100),
                           r2 = reading("key-pv2", "sb-pv-restart", 2, 2, t0 + 150 * SEC, 10, 150);
        aggtest_produce(&t, &r1);
        aggtest_produce(&t, &r2);
        aggtest_flush(&t);

        const char *extra[] = { "--provenance-grace-ms", "15000", NULL };
        pid_t agg = aggtest_spawn(&t, extra);
        CHECK(aggtest_wait_caught_up(&t, 90) == 0, "not caught up");
        /* Held across the batch: the ghost, the forged epoch sample and
         * stopped, and the honest epoch-2 sample waiting for its announcement. */
        int64_t held = count(&t, "SELECT count(*) FROM held_readings");
        CHECK(held == 4, "held readings after the first part: %" PRId64 ", want 4", held);

        struct usage_event rr = r2;
        rr.type = EVENT_RESTARTED;
        snprintf(rr.reason, sizeof(rr.reason), "counter_back");
        aggtest_produce(&t, &rr);
        struct usage_event r3 = reading("key-pv2", "sb-pv-restart", 2, 3, t0 + 200 * SEC, 30, 200);
        aggtest_produce(&t, &r3);
        aggtest_flush(&t);
        CHECK(aggtest_wait_caught_up(&t, 90) == 0, "not caught up after the announcement");

        /* The forged readings still held go to the dead letters after the grace. */
        int64_t dead = 0;
        for (int i = 0; i < 900 && (dead = count(&t, "SELECT count(*) FROM dead_letters")) < 5; i++)
                time_sleep_ns(100 * NS_PER_MS);
        CHECK(dead == 5, "dead letters: %" PRId64 ", want 5", dead);
        CHECK(count(&t, "SELECT count(*) FROM held_readings") == 0, "held readings left");

        /* The ledger: what the honest stream alone bills. Each honest sandbox
         * 205 CPU-s and 310 s x 1 GiB; the young one 5 CPU-s and 5 s x 1 GiB;
         * the restarted one 50 + 30 CPU-s (its epoch 2 counter from zero) and
         * 200 s x 1 GiB; the ghost nothing. */
        expect(&t, "sb-pv-epoch", "205000000000/332859965440000000000/0", "a forged epoch + 1 silences nothing");
        expect(&t, "sb-pv-stop", "205000000000/332859965440000000000/0", "a forged stopped closes nothing");
        expect(&t, "sb-pv-young", "5000000000/5368709120000000000/0", "a first reading is bounded by its age");
        expect(&t, "sb-pv-restart", "80000000000/214748364800000000000/0", "an announced epoch bills");
        CHECK(count(&t, "SELECT count(*) FROM usage_hourly WHERE sandbox_id = 'sb-pv-ghost'") == 0,
              "the sandbox that never existed is billed nothing");

        /* Money, key-pv: CPU 410e9 ns x 25,000,000 nano-$/vCPU-hour and
         * 620e9 ns x 2^30 B x 7,500,000 nano-$/GiB-hour, summed exactly;
         * nano-dollars 2,847,222.2 + 1,291,666.7 = 4,138,888.9, rounded once. */
        char *v = aggtest_query(&t, "SELECT sum(cpu_rated)::text || '/' || sum(memory_rated)::text || '/' ||"
                                    " sum(storage_rated)::text || '/' || count(*) || '/' || sum(nanodollars)"
                                    " FROM spend_daily WHERE key_id = 'key-pv'");
        CHECK(v && strncmp(v, "10250000000000000000/4992899481600000000000000000/0/", 52) == 0,
              "key-pv rated: %s", v ? v : "?");
        if (v && strncmp(v + 52, "1/", 2) == 0) /* one UTC day (not across midnight): rounded once */
                CHECK(strcmp(v + 54, "4138889") == 0, "key-pv spend: %s nano-dollars, want 4138889", v + 54);
        free(v);

        v = aggtest_query(&t, "SELECT string_agg(reason, ' | ' ORDER BY reason) FROM dead_letters");
        CHECK(v && strstr(v, "no created event for the sandbox (held 15000 ms)") &&
                      strstr(v, "epoch 2 was never announced by the sandbox's host (announced up to 1) (held 15000 ms)") &&
                      strstr(v, "stopped from host host-evil, but the sandbox was created on host host-1") &&
                      strstr(v, "impossible first reading"),
              "the reasons say what was refused: %s", v ? v : "?");
        free(v);
        CHECK(count(&t, "SELECT count(*) FROM dead_letters WHERE reason LIKE 'epoch 2 was never announced%'") == 2,
              "the forged epoch sample and stopped both refused");

        CHECK(aggtest_terminate(agg) == 0, "unclean stop");
        aggtest_stop(&t);
        return test_result();
}
