/* log.c — see log.h. One fprintf per event, so lines from threads never interleave. */
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static const char *log_component = "tally";
static enum log_level log_min = LOG_LEVEL_INFO;
static const char *const level_names[] = { "debug", "info", "warn", "error" };

void log_set_component(const char *component) { log_component = component; }
void log_set_level(enum log_level level) { log_min = level; }
enum log_level log_get_level(void) { return log_min; }

int log_level_parse(const char *s, enum log_level *ret)
{
        for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++)
                if (strcmp(s, level_names[i]) == 0) {
                        *ret = (enum log_level)i;
                        return 0;
                }
        return -EINVAL;
}

const char *log_quote(char *out, size_t size, const char *s)
{
        size_t n = 0;
        if (size < 3)
                return "";
        out[n++] = '"';
        for (; *s && n + 3 < size; s++) {
                char c = *s;
                if (c == '"' || c == '\\') {
                        out[n++] = '\\';
                        out[n++] = c;
                } else if (c == '\n') {
                        out[n++] = '\\';
                        out[n++] = 'n';
                } else {
                        out[n++] = c;
                }
        }
        out[n++] = '"';
        out[n] = '\0';
        return out;
}

void log_eventv(enum log_level level, const char *msg, const char *fields, va_list ap)
{
        if (level < log_min)
                return;
        int saved = errno; /* fields may use %m */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        char when[32];
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
        char qmsg[512];
        log_quote(qmsg, sizeof(qmsg), msg);
        char rest[1024] = "";
        if (fields) {
                errno = saved;
                rest[0] = ' ';
                vsnprintf(rest + 1, sizeof(rest) - 1, fields, ap);
        }
        fprintf(stderr, "ts=%s.%03ldZ level=%s component=%s msg=%s%s\n", when,
                ts.tv_nsec / 1000000, level_names[level], log_component, qmsg, rest);
        errno = saved;
}

void log_event(enum log_level level, const char *msg, const char *fields, ...)
{
        va_list ap;
        va_start(ap, fields);
        log_eventv(level, msg, fields, ap);
        va_end(ap);
}
