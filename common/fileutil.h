/* fileutil.h — small-file helpers shared by the daemons. */
#pragma once

#include <stddef.h>

/* Reads up to size - 1 bytes of a small file (one read: cgroup files, state
 * files) into buf and NUL-terminates it. Returns 0 or -errno (-ENOENT when
 * the file does not exist). */
int file_read_small(const char *path, char *buf, size_t size);
