/* metrics_text.h — writing a /metrics page (Prometheus text format) into a
 * fixed buffer, printf by printf, without checking each call: once a line
 * does not fit, the rest is dropped and the page is refused as a whole. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct metrics_text {
        char *buf;
        size_t size, len;
        bool full;                       /* a line did not fit */
};

/* Starts a page in buf (size bytes). */
void metrics_text_init(struct metrics_text *t, char *buf, size_t size);
/* Appends printf(fmt, ...) (NUL-terminated), or marks the page full. */
void metrics_text_put(struct metrics_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The page's length, or -ENOBUFS when something did not fit. */
int metrics_text_end(const struct metrics_text *t);
