/* egress_dest.h — where the egress proxy may connect for a sandbox: a
 * name's addresses (an address literal, the egress hosts file's pins, else
 * the host's resolver), and a connection to exactly one of them that is
 * public and not one of this host's own (egress.h says why: no answer the
 * sandbox could influence is used twice, so no rebinding window).
 *
 * Nothing here keeps state; the caller checked the name against the
 * sandbox's allow-list first. Blocking: a lookup or a connect may take as
 * long as the resolver or connect_timeout_ms. */
#pragma once

#include <stdint.h>
#include <sys/socket.h>

/* The addresses host (lower case) stands for, at most max into out; the
 * ports are not set. Returns how many (0: none, the name does not resolve).
 * hosts_file: "address name [name...]" lines, '#' comments; NULL or "": none. */
int egress_resolve(const char *hosts_file, const char *host, struct sockaddr_storage *out, int max);

/* Connects to port of the first of addrs[0..n) a sandbox may reach (the
 * addresses' ports are overwritten). Returns the socket (non-blocking,
 * close-on-exec; the caller closes it), -EACCES if every answer was refused,
 * or another -errno (-ETIMEDOUT after connect_timeout_ms). */
int egress_connect_checked(struct sockaddr_storage *addrs, int n, int port, int64_t connect_timeout_ms);
