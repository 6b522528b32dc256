/* Unit: the aggregator's fast sample decoder against event_decode, the
 * reference. Whenever the fast path takes a message, event_decode must decode
 * it to the same event; and it must take the samples the collector writes
 * (else it is no fast path). Checked on written samples, hand-made edge cases
 * and a few hundred thousand random mutations of samples. */
#include "event.h"
#include "sample_decode.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static bool same(const struct usage_event *a, const struct usage_event *b)
{
        return a->type == b->type && strcmp(a->host, b->host) == 0 && strcmp(a->sandbox, b->sandbox) == 0 &&
               strcmp(a->account, b->account) == 0 && strcmp(a->key, b->key) == 0 && a->epoch == b->epoch &&
               a->seq == b->seq && a->wall_ns == b->wall_ns && a->mono_ns == b->mono_ns && a->state == b->state &&
               a->cpu_ns == b->cpu_ns && a->mem_bytes == b->mem_bytes && a->mem_peak_bytes == b->mem_peak_bytes &&
               a->mem_size_bytes == b->mem_size_bytes && a->disk_bytes == b->disk_bytes && a->vcpus == b->vcpus &&
               a->final == b->final && a->held_known == b->held_known && a->running_ns == b->running_ns &&
               a->paused_ns == b->paused_ns && a->net_known == b->net_known && a->net_rx_bytes == b->net_rx_bytes &&
               a->net_tx_bytes == b->net_tx_bytes && strcmp(a->parent, b->parent) == 0 &&
               strcmp(a->backend, b->backend) == 0 && a->disk_size_bytes == b->disk_size_bytes &&
               a->fork_count == b->fork_count && a->nlabels == 0 && b->nlabels == 0;
}

static unsigned taken, left;

/* The rule: taken by the fast path => event_decode decodes it, to the same. */
static void check(const char *msg, size_t len)
{
        struct usage_event fast, ref;
        char why[256];
        if (!sample_decode_fast(msg, len, &fast)) {
                left++;
                return;
        }
        taken++;
        int r = event_decode(msg, len, &ref, why, sizeof(why));
        if (r != 0)
                fail_msg("fast path took a message event_decode refuses (%s): %.*s", why, (int)len, msg);
        if (!same(&fast, &ref))
                fail_msg("fast path decoded differently: %.*s", (int)len, msg);
        event_clear(&ref);
}

static struct usage_event sample(unsigned i)
{
        struct usage_event ev = { .type = EVENT_SAMPLE, .epoch = i * 7919ULL, .seq = ((uint64_t)i << 32) | i,
                                  .wall_ns = INT64_C(1796039415378726095) + i, .mono_ns = i * 3ULL,
                                  .state = (enum sandbox_state)(i % 3), .cpu_ns = i * 700000000ULL,
                                  .mem_bytes = (uint64_t)i << 20, .mem_peak_bytes = (uint64_t)i << 21,
                                  .mem_size_bytes = 4ULL << 30, .disk_bytes = i, .vcpus = 1 + i % EVENT_VCPUS_MAX,
                                  .final = i % 5 == 0, .held_known = i % 2 == 0, .running_ns = i * 1000ULL,
                                  .paused_ns = i % 4 ? 0 : i, .net_known = i % 3 == 1, .net_rx_bytes = i * 1500ULL,
                                  .net_tx_bytes = i * 40ULL };
        snprintf(ev.host, sizeof(ev.host), i % 7 ? "host-%u" : "%.0u", i);
        snprintf(ev.sandbox, sizeof(ev.sandbox), "sb_%u.x:y-z", i);
        snprintf(ev.account, sizeof(ev.account), "acct-%u", i % 97);
        snprintf(ev.key, sizeof(ev.key), "key-%u", i % 13);
        if (i == 1) /* the extremes */
                ev.epoch = ev.seq = ev.cpu_ns = ev.mem_size_bytes = ev.running_ns = INT64_MAX;
        if (!ev.held_known) /* not written then */
                ev.running_ns = ev.paused_ns = 0;
        if (!ev.net_known)
                ev.net_rx_bytes = ev.net_tx_bytes = 0;
        if (i == 4) /* the extremes */
                ev.net_known = true, ev.net_rx_bytes = ev.net_tx_bytes = INT64_MAX;
        return ev;
}

static void written_samples_are_taken(void **state)
{
        (void)state;
        for (unsigned i = 0; i < 2000; i++) {
                struct usage_event ev = sample(i), fast;
                char buf[2048];
                int n = event_encode(&ev, buf, sizeof(buf));
                assert_true(n > 0);
                if (!sample_decode_fast(buf, (size_t)n, &fast))
                        fail_msg("the fast path left a written sample: %.*s", n, buf);
                assert_true(same(&fast, &ev));
                check(buf, (size_t)n);
        }
}

static void edge_cases(void **state)
{
        (void)state;
        static const char *const cases[] = {
                /* taken */
                " {\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"paused\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1} \n",
                "{ \"state\" : \"stopped\" , \"vcpus\" : 64 , \"mem_size_bytes\" : 1 , \"cpu_ns\" : 5 ,"
                " \"wall_ns\" : 7258118400000000000 , \"seq\" : 9223372036854775807 , \"epoch\" : 3 , \"key\" : \"k\" ,"
                " \"account\" : \"a\" , \"sandbox\" : \"s\" , \"type\" : \"sample\" , \"v\" : 1 , \"host\" : \"\" }",
                /* left to event_decode, refused or not */
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836799999999999,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":0}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1,"
                "\"labels\":{\"a\":\"b\"}}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1,"
                "\"host\":\"\",\"host\":\"h\"}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1,"
                "\"running_ns\":5}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1,"
                "\"net_rx_bytes\":5}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":1.0,\"mem_size_bytes\":0,\"vcpus\":1}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":9223372036854775808,"
                "\"mem_size_bytes\":0,\"vcpus\":1}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\\u0041\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,"
                "\"seq\":0,\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,"
                "\"vcpus\":1}",
                "{\"v\":1,\"type\":\"stopped\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1}x",
                "{\"v\":2,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1}",
                "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\",\"epoch\":0,\"seq\":0,"
                "\"wall_ns\":1577836800000000000,\"state\":\"running\",\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1,"
                "\"final\":null}",
                "{}", "", "[]", "{\"v\":1", "{\"v\":01}",
        };
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
                check(cases[i], strlen(cases[i]));
        struct usage_event ev;
        assert_true(sample_decode_fast(cases[0], strlen(cases[0]), &ev));
        assert_true(sample_decode_fast(cases[1], strlen(cases[1]), &ev));
        for (size_t i = 2; i < sizeof(cases) / sizeof(cases[0]); i++)
                if (sample_decode_fast(cases[i], strlen(cases[i]), &ev))
                        fail_msg("case %zu taken: %s", i, cases[i]);
}

/* Random edits of written samples: whatever the fast path takes, event_decode
 * decodes the same. */
static void mutations(void **state)
{
        (void)state;
        static const char alphabet[] = "0123456789\"{}[],:. -eE\\tfalsnu_xA\x7f\x80\xc3\n";
        unsigned seed = 12345;
        taken = left = 0;
        for (unsigned i = 0; i < 300000; i++) {
                struct usage_event ev = sample(i % 4000);
                char buf[2100];
                int n = event_encode(&ev, buf, 2048);
                assert_true(n > 0);
                int edits = 1 + (int)(rand_r(&seed) % 3);
                for (int e = 0; e < edits && n > 1; e++) {
                        int at = (int)(rand_r(&seed) % (unsigned)n);
                        char c = alphabet[rand_r(&seed) % (sizeof(alphabet) - 1)];
                        switch (rand_r(&seed) % 3) {
                        case 0: buf[at] = c; break;
                        case 1: memmove(buf + at, buf + at + 1, (size_t)(n - at - 1)); n--; break;
                        default: memmove(buf + at + 1, buf + at, (size_t)(n - at)); buf[at] = c; n++; break;
                        }
                }
                check(buf, (size_t)n);
        }
        print_message("mutations: %u taken by the fast path (each checked against event_decode), %u left to it\n",
                      taken, left);
        assert_true(taken > 1000 && left > 1000);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(written_samples_are_taken),
                cmocka_unit_test(edge_cases),
                cmocka_unit_test(mutations),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
