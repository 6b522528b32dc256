/* timeutil.c — see timeutil.h. */
#include "timeutil.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static int64_t now(clockid_t clock)
{
        struct timespec ts;
        clock_gettime(clock, &ts);
        return (int64_t)ts.tv_sec * NS_PER_SEC + ts.tv_nsec;
}

int64_t time_wall_ns(void) { return now(CLOCK_REALTIME); }
int64_t time_mono_ns(void) { return now(CLOCK_MONOTONIC); }
int64_t time_boot_ns(void) { return now(CLOCK_BOOTTIME); }
int64_t time_mono_ms(void) { return now(CLOCK_MONOTONIC) / NS_PER_MS; }

int64_t time_floor(int64_t t, int64_t unit)
{
        int64_t r = t % unit;
        return r < 0 ? t - r - unit : t - r;
}

int time_format(char *buf, size_t size, int64_t wall_ns)
{
        int64_t sec = time_floor(wall_ns, NS_PER_SEC);
        time_t s = (time_t)(sec / NS_PER_SEC);
        struct tm tm;
        gmtime_r(&s, &tm);
        char day[32];
        strftime(day, sizeof(day), "%Y-%m-%dT%H:%M:%S", &tm);
        return snprintf(buf, size, "%s.%09lldZ", day, (long long)(wall_ns - sec));
}

void time_sleep_ns(int64_t ns)
{
        struct timespec ts = { .tv_sec = ns / NS_PER_SEC, .tv_nsec = ns % NS_PER_SEC };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

void time_now3(int64_t *wall, int64_t *mono, int64_t *boot)
{
        int64_t best_w = 0, best_m = 0, best_b = 0, best_gap = INT64_MAX;
        for (int i = 0; i < 8 && best_gap > 20 * NS_PER_US; i++) {
                int64_t w0 = time_wall_ns(), m = time_mono_ns(), b = time_boot_ns(), w1 = time_wall_ns();
                int64_t gap = w1 - w0;
                if (gap < 0)
                        gap = -gap; /* the wall clock stepped between: as far apart as that */
                if (gap < best_gap) {
                        best_gap = gap;
                        best_w = w0 + (w1 - w0) / 2;
                        best_m = m;
                        best_b = b;
                }
        }
        if (wall)
                *wall = best_w;
        if (mono)
                *mono = best_m;
        if (boot)
                *boot = best_b;
}
