/* metrics_text.h — writing a /metrics page (Prometheus text format) into a
 * fixed buffer, printf by printf, without checking each call: once a line
 * does not fit, the rest is dropped and the page is refused as a whole. */
#pragma once

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* A latency histogram the daemons share: buckets from 5 ms to 30 s (their
 * upper bounds, +Inf after), a count and a sum in microseconds. Writers add
 * with relaxed atomics from any thread; the page reads it. */
#define METRICS_LATENCY_BUCKETS 12
extern const uint32_t metrics_latency_bounds_ms[METRICS_LATENCY_BUCKETS];

struct metrics_histogram {
        _Atomic uint64_t bucket[METRICS_LATENCY_BUCKETS + 1]; /* not cumulative; the last is +Inf */
        _Atomic uint64_t count, sum_us;
};

/* Counts one observation of us microseconds (a negative one as 0). */
void metrics_histogram_add_us(struct metrics_histogram *h, int64_t us);
/* n observations of us at once (a message that carries n samples). */
void metrics_histogram_add_n_us(struct metrics_histogram *h, int64_t us, uint64_t n);
/* Writes the histogram's lines: NAME_bucket{le="S"} (cumulative), NAME_sum in
 * seconds (exact, from microseconds) and NAME_count. The HELP and TYPE lines
 * are the caller's. */
void metrics_text_histogram(struct metrics_text *t, const char *name, const struct metrics_histogram *h);
