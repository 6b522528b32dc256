/* fileutil.h — small-file helpers shared by the daemons. */
#pragma once

#include <stddef.h>
#include <sys/types.h>

/* Reads up to size - 1 bytes of a small file (one read: cgroup files, state
 * files) into buf and NUL-terminates it. Returns 0 or -errno (-ENOENT when
 * the file does not exist). */
int file_read_small(const char *path, char *buf, size_t size);

/* Replaces path with the len bytes at text, all or nothing: they are written to
 * path.tmp (created with mode, never through a link, its mode set again should
 * a crash have left one behind), synced, and renamed over path. Returns 0 or
 * -errno, path.tmp removed then. The folder's entry is not synced: a caller
 * that needs the rename itself durable syncs the folder after. */
int file_write_atomic(const char *path, const void *text, size_t len, mode_t mode);
