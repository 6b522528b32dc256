/* fuzz_control.c — the control decoder (common/control.c) on hostile bytes.
 * What it accepts must encode and decode again to the same command. */
#include "control.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, "fuzz_control: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char a[4096], b[4096], why[256];
        struct control_command c, again;
        memset(&c, 0, sizeof(c));
        memset(&again, 0, sizeof(again));
        if (control_decode(data, size, &c, why, sizeof(why)) < 0) {
                if (!memchr(why, '\0', sizeof(why)) || !why[0])
                        FAIL("a refusal without a reason");
                return 0;
        }
        if ((unsigned)c.action >= CONTROL_ACTION_COUNT)
                FAIL("accepted action %d", (int)c.action);
        int n = control_encode(&c, a, sizeof(a));
        if (n < 0)
                FAIL("an accepted command does not encode: %d", n);
        if (control_decode(a, (size_t)n, &again, why, sizeof(why)) < 0)
                FAIL("an encoded command does not decode: %s: %.*s", why, n, a);
        int m = control_encode(&again, b, sizeof(b));
        if (m != n || memcmp(a, b, (size_t)n) != 0)
                FAIL("the round trip changed the command:\n%.*s\n%.*s", n, a, m < 0 ? 0 : m, b);
        return 0;
}
