/* ports.c — test_free_port: see support.h. */
#include "support.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Where outgoing connections take their local ports; Linux's default when the
 * file cannot be read. */
static void ephemeral_range(int *low, int *high)
{
        *low = 32768;
        *high = 60999;
        FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
        if (!f)
                return;
        int l, h;
        if (fscanf(f, "%d %d", &l, &h) == 2 && l > 0 && h >= l && h <= 65535) {
                *low = l;
                *high = h;
        }
        fclose(f);
}

void test_port_range(int *lo, int *hi)
{
        int low, high;
        ephemeral_range(&low, &high);
        /* 20000 up to the ephemeral range; a host whose ephemeral range starts
         * lower than that (21000 and less) leaves too few there: then above it,
         * or as a last resort anywhere from 1024 (the race is back, said once). */
        if (low - 1 - 20000 >= 1000) {
                *lo = 20000;
                *hi = low - 1;
        } else if (low - 1 - 1024 >= 1000) {
                *lo = 1024;
                *hi = low - 1;
        } else if (65535 - (high + 1) >= 1000) {
                *lo = high + 1;
                *hi = 65535;
        } else {
                static int said;
                if (!said++)
                        fprintf(stderr, "warning: the ephemeral port range %d-%d leaves no ports outside it:"
                                        " a port picked for a server may be taken by an outgoing connection\n",
                                low, high);
                *lo = 1024;
                *hi = 65535;
        }
}

/* Bound (no SO_REUSEADDR: a port in TIME_WAIT counts as taken) and released. */
static int port_free(int port)
{
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        int r = bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 ? 0 : -errno;
        close(fd);
        return r;
}

int test_free_port(void)
{
        /* The ports this process handed out: a second pick before the first
         * port's server has bound must not return it again. */
        static int given[64];
        static size_t ngiven;
        static uint64_t state;
        if (!state) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                state = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40) ^ 1;
        }
        int lo, hi;
        test_port_range(&lo, &hi);
        for (int attempt = 0; attempt < 1000; attempt++) {
                /* xorshift64: a sequence of the process's own, whatever rand() callers do. */
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                int p = lo + (int)(state % (uint64_t)(hi - lo + 1));
                bool taken = false;
                for (size_t i = 0; i < ngiven && i < sizeof(given) / sizeof(given[0]) && !taken; i++)
                        taken = given[i] == p;
                if (taken || port_free(p) < 0)
                        continue;
                given[ngiven++ % (sizeof(given) / sizeof(given[0]))] = p;
                return p;
        }
        fprintf(stderr, "FAIL: no free port on 127.0.0.1 in %d-%d after 1000 tries\n", lo, hi);
        exit(1);
}
