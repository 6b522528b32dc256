/* netpolicy.h — what network a sandbox may reach, as its creator asked for it,
 * and the address rules no allow-list can widen.
 *
 * Every sandbox has a network namespace of its own holding only a loopback
 * interface: no route leaves it. A sandbox with internet reaches the outside
 * only through tally-vmm's egress proxy (egress.h), which asks this module
 * whether a name is on the sandbox's allow-list and whether an address is one
 * a sandbox may ever reach. Pure functions: no I/O, no allocation but the
 * JSON built by net_policy_json. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#define NET_ALLOW_MAX 64          /* names on one allow-list */
#define NET_NAME_MAX  253         /* a DNS name's length in text, without the trailing dot */

struct net_policy {
        bool internet;            /* false: loopback only (the default) */
        uint32_t nallow;          /* 0 with internet: any name (addresses are still checked) */
        char allow[NET_ALLOW_MAX][NET_NAME_MAX + 1]; /* lower case; "*.example.com" matches below it */
};

/* Parses the create request's "network": absent or false (loopback only),
 * true (internet, no allow-list), or {"internet": bool, "allow": [names]}.
 * Names are DNS names (letters, digits, '-', labels of 1..63, at most
 * NET_NAME_MAX in all), a wildcard only as a leading "*."; they are kept in
 * lower case. An allow-list without internet is refused (it would mean
 * nothing). Returns 0 and fills *ret, or -EINVAL with why. */
int net_policy_parse(const json_t *v, struct net_policy *ret, char *why, size_t whylen);

/* {"internet": bool, "allow": [...]}: the form net_policy_parse reads back. New reference. */
json_t *net_policy_json(const struct net_policy *p);

/* Whether host (a name or an address literal, any case, an optional trailing
 * dot) may be asked for under p. Addresses are checked separately. */
bool net_policy_allows(const struct net_policy *p, const char *host);

/* Whether a sandbox may ever connect to this address, whatever its allow-list:
 * false for unspecified, loopback, private (RFC 1918, CGNAT 100.64/10, IPv6
 * ULA fc00::/7), link-local (169.254/16 with the cloud metadata address,
 * fe80::/10), multicast, broadcast and reserved ranges, and for IPv6 forms
 * that carry an IPv4 address (mapped, compatible, NAT64, 6to4) whose IPv4
 * address is one of those. Only AF_INET and AF_INET6 are ever public. */
bool net_addr_public(const struct sockaddr *sa);

/* Whether a and b are the same address (ports ignored; an IPv4-mapped IPv6
 * address equals its IPv4 address). */
bool net_addr_same(const struct sockaddr *a, const struct sockaddr *b);
