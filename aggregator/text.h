/* text.h — the aggregator's small text and array helpers: growing arrays,
 * a growing buffer for COPY and SQL, UTF-8-safe copies of reasons, and the
 * numbers and timestamps as the ledger reads them.
 *
 * No I/O. Every function that allocates returns -ENOMEM and leaves what it
 * was given as it was. */
#pragma once

#include "fold.h"

#include <stddef.h>
#include <stdint.h>

/* Makes *p (an array of *cap elements of size bytes) hold at least need
 * elements, doubling from 1024. 0, or -ENOMEM with *p and *cap unchanged. */
int grow(void **p, size_t *cap, size_t need, size_t size);

/* A growing text buffer (for COPY rows and built SQL). Starts zeroed; the
 * owner frees buf. */
struct text {
        char *buf;
        size_t len, cap;
};

/* Appends printf-style; 0, -EINVAL or -ENOMEM. */
int text_add(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Append s, or v in decimal, then end (a COPY row's tab or newline): the
 * fast path for rows of ids and numbers, which need no escaping. 0 or
 * -ENOMEM. */
int text_put(struct text *t, const char *s, char end);
int text_put_u64(struct text *t, uint64_t v, char end);
int text_put_i64(struct text *t, int64_t v, char end);

/* Appends s as one field of COPY's text format (backslash, tab, newline and
 * carriage return escaped; NULL as \N), then end (a tab or a newline). */
int text_add_copy_field(struct text *t, const char *s, char end);

/* Copies src into dst (size bytes with the NUL) as valid UTF-8: cut on a
 * character boundary, never inside one, and any byte that starts no valid
 * character (a reason cut mid-character by whoever wrote it) becomes '?'.
 * The ledger refuses text that is not UTF-8. */
void utf8_copy(char *dst, size_t size, const char *src);

/* v in decimal, in buf (cut to size); returns buf. */
char *u128_str(u128 v, char *buf, size_t size);

/* ns (Unix time) as a PostgreSQL timestamptz in UTC, to the microsecond
 * ("2026-12-06 09:50:00.000000+00"; "" when size is under 30). */
void format_ts(char *buf, size_t size, int64_t ns);
