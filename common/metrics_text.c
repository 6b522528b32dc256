/* metrics_text.c — see metrics_text.h. */
#include "metrics_text.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

void metrics_text_init(struct metrics_text *t, char *buf, size_t size)
{
        *t = (struct metrics_text){ buf, size, 0, size == 0 };
        if (size)
                buf[0] = '\0';
}

void metrics_text_put(struct metrics_text *t, const char *fmt, ...)
{
        if (t->full)
                return;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->size - t->len, fmt, ap);
        va_end(ap);
        if (n < 0 || (size_t)n >= t->size - t->len)
                t->full = true;
        else
                t->len += (size_t)n;
}

int metrics_text_end(const struct metrics_text *t)
{
        return t->full ? -ENOBUFS : (int)t->len;
}

const uint32_t metrics_latency_bounds_ms[METRICS_LATENCY_BUCKETS] = { 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000,
                                                                      10000, 30000 };

void metrics_histogram_add_us(struct metrics_histogram *h, int64_t us)
{
        metrics_histogram_add_n_us(h, us, 1);
}

void metrics_histogram_add_n_us(struct metrics_histogram *h, int64_t us, uint64_t n)
{
        if (us < 0)
                us = 0;
        int i = 0;
        while (i < METRICS_LATENCY_BUCKETS && (uint64_t)us > (uint64_t)metrics_latency_bounds_ms[i] * 1000)
                i++;
        atomic_fetch_add_explicit(&h->bucket[i], n, memory_order_relaxed);
        atomic_fetch_add_explicit(&h->count, n, memory_order_relaxed);
        atomic_fetch_add_explicit(&h->sum_us, (uint64_t)us * n, memory_order_relaxed);
}

static uint64_t get(const _Atomic uint64_t *v)
{
        return atomic_load_explicit(v, memory_order_relaxed);
}

void metrics_text_histogram(struct metrics_text *t, const char *name, const struct metrics_histogram *h)
{
        uint64_t cum = 0;
        for (int i = 0; i < METRICS_LATENCY_BUCKETS; i++) {
                cum += get(&h->bucket[i]);
                metrics_text_put(t, "%s_bucket{le=\"%" PRIu32 ".%03" PRIu32 "\"} %" PRIu64 "\n", name,
                                 metrics_latency_bounds_ms[i] / 1000, metrics_latency_bounds_ms[i] % 1000, cum);
        }
        cum += get(&h->bucket[METRICS_LATENCY_BUCKETS]);
        uint64_t sum = get(&h->sum_us);
        metrics_text_put(t, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cum);
        metrics_text_put(t, "%s_sum %" PRIu64 ".%06" PRIu64 "\n", name, sum / 1000000, sum % 1000000);
        metrics_text_put(t, "%s_count %" PRIu64 "\n", name, get(&h->count));
}
