/* daemon.c — see daemon.h. */
#include "daemon.h"

volatile sig_atomic_t daemon_stop_requested;

static void on_stop_signal(int sig)
{
        (void)sig;
        daemon_stop_requested = 1;
}

void daemon_handle_signals(void)
{
        struct sigaction sa = { .sa_handler = on_stop_signal };
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);
}
