/* sockio.h — the small I/O every part of the qemu backend shares: reads and writes on a socket bounded by a
 * deadline, the listening unix sockets QEMU connects to, and the why
 * sentence a failure is explained in.
 *
 * A deadline is a time_mono_ms() value; -1 means none (wait for ever). Errors
 * are negative errno: -ETIMEDOUT when the deadline passed, -EPIPE when the
 * peer closed its end before len bytes came. Nothing here keeps state. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "timeutil.h" /* time_mono_ms(): the deadlines' clock */

/* Milliseconds left until deadline, for poll: -1 without a deadline, 0 once
 * it passed, at most 60 s (poll is then called again). */
int qio_left_ms(int64_t deadline);

/* A listening unix socket at path (a stale file there is replaced). Returns
 * the descriptor (close-on-exec), or -ENAMETOOLONG / -errno. */
int qio_listen_unix(const char *path);

/* Writes all of buf to the socket fd (never raising SIGPIPE). */
int qio_write_all(int fd, const void *buf, size_t len, int64_t deadline);

/* Reads what fd has, up to len bytes (at least one; waiting for them). Returns
 * how many, or a negative errno. */
ssize_t qio_read_some(int fd, void *buf, size_t len, int64_t deadline);

/* Reads exactly len bytes from fd into buf. */
int qio_read_all(int fd, void *buf, size_t len, int64_t deadline);

/* Writes a sentence into why (whylen bytes with its NUL; why NULL or whylen 0:
 * nothing is written). */
void qio_set_why(char *why, size_t whylen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
