/* Unit tests of common/event.c: the usage topic's message format. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "event.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static struct usage_event sample(void)
{
        struct usage_event ev = { .type = EVENT_SAMPLE, .epoch = 7, .seq = 42,
                                  .wall_ns = INT64_C(1795936457000000001), .mono_ns = 123456789,
                                  .state = STATE_RUNNING, .cpu_ns = UINT64_C(9000000000000000000),
                                  .mem_bytes = 1 << 20, .mem_peak_bytes = 2 << 20,
                                  .mem_size_bytes = UINT64_C(4) << 30, .disk_bytes = 12345, .vcpus = 2 };
        strcpy(ev.host, "host-1");
        strcpy(ev.sandbox, "sb_01");
        strcpy(ev.account, "acct_1");
        strcpy(ev.key, "key_1");
        return ev;
}

static void sample_round_trip(void **state)
{
        struct usage_event ev = sample(), back;
        char buf[1024], why[128];
        int n = event_encode(&ev, buf, sizeof(buf));
        assert_true(n > 0);
        assert_int_equal((size_t)n, strlen(buf));
        assert_int_equal(event_decode(buf, (size_t)n, &back, why, sizeof(why)), 0);
        assert_int_equal(back.type, EVENT_SAMPLE);
        assert_string_equal(back.sandbox, "sb_01");
        assert_string_equal(back.key, "key_1");
        assert_int_equal(back.epoch, 7);
        assert_int_equal(back.seq, 42);
        assert_true(back.cpu_ns == UINT64_C(9000000000000000000));
        assert_true(back.mem_size_bytes == UINT64_C(4) << 30);
        assert_int_equal(back.wall_ns, INT64_C(1795936457000000001));
        assert_int_equal(back.vcpus, 2);
        assert_int_equal(back.state, STATE_RUNNING);
        assert_false(back.final);
        assert_false(back.net_known); /* a sandbox without internet sends none */
        assert_null(strstr(buf, "net_rx_bytes"));
        event_clear(&back);
        assert_int_equal(event_encode(&ev, buf, 40), -ENOBUFS);
}

/* Network bytes: optional, together, cumulative; a decoder that knows nothing of
 * them (any older aggregator) ignores unknown fields. */
static void sample_network_bytes(void **state)
{
        struct usage_event ev = sample(), back;
        ev.net_known = true;
        ev.net_rx_bytes = 40016;
        ev.net_tx_bytes = 100;
        char buf[1024], why[128];
        int n = event_encode(&ev, buf, sizeof(buf));
        assert_true(n > 0);
        assert_non_null(strstr(buf, "\"net_rx_bytes\":40016,\"net_tx_bytes\":100"));
        assert_int_equal(event_decode(buf, (size_t)n, &back, why, sizeof(why)), 0);
        assert_true(back.net_known);
        assert_true(back.net_rx_bytes == 40016 && back.net_tx_bytes == 100);
        event_clear(&back);
        static const char one[] = "{\"v\":1,\"type\":\"sample\",\"sandbox\":\"s\",\"account\":\"a\",\"key\":\"k\","
                                  "\"epoch\":0,\"seq\":0,\"wall_ns\":1795936457000000001,\"state\":\"running\","
                                  "\"cpu_ns\":0,\"mem_size_bytes\":0,\"vcpus\":1,\"net_tx_bytes\":5}";
        assert_int_equal(event_decode(one, sizeof(one) - 1, &back, why, sizeof(why)), -EINVAL);
        assert_non_null(strstr(why, "net_rx_bytes and net_tx_bytes come together"));
        ev.net_rx_bytes = UINT64_C(1) << 63;
        assert_int_equal(event_encode(&ev, buf, sizeof(buf)), -EINVAL);
}

static void created_with_labels(void **state)
{
        struct usage_event ev = sample();
        ev.type = EVENT_CREATED;
        strcpy(ev.backend, "process");
        strcpy(ev.parent, "sb_00");
        ev.disk_size_bytes = UINT64_C(8192) << 20;
        assert_int_equal(event_add_label(&ev, "task", "1234 \"quoted\" \\ \n"), 0);
        assert_int_equal(event_add_label(&ev, "agent", "coder"), 0);
        char buf[2048], why[128];
        int n = event_encode(&ev, buf, sizeof(buf));
        assert_true(n > 0);
        struct usage_event back;
        assert_int_equal(event_decode(buf, (size_t)n, &back, why, sizeof(why)), 0);
        assert_int_equal(back.type, EVENT_CREATED);
        assert_string_equal(back.backend, "process");
        assert_string_equal(back.parent, "sb_00");
        assert_int_equal(back.nlabels, 2);
        int task = strcmp(back.labels[0].key, "task") == 0 ? 0 : 1;
        assert_string_equal(back.labels[task].value, "1234 \"quoted\" \\ \n");
        event_clear(&back);
        event_clear(&ev);
}

static void label_limits(void **state)
{
        struct usage_event ev = sample();
        char big[EVENT_LABEL_VALUE_MAX + 2];
        memset(big, 'x', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        assert_int_equal(event_add_label(&ev, "k", big), -E2BIG);
        for (int i = 0; i < EVENT_LABELS_MAX; i++) {
                char k[8];
                snprintf(k, sizeof(k), "k%d", i);
                assert_int_equal(event_add_label(&ev, k, "v"), 0);
        }
        assert_int_equal(event_add_label(&ev, "one-more", "v"), -E2BIG);
        event_clear(&ev);
}

static void refuse(const char *json, const char *reason)
{
        struct usage_event ev;
        char why[256] = "";
        assert_int_equal(event_decode(json, strlen(json), &ev, why, sizeof(why)), -EINVAL);
        if (!strstr(why, reason))
                fail_msg("reason \"%s\" lacks \"%s\"", why, reason);
}

#define BASE "\"v\":1,\"type\":\"sample\",\"sandbox\":\"sb\",\"account\":\"a\",\"key\":\"k\",\"epoch\":1,\"seq\":1," \
             "\"wall_ns\":1795936457000000000,\"state\":\"running\",\"mem_size_bytes\":1,\"vcpus\":1"

static void refusals_say_why(void **state)
{
        refuse("{not json", "invalid JSON");
        refuse("[1,2]", "not a JSON object");
        refuse("{\"v\":2}", "unknown version 2");
        refuse("{" BASE "}", "missing field cpu_ns");
        refuse("{" BASE ",\"cpu_ns\":-5}", "field cpu_ns out of range");
        refuse("{" BASE ",\"cpu_ns\":1.5}", "field cpu_ns is not an integer");
        refuse("{" BASE ",\"cpu_ns\":\"12\"}", "field cpu_ns is not an integer");
        refuse("{" BASE ",\"cpu_ns\":1,\"cpu_ns\":2}", "invalid JSON");
        refuse("{\"v\":1,\"type\":\"sample\",\"sandbox\":\"sb/../x\",\"account\":\"a\"}", "sandbox is not a valid id");
        refuse("{\"v\":1,\"type\":\"explode\"}", "unknown type");
        refuse("{" BASE ",\"cpu_ns\":1,\"state\":\"dancing\"}", "invalid JSON"); /* duplicate state key */
        refuse("{\"v\":1,\"type\":\"sample\",\"sandbox\":\"sb\",\"account\":\"a\",\"key\":\"k\",\"epoch\":1,\"seq\":1,"
               "\"wall_ns\":5,\"state\":\"running\",\"mem_size_bytes\":1,\"vcpus\":1,\"cpu_ns\":1}",
               "field wall_ns out of range");
        refuse("{\"v\":1,\"type\":\"sample\",\"sandbox\":\"sb\",\"account\":\"a\",\"key\":\"k\",\"epoch\":1,\"seq\":1,"
               "\"wall_ns\":1795936457000000000,\"state\":\"running\",\"mem_size_bytes\":1,\"vcpus\":0,\"cpu_ns\":1}",
               "field vcpus out of range");
        struct usage_event ev;
        char why[64];
        const char *ok = "{" BASE ",\"cpu_ns\":0}";
        assert_int_equal(event_decode(ok, strlen(ok), &ev, why, sizeof(why)), 0);
        event_clear(&ev);
}

static void lifecycle_needs_less(void **state)
{
        const char *stopped = "{\"v\":1,\"type\":\"stopped\",\"sandbox\":\"sb\",\"account\":\"a\","
                              "\"wall_ns\":1795936457000000000,\"cpu_ns\":77}";
        struct usage_event ev;
        char why[128] = "";
        assert_int_equal(event_decode(stopped, strlen(stopped), &ev, why, sizeof(why)), 0);
        assert_int_equal(ev.type, EVENT_STOPPED);
        assert_int_equal(ev.cpu_ns, 77);
        event_clear(&ev);
}

static void restarted_needs_epoch_and_reason(void **state)
{
        struct usage_event ev = sample(), back;
        ev.type = EVENT_RESTARTED;
        ev.epoch = 3;
        strcpy(ev.reason, "counter_back");
        char buf[4096], why[256];
        int n = event_encode(&ev, buf, sizeof(buf));
        assert_true(n > 0);
        assert_non_null(strstr(buf, "\"type\":\"restarted\""));
        assert_non_null(strstr(buf, "\"reason\":\"counter_back\""));
        assert_int_equal(event_decode(buf, (size_t)n, &back, why, sizeof(why)), 0);
        assert_int_equal(back.type, EVENT_RESTARTED);
        assert_int_equal(back.epoch, 3);
        assert_string_equal(back.reason, "counter_back");
        event_clear(&back);
        const char *no_reason = "{\"v\":1,\"type\":\"restarted\",\"host\":\"h\",\"sandbox\":\"s\","
                                "\"account\":\"a\",\"epoch\":2,\"wall_ns\":1795936457000000001}";
        assert_int_equal(event_decode(no_reason, strlen(no_reason), &back, why, sizeof(why)), -EINVAL);
        assert_string_equal(why, "missing field reason");
        const char *no_epoch = "{\"v\":1,\"type\":\"restarted\",\"host\":\"h\",\"sandbox\":\"s\","
                               "\"account\":\"a\",\"reason\":\"restore\",\"wall_ns\":1795936457000000001}";
        assert_int_equal(event_decode(no_epoch, strlen(no_epoch), &back, why, sizeof(why)), -EINVAL);
        assert_string_equal(why, "missing field epoch");
        const char *bad = "{\"v\":1,\"type\":\"restarted\",\"host\":\"h\",\"sandbox\":\"s\","
                          "\"account\":\"a\",\"epoch\":2,\"reason\":\"Restore!\",\"wall_ns\":1795936457000000001}";
        assert_int_equal(event_decode(bad, strlen(bad), &back, why, sizeof(why)), -EINVAL);
        strcpy(ev.reason, "UPPER");
        assert_int_equal(event_encode(&ev, buf, sizeof(buf)), -EINVAL);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(sample_round_trip),
                cmocka_unit_test(sample_network_bytes),
                cmocka_unit_test(created_with_labels),
                cmocka_unit_test(label_limits),
                cmocka_unit_test(refusals_say_why),
                cmocka_unit_test(lifecycle_needs_less),
                cmocka_unit_test(restarted_needs_epoch_and_reason),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
