/* netpolicy.c — see netpolicy.h. */
#include "netpolicy.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

/* A DNS name: labels of 1..63 letters, digits and '-' (not first or last),
 * at least two labels, NET_NAME_MAX in all; with wildcard_ok a leading "*."
 * is allowed. An IPv4 literal passes as a name of digit labels. */
static bool name_valid(const char *name, bool wildcard_ok)
{
        size_t len = strlen(name);
        if (wildcard_ok && strncmp(name, "*.", 2) == 0) {
                name += 2;
                len -= 2;
        }
        if (len == 0 || len > NET_NAME_MAX || !strchr(name, '.'))
                return false;
        size_t label = 0;
        for (size_t i = 0; i <= len; i++) {
                char c = name[i];
                if (c == '.' || c == '\0') {
                        if (label == 0 || label > 63 || name[i - 1] == '-')
                                return false;
                        label = 0;
                        continue;
                }
                if (!(isalnum((unsigned char)c) || (c == '-' && label > 0)))
                        return false;
                label++;
        }
        return true;
}

int net_policy_parse(const json_t *v, struct net_policy *ret, char *why, size_t whylen)
{
        struct net_policy p = { 0 };
        if (!v || json_is_false(v)) {
                *ret = p;
                return 0;
        }
        if (json_is_true(v)) {
                p.internet = true;
                *ret = p;
                return 0;
        }
        if (!json_is_object(v)) {
                snprintf(why, whylen, "network must be false, true or {\"internet\": bool, \"allow\": [names]}");
                return -EINVAL;
        }
        const char *k;
        json_t *f;
        json_object_foreach((json_t *)v, k, f) {
                if (strcmp(k, "internet") != 0 && strcmp(k, "allow") != 0) {
                        snprintf(why, whylen, "network: unknown field \"%.64s\" (internet, allow)", k);
                        return -EINVAL;
                }
        }
        json_t *internet = json_object_get(v, "internet"), *allow = json_object_get(v, "allow");
        if (internet && !json_is_boolean(internet)) {
                snprintf(why, whylen, "network.internet must be true or false");
                return -EINVAL;
        }
        p.internet = internet && json_is_true(internet);
        if (allow && !json_is_array(allow)) {
                snprintf(why, whylen, "network.allow must be an array of names");
                return -EINVAL;
        }
        if (allow && json_array_size(allow) > NET_ALLOW_MAX) {
                snprintf(why, whylen, "network.allow has %zu names: at most %d", json_array_size(allow),
                         NET_ALLOW_MAX);
                return -EINVAL;
        }
        if (allow && json_array_size(allow) > 0 && !p.internet) {
                snprintf(why, whylen, "network.allow needs network.internet true");
                return -EINVAL;
        }
        size_t i;
        json_t *name;
        json_array_foreach(allow, i, name) {
                const char *s = json_string_value(name);
                if (!s || json_string_length(name) != strlen(s) || !name_valid(s, true)) {
                        snprintf(why, whylen,
                                 "network.allow[%zu]: a DNS name of at most %d characters (letters, digits, '-', "
                                 "at least two labels), a wildcard only as a leading \"*.\"",
                                 i, NET_NAME_MAX);
                        return -EINVAL;
                }
                size_t n = strlen(s);
                for (size_t c = 0; c <= n; c++)
                        p.allow[p.nallow][c] = (char)tolower((unsigned char)s[c]);
                p.nallow++;
        }
        *ret = p;
        return 0;
}

json_t *net_policy_json(const struct net_policy *p)
{
        json_t *list = json_array();
        for (uint32_t i = 0; i < p->nallow; i++)
                json_array_append_new(list, json_string(p->allow[i]));
        return json_pack("{s:b, s:o}", "internet", p->internet, "allow", list);
}

bool net_policy_allows(const struct net_policy *p, const char *host)
{
        if (!p->internet)
                return false;
        char h[NET_NAME_MAX + 2];
        size_t n = strlen(host);
        if (n > 0 && host[n - 1] == '.')
                n--;
        if (n == 0 || n > NET_NAME_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                h[i] = (char)tolower((unsigned char)host[i]);
        h[n] = '\0';
        if (p->nallow == 0)
                return true;
        for (uint32_t i = 0; i < p->nallow; i++) {
                const char *a = p->allow[i];
                if (strncmp(a, "*.", 2) == 0) {
                        size_t sl = strlen(a + 1); /* ".example.com" */
                        if (n > sl && strcmp(h + n - sl, a + 1) == 0)
                                return true;
                } else if (strcmp(a, h) == 0) {
                        return true;
                }
        }
        return false;
}

/* IPv4 address a (host order) under prefix/len. */
static bool in4(uint32_t a, uint32_t prefix, int len)
{
        uint32_t mask = len == 0 ? 0 : ~0u << (32 - len);
        return (a & mask) == (prefix & mask);
}

static bool v4_public(uint32_t a)
{
        static const struct {
                uint32_t prefix;
                int len;
        } closed[] = {
                { 0x00000000, 8 },  /* "this network", 0.0.0.0 */
                { 0x0a000000, 8 },  /* 10/8 private */
                { 0x64400000, 10 }, /* 100.64/10 carrier-grade NAT */
                { 0x7f000000, 8 },  /* loopback */
                { 0xa9fe0000, 16 }, /* 169.254/16 link-local, cloud metadata */
                { 0xac100000, 12 }, /* 172.16/12 private */
                { 0xc0000000, 24 }, /* 192.0.0/24 IETF protocol assignments */
                { 0xc0a80000, 16 }, /* 192.168/16 private */
                { 0xc6120000, 15 }, /* 198.18/15 benchmarking */
                { 0xe0000000, 4 },  /* multicast */
                { 0xf0000000, 4 },  /* reserved, broadcast */
        };
        for (size_t i = 0; i < sizeof(closed) / sizeof(closed[0]); i++)
                if (in4(a, closed[i].prefix, closed[i].len))
                        return false;
        return true;
}

static uint32_t v4_at(const uint8_t *b)
{
        return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

static bool v6_public(const uint8_t *b)
{
        static const uint8_t zero[12] = { 0 };
        static const uint8_t mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
        static const uint8_t nat64[12] = { 0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0 };
        if (memcmp(b, zero, 12) == 0)
                return false; /* ::, ::1, IPv4-compatible */
        if (memcmp(b, mapped, 12) == 0 || memcmp(b, nat64, 12) == 0)
                return v4_public(v4_at(b + 12));
        if (b[0] == 0x20 && b[1] == 0x02)
                return v4_public(v4_at(b + 2)); /* 6to4 */
        if ((b[0] & 0xfe) == 0xfc)
                return false; /* fc00::/7 unique local */
        if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80)
                return false; /* fe80::/10 link-local */
        if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0)
                return false; /* fec0::/10 site-local (deprecated) */
        if (b[0] == 0xff)
                return false; /* multicast */
        if (b[0] == 0x01 && b[1] == 0 && memcmp(b + 2, zero, 6) == 0)
                return false; /* 100::/64 discard */
        return true;
}

bool net_addr_public(const struct sockaddr *sa)
{
        if (sa->sa_family == AF_INET)
                return v4_public(ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr));
        if (sa->sa_family == AF_INET6)
                return v6_public(((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr);
        return false;
}

/* The address as 16 bytes, IPv4 as IPv4-mapped; false for other families. */
static bool as16(const struct sockaddr *sa, uint8_t out[16])
{
        if (sa->sa_family == AF_INET6) {
                memcpy(out, ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr, 16);
                return true;
        }
        if (sa->sa_family == AF_INET) {
                memset(out, 0, 10);
                out[10] = out[11] = 0xff;
                memcpy(out + 12, &((const struct sockaddr_in *)sa)->sin_addr.s_addr, 4);
                return true;
        }
        return false;
}

bool net_addr_same(const struct sockaddr *a, const struct sockaddr *b)
{
        uint8_t x[16], y[16];
        return as16(a, x) && as16(b, y) && memcmp(x, y, 16) == 0;
}
