/* timeutil.h — time as int64 nanoseconds. Wall clock is Unix time in ns (UTC);
 * the monotonic clock never steps. Billing splits at UTC hour and day boundaries. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#define NS_PER_US   INT64_C(1000)
#define NS_PER_MS   INT64_C(1000000)
#define NS_PER_SEC  INT64_C(1000000000)
#define NS_PER_HOUR (INT64_C(3600) * NS_PER_SEC)
#define NS_PER_DAY  (INT64_C(24) * NS_PER_HOUR)

int64_t time_wall_ns(void);
int64_t time_mono_ns(void);
/* The monotonic clock in milliseconds (deadlines of polls and waits). */
int64_t time_mono_ms(void);
/* CLOCK_BOOTTIME: never steps, counts suspended time, shared by every process
 * of the host until it reboots (held time is measured on it). */
int64_t time_boot_ns(void);

/* The wall, monotonic and boot clocks as of one instant, as near as this
 * thread can: read one after another, a preemption between two reads puts
 * them apart by its length (15 ms seen on a loaded host, a moment's wall time
 * then that far from its boot time), so they are read again (at most 8 times)
 * while the wall clock moved more than 20 us across them; the closest try is
 * kept, its wall time at the middle. Any pointer may be NULL. */
void time_now3(int64_t *wall, int64_t *mono, int64_t *boot);

/* Start of the UTC hour / day holding t (floor, also for t < 0). */
int64_t time_floor(int64_t t, int64_t unit);
#define time_hour_start(t) time_floor((t), NS_PER_HOUR)
#define time_day_start(t)  time_floor((t), NS_PER_DAY)

/* "2026-11-29T07:14:17.123456789Z". Returns snprintf's length. */
int time_format(char *buf, size_t size, int64_t wall_ns);

/* Sleeps for ns, resuming after signals. */
void time_sleep_ns(int64_t ns);
