/* event.h — the usage topic's message: usage samples and sandbox lifecycle events.
 *
 * This is the contract between vmm, collector and aggregator (docs/events.md).
 * Messages are versioned JSON objects keyed by account id, so one partition sees
 * an account's events in order. A sample carries *cumulative* counters, never
 * deltas: losing or repeating one costs nothing, the next carries the truth.
 * The decoder validates everything billing relies on and says why it refused,
 * so the aggregator can dead-letter a message instead of failing on it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EVENT_VERSION    1
#define EVENT_ID_MAX     64  /* host, sandbox, account and key ids: [A-Za-z0-9_.:-]{1,64} */
#define EVENT_LABELS_MAX 32
#define EVENT_LABEL_KEY_MAX   63
#define EVENT_LABEL_VALUE_MAX 255
#define EVENT_VCPUS_MAX  1024
#define EVENT_REASON_MAX 31  /* restarted: [a-z_]{1,31} */

enum event_type {
        EVENT_SAMPLE,   /* one reading of a sandbox's cgroup */
        EVENT_CREATED,  /* a sandbox exists: its spec and labels */
        EVENT_PAUSED,
        EVENT_RESUMED,
        EVENT_FORKED,   /* on the source sandbox; each copy also gets EVENT_CREATED with parent set */
        EVENT_STOPPED,  /* carries the final cumulative CPU counter */
        EVENT_RESTARTED, /* the sandbox's counters restarted: a new epoch, announced with its reason */
        EVENT_TYPE_COUNT
};

enum sandbox_state { STATE_RUNNING, STATE_PAUSED, STATE_STOPPED, STATE_COUNT };

struct event_label {
        char key[EVENT_LABEL_KEY_MAX + 1];
        char value[EVENT_LABEL_VALUE_MAX + 1];
};

struct usage_event {
        enum event_type type;
        char host[EVENT_ID_MAX + 1];
        char sandbox[EVENT_ID_MAX + 1];
        char account[EVENT_ID_MAX + 1];
        char key[EVENT_ID_MAX + 1];      /* the API key that created the sandbox */
        uint64_t epoch;      /* changes whenever the counters may have restarted */
        uint64_t seq;        /* increases within an epoch */
        int64_t wall_ns;     /* Unix time of the reading, UTC, ns */
        int64_t mono_ns;     /* the host's monotonic clock at the reading */
        enum sandbox_state state;
        uint64_t cpu_ns;         /* cumulative CPU time of the sandbox's cgroup */
        uint64_t mem_bytes;      /* measured memory now (not billed) */
        uint64_t mem_peak_bytes; /* measured peak (not billed); 0 if unknown */
        uint64_t mem_size_bytes; /* memory size held: billed while running */
        uint64_t disk_bytes;     /* disk bytes used: with the memory image, billed while paused */
        uint32_t vcpus;
        bool final;              /* the last sample of a stopped sandbox */
        /* Held time (sample and stopped): cumulative ns the sandbox has spent
         * running and paused since it was created, measured by the vmm from
         * the lifecycle moments themselves on the host's boot clock
         * (docs/events.md, "held time"). held_known is false when the sender
         * did not include them. */
        bool held_known;
        uint64_t running_ns;
        uint64_t paused_ns;
        /* Network (sample, optional): bytes the vmm's egress proxy relayed to
         * (rx) and from (tx) the sandbox, cumulative. Recorded, not priced.
         * net_known is false when the sender did not include them (a sandbox
         * without internet, or an older collector). */
        bool net_known;
        uint64_t net_rx_bytes;
        uint64_t net_tx_bytes;
        /* lifecycle events only */
        char parent[EVENT_ID_MAX + 1]; /* created by fork: the source sandbox */
        char backend[16];              /* created: "process" or "qemu" */
        uint64_t disk_size_bytes;      /* created: disk size asked for */
        uint32_t fork_count;           /* forked: copies made */
        char reason[EVENT_REASON_MAX + 1]; /* restarted: why the counters restarted */
        size_t nlabels;
        struct event_label *labels;    /* owned; freed by event_clear */
};

const char *event_type_name(enum event_type t);
const char *sandbox_state_name(enum sandbox_state s);
int event_type_parse(const char *s, enum event_type *ret);
int sandbox_state_parse(const char *s, enum sandbox_state *ret);

/* True if s is a valid id: 1..64 of [A-Za-z0-9_.:-]. */
bool event_id_valid(const char *s);

/* Adds a label to ev (copying). Returns 0, -E2BIG (too many / too long), -EINVAL, -ENOMEM. */
int event_add_label(struct usage_event *ev, const char *key, const char *value);

/* Encodes ev as one JSON object into buf without allocating for samples.
 * Returns the length (excluding no terminator), or -ENOBUFS / -EINVAL. */
int event_encode(const struct usage_event *ev, char *buf, size_t size);

/* Decodes and validates; on success fills *ret (which the caller later passes to
 * event_clear). On failure returns -EINVAL and writes the reason into why. */
int event_decode(const void *buf, size_t len, struct usage_event *ret, char *why, size_t whylen);

/* Frees what the event owns and zeroes it. Accepts NULL. */
void event_clear(struct usage_event *ev);
