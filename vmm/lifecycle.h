/* lifecycle.h — inside tally-vmm's sandbox manager (vmm.h is its outside):
 * the manager's state, made of the modules that own each part of it, and the
 * lifecycle steps its files share.
 *
 *   records.h       the sandbox table, references, records, moments
 *   events.h        the Kafka producer and the control consumer
 *   spend_limits.h  the spend-limit check at create, fork and resume
 *   vmm_metrics.h   the counters /metrics shows
 *   create.c        admission, create and fork          lifecycle.c  the other operations
 *   tick.c          the background tick                 recover.c    restart recovery
 *   vmm.c           open and close
 *
 * Locking: v->table.lock guards the list and every sandbox's record and
 * flags (records.h); a sandbox's op mutex serialises its lifecycle changes.
 * Functions named *_locked expect the sandbox's op mutex held by the caller,
 * never the table's lock. */
#pragma once

#include "capacity.h"
#include "cgroup.h"
#include "events.h"
#include "records.h"
#include "spend_limits.h"
#include "vmm.h"
#include "vmm_metrics.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define FORK_MAX        10
#define FREEZE_WAIT_MS  5000
#define KILL_WAIT_MS    5000
#define RELEASE_WAIT_MS 2000 /* for a stopped sandbox's dying tasks to be released */

struct vmm {
        struct vmm_settings s;           /* strings owned by the caller */
        struct cgroup_host cgroups;
        struct vmm_limits limits;
        const struct backend_ops *default_backend;
        const char *default_reason;
        struct records table;
        struct events events;
        struct spend_limits spend;
        struct vmm_metrics metrics;
        struct capacity capacity;
        struct capacity_use reserved;    /* creates and fork copies under way (under table.lock) */
        pthread_t thread;                /* the tick's (tick.c) */
        bool thread_started;
        atomic_bool quit;                /* ends the tick's thread */
        atomic_int stopping;             /* set by vmm_begin_shutdown: running execs end */
};

/* The sandbox id as a reference, or NULL with why saying there is none. */
struct sandbox *vmm_find(struct vmm *v, const char *id, char *why, size_t whylen);
/* The sandbox as JSON (vmm_show's). */
json_t *vmm_describe(struct vmm *v, struct sandbox *sb);
/* Starts the sandbox's egress proxy if it has internet (its init is pid). */
int vmm_open_egress(struct vmm *v, struct sandbox *sb, pid_t pid, char *why, size_t whylen);
/* Hands the sandbox's deadline to the backend, so the sandbox ends then even
 * with no tally-vmm running (0: no lease). Backends without the op rely on the
 * tick alone. Never called with the table's lock held (it may talk to the
 * sandbox). 0 or -errno (logged). */
int vmm_set_lease(struct sandbox *sb, int64_t deadline_wall_ns);
/* Freezes a running sandbox and records and publishes the pause. */
int vmm_pause_locked(struct vmm *v, struct sandbox *sb, const char *reason, char *why, size_t whylen);
/* Ends the sandbox's processes, records the final counter and held time, and
 * publishes them. The stop's moment is when the processes are gone, or at, if
 * given (a sandbox found ended after a restart: when its lease ran out). The
 * cgroup and record are removed later by the tick (docs/registry.md). why may
 * be NULL. Stopping a stopped sandbox returns 0. */
int vmm_stop_locked(struct vmm *v, struct sandbox *sb, const char *reason, const struct moment *at, char *why,
                    size_t whylen);

/* Takes over what a previous run left: live sandboxes, stopped ones whose
 * clean-up was pending, sandboxes that died meanwhile, and cgroups without a
 * record (recover.c). */
void vmm_recover(struct vmm *v);
/* Starts the thread that polls the producer and runs the tick every 50 ms
 * (tick.c). 0 or -EAGAIN. */
int vmm_tick_start(struct vmm *v);
/* Ends it (after setting nothing: it sets v->quit itself). */
void vmm_tick_stop(struct vmm *v);
