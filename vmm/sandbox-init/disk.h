/* disk.h — a sandbox's disk: a size-capped ext4 image on a loop device (a
 * tmpfs for disks under JAIL_DISK_IMAGE_MIN) mounted at /work, so writing past
 * its size is ENOSPC, and /tmp as a folder of that disk. Runs as host root in
 * the builder (builder.h): failures end the init through fail(). */
#pragma once

#include <stdint.h>

/* Mounts a disk of `bytes` at work (an existing folder), owned by base (the
 * sandbox's root outside its user namespace). The image file is <cfg.dir>/disk. */
void make_disk(const char *work, uint64_t bytes, uint32_t base);

/* /tmp is the disk's .tmp, bound from a descriptor: a folder of the disk's
 * own file system (workfd), opened beneath the disk's root without following
 * a link. Anything else in its place (a link to "/", to /proc, a file) is
 * removed and a fresh folder made: never followed. tmp is the mount point. */
void make_tmp(int workfd, const char *tmp, uint32_t base);
