/* heapstat.c — a preload library for the soak (tests/bench/soak.sh): the heap
 * a daemon's allocations hold, which its RSS only hints at.
 *
 * RSS moves with what glibc has not yet given back (tally's daemons trim every
 * 10 s: tally-api's RSS swings ~3 MB between trims) and with library pages first
 * touched late; neither is a leak. mallinfo2's bytes in use — arena chunks
 * handed out plus mmapped ones — are what a leak adds to and nothing else.
 *
 * With TALLY_HEAPSTAT_FILE set, a thread of its own writes that figure (in
 * KiB, one line) to the file every TALLY_HEAPSTAT_MS (default 1000),
 * replacing it whole (a rename), so a reader never sees half a line. It
 * allocates nothing itself. TALLY_HEAPSTAT_LEAK_KIB_PER_MIN makes it leak that
 * much on purpose (malloc'd, touched, never freed): the soak's judgement has to
 * call that growth. The variables, LD_PRELOAD included, are taken out of the
 * environment at load, so no child the daemon starts inherits them. */
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char path[4096], tmp[4110];
static long period_ms = 1000, leak_kib_per_min;

static void write_figure(void)
{
        struct mallinfo2 mi = mallinfo2();
        char line[32];
        int n = snprintf(line, sizeof(line), "%zu\n", (mi.uordblks + mi.hblkhd) / 1024);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
                return;
        ssize_t w = write(fd, line, (size_t)n);
        close(fd);
        if (w == n)
                rename(tmp, path);
}

static void *sampler(void *arg)
{
        (void)arg;
        /* Leaked bytes owed so far, in KiB x ms / min, paid in whole KiB. */
        long long owed = 0;
        for (;;) {
                if (leak_kib_per_min > 0) {
                        owed += (long long)leak_kib_per_min * period_ms;
                        long long kib = owed / 60000;
                        owed -= kib * 60000;
                        if (kib > 0) {
                                char *p = malloc((size_t)kib * 1024);
                                if (p)
                                        memset(p, 1, (size_t)kib * 1024);
                        }
                }
                write_figure();
                struct timespec ts = { period_ms / 1000, (period_ms % 1000) * 1000000 };
                nanosleep(&ts, NULL);
        }
        return NULL;
}

__attribute__((constructor)) static void heapstat_start(void)
{
        const char *f = getenv("TALLY_HEAPSTAT_FILE");
        const char *ms = getenv("TALLY_HEAPSTAT_MS");
        const char *leak = getenv("TALLY_HEAPSTAT_LEAK_KIB_PER_MIN");
        if (ms && atol(ms) > 0)
                period_ms = atol(ms);
        if (leak)
                leak_kib_per_min = atol(leak);
        if (f && strlen(f) < sizeof(path)) {
                snprintf(path, sizeof(path), "%s", f);
                snprintf(tmp, sizeof(tmp), "%s.new", f);
        }
        unsetenv("TALLY_HEAPSTAT_FILE");
        unsetenv("TALLY_HEAPSTAT_MS");
        unsetenv("TALLY_HEAPSTAT_LEAK_KIB_PER_MIN");
        unsetenv("LD_PRELOAD");
        if (!path[0])
                return;
        /* Every signal blocked in the sampler: the daemons wait for SIGTERM
         * with sigwait in a thread of theirs, and a thread that left it
         * unblocked would take it and end the process. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_create(&t, &a, sampler, NULL);
        pthread_attr_destroy(&a);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
}
