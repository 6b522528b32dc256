/* fuzz_sample_batch.c — the usage batch reader (common/sample_batch.c,
 * format v2) on hostile bytes.
 *
 * Beyond "no crash, no sanitizer report": the reader is total (every refusal
 * has a reason; a record that runs past the end ends the batch), whatever it
 * accepts writes back to exactly the record's bytes, and the sample means
 * the same as a v1 message: its JSON decodes to the same event. The peek
 * the aggregator reads fold states ahead with (sample_batch_peek_sandbox)
 * moves forward to the end and names, in order, every sandbox a record that
 * decodes bills. */
#include "event.h"
#include "sample_batch.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, "fuzz_sample_batch: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void same(const struct usage_event *a, const struct usage_event *b)
{
        if (a->type != b->type || strcmp(a->host, b->host) || strcmp(a->sandbox, b->sandbox) ||
            strcmp(a->account, b->account) || strcmp(a->key, b->key) || a->epoch != b->epoch || a->seq != b->seq ||
            a->wall_ns != b->wall_ns || a->mono_ns != b->mono_ns || a->state != b->state || a->cpu_ns != b->cpu_ns ||
            a->mem_bytes != b->mem_bytes || a->mem_peak_bytes != b->mem_peak_bytes ||
            a->mem_size_bytes != b->mem_size_bytes || a->disk_bytes != b->disk_bytes || a->vcpus != b->vcpus ||
            a->final != b->final || a->held_known != b->held_known || a->running_ns != b->running_ns ||
            a->paused_ns != b->paused_ns || a->net_known != b->net_known || a->net_rx_bytes != b->net_rx_bytes ||
            a->net_tx_bytes != b->net_tx_bytes)
                FAIL("a sample and its v1 JSON differ: sandbox %s", a->sandbox);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        struct sample_batch_reader rd;
        char why[256], peeked[EVENT_ID_MAX + 1];
        size_t at = 0;
        why[0] = '\0';
        if (sample_batch_open(&rd, data, size, why, sizeof(why)) < 0) {
                if (!memchr(why, '\0', sizeof(why)) || !why[0])
                        FAIL("a refused batch without a reason");
                if (sample_batch_peek_sandbox(data, size, &at, peeked) || at != size)
                        FAIL("the peek named a sandbox in a refused batch");
                return 0;
        }
        for (;;) {
                struct usage_event ev, v1;
                const uint8_t *rec = NULL;
                size_t reclen = 0;
                why[0] = '\0';
                int r = sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why));
                if (r == 0)
                        break;
                if (rec < data || reclen == 0 || rec + reclen > data + size)
                        FAIL("a record outside the batch");
                if (r < 0) {
                        if (!why[0])
                                FAIL("a refused record without a reason");
                        if (r == -EPROTO && (rec + reclen != data + size ||
                                             sample_batch_next(&rd, &ev, &rec, &reclen, why, sizeof(why)) != 0))
                                FAIL("a record past the end did not end the batch");
                        if (r != -EINVAL && r != -EPROTO)
                                FAIL("an unknown refusal %d", r);
                        continue;
                }
                uint8_t again[SAMPLE_BATCH_RECORD_MAX];
                int n = sample_batch_record(again, sizeof(again), rd.wall_base, rd.mono_base, &ev);
                if (n < 0)
                        FAIL("an accepted record does not write back: %d", n);
                if ((size_t)n != reclen || memcmp(again, rec, reclen) != 0)
                        FAIL("the round trip changed record %zu", rd.index);
                char json[4096];
                int j = event_encode(&ev, json, sizeof(json));
                if (j < 0)
                        FAIL("an accepted sample does not encode as v1: %d", j);
                if (event_decode(json, (size_t)j, &v1, why, sizeof(why)) < 0)
                        FAIL("an accepted sample's v1 JSON is refused: %s: %.*s", why, j, json);
                same(&ev, &v1);
                event_clear(&v1);
                for (;;) { /* the peek reaches this sample's sandbox, moving forward only */
                        size_t before = at;
                        if (!sample_batch_peek_sandbox(data, size, &at, peeked))
                                FAIL("the peek missed record %zu's sandbox %s", rd.index, ev.sandbox);
                        if (at <= before || at > size)
                                FAIL("the peek did not move forward within the batch");
                        if (strcmp(peeked, ev.sandbox) == 0)
                                break;
                }
        }
        while (sample_batch_peek_sandbox(data, size, &at, peeked))
                ;
        if (at != size)
                FAIL("the peek stopped at %zu of %zu", at, size);
        return 0;
}
