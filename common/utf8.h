/* utf8.h — the one check that bytes are UTF-8 (RFC 3629), for what tally
 * takes from outside or puts into JSON: query strings (tally-api), a
 * command's output (tally-vmm). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

/* Whether s[0..n) is UTF-8: no overlong forms, no surrogates, nothing past
 * U+10FFFF. A NUL byte is valid UTF-8 (U+0000): a caller that cannot hold
 * one checks for it itself. */
bool utf8_valid(const void *s, size_t n);
