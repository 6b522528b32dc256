/* log.h — structured logging: one event per line, key=value, to stderr.
 *
 * A line looks like
 *   ts=2026-11-29T07:14:17.123Z level=info component=aggregator msg="partition assigned" partition=3
 * Library code logs little and returns errors; daemons log where they handle them.
 * Never log secrets (API keys, passwords in database URLs). */
#pragma once

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

enum log_level { LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };

/* Sets the component name written on every line (not copied: pass a literal). */
void log_set_component(const char *component);
void log_set_level(enum log_level level);
enum log_level log_get_level(void);

/* Parses "debug", "info", "warn" or "error". Returns 0, or -EINVAL. */
int log_level_parse(const char *s, enum log_level *ret);

/* Where lines go (NULL: stderr, the default). Not thread-safe: set it first. */
void log_set_stream(FILE *stream);

/* Writes s into out as a quoted log value ("a \"b\""), escaping quotes,
 * backslashes, \n \r \t and other control bytes (\xNN), and returns out. */
const char *log_quote(char *out, size_t size, const char *s);

/* Formats a fields format (see log_event) into buf like vsnprintf, except that
 * every string substituted by %s or %m is escaped so it stays one value: inside
 * the format's quotes ("%s") quotes, backslashes and control bytes are escaped;
 * bare (key=%s) a value with a space, '=', a quote, a backslash or a control
 * byte is written quoted (an already quoted value from log_quote is kept).
 * Returns the length written (truncated to size - 1). */
int log_format_fields(char *buf, size_t size, const char *fmt, va_list ap);

/* msg is the quoted human part; fields, if not NULL, is a printf format of
 * further key=value pairs, e.g. "partition=%d offset=%lld", whose strings are
 * escaped as log_format_fields says: a value cannot add a field or a line. */
void log_event(enum log_level level, const char *msg, const char *fields, ...)
        __attribute__((format(printf, 3, 4)));
void log_eventv(enum log_level level, const char *msg, const char *fields, va_list ap)
        __attribute__((format(printf, 3, 0)));

#define log_debug(msg, ...) log_event(LOG_LEVEL_DEBUG, msg, __VA_ARGS__)
#define log_info(msg, ...)  log_event(LOG_LEVEL_INFO, msg, __VA_ARGS__)
#define log_warn(msg, ...)  log_event(LOG_LEVEL_WARN, msg, __VA_ARGS__)
#define log_error(msg, ...) log_event(LOG_LEVEL_ERROR, msg, __VA_ARGS__)
