/* daemon.h — what every tally daemon does with signals: SIGINT and SIGTERM ask
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
 * Returns the signal's number. */
int daemon_wait_stop(void);
