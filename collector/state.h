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

/* The host's generation follows the clock's hours since GENERATION_EPOCH_S
 * (2023-11-14), so that one lost state folder can be recovered from the clock
 * alone (docs/events.md, "Sequence numbers"): an aggregator dead-letters a
 * generation more than 65,536 above the last it billed for a sandbox, and
 * ignores one below it.
 *  - At each start: the last + 1, or the clock's hours if higher — but never
 *    more than GENERATION_LEAP_MAX above the last (a wall clock set far ahead
 *    cannot make a jump an aggregator refuses).
 *  - During a run: one more whenever the clock's hours have passed it and an
 *    hour of monotonic time has gone by since the last raise
 *    (generation_follow_clock): so the generation a live sandbox last used
 *    never lags the clock by more than about an hour plus the collector's
 *    downtime, however long the host lives.
 *  - None stored (a new host, or a lost folder): the clock's hours plus
 *    GENERATION_LOST_MARGIN. That is above the last one used unless the host
 *    started (or raised) it more than the margin's times beyond the clock
 *    since it last followed the clock (a crash loop of over 1,024 starts, or
 *    after an earlier loss, more starts than hours since), and above it by at
 *    most the margin plus the hours the collector was down.
 * Returns 0 and the generation, stored first, or -errno (-EOVERFLOW past
 * 2^31 - 1). */
#define GENERATION_EPOCH_S INT64_C(1700000000)
#define GENERATION_LEAP_MAX 32768
#define GENERATION_LOST_MARGIN 1024
int state_next_generation(const char *state_dir, int64_t now_sec, uint32_t *ret);

/* The generation a running collector moves to (stored first) at wall second
 * now_sec, since_raise_ns of monotonic time after it last started or raised
 * it: gen + 1 when the clock's hours are above gen and an hour has passed,
 * else gen. */
uint32_t generation_follow_clock(uint32_t gen, int64_t now_sec, int64_t since_raise_ns);

/* Stores a generation raised during a run (a sandbox's n ran out). Returns 0 or -errno. */
int state_save_generation(const char *state_dir, uint32_t generation);

/* A sandbox's persisted epoch: the epoch published and the record epoch it was
 * raised over. Missing: 0 in both and return 0. Returns 0 or -errno. */
int state_load_epoch(const char *state_dir, const char *sandbox, uint64_t *ret_epoch, uint64_t *ret_record);
int state_save_epoch(const char *state_dir, const char *sandbox, uint64_t epoch, uint64_t record);
int state_remove_epoch(const char *state_dir, const char *sandbox);

/* Writes text to path atomically: temporary file, fsync, rename, fsync of the folder. */
int state_write_atomic(const char *path, const char *text, size_t len);
