/* table.h — the sandboxes one tally-collector tracks: one struct sandbox per
 * registry record it has taken in, found by id through a hash and walked in
 * a dense list (the tick's order).
 *
 * The table owns every struct sandbox in it and what each one holds (its
 * paths, its pending sample's buffer, its descriptors); table_remove hands one
 * back to the caller, who frees it with sandbox_free once it has closed what
 * other modules opened for it (its counter files: counters.h). A sandbox's
 * fields are written by the modules named beside them; the table itself only
 * links and unlinks. */
#pragma once

#include "cgroup.h"
#include "cgroup_scan.h"
#include "event.h"
#include "track.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SAMPLE_MAX 1024   /* an encoded sample without labels fits easily */
#define TABLE_HASH_SIZE 16384

struct sandbox {
        struct sandbox *hnext;
        size_t index;                 /* in sandbox_table.list */
        char id[EVENT_ID_MAX + 1];
        char account[EVENT_ID_MAX + 1];
        char key[EVENT_ID_MAX + 1];
        char host[EVENT_ID_MAX + 1];
        enum sandbox_state state;
        uint32_t vcpus;
        uint64_t mem_size_bytes;
        uint64_t disk_bytes;
        uint64_t final_cpu_ns;
        uint64_t record_epoch;        /* the record's epoch now; the tracker applies it at the next reading */
        int cgroup_version;
        char *cpu_dir, *mem_dir, *disk_path;
        struct cgroup_files files;
        struct cgroup_scan_ref scan_cpu, scan_mem; /* where the walk finds its cgroups; root -1: not watched */
        struct epoch_track track;
        bool epoch_unsaved;           /* the epoch changed and is not on disk yet: not published until it is */
        const char *epoch_reason;     /* why the collector raised its epoch (the `restarted` event's reason) */
        uint64_t announced_epoch;     /* the last epoch of our own announced, and when (monotonic) */
        int64_t announced_mono_ns;
        bool save_error_logged;
        bool opened_before, reopened; /* files opened again since the last reading: a recreated cgroup */
        struct seq_track seq;         /* the generation and n of its last seq */
        /* Held time from the record (registry.h): totals before the current state and when it began
         * on the boot clock; state_since_boot_ns 0: the vmm did not say, no held time is sent. */
        uint64_t running_ns, paused_ns;
        int64_t state_since_boot_ns;
        int64_t lease_wall_ns;        /* the lease's end on the wall clock (0: none): running stops there */
        bool starting;                /* the record says the backend has not started it: no samples yet */
        /* What its last encoded sample carried: held time and clocks never go back within a sandbox. */
        bool pub_known;
        uint64_t pub_running_ns, pub_paused_ns;
        int64_t pub_wall_ns, pub_mono_ns;
        bool finished;                /* final sample spooled and <id>.final made */
        bool gone_logged;
        uint64_t peak_bytes;          /* the last peak read */
        int net_fd;                   /* the vmm's network counters file (registry.h), -1: none (no internet) */
        bool peak_read;               /* read at least once (the first sample has one) */
        bool pending;                 /* pending_buf holds this sandbox's newest unpublished sample */
        int pending_len;
        char *pending_buf;            /* SAMPLE_MAX bytes, allocated with the sandbox */
        int32_t partition;            /* of its account in usage (publish.h), when it had partition_of partitions */
        int32_t partition_of;         /* 0: not worked out (a record may change the account) */
};

struct sandbox_table {
        struct sandbox *hash[TABLE_HASH_SIZE];
        struct sandbox **list;        /* list[0..n-1]; list[i]->index == i */
        size_t n, cap;
};

/* The sandbox with this id, or NULL. */
struct sandbox *table_find(const struct sandbox_table *t, const char *id);

/* Adds a new sandbox with this id (not in t yet): nothing open (net_fd -1,
 * CGROUP_FILES_NONE, no scan refs), everything else zero but its pending
 * buffer (SAMPLE_MAX bytes). Returns 0 and *ret (owned by t), or -ENOMEM
 * with t unchanged. */
int table_add(struct sandbox_table *t, const char *id, struct sandbox **ret);

/* Unlinks s from t (the last one takes its index); s is the caller's now. */
void table_remove(struct sandbox_table *t, struct sandbox *s);

/* Frees s and closes what it holds. Accepts NULL. */
void sandbox_free(struct sandbox *s);

/* Frees every sandbox in t and the list; t is empty after. */
void table_free(struct sandbox_table *t);
