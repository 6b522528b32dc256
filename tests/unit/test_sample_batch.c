/* Unit tests of common/sample_batch.c: usage batches (format v2,
 * docs/events.md "Usage batches"). Expected bytes are worked out by hand
 * from the layout in the docs; decoded samples are compared with the events
 * they were written from and with event_decode of their v1 JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "event.h"
#include "sample_batch.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define WALL INT64_C(1795936457000000001)

static struct usage_event sample(int i)
{
        struct usage_event ev = { .type = EVENT_SAMPLE, .epoch = 7, .seq = (UINT64_C(5) << 32) | (uint64_t)i,
                                  .wall_ns = WALL, .mono_ns = 123456789,
                                  .state = (enum sandbox_state)(i % 3), .cpu_ns = UINT64_C(9000000000000000000) + (uint64_t)i,
                                  .mem_bytes = 1 << 20, .mem_peak_bytes = 2 << 20,
                                  .mem_size_bytes = UINT64_C(4) << 30, .disk_bytes = 12345, .vcpus = 2,
                                  .final = i % 5 == 4, .held_known = i % 2 == 0, .running_ns = 1000 + (uint64_t)i,
                                  .paused_ns = INT64_MAX, .net_known = i % 3 == 0, .net_rx_bytes = 77,
                                  .net_tx_bytes = (uint64_t)i };
        strcpy(ev.host, "host-1");
        snprintf(ev.sandbox, sizeof(ev.sandbox), "sb_%d", i);
        strcpy(ev.account, "acct_1");
        strcpy(ev.key, "key.1:a-Z");
        return ev;
}

/* Every field event_decode fills for a sample. */
static void assert_same(const struct usage_event *a, const struct usage_event *b)
{
        assert_int_equal(a->type, b->type);
        assert_string_equal(a->host, b->host);
        assert_string_equal(a->sandbox, b->sandbox);
        assert_string_equal(a->account, b->account);
        assert_string_equal(a->key, b->key);
        assert_int_equal(a->epoch, b->epoch);
        assert_int_equal(a->seq, b->seq);
        assert_int_equal(a->wall_ns, b->wall_ns);
        assert_int_equal(a->mono_ns, b->mono_ns);
        assert_int_equal(a->state, b->state);
        assert_int_equal(a->cpu_ns, b->cpu_ns);
        assert_int_equal(a->mem_bytes, b->mem_bytes);
        assert_int_equal(a->mem_peak_bytes, b->mem_peak_bytes);
        assert_int_equal(a->mem_size_bytes, b->mem_size_bytes);
        assert_int_equal(a->disk_bytes, b->disk_bytes);
        assert_int_equal(a->vcpus, b->vcpus);
        assert_int_equal(a->final, b->final);
        assert_int_equal(a->held_known, b->held_known);
        assert_int_equal(a->net_known, b->net_known);
        if (a->held_known) {
                assert_int_equal(a->running_ns, b->running_ns);
                assert_int_equal(a->paused_ns, b->paused_ns);
        }
        if (a->net_known) {
                assert_int_equal(a->net_rx_bytes, b->net_rx_bytes);
                assert_int_equal(a->net_tx_bytes, b->net_tx_bytes);
        }
}

/* A batch of n samples (the i-th's wall moved by wall_step * i). */
static size_t write_batch(uint8_t *buf, size_t size, int n, int64_t wall_step)
{
        int r = sample_batch_begin(buf, size, "host-1", WALL, 100);
        assert_true(r > 0);
        size_t len = (size_t)r;
        for (int i = 0; i < n; i++) {
                struct usage_event ev = sample(i);
                ev.wall_ns += wall_step * i;
                r = sample_batch_record(buf + len, size - len, WALL, 100, &ev);
                assert_true(r > 0);
                len += (size_t)r;
        }
        return len;
}

static void round_trip_equals_v1(void **state)
{
        uint8_t buf[65536];
        size_t len = write_batch(buf, sizeof(buf), 30, -1000);
        struct sample_batch_reader rd;
        char why[256], json[2048];
        assert_int_equal(sample_batch_open(&rd, buf, len, why, sizeof(why)), 0);
        assert_string_equal(rd.host, "host-1");
        struct usage_event ev, v1;
        const uint8_t *rec;
        size_t reclen;
        for (int i = 0; i < 30; i++) {
                assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), 1);
                struct usage_event want = sample(i);
                want.wall_ns -= 1000 * i;
                assert_same(&ev, &want);
                /* the same sample as a v1 message decodes to the same event */
                int n = event_encode(&want, json, sizeof(json));
                assert_true(n > 0);
                assert_int_equal(event_decode(json, (size_t)n, &v1, why, sizeof(why)), 0);
                assert_same(&ev, &v1);
        }
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), 0);
}

/* The layout of docs/events.md, byte by byte. */
static void bytes_by_hand(void **state)
{
        struct usage_event ev = { .type = EVENT_SAMPLE, .state = STATE_PAUSED, .epoch = 1, .seq = 300,
                                  .wall_ns = INT64_C(1577836800000000000), .mono_ns = 3, .mem_size_bytes = 128,
                                  .vcpus = 2, .held_known = true, .running_ns = 1, .paused_ns = 2 };
        strcpy(ev.host, "h");
        strcpy(ev.sandbox, "s");
        strcpy(ev.account, "a");
        strcpy(ev.key, "k");
        static const uint8_t want[] = {
                0x02, 0x01, 'h', 0x80, 0x80, 0xa8, 0xcc, 0xdb, 0xc6, 0xe6, 0xf2, 0x15, 0x05, /* header */
                21,                                 /* record length */
                0x09,                               /* paused, held time */
                0x01, 's', 0x01, 'a', 0x01, 'k',
                0x01, 0xac, 0x02,                   /* epoch 1, seq 300 */
                0x00, 0x03,                         /* wall +0, mono -2 (zigzag 3) */
                0x00, 0x00, 0x00, 0x80, 0x01, 0x00, /* cpu, mem, peak, size 128, disk */
                0x02, 0x01, 0x02,                   /* vcpus, running, paused */
        };
        uint8_t buf[256];
        int h = sample_batch_begin(buf, sizeof(buf), "h", INT64_C(1577836800000000000), 5);
        assert_int_equal(h, 13);
        int r = sample_batch_record(buf + h, sizeof(buf) - (size_t)h, INT64_C(1577836800000000000), 5, &ev);
        assert_int_equal(h + r, sizeof(want));
        assert_memory_equal(buf, want, sizeof(want));
}

static void one_bad_record_costs_itself(void **state)
{
        uint8_t buf[65536];
        size_t len = write_batch(buf, sizeof(buf), 3, 0);
        struct sample_batch_reader rd;
        char why[256];
        assert_int_equal(sample_batch_open(&rd, buf, len, why, sizeof(why)), 0);
        /* the second record's flags given an unknown bit */
        const uint8_t *rec;
        size_t reclen;
        struct usage_event ev;
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), 1);
        size_t second = (size_t)(rd.p - buf);
        buf[second + ((buf[second] & 0x80) ? 2 : 1)] |= 0x80; /* after its length, the flags */
        assert_int_equal(sample_batch_open(&rd, buf, len, why, sizeof(why)), 0);
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), 1);
        assert_string_equal(ev.sandbox, "sb_0");
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), -EINVAL);
        assert_non_null(strstr(why, "record 2"));
        assert_ptr_equal(rec, buf + second);
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), 1);
        assert_string_equal(ev.sandbox, "sb_2");
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), 0);

        /* cut inside the last record: its length runs past the end, the rest is one refusal */
        assert_int_equal(sample_batch_open(&rd, buf, len - 1, why, sizeof(why)), 0);
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), 1);
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), -EINVAL);
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), -EPROTO);
        assert_int_equal(rec + reclen, buf + len - 1);
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), 0);
}

/* sample_batch_peek_sandbox: each record's sandbox id in order, a record
 * whose id does not read skipped, nothing past a cut length or in bytes that
 * are not a batch. */
static void peek_sandboxes(void **state)
{
        uint8_t buf[65536];
        size_t len = write_batch(buf, sizeof(buf), 3, 0);
        char id[EVENT_ID_MAX + 1];
        size_t at = 0;
        for (int i = 0; i < 3; i++) {
                char want[16];
                snprintf(want, sizeof(want), "sb_%d", i);
                assert_true(sample_batch_peek_sandbox(buf, len, &at, id));
                assert_string_equal(id, want);
        }
        assert_false(sample_batch_peek_sandbox(buf, len, &at, id));
        assert_int_equal(at, len);

        /* the second record's sandbox id given a space: that record is passed over */
        struct sample_batch_reader rd;
        char why[256];
        const uint8_t *rec;
        size_t reclen;
        struct usage_event ev;
        assert_int_equal(sample_batch_open(&rd, buf, len, why, sizeof(why)), 0);
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), 1);
        size_t second = (size_t)(rd.p - buf);
        size_t flags = second + ((buf[second] & 0x80) ? 2 : 1);
        buf[flags + 2] = ' '; /* after the flags, the id's length, then its first byte */
        at = 0;
        assert_true(sample_batch_peek_sandbox(buf, len, &at, id));
        assert_string_equal(id, "sb_0");
        assert_true(sample_batch_peek_sandbox(buf, len, &at, id));
        assert_string_equal(id, "sb_2");
        assert_false(sample_batch_peek_sandbox(buf, len, &at, id));

        /* cut inside the last record: the readable records before it only */
        at = 0;
        assert_true(sample_batch_peek_sandbox(buf, len - 1, &at, id));
        assert_string_equal(id, "sb_0");
        assert_false(sample_batch_peek_sandbox(buf, len - 1, &at, id));
        assert_int_equal(at, len - 1);
        /* not a batch */
        static const char json[] = "{\"type\":\"sample\",\"sandbox\":\"sb_9\"}";
        at = 0;
        assert_false(sample_batch_peek_sandbox(json, sizeof(json) - 1, &at, id));
        assert_int_equal(at, sizeof(json) - 1);
}

static void refusals(void **state)
{
        struct sample_batch_reader rd;
        char why[256];
        struct usage_event ev;
        const uint8_t *rec;
        size_t reclen;
        static const uint8_t no_record[] = { 0x02, 0x00, 0x01, 0x01 };
        assert_int_equal(sample_batch_open(&rd, no_record, sizeof(no_record), why, sizeof(why)), -EINVAL);
        static const uint8_t bad_host[] = { 0x02, 0x02, 'h', '/', 0x01, 0x01, 0x01, 0x00 };
        assert_int_equal(sample_batch_open(&rd, bad_host, sizeof(bad_host), why, sizeof(why)), -EINVAL);
        static const uint8_t long_varint[] = { 0x02, 0x00, 0x81, 0x00, 0x01, 0x01, 0x00 };
        assert_int_equal(sample_batch_open(&rd, long_varint, sizeof(long_varint), why, sizeof(why)), -EINVAL);
        static const uint8_t two_63[] = { 0x02, 0x00, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
                                          0x01, 0x01, 0x00 };
        assert_int_equal(sample_batch_open(&rd, two_63, sizeof(two_63), why, sizeof(why)), -EINVAL);
        assert_int_equal(sample_batch_open(&rd, "{\"v\":1}", 7, why, sizeof(why)), -EINVAL);
        /* a record of one byte: the state 3 is no state */
        static const uint8_t state3[] = { 0x02, 0x00, 0x01, 0x01, 0x01, 0x03 };
        assert_int_equal(sample_batch_open(&rd, state3, sizeof(state3), why, sizeof(why)), 0);
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), -EINVAL);
        assert_int_equal(sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)), 0);

        /* the writer refuses what event_decode would */
        uint8_t buf[512];
        struct usage_event s = sample(1);
        s.vcpus = 0;
        assert_int_equal(sample_batch_record(buf, sizeof(buf), WALL, 0, &s), -EINVAL);
        s = sample(1);
        s.wall_ns = INT64_C(1000);
        assert_int_equal(sample_batch_record(buf, sizeof(buf), WALL, 0, &s), -EINVAL);
        s = sample(1);
        strcpy(s.key, "a b");
        assert_int_equal(sample_batch_record(buf, sizeof(buf), WALL, 0, &s), -EINVAL);
        s = sample(1);
        s.cpu_ns = UINT64_C(1) << 63;
        assert_int_equal(sample_batch_record(buf, sizeof(buf), WALL, 0, &s), -EINVAL);
        s = sample(1);
        assert_int_equal(sample_batch_record(buf, 10, WALL, 0, &s), -ENOBUFS);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(round_trip_equals_v1),
                cmocka_unit_test(bytes_by_hand),
                cmocka_unit_test(one_bad_record_costs_itself),
                cmocka_unit_test(refusals),
                cmocka_unit_test(peek_sandboxes),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
