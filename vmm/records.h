/* records.h — the vmm's table of sandboxes: each sandbox's registry record
 * and the host-side state beside it, their references, the lifecycle moment
 * (its three clocks and the registry's moment lock), and the files a sandbox
 * keeps in its folder (<state_dir>/vmm/<id>/: spec.json).
 *
 * Ownership: the table holds one reference to each sandbox in its list; every
 * caller that got one (records_get, records_snapshot, sandbox_new) gives it
 * back with sandbox_unref, and the last reference frees the sandbox (its
 * backend handle, egress proxy, pidfd and labels). table->lock guards the
 * list and every sandbox's rec and flags; it is never held across a backend
 * call, a cgroup wait or a Kafka call that may block. A sandbox's op mutex
 * serialises its lifecycle changes (pause, resume, stop, fork); exec takes a
 * reference and runs beside them. */
#pragma once

#include "backend.h"
#include "cgroup.h"
#include "egress.h"
#include "netpolicy.h"
#include "registry.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SANDBOX_DIR "vmm" /* <state_dir>/vmm/<id>/: the sandbox's own folder */

/* A lifecycle moment (created, paused, resumed, stopped) on the three clocks:
 * wall for the event's wall_ns, mono for its mono_ns, boot for held time
 * (docs/events.md, "Held time"). */
struct moment {
        int64_t wall, mono, boot;
};

struct sandbox {
        struct sandbox *next;
        int refs;                        /* the list holds one; each caller one more */
        pthread_mutex_t op;              /* serialises lifecycle changes */
        pthread_mutex_t exec_lock;       /* for backends without concurrent exec */
        struct sandbox_record rec;       /* guarded by the table's lock */
        const struct backend_ops *ops;
        struct backend_sandbox *bs;      /* NULL once stopped */
        struct sandbox_cgroup cg;
        char dir[PATH_MAX];
        struct net_policy net;           /* as asked for at create; forks keep it */
        struct egress *egress;           /* the proxy while it runs with internet, else NULL */
        int64_t remaining_ns;            /* while paused: what was left of the lease */
        uint32_t pids_max;               /* as asked for at create (0: the backend's default); forks keep it */
        struct moment moment;            /* the last lifecycle moment: its event's time */
        bool record_dirty;               /* the record on disk is behind rec: the tick retries */
        int pidfd;                       /* the main process's pidfd (-1: none): readable once it ended */
        bool stop_published;             /* the stopped event is with the producer */
        bool stop_acked;                 /* ... and the broker acknowledged it */
        int64_t stopped_mono;
        bool removed;                    /* no longer in the list */
};

struct records {
        const char *state_dir;           /* borrowed from the settings */
        pthread_mutex_t lock;
        struct sandbox *list;
        atomic_uint_fast64_t write_failures; /* record writes that failed, retries included (/metrics) */
};

void records_init(struct records *t, const char *state_dir);
/* Drops the table's reference to every sandbox (sandboxes keep running: only
 * the memory goes) and destroys the lock. */
void records_free(struct records *t);

/* A new sandbox holding one reference (the caller's), not in the list; NULL
 * when out of memory. */
struct sandbox *sandbox_new(void);
/* Gives back a reference; the last one frees the sandbox. */
void sandbox_unref(struct records *t, struct sandbox *sb);
/* A reference to the sandbox id, or NULL. */
struct sandbox *records_get(struct records *t, const char *id);
/* Puts sb in the list; the list takes over the caller's reference. */
void records_insert(struct records *t, struct sandbox *sb);
/* Takes sb out of the list (if there) and drops the list's reference. */
void records_unlink(struct records *t, struct sandbox *sb);
/* References to every sandbox (malloc'd array) for work outside the lock;
 * returns how many, or -ENOMEM. Give them back with records_snapshot_free. */
int records_snapshot(struct records *t, struct sandbox ***ret);
void records_snapshot_free(struct records *t, struct sandbox **all, int n);
/* How many sandboxes the list holds. */
int records_count(struct records *t);

/* One write of rec to the registry (registry_write), counted in
 * write_failures when it fails. 0 or -errno. */
int records_write(struct records *t, const struct sandbox_record *rec);
/* Writes sb's record (the table's lock held), retrying at once a few times.
 * A record that still cannot be written is never left silently behind the
 * sandbox: the failure is logged at error, the sandbox is marked so the tick
 * rewrites the record every second until it succeeds (and its clean-up waits
 * for that), and the caller fails the request that changed it. Returns 0 or
 * -errno. */
int records_save(struct records *t, struct sandbox *sb);
/* The error for a request whose change took effect but whose record could not
 * be written: -EIO whatever the write's errno (an EACCES must not read as "the
 * key is blocked"), with the write's reason in the sentence (why may be NULL). */
int record_failed(const struct sandbox *sb, int r, const char *done, char *why, size_t whylen);

/* A fresh sandbox id, "sbx-" and 16 hex digits. 0 or -EIO. */
int sandbox_new_id(char *buf, size_t size);
/* <state_dir>/vmm/<id> */
void sandbox_dir_path(const char *state_dir, const char *id, char *buf, size_t size);
/* Removes a sandbox's folder by descriptor, never following a link or leaving
 * its file system (it may hold what a jailed QEMU made); logs a failure. */
void sandbox_remove_dir(const char *path);
/* The few spec fields the registry record does not hold, kept in the sandbox's
 * folder: the network policy (a restarted vmm keeps enforcing its allow-list,
 * a fork copies it) and pids_max. 0 or -EIO. */
int sandbox_spec_write(const char *dir, const struct net_policy *net, uint32_t pids_max);
/* What spec.json kept. A file that cannot be read or parsed gives loopback
 * only: never more network. */
void sandbox_spec_read(const char *dir, struct net_policy *ret_net, uint32_t *ret_pids_max);
/* Opens a pidfd on the main process: the tick learns it ended within one turn
 * (50 ms), so a sandbox that ends on its own stops, and stops holding, then.
 * Without a pidfd the once-a-second look at /proc remains. */
void sandbox_watch_main(struct sandbox *sb);

struct moment moment_now(void);
/* Takes the registry's moment lock (registry.h) before a moment's clocks are
 * read; moment_end releases it once the record carrying the moment is renamed
 * into place. Then no collector tick stamped after the moment can miss its
 * record, and none extrapolates the old state past it (docs/registry.md,
 * "Moments and ticks"). Never held across a backend call or a wait for the
 * sandbox: only the clock read, the record's write and what lies between.
 * A lock not had within REGISTRY_MOMENT_WAIT_MS (a wedged collector holding
 * it) is logged and the moment goes on without: the vmm never stops for it.
 * Returns the lock's descriptor or -errno (moment_end accepts either). */
int moment_begin(const char *state_dir, const char *id);
void moment_end(int fd);
/* The moment the record's current state began, seen from now (for a record a
 * previous run wrote); now itself if the boot clock says it was another boot. */
struct moment moment_of_record(const struct sandbox_record *rec);
/* When a running sandbox found already ended (its main process gone) had
 * ended: at its lease's end if that has passed — its own init ended it then
 * (the lease the backend holds), also while no tally-vmm ran — else unknown
 * (false: now). */
bool lease_end_moment(const struct sandbox_record *rec, struct moment *ret);
