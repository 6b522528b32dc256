/* daemon.h — what every tally daemon does with signals: SIGINT and SIGTERM ask
 * it to stop cleanly (it finishes what it holds, flushes, exits 0); SIGPIPE is
 * ignored, so a peer that hangs up is an error return, never a death. */
#pragma once

#include <signal.h>

/* Set to 1 by SIGINT or SIGTERM once daemon_handle_signals() ran. */
extern volatile sig_atomic_t daemon_stop_requested;

void daemon_handle_signals(void);
