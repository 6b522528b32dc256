/* cgroup_counter.h — the one reader of the cgroup CPU counter's text, for both
 * cgroup versions. The vmm's final counter (in the billed `stopped` event) and
 * the collector's samples are parsed here, so the two agree by construction.
 *
 *   v1  cpuacct.usage   one decimal line, nanoseconds
 *   v2  cpu.stat        "key value" lines; the line starting "usage_usec "
 *                       holds microseconds, returned as nanoseconds
 *
 * Pure functions: no I/O, no allocation, no errno. Every value is checked for
 * overflow; anything that is not exactly the expected text is refused with
 * -EINVAL, and the out-parameter is written only on success. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* One unsigned decimal value filling buf (len bytes, no NUL needed), optionally
 * followed by one '\n' and nothing else: "218103808\n". No sign, no space, no
 * empty value; a value over UINT64_MAX is refused. Also the memory files
 * (memory.current, memory.usage_in_bytes, memory.peak). */
int cgroup_counter_parse_u64(const char *buf, size_t len, uint64_t *ret);

/* cgroup v2 cpu.stat: the value of the line that begins with "usage_usec "
 * (a key that merely contains it, such as "core_usage_usec", is another
 * line), times 1000. -EINVAL: no such line, a bad value on it, or one whose
 * nanoseconds overflow 64 bits. */
int cgroup_counter_parse_cpu_stat(const char *buf, size_t len, uint64_t *ret_ns);

/* The CPU counter of a cgroup of the given version (1: cpuacct.usage's text,
 * 2: cpu.stat's) in nanoseconds. -EINVAL for another version or bad text. */
int cgroup_counter_parse_cpu(int version, const char *buf, size_t len, uint64_t *ret_ns);
