/* csv.h — RFC 4180 text: fields separated by commas, records ended by CRLF, a
 * field quoted (with its quotes doubled) when it holds a comma, a quote, CR or
 * LF. A field a spreadsheet would run as a formula (it starts with = + - @,
 * tab or CR and is not a plain number such as -12.5: OWASP's rule) is
 * written quoted with a leading ' — the spreadsheet shows it as text. Every
 * CSV tally writes goes through here. The writer grows a buffer it owns until
 * csv_take hands it over. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct csv {
        char *buf;
        size_t len, cap;
        bool field_open; /* a field was written on the current record */
        bool failed;     /* an allocation failed: csv_take returns NULL */
};

/* Whether s would run as a formula in a spreadsheet (csv_field neutralises it). */
bool csv_formula(const char *s);
/* Appends one field (NULL writes an empty field). */
void csv_field(struct csv *c, const char *s);
/* Ends the current record. */
void csv_end_record(struct csv *c);
/* The text (malloc'd, NUL-terminated; *len without the NUL), or NULL if any
 * append failed. The writer is empty afterwards. */
char *csv_take(struct csv *c, size_t *len);
void csv_free(struct csv *c);
