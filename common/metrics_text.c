/* metrics_text.c — see metrics_text.h. */
#include "metrics_text.h"

#include <errno.h>
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
