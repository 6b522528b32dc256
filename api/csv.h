/* csv.h — RFC 4180 text: fields separated by commas, records ended by CRLF, a
 * field quoted (with its quotes doubled) when it holds a comma, a quote, CR or
 * LF. The writer grows a buffer it owns until csv_take hands it over. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct csv {
        char *buf;
        size_t len, cap;
        bool field_open; /* a field was written on the current record */
        bool failed;     /* an allocation failed: csv_take returns NULL */
};

/* Appends one field (NULL writes an empty field). */
void csv_field(struct csv *c, const char *s);
/* Ends the current record. */
void csv_end_record(struct csv *c);
/* The text (malloc'd, NUL-terminated; *len without the NUL), or NULL if any
 * append failed. The writer is empty afterwards. */
char *csv_take(struct csv *c, size_t *len);
void csv_free(struct csv *c);
