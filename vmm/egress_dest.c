/* egress_dest.c — a sandbox's destinations, resolved and checked (see egress_dest.h). */
#include "egress_dest.h"
#include "netpolicy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* Pins from the hosts file: "address name [name...]" lines, '#' comments.
 * Fills up to max addresses for host (lower case); returns how many. */
static int hosts_lookup(const char *file, const char *host, struct sockaddr_storage *out, int max)
{
        if (!file || !*file)
                return 0;
        FILE *f = fopen(file, "re");
        if (!f)
                return 0;
        char line[1024];
        int n = 0;
        while (n < max && fgets(line, sizeof(line), f)) {
                char *hash = strchr(line, '#');
                if (hash)
                        *hash = '\0';
                char *save = NULL, *addr = strtok_r(line, " \t\r\n", &save);
                if (!addr)
                        continue;
                bool match = false;
                for (char *name; (name = strtok_r(NULL, " \t\r\n", &save));)
                        match |= strcasecmp(name, host) == 0;
                if (!match)
                        continue;
                struct sockaddr_in *a4 = (struct sockaddr_in *)&out[n];
                struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&out[n];
                memset(&out[n], 0, sizeof(out[n]));
                if (inet_pton(AF_INET, addr, &a4->sin_addr) == 1) {
                        a4->sin_family = AF_INET;
                        n++;
                } else if (inet_pton(AF_INET6, addr, &a6->sin6_addr) == 1) {
                        a6->sin6_family = AF_INET6;
                        n++;
                }
        }
        fclose(f);
        return n;
}

int egress_resolve(const char *hosts_file, const char *host, struct sockaddr_storage *out, int max)
{
        memset(&out[0], 0, sizeof(out[0]));
        struct sockaddr_in *a4 = (struct sockaddr_in *)&out[0];
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&out[0];
        if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
                a4->sin_family = AF_INET;
                return 1;
        }
        if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
                a6->sin6_family = AF_INET6;
                return 1;
        }
        int n = hosts_lookup(hosts_file, host, out, max);
        if (n > 0)
                return n;
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *res = NULL;
        if (getaddrinfo(host, NULL, &hints, &res) != 0)
                return 0;
        for (struct addrinfo *a = res; a && n < max; a = a->ai_next)
                if ((a->ai_family == AF_INET || a->ai_family == AF_INET6) && a->ai_addrlen <= sizeof(out[n])) {
                        memset(&out[n], 0, sizeof(out[n]));
                        memcpy(&out[n], a->ai_addr, a->ai_addrlen);
                        n++;
                }
        freeaddrinfo(res);
        return n;
}

/* Whether sa is one of this host's own addresses (any interface, up or not). */
static bool host_own(const struct sockaddr *sa)
{
        struct ifaddrs *ifs = NULL;
        if (getifaddrs(&ifs) < 0)
                return true; /* unknown: refuse */
        bool own = false;
        for (struct ifaddrs *i = ifs; i && !own; i = i->ifa_next)
                own = i->ifa_addr && net_addr_same(i->ifa_addr, sa);
        freeifaddrs(ifs);
        return own;
}

int egress_connect_checked(struct sockaddr_storage *addrs, int n, int port, int64_t connect_timeout_ms)
{
        int r = -EACCES;
        for (int i = 0; i < n; i++) {
                struct sockaddr *sa = (struct sockaddr *)&addrs[i];
                if (!net_addr_public(sa) || host_own(sa))
                        continue;
                socklen_t len;
                if (sa->sa_family == AF_INET) {
                        ((struct sockaddr_in *)sa)->sin_port = htons((uint16_t)port);
                        len = sizeof(struct sockaddr_in);
                } else {
                        ((struct sockaddr_in6 *)sa)->sin6_port = htons((uint16_t)port);
                        ((struct sockaddr_in6 *)sa)->sin6_scope_id = 0;
                        len = sizeof(struct sockaddr_in6);
                }
                int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
                if (fd < 0) {
                        r = -errno;
                        continue;
                }
                /* Exactly the address checked above: no second lookup. */
                if (connect(fd, sa, len) < 0 && errno != EINPROGRESS) {
                        r = -errno;
                        close(fd);
                        continue;
                }
                struct pollfd p = { fd, POLLOUT, 0 };
                int err = 0;
                socklen_t el = sizeof(err);
                int pr = poll(&p, 1, (int)connect_timeout_ms);
                if (pr == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0)
                        return fd;
                r = pr == 0 ? -ETIMEDOUT : -(err ? err : EIO);
                close(fd);
        }
        return r;
}
