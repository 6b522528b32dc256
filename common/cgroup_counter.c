/* cgroup_counter.c — see cgroup_counter.h. Reads only the bytes it is given:
 * the text need not be NUL-terminated. */
#include "cgroup_counter.h"

#include <errno.h>
#include <string.h>

int cgroup_counter_parse_u64(const char *buf, size_t len, uint64_t *ret)
{
        uint64_t v = 0;
        size_t i = 0;
        if (len == 0 || buf[0] < '0' || buf[0] > '9')
                return -EINVAL;
        for (; i < len && buf[i] >= '0' && buf[i] <= '9'; i++) {
                uint64_t d = (uint64_t)(buf[i] - '0');
                if (v > (UINT64_MAX - d) / 10)
                        return -EINVAL;
                v = v * 10 + d;
        }
        if (i < len && (buf[i] != '\n' || i + 1 != len))
                return -EINVAL;
        *ret = v;
        return 0;
}

int cgroup_counter_parse_cpu_stat(const char *buf, size_t len, uint64_t *ret_ns)
{
        static const char name[] = "usage_usec ";
        const size_t nlen = sizeof(name) - 1;
        size_t pos = 0;
        while (pos < len) {
                const char *nl = memchr(buf + pos, '\n', len - pos);
                size_t end = nl ? (size_t)(nl - buf) : len;
                if (end - pos > nlen && memcmp(buf + pos, name, nlen) == 0) {
                        uint64_t us;
                        int r = cgroup_counter_parse_u64(buf + pos + nlen, end - pos - nlen, &us);
                        if (r < 0)
                                return r;
                        if (us > UINT64_MAX / 1000)
                                return -EINVAL;
                        *ret_ns = us * 1000;
                        return 0;
                }
                pos = end + 1;
        }
        return -EINVAL;
}

int cgroup_counter_parse_cpu(int version, const char *buf, size_t len, uint64_t *ret_ns)
{
        if (version == 1)
                return cgroup_counter_parse_u64(buf, len, ret_ns);
        if (version == 2)
                return cgroup_counter_parse_cpu_stat(buf, len, ret_ns);
        return -EINVAL;
}
