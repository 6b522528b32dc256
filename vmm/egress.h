/* egress.h — a sandbox's only way out: tally-vmm's egress proxy.
 *
 * A sandbox's network namespace holds only loopback: no veth, no NAT, no
 * route, so no packet of it ever reaches the host's network stack. For a
 * sandbox with internet, tally-vmm makes a listening TCP socket *inside* that
 * namespace (127.0.0.1:JAIL_EGRESS_PORT, made by a short-lived thread that
 * setns()es there and back) and serves it from the host: HTTP CONNECT
 * host:port and plain HTTP requests (absolute URI or Host header). Each name
 * is checked against the sandbox's allow-list (netpolicy.h), resolved here
 * (the egress hosts file first, then the host's resolver), every answer that
 * is not a public address or is one of the host's own addresses is refused,
 * and the proxy connects to exactly the address it checked: no DNS answer
 * the sandbox could influence is ever used twice (no rebinding window).
 *
 * Bytes relayed are counted per sandbox (rx: to the sandbox, tx: from it) and
 * written to the sandbox's counters file (registry.h, SANDBOX_NET_FILE) for
 * the collector. The proxy must never connect anywhere from inside the
 * sandbox's namespace, and never follow a name the allow-list refused. */
#pragma once

#include "netpolicy.h"

#include <stdint.h>
#include <sys/types.h>

struct egress_settings {
        const char *hosts_file;          /* "address name..." pins consulted before DNS; "" none */
        int64_t connections_max;         /* concurrent connections per sandbox */
        int64_t connect_timeout_ms;
        int64_t idle_timeout_ms;         /* a relayed connection with no byte either way this long is closed */
};

struct egress;

/* Starts the proxy of sandbox id: its listener in the network namespace of
 * pid (the sandbox's init), its counters file in dir (continued from what it
 * holds: a restarted tally-vmm keeps counting). p is copied. Returns 0 or
 * -errno with why. */
int egress_open(const struct egress_settings *s, const char *id, pid_t pid, const char *dir,
                const struct net_policy *p, struct egress **ret, char *why, size_t whylen);

/* Bytes relayed so far, cumulative. */
void egress_counts(struct egress *e, uint64_t *ret_rx, uint64_t *ret_tx);

/* Closes the listener and every connection, waits for their threads and
 * writes the counters file a last time. Accepts NULL. */
void egress_close(struct egress *e);
