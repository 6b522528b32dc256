/* vmm.h — the sandbox manager behind tally-vmm: the host's sandboxes, their
 * lifecycle, their registry records, their events and the commands of the
 * control topic. The HTTP API (api.h) and the daemon's main only call this.
 *
 * Order that billing relies on: a sandbox's cgroup exists before its first
 * instruction; its `created` event carries its spec; a stopped sandbox's
 * cgroup is read one last time, that counter goes into its record and its
 * `stopped` event, and the cgroup is removed only after the broker has
 * acknowledged that event and the collector has taken its final sample
 * (docs/registry.md). */
#pragma once

#include "kafka.h"

#include "backend.h"
#include "capacity.h"
#include "control.h"
#include "egress.h"
#include "spec.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

struct vmm_settings {
        const char *state_dir;
        const char *host_id;
        const char *backend;             /* default backend: auto, process, qemu */
        const char *cgroup_mount;        /* "" : /sys/fs/cgroup */
        const char *cgroup_parent;       /* e.g. "tally" */
        const char *kafka_brokers;
        const struct kafka_client_settings *kafka; /* TLS/SASL for the event producer and command consumer */
        const char *limits_database_url; /* "": no spend-limit check at create */
        const char *blocked_key_query;   /* $1 account, $2 key: a row means blocked */
        int64_t timeout_max_s;
        int64_t final_wait_ms;           /* how long a stopped cgroup waits for the collector's <id>.final */
        int64_t exec_timeout_default_ms;
        int64_t exec_output_cap_default;
        struct capacity_settings capacity; /* admission: what this host may promise its sandboxes */
        struct egress_settings egress;   /* the egress proxy of sandboxes with internet */
};

struct vmm;

/* Detects the cgroup version, opens the producer and the control consumer,
 * finds the sandboxes a previous run left (and removes orphaned cgroups), and
 * starts the background thread (events, control, timeouts, clean-up).
 * Returns 0 or -errno with the reason in err. */
int vmm_open(const struct vmm_settings *s, struct vmm **ret, char *err, size_t errlen);

/* Ends the commands exec is running (they would otherwise hold the API's
 * connections, and so the daemon's exit, until they finish). */
void vmm_begin_shutdown(struct vmm *v);

/* Stops the background work and frees everything, giving queued lifecycle
 * events until deadline_mono_ns (time_mono_ns) to reach the broker. Running
 * sandboxes keep running: a later tally-vmm finds them again. Accepts NULL. */
void vmm_close(struct vmm *v, int64_t deadline_mono_ns);

/* Waits up to timeout_ms for queued lifecycle events to reach the broker (for
 * an exit that cannot free the vmm: a request still uses it). */
void vmm_flush(struct vmm *v, int64_t timeout_ms);

/* Every operation returns 0 or a negative errno with a sentence in why:
 *   -EINVAL bad input, -ENOENT no such sandbox, -EBUSY the sandbox's state
 *   forbids it (exec in a stopped or paused sandbox), -EACCES the key is
 *   blocked for today, -EOPNOTSUPP the backend cannot, -EAGAIN a dependency
 *   (database) is unavailable, -ENOSPC this host cannot take it (its
 *   capacity, capacity.h: why names what is short), others: the host failed. */

/* Creates and starts a sandbox; *ret is its description (see vmm_show). */
int vmm_create(struct vmm *v, const struct create_request *req, json_t **ret, char *why, size_t whylen);
int vmm_exec(struct vmm *v, const char *id, const struct exec_request *req, struct exec_result *ret, char *why,
             size_t whylen);
int vmm_pause(struct vmm *v, const char *id, const char *reason, char *why, size_t whylen);
int vmm_resume(struct vmm *v, const char *id, char *why, size_t whylen);
/* Stopping a stopped sandbox returns 0. */
int vmm_stop(struct vmm *v, const char *id, const char *reason, char *why, size_t whylen);
/* Makes count (1..10) running copies; *ret: {"sandboxes": [...], "processes_copied": bool, "note": "..."}. */
int vmm_fork(struct vmm *v, const char *id, int count, json_t **ret, char *why, size_t whylen);
/* Sets the sandbox's deadline to now + timeout_s. */
int vmm_set_timeout(struct vmm *v, const char *id, int64_t timeout_s, char *why, size_t whylen);

/* A sandbox as JSON (ids, spec, labels, state, backend, cgroup, pid, deadline, cpu_ns now). */
int vmm_show(struct vmm *v, const char *id, json_t **ret, char *why, size_t whylen);
/* Every sandbox, optionally only one account's (NULL: all). */
json_t *vmm_list(struct vmm *v, const char *account);
/* {"host":..., "cgroup_version":..., "backend_default":..., "control_ready": bool, ...} */
json_t *vmm_status(struct vmm *v);

/* Carries out a control-topic command for the matching sandboxes. Returns how many it changed. */
int vmm_apply_control(struct vmm *v, const struct control_command *c);

/* The /metrics page (Prometheus text format) as a metrics_http page function
 * (arg: the struct vmm): sandboxes by state, creates, forks and execs with
 * their latency, control commands and what they changed, registry write
 * failures. Safe on any thread. Returns the length or -ENOBUFS. */
int vmm_metrics_page(const void *arg, char *buf, size_t size);

/* What this host may promise (its capacity and ratios), what it has promised
 * now (admission's sum: live sandboxes and creates under way) and how many
 * sandboxes are live (running or paused): the host registry's heartbeat. */
void vmm_capacity_report(struct vmm *v, struct capacity *ret_capacity, struct capacity_use *ret_promised,
                         int *ret_live);

const struct vmm_settings *vmm_get_settings(const struct vmm *v);
/* What a create request may ask for on this host. */
const struct vmm_limits *vmm_get_limits(const struct vmm *v);
