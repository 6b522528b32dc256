/* fuzz_cgroup_counter.c — the cgroup CPU counter's parser (common/
 * cgroup_counter.c) on hostile bytes, for both versions. Never reads past the
 * bytes given (the sanitizers see to that: the input is copied into a buffer
 * of exactly its size), and what it accepts is what a second, independent
 * reading says: the value's decimal text (printed back with snprintf) is the
 * input's (v1) or the usage_usec line's (v2) with its leading zeros dropped. */
#include "cgroup_counter.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, "fuzz_cgroup_counter: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether the len bytes at s are value's decimal digits (leading zeros allowed). */
static int digits_are(const char *s, size_t len, uint64_t value)
{
        char want[32];
        int n = snprintf(want, sizeof(want), "%" PRIu64, value);
        while (len > (size_t)n && *s == '0') {
                s++;
                len--;
        }
        return len == (size_t)n && memcmp(s, want, len) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char *buf = malloc(size ? size : 1);
        if (!buf)
                return 0;
        memcpy(buf, data, size);
        const uint64_t untouched = UINT64_C(0x5a5a5a5a5a5a5a5a);

        uint64_t v = untouched;
        int r = cgroup_counter_parse_cpu(1, buf, size, &v);
        if (r < 0 && v != untouched)
                FAIL("v1: a refusal wrote its out-parameter");
        if (r == 0) {
                size_t len = size && buf[size - 1] == '\n' ? size - 1 : size;
                if (!digits_are(buf, len, v))
                        FAIL("v1: accepted %.*s as %" PRIu64, (int)size, buf, v);
        }

        v = untouched;
        r = cgroup_counter_parse_cpu(2, buf, size, &v);
        if (r < 0 && v != untouched)
                FAIL("v2: a refusal wrote its out-parameter");
        if (r == 0) {
                if (v % 1000 != 0)
                        FAIL("v2: %" PRIu64 " ns is not whole microseconds", v);
                /* The first line that begins "usage_usec " holds exactly v / 1000. */
                size_t pos = 0;
                int found = 0;
                while (pos < size && !found) {
                        const char *nl = memchr(buf + pos, '\n', size - pos);
                        size_t end = nl ? (size_t)(nl - buf) : size;
                        if (end - pos >= 11 && memcmp(buf + pos, "usage_usec ", 11) == 0) {
                                if (!digits_are(buf + pos + 11, end - pos - 11, v / 1000))
                                        FAIL("v2: accepted a usage_usec line that does not say %" PRIu64 " us",
                                             v / 1000);
                                found = 1;
                        }
                        pos = end + 1;
                }
                if (!found)
                        FAIL("v2: accepted text without a usage_usec line");
        }
        free(buf);
        return 0;
}
