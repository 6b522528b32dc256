/* serve.h — the init's life after the jail is built: the exec server on
 * tally-vmm's socket (each request forked and run through exec_in_jail,
 * confine.h, answered with its pid then its wait status; a command is killed
 * when the daemon asks or hangs up), the reaping of every process of the
 * sandbox's pid namespace, and the lease: the sandbox ends at its deadline
 * (the lease file, plus JAIL_LEASE_GRACE_NS) whether tally-vmm is up or not.
 * Single-threaded (builder.h); SIGCHLD is only unblocked inside ppoll. */
#pragma once

#include <signal.h>

/* Opens <dir>/lease and the lease's timer; fails if either cannot be. */
void lease_open(const char *dir);

/* Re-reads the lease and arms the timer; ends the sandbox (every process,
 * then the init) if its deadline has passed. */
void lease_check(void);

/* The SIGCHLD handler: it only interrupts ppoll, which then reaps. */
void on_sigchld(int sig);

/* Serves exec requests on listen_fd (-1: none) and the lease's timer until
 * the sandbox ends; none is the signal mask ppoll waits under. */
_Noreturn void serve(int listen_fd, const sigset_t *none);
