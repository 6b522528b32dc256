/* daemon.c — see daemon.h. */
#include "daemon.h"

#include <errno.h>
#include <pthread.h>

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

static void stop_signals(sigset_t *set)
{
        sigemptyset(set);
        sigaddset(set, SIGINT);
        sigaddset(set, SIGTERM);
}

void daemon_block_stop_signals(void)
{
        sigset_t set;
        stop_signals(&set);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        signal(SIGPIPE, SIG_IGN);
}

int daemon_wait_stop(void)
{
        sigset_t set;
        stop_signals(&set);
        int sig;
        while ((sig = sigwaitinfo(&set, NULL)) < 0 && errno == EINTR)
                ;
        daemon_stop_requested = 1;
        return sig < 0 ? SIGTERM : sig;
}
