/* fuzz_event.c — the usage-event decoder (common/event.c) on hostile bytes.
 *
 * Beyond "no crash, no sanitizer report": whatever the decoder accepts must
 * encode, and decode again to the same event (encode(decode(encode(x))) is
 * byte-for-byte encode(x)), so nothing the aggregator bills from is lost or
 * changed by a round trip through the topic. */
#include "event.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, "fuzz_event: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static char a[1 << 16], b[1 << 16];
        struct usage_event ev, again;
        char why[256];
        memset(&ev, 0, sizeof(ev));
        memset(&again, 0, sizeof(again));
        if (event_decode(data, size, &ev, why, sizeof(why)) < 0) {
                if (!memchr(why, '\0', sizeof(why)) || !why[0])
                        FAIL("a refusal without a reason");
                return 0;
        }
        int n = event_encode(&ev, a, sizeof(a));
        if (n < 0)
                FAIL("an accepted event does not encode: %d", n);
        if (event_decode(a, (size_t)n, &again, why, sizeof(why)) < 0)
                FAIL("an encoded event does not decode: %s: %.*s", why, n, a);
        int m = event_encode(&again, b, sizeof(b));
        if (m != n || memcmp(a, b, (size_t)n) != 0)
                FAIL("the round trip changed the event:\n%.*s\n%.*s", n, a, m < 0 ? 0 : m, b);
        event_clear(&ev);
        event_clear(&again);
        return 0;
}
