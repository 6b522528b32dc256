/* root.h — the sandbox's file system: a private root (a tmpfs the init then
 * pivots into) holding read-only binds of the host's /usr (and /lib*, /bin,
 * /sbin as they are on the host), a generated /etc, a minimal /dev, its own
 * /proc over an empty folder with the host's kernel files masked, the disk at
 * /work (disk.h; copied from another sandbox on fork: copy.h) with /tmp on it,
 * and nothing of the state folder or the vmm's socket. Runs as host root in
 * the builder, in the sandbox's fresh mount namespace (builder.h). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

/* Builds the root at root (cfg.dir/root); network: the sandbox has internet
 * through the egress proxy (/etc/ssl is bound for TLS through it). */
void make_root(const char *root, uint64_t disk_bytes, uint32_t base, bool network);
