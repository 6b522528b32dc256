/* state.h — what tally-collector keeps on disk besides the spool, under
 * <state_dir>/collector/: the start generation (so sequence numbers keep
 * increasing across restarts) and, per sandbox, an epoch the collector raised
 * itself (so it is not lowered by a restart). Every write is atomic and
 * fsync'd: a kill -9 leaves the old value or the new one. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define COLLECTOR_DIR "collector"

/* Creates <state_dir>/collector and its epochs/ and spool/ folders. Returns 0 or -errno. */
int state_prepare(const char *state_dir);

/* Reads the last generation, stores and returns the next one: the last + 1
 * (docs/events.md: raised by one at every start, so an aggregator never sees
 * a jump it would refuse). With none stored (a new host, or a lost folder) it
 * starts at the hours since GENERATION_EPOCH_S (2023-11-14), so a lost folder
 * still gives a higher generation on a host that restarted less often than
 * hourly. Returns 0 or -errno (-EOVERFLOW past 2^31 - 1). */
#define GENERATION_EPOCH_S INT64_C(1700000000)
int state_next_generation(const char *state_dir, int64_t now_sec, uint32_t *ret);

/* Stores a generation raised during a run (a sandbox's n ran out). Returns 0 or -errno. */
int state_save_generation(const char *state_dir, uint32_t generation);

/* A sandbox's persisted epoch: the epoch published and the record epoch it was
 * raised over. Missing: 0 in both and return 0. Returns 0 or -errno. */
int state_load_epoch(const char *state_dir, const char *sandbox, uint64_t *ret_epoch, uint64_t *ret_record);
int state_save_epoch(const char *state_dir, const char *sandbox, uint64_t epoch, uint64_t record);
int state_remove_epoch(const char *state_dir, const char *sandbox);

/* Writes text to path atomically: temporary file, fsync, rename, fsync of the folder. */
int state_write_atomic(const char *path, const char *text, size_t len);
