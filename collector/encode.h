/* encode.h — what a sample carries: the clocks of a tick's readings, the
 * epoch (the counter rules of track.h, persisted before a changed epoch is
 * published), the sequence number (the host's generation, on disk before any
 * seq uses it, following the clock's hours over a long run), and the event
 * itself, built in one reused buffer (no allocation on the hot path).
 *
 * The encoder owns the host's generation and the tick's stamps; it reads and
 * writes the epoch, seq and last-published fields of the sandbox it is given.
 * Every function that may store state (a raised generation, a changed epoch)
 * does so before it lets a sample out, and logs a failure once until it heals:
 * its caller only holds the sample back. */
#pragma once

#include "cgroup.h"
#include "collector.h"
#include "event.h"
#include "registry.h"
#include "table.h"
#include "track.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct encoder {
        const char *state_dir;        /* borrowed: the collector's */
        const char *host_id;          /* borrowed: used when a record names no host */
        struct collector_metrics *m;  /* borrowed */
        uint32_t generation;          /* the host's, on disk before any seq uses it */
        int64_t gen_raised_mono;      /* when it was last set (start or raise), monotonic */
        bool gen_error_logged;        /* a raised generation could not be stored (logged once until it is) */
        struct wall_guard wall;
        int64_t stamp_wall, stamp_mono, stamp_boot; /* the clocks for the readings being taken */
        struct sandbox_record held_rec; /* scratch for registry_held_at: only the held fields are set */
        struct usage_event ev;        /* the sample being built: reused for every sample */
        char buf[SAMPLE_MAX];         /* ev encoded */
};

/* Raises and stores the start generation (state.h) under state_dir. The
 * strings and m are borrowed for the encoder's life. Returns 0 or -errno. */
int encoder_init(struct encoder *e, const char *state_dir, const char *host_id, struct collector_metrics *m);

/* Reads the clocks for a batch of readings: once per tick, not per sample,
 * just before the counters are read. */
void encoder_stamp(struct encoder *e);

/* Keeps the host's generation with the clock's hours during a long run
 * (state.h), stored before any seq uses it. It may fsync: not under the
 * registry's moment lock. */
void encoder_follow_clock(struct encoder *e);

/* Applies the epoch rules to a counter read from s's cgroup (record_epoch: the
 * record's), and persists an epoch that changed. Returns true when s may be
 * published: a changed epoch is published only once it is on disk (else a
 * restarted collector could publish a lower one, which an aggregator ignores
 * for good); until then the save is retried at each reading and s's samples
 * wait. */
bool encoder_observe(struct encoder *e, struct sandbox *s, uint64_t record_epoch, uint64_t cpu_ns);

/* Fills e->ev with s's sample at this stamp (rd NULL: a final without a
 * reading of its own). Returns 0, or the -errno of a generation that could
 * not be stored: then nothing may be published for s. */
int encoder_next_event(struct encoder *e, struct sandbox *s, uint64_t cpu_ns, const struct cgroup_reading *rd);

/* Encodes e->ev into e->buf. Returns the length or -errno. */
int encoder_encode(struct encoder *e);

/* Remembers on s what its encoded sample ev carried: held time and clocks
 * never go back within a sandbox. */
void encoder_remember(struct sandbox *s, const struct usage_event *ev);

/* Encodes s's `restarted` event announcing its current epoch (the
 * collector's own) into buf. Returns the length or -errno. */
int encoder_restarted(const struct sandbox *s, const char *host_id, char *buf, size_t size);
