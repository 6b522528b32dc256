/* utf8.c — see utf8.h. */
#include "utf8.h"

#include <stdint.h>

bool utf8_valid(const void *bytes, size_t n)
{
        const unsigned char *s = bytes;
        for (size_t i = 0; i < n;) {
                unsigned char c = s[i];
                size_t len;
                uint32_t cp;
                if (c < 0x80) {
                        i++;
                        continue;
                } else if ((c & 0xe0) == 0xc0) {
                        len = 2;
                        cp = c & 0x1f;
                } else if ((c & 0xf0) == 0xe0) {
                        len = 3;
                        cp = c & 0x0f;
                } else if ((c & 0xf8) == 0xf0) {
                        len = 4;
                        cp = c & 0x07;
                } else {
                        return false;
                }
                if (i + len > n)
                        return false;
                for (size_t k = 1; k < len; k++) {
                        if ((s[i + k] & 0xc0) != 0x80)
                                return false;
                        cp = cp << 6 | (s[i + k] & 0x3f);
                }
                static const uint32_t min[] = { 0, 0, 0x80, 0x800, 0x10000 };
                if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                        return false;
                i += len;
        }
        return true;
}
