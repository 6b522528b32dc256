/* jail.h — what the process backend's jail is made of, shared by tally-vmm
 * (vmm/process.c, which starts tally-sandbox-init) and tally-sandbox-init
 * (vmm/sandbox-init/: init.c and the steps it names, which build the jail).
 * Only constants and the configuration's wire form live here: the daemon must
 * not link the jail's code, which runs in a single-threaded program of its own.
 *
 * The daemon clone()s the init into new pid, mount, uts, ipc and net
 * namespaces (always: a sandbox's network is its loopback alone), moves it
 * into the sandbox's cgroup, and the clone child then only execve()s tally-sandbox-init: nothing but system calls runs
 * in the copy of the threaded daemon. The init, single-threaded, builds the
 * jail with ordinary calls (docs/security.md says what each layer stops).
 *
 * Descriptors the init starts with: 0-2 /dev/null, JAIL_FD_READY (writes "ok"
 * or the reason it failed, then closes), JAIL_FD_LISTEN (the exec socket, or
 * closed), JAIL_FD_CONFIG (a memfd holding the configuration: NUL-terminated
 * "key=value" strings, then "--", then the main program's argv, if any).
 * Keys: id, dir, disk_bytes, network (1: internet through the egress proxy,
 * JAIL_EGRESS_PORT on the sandbox's loopback; 0: loopback only), copy_from (a
 * running sandbox's init pid whose /work is copied: fork) and copy_from_id
 * (that sandbox's id: the init checks the pid is still in its cgroup before it
 * trusts it).
 *
 * "--join" mode, for exec without the init's socket: descriptors 0-2 are the
 * command's, JAIL_FD_STATUS receives the command's pid then its wait status
 * (two ints), the config holds pid (the sandbox's init), cgroup (one per
 * folder to enter), "--", then the command's argv. */
#pragma once

#include <net/if.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#define JAIL_FD_READY  3
#define JAIL_FD_STATUS 3
#define JAIL_FD_LISTEN 4
#define JAIL_FD_CONFIG 5

#define JAIL_INIT_NAME "tally-sandbox-init"

/* Each sandbox's user namespace maps uids and gids 0..JAIL_UID_COUNT-1 inside
 * to JAIL_UID_BASE + slot * JAIL_UID_COUNT.. outside: a range of its own, held
 * by a lock file under JAIL_SLOT_DIR for the init's lifetime. */
#define JAIL_UID_BASE  0x40000000u
#define JAIL_UID_COUNT 65536u
#define JAIL_SLOTS     8192u
#define JAIL_SLOT_DIR  "/run/tally-sandbox-uids"

/* Below this the disk is a size-capped tmpfs, not an ext4 image. */
#define JAIL_DISK_IMAGE_MIN (8u << 20)

/* The lease file in the sandbox's folder: the wall-clock deadline in ns
 * (decimal, "0" for none). The init re-reads it when its timer fires and
 * when the daemon sends an exec request whose argv is JAIL_LEASE_REQUEST. */
#define JAIL_LEASE_FILE "lease"
#define JAIL_LEASE_REQUEST "\001lease"
/* The init ends the sandbox this long after the deadline, so a running
 * daemon's own timeout stop (with its event) normally comes first. */
#define JAIL_LEASE_GRACE_NS 200000000LL

#define JAIL_PIDS_MAX_DEFAULT 1024

/* tally-vmm's egress proxy listens here, on 127.0.0.1 inside a sandbox with
 * internet (vmm/egress.h); the sandbox's environment names it in HTTP_PROXY,
 * HTTPS_PROXY and ALL_PROXY. */
#define JAIL_EGRESS_PORT 3128

/* Brings the calling thread's network namespace's loopback up (the sandbox's
 * init does it at start; tally-vmm's egress proxy too, in case it comes first). */
static inline void jail_loopback_up(void)
{
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (s < 0)
                return;
        struct ifreq ifr = { 0 };
        memcpy(ifr.ifr_name, "lo", 3);
        if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0 && !(ifr.ifr_flags & IFF_UP)) {
                ifr.ifr_flags |= IFF_UP;
                ioctl(s, SIOCSIFFLAGS, &ifr);
        }
        close(s);
}
