/* capacity.h — what this host can promise its sandboxes: memory, vCPUs and
 * disk, each the host's (or a setting's) times an over-commit ratio, and the
 * one rule of admission: a create or a fork copy is refused when what the live
 * sandboxes are promised plus what it asks would pass the capacity.
 *
 * Promised is the sum over live sandboxes: memory and disk of running and
 * paused ones (a paused sandbox keeps both), vCPUs of running ones (a paused
 * sandbox burns none). The pure check lives here; vmm.c sums its list under
 * its lock and holds the reservations of creates under way. */
#pragma once

#include <stddef.h>
#include <stdint.h>

struct capacity_settings {
        int64_t memory_mib;            /* 0: the host's MemTotal */
        int64_t vcpus;                 /* 0: the host's online CPUs */
        int64_t disk_mib;              /* 0: free space under the state folder at start */
        int64_t memory_overcommit_pct; /* percent of the capacity that may be promised */
        int64_t vcpu_overcommit_pct;
        int64_t disk_overcommit_pct;
};

struct capacity_use {
        uint64_t mem_bytes;
        uint64_t vcpus;
        uint64_t disk_bytes;
};

struct capacity {
        struct capacity_use host;  /* the capacity before the ratios */
        struct capacity_use limit; /* what may be promised: host × ratio / 100 */
        int64_t memory_pct, vcpu_pct, disk_pct;
};

/* Fills c from s, reading the host's memory, CPUs and the free space under
 * state_dir for what s leaves 0. Returns 0 or -errno with the reason in err. */
int capacity_init(struct capacity *c, const struct capacity_settings *s, const char *state_dir, char *err,
                  size_t errlen);

/* 0 if promised + want fits c's limits in memory, vCPUs and disk; else
 * -ENOSPC with a sentence in why naming the first that is short. */
int capacity_check(const struct capacity *c, const struct capacity_use *promised, const struct capacity_use *want,
                   char *why, size_t whylen);

/* 0 if a disk of disk_bytes fits the free space under state_dir now (the
 * image is sparse, but it may fill); else -ENOSPC with why, or -errno. */
int capacity_check_free(const char *state_dir, uint64_t disk_bytes, char *why, size_t whylen);
