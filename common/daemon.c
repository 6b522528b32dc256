/* daemon.c — see daemon.h. */
#include "daemon.h"

#include "timeutil.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

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
        const struct timespec interval = { .tv_sec = DAEMON_TRIM_INTERVAL_S };
        int sig;
        while ((sig = sigtimedwait(&set, NULL, &interval)) < 0 && (errno == EINTR || errno == EAGAIN))
                daemon_memory_trim(time_mono_ns());
        daemon_stop_requested = 1;
        return sig < 0 ? SIGTERM : sig;
}

void daemon_memory_setup(void)
{
        mallopt(M_MMAP_THRESHOLD, DAEMON_MMAP_THRESHOLD);
}

/* When the last trim was (monotonic ns); 0: never. */
static _Atomic int64_t last_trim_ns;

bool daemon_memory_trim(int64_t mono_ns)
{
        int64_t last = atomic_load(&last_trim_ns);
        if (last != 0 && mono_ns - last < DAEMON_TRIM_INTERVAL_S * NS_PER_SEC)
                return false;
        /* One caller of those that saw the same last trim wins it. */
        if (!atomic_compare_exchange_strong(&last_trim_ns, &last, mono_ns ? mono_ns : 1))
                return false;
        malloc_trim(0);
        return true;
}
