/* confine.h — what every sandbox command runs under: a uid range of its own
 * (a user namespace whose root is an unprivileged uid outside, with no
 * capability on the host), the seccomp filter (the second wall: calls that
 * reach the host kernel's global state, load code into it or leave the
 * namespaces), no new privileges, and the sandbox's environment (the egress
 * proxy named in it when the sandbox has internet; its network namespace has
 * only loopback, jail.h). The init itself drops every capability before it
 * runs anything of the sandbox's.
 *
 * exec_in_jail runs in a child forked from the single-threaded builder
 * (builder.h), so it may use ordinary calls up to the exec; it reports its
 * own failures on the command's stderr and exits 126/127, never fail(). */
#pragma once

#include <stdint.h>

/* The sandbox's user namespace: made by make_userns (init) or found through
 * the init's descriptors (--join, init.c); -1 until then. */
extern int userns_fd;

/* Names the egress proxy in every command's environment. */
void use_egress_env(void);

/* Takes a free uid range's lock (JAIL_SLOT_DIR), held while this process
 * lives, trying from a hash of id. Returns the slot; fails if none is free. */
uint32_t take_uid_slot(const char *id);

/* Creates the sandbox's user namespace mapping 0..JAIL_UID_COUNT-1 to
 * base.. and keeps it in userns_fd. */
void make_userns(uint32_t base);

/* Builds and exports the seccomp filter exec_in_jail loads. */
void build_filter(void);

/* In a child forked for one command, stdio set: becomes the sandbox's root
 * in its user namespace, closes every other descriptor, loads the filter and
 * execs argv. Never returns. */
_Noreturn void exec_in_jail(char *const argv[]);

/* Drops every capability of the init (it keeps what it needs in the
 * sandbox's user namespace as that namespace's owner). */
void drop_capabilities(void);
