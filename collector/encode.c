/* encode.c — see encode.h. */
#include "encode.h"
#include "log.h"
#include "metrics.h"
#include "state.h"
#include "timeutil.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int encoder_init(struct encoder *e, const char *state_dir, const char *host_id, struct collector_metrics *m)
{
        e->state_dir = state_dir;
        e->host_id = host_id;
        e->m = m;
        e->gen_raised_mono = time_mono_ns();
        return state_next_generation(state_dir, time_wall_ns() / NS_PER_SEC, &e->generation);
}

/* Reads the clocks for a batch of readings: once per tick, not per sample,
 * just before the counters are read (the walk, then files). */
void encoder_stamp(struct encoder *e)
{
        int64_t wall;
        time_now3(&wall, &e->stamp_mono, &e->stamp_boot); /* a late final's wall time comes from boot's */
        e->stamp_wall = wall_guard_next(&e->wall, wall, e->stamp_mono);
        M_SET(e->m, clock_steps_total, e->wall.steps);
}

/* Stores a raised generation before any seq uses it. Returns 0, or -errno
 * logged with failed_msg (once until a store succeeds). */
static int store_generation(struct encoder *e, uint32_t next, const char *failed_msg)
{
        int r = state_save_generation(e->state_dir, next);
        if (r < 0) {
                M_ADD(e->m, state_save_errors_total, 1);
                if (!e->gen_error_logged)
                        log_error(failed_msg, "generation=%u error=\"%s\"", next, strerror(-r));
                e->gen_error_logged = true;
                return r;
        }
        e->gen_error_logged = false;
        return 0;
}

/* Raises the host's generation for a sandbox whose n ran out (track.h): on disk first. */
static int raise_generation(void *ctx, uint32_t next)
{
        struct encoder *e = ctx;
        int r = store_generation(e, next,
                                 "could not store a raised generation: the sandbox's samples wait until it is stored");
        if (r < 0)
                return r;
        e->gen_raised_mono = time_mono_ns();
        log_info("generation raised: a sandbox's sequence ran out of n", "generation=%u", next);
        return 0;
}

/* Keeps the host's generation with the clock's hours during a long run
 * (state.h), stored before any seq uses it; every sandbox's next seq moves to
 * it (seq_next). Outside the moment lock: it may fsync. */
void encoder_follow_clock(struct encoder *e)
{
        uint32_t next = generation_follow_clock(e->generation, e->stamp_wall / NS_PER_SEC,
                                                e->stamp_mono - e->gen_raised_mono);
        if (next == e->generation ||
            store_generation(e, next, "could not store a raised generation: keeping the current one") < 0)
                return;
        e->generation = next;
        e->gen_raised_mono = e->stamp_mono;
        log_info("generation raised to follow the clock", "generation=%u", next);
}

/* Fills e->ev with s's sample at this stamp. Returns 0, or the -errno of a
 * generation that could not be stored: then nothing may be published for s. */
int encoder_next_event(struct encoder *e, struct sandbox *s, uint64_t cpu_ns, const struct cgroup_reading *rd)
{
        uint64_t seq;
        int r = seq_next(&s->seq, &e->generation, raise_generation, e, &seq);
        if (r < 0) {
                M_ADD(e->m, samples_held_total, 1);
                return r;
        }
        struct usage_event *ev = &e->ev;
        ev->type = EVENT_SAMPLE;
        memcpy(ev->host, *s->host ? s->host : e->host_id, sizeof(ev->host));
        memcpy(ev->sandbox, s->id, sizeof(ev->sandbox));
        memcpy(ev->account, s->account, sizeof(ev->account));
        memcpy(ev->key, s->key, sizeof(ev->key));
        ev->epoch = s->track.epoch;
        ev->seq = seq;
        ev->mono_ns = e->stamp_mono;
        ev->wall_ns = e->stamp_wall;
        ev->state = s->state;
        ev->cpu_ns = cpu_ns;
        ev->mem_bytes = rd ? rd->mem_bytes : 0;
        ev->mem_peak_bytes = rd ? s->peak_bytes : 0;
        ev->mem_size_bytes = s->mem_size_bytes;
        ev->disk_bytes = s->disk_bytes;
        ev->vcpus = s->vcpus;
        ev->final = s->state == STATE_STOPPED;
        /* Bytes through the vmm's egress proxy: a pread of the file it keeps (only sandboxes with internet
         * have one). A reading that fails leaves them out; the next sample carries the cumulative truth. */
        ev->net_known = s->net_fd >= 0 && sandbox_net_read(s->net_fd, &ev->net_rx_bytes, &ev->net_tx_bytes) == 0;
        if (!ev->net_known)
                ev->net_rx_bytes = ev->net_tx_bytes = 0;
        /* Held time at the instant the counters were read (docs/events.md, "Held time"). A sample
         * taken between a lifecycle moment and the vmm's record of it runs ahead by that gap; the
         * next ones keep that total rather than go back. */
        ev->held_known = s->state_since_boot_ns > 0;
        ev->running_ns = ev->paused_ns = 0;
        if (ev->held_known) {
                struct sandbox_record *h = &e->held_rec;
                h->state = s->state;
                h->running_ns = s->running_ns;
                h->paused_ns = s->paused_ns;
                h->state_since_boot_ns = s->state_since_boot_ns;
                /* A running sandbox's own init ends it at its lease, also while no tally-vmm runs to
                 * record the stop (the vmm then dates it at the lease's end): running time is never
                 * extrapolated past the lease. */
                int64_t at = e->stamp_boot;
                if (s->state == STATE_RUNNING && s->lease_wall_ns > 0 && e->stamp_wall > s->lease_wall_ns) {
                        at = e->stamp_boot - (e->stamp_wall - s->lease_wall_ns);
                        if (at < s->state_since_boot_ns)
                                at = s->state_since_boot_ns;
                }
                registry_held_at(h, at, &ev->running_ns, &ev->paused_ns);
                /* A final carries the record's frozen totals exactly: they are the truth,
                 * and aggregators bill the highest totals seen anyway. */
                bool final = s->state == STATE_STOPPED;
                if (!final && s->pub_known && ev->running_ns < s->pub_running_ns)
                        ev->running_ns = s->pub_running_ns;
                if (!final && s->pub_known && ev->paused_ns < s->pub_paused_ns)
                        ev->paused_ns = s->pub_paused_ns;
        }
        return 0;
}

/* Remembers what s's encoded sample carried. */
void encoder_remember(struct sandbox *s, const struct usage_event *ev)
{
        s->pub_known = true;
        if (ev->held_known) {
                s->pub_running_ns = ev->running_ns;
                s->pub_paused_ns = ev->paused_ns;
        }
        s->pub_wall_ns = ev->wall_ns;
        s->pub_mono_ns = ev->mono_ns;
}

/* Applies the epoch rules to a counter read from s's cgroup, and persists an
 * epoch that changed. Returns true when s may be published: a changed epoch is
 * published only once it is on disk (else a restarted collector could publish
 * a lower one, which an aggregator ignores for good); until then the save is
 * retried at each reading and s's samples wait. */
bool encoder_observe(struct encoder *e, struct sandbox *s, uint64_t record_epoch, uint64_t cpu_ns)
{
        uint64_t before = s->track.epoch, before_record = s->track.record_epoch, last = s->track.last_cpu_ns;
        if (epoch_track_observe(&s->track, record_epoch, cpu_ns)) {
                M_ADD(e->m, epoch_changes_total, 1);
                s->epoch_unsaved = true;
                if (record_epoch != before_record) {
                        log_info("counter restarted by the vmm: new epoch",
                                 "sandbox=%s epoch=%llu previous=%llu record_epoch=%llu", s->id,
                                 (unsigned long long)s->track.epoch, (unsigned long long)before,
                                 (unsigned long long)record_epoch);
                } else if (s->reopened) {
                        s->epoch_reason = "cgroup_recreated";
                        log_info("cgroup recreated: its counter restarted, new epoch",
                                 "sandbox=%s epoch=%llu previous=%llu previous_cpu_ns=%llu cpu_ns=%llu", s->id,
                                 (unsigned long long)s->track.epoch, (unsigned long long)before,
                                 (unsigned long long)last, (unsigned long long)cpu_ns);
                } else {
                        /* The same open cgroup's counter went down: nothing but a write to it (v1's
                         * cpuacct.usage takes 0) does that. A new epoch bills the counter from zero
                         * again, so the CPU before the reset stays billed; the time since the last
                         * reading before it is lost, and an operator must hear of it. */
                        M_ADD(e->m, counter_backwards_total, 1);
                        s->epoch_reason = "counter_back";
                        log_warn("counter went backwards in the same cgroup: possible tampering; new epoch",
                                 "sandbox=%s account=%s previous_cpu_ns=%llu cpu_ns=%llu epoch=%llu", s->id,
                                 s->account, (unsigned long long)last, (unsigned long long)cpu_ns,
                                 (unsigned long long)s->track.epoch);
                }
        }
        s->reopened = false;
        if (!s->epoch_unsaved)
                return true;
        int r = epoch_track_is_local(&s->track)
                        ? state_save_epoch(e->state_dir, s->id, s->track.epoch, s->track.record_epoch)
                        : state_remove_epoch(e->state_dir, s->id);
        if (r < 0) {
                M_ADD(e->m, state_save_errors_total, 1);
                M_ADD(e->m, samples_held_total, 1);
                if (!s->save_error_logged)
                        log_error("could not persist a sandbox's epoch: its samples wait until it is saved",
                                  "sandbox=%s epoch=%llu error=\"%s\"", s->id, (unsigned long long)s->track.epoch,
                                  strerror(-r));
                s->save_error_logged = true;
                return false;
        }
        if (s->save_error_logged)
                log_info("sandbox's epoch persisted: publishing again", "sandbox=%s epoch=%llu", s->id,
                         (unsigned long long)s->track.epoch);
        s->save_error_logged = false;
        s->epoch_unsaved = false;
        return true;
}

int encoder_encode(struct encoder *e)
{
        return event_encode(&e->ev, e->buf, sizeof(e->buf));
}

int encoder_restarted(const struct sandbox *s, const char *host_id, char *buf, size_t size)
{
        struct usage_event ev = { .type = EVENT_RESTARTED, .epoch = s->track.epoch, .wall_ns = time_wall_ns(),
                                  .state = s->state, .vcpus = s->vcpus };
        memcpy(ev.host, *s->host ? s->host : host_id, sizeof(ev.host));
        memcpy(ev.sandbox, s->id, sizeof(ev.sandbox));
        memcpy(ev.account, s->account, sizeof(ev.account));
        memcpy(ev.key, s->key, sizeof(ev.key));
        snprintf(ev.reason, sizeof(ev.reason), "%s", s->epoch_reason ? s->epoch_reason : "counter_back");
        return event_encode(&ev, buf, size);
}
