/* daemon.h — what every tally daemon does with signals and with its heap.
 *
 * Signals: SIGINT and SIGTERM ask
 * it to stop cleanly (it finishes what it holds, flushes, exits 0); SIGPIPE is
 * ignored, so a peer that hangs up is an error return, never a death.
 *
 * Two ways to learn of the stop: a loop that already wakes often reads
 * daemon_stop_requested (daemon_handle_signals); a main thread with nothing
 * else to do blocks the signals before it starts any thread and sleeps in
 * daemon_wait_stop() — never `while (!flag) pause();`, which misses a signal
 * that lands between the test and the pause. */
#pragma once

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

/* Set to 1 by SIGINT or SIGTERM once daemon_handle_signals() ran, or when
 * daemon_wait_stop() returns. */
extern volatile sig_atomic_t daemon_stop_requested;

void daemon_handle_signals(void);

/* Blocks SIGINT and SIGTERM in the calling thread (and so in every thread it
 * starts afterwards) and ignores SIGPIPE. Call before starting any thread.
 * Children inherit the mask: every fork in tally resets it before exec. */
void daemon_block_stop_signals(void);

/* Waits for SIGINT or SIGTERM (blocked with daemon_block_stop_signals) and
 * takes it; a signal that came earlier is pending and returns at once.
 * Meanwhile it trims the heap (daemon_memory_trim) every
 * DAEMON_TRIM_INTERVAL_S. Returns the signal's number. */
int daemon_wait_stop(void);

/* The heap. glibc keeps what a daemon frees for reuse, and by default keeps
 * more the larger the blocks it has seen freed: freeing a block it had
 * mmap()ed (128 KiB or more) raises its mmap threshold to that block's size
 * and its threshold for giving the heap's top back to the kernel to twice
 * that. So a list of a few MiB built once a minute (the collector's registry
 * rescan: ~12 KiB a record) moves into the heap and its pages stay in RSS
 * after every free. And each thread's arena keeps the free pages between
 * blocks still in use (tally-api's HTTP threads, the vmm's request threads).
 * Neither is a leak, but either makes RSS, the one figure an operator or the
 * soak benchmark sees, grow and stay high for no live data.
 *
 * daemon_memory_setup() fixes the mmap threshold at DAEMON_MMAP_THRESHOLD, so
 * glibc stops moving it (and the trim threshold stays at its 128 KiB
 * default): a block that size or larger which the heap has no free room for
 * gets a mapping of its own, unmapped when freed. 32 KiB rather than the
 * 128 KiB default puts the vmm's per-sandbox blocks (~65 and ~52 KiB, mostly
 * PATH_MAX buffers) above it. Call it at start, before any thread. daemon_memory_trim() gives every arena's whole free pages back
 * (malloc_trim), at most once every DAEMON_TRIM_INTERVAL_S: it took 0.1 to
 * 0.7 ms in the soak. daemon_wait_stop() calls it while it waits; a daemon
 * whose main thread loops instead calls it from that loop. */
#define DAEMON_MMAP_THRESHOLD (32 * 1024)
#define DAEMON_TRIM_INTERVAL_S 10

void daemon_memory_setup(void);

/* mono_ns: now on the monotonic clock (time_mono_ns). Trims if
 * DAEMON_TRIM_INTERVAL_S passed since the last trim (or none was done yet);
 * any thread may call it, and of callers at the same moment one trims.
 * Returns true if this call trimmed. */
bool daemon_memory_trim(int64_t mono_ns);
