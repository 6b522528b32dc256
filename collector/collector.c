/* collector.c — see collector.h.
 *
 * The hot path (sample_all) makes one pread per counter file, encodes into a
 * reused buffer and hands a copy to librdkafka: no open, no allocation. All
 * registry work (reading records, opening files, taking final samples) happens
 * outside it, when inotify says a record changed. */
#include "collector.h"
#include "beneath.h"
#include "cgroup.h"
#include "cgroup_scan.h"
#include "daemon.h"
#include "event.h"
#include "kafka.h"
#include "log.h"
#include "registry.h"
#include "spool.h"
#include "state.h"
#include "timeutil.h"
#include "track.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define SAMPLE_MAX 1024   /* an encoded sample without labels fits easily */
#define HASH_SIZE 16384

struct sandbox {
        struct sandbox *hnext;
        size_t index;                 /* in collector.list */
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
};

/* A registry record inotify said changed: its content at the read, or gone. */
struct changed_record {
        bool gone;
        char id[EVENT_ID_MAX + 1];
        struct sandbox_record rec;
};

struct collector {
        struct collector_options opt;
        char state_dir[PATH_MAX];
        char registry_dir[PATH_MAX];
        char host_id[EVENT_ID_MAX + 1];
        rd_kafka_t *rk;
        struct spool spool;
        int inotify_fd;
        uint32_t generation;          /* the host's, on disk before any seq uses it */
        int64_t gen_raised_mono;      /* when it was last set (start or raise), monotonic */
        uint64_t ticks;
        struct wall_guard wall;
        int64_t stamp_wall, stamp_mono, stamp_boot; /* the clocks for the readings being taken */
        struct sandbox_record held_rec; /* scratch for registry_held_at: only the held fields are set */
        struct sandbox *hash[HASH_SIZE];
        struct sandbox **list;
        size_t n, cap;
        size_t npending;
        size_t pending_next;          /* where publish_pending resumes, so no sandbox starves */
        size_t kept_fds, fd_budget;   /* counter descriptors open, and how many we may keep */
        bool transient_logged;
        bool fatal;                   /* the producer failed for good */
        struct cgroup_scan *scan;     /* the BPF cgroup walk, or NULL: every sandbox is read from its files */
        bool scanned;                 /* this tick's walk succeeded */
        bool scan_error_logged;
        bool gen_error_logged;        /* a raised generation could not be stored (logged once until it is) */
        /* Records read while the moment lock was held, applied once it is released (reading is
         * quick; applying may open files, walk a disk folder or fsync a final sample). */
        struct changed_record *changed;
        size_t nchanged, changed_cap;
        struct sandbox_record *listed; /* a full re-read (the inotify queue overflowed) ... */
        int nlisted;
        bool full_read;               /* ... when set */
        bool lock_timed_out;          /* the last tick could not take the moment lock */
        struct usage_event ev;        /* reused for every sample */
        char buf[SAMPLE_MAX];
        struct collector_metrics m;
};

#define M_SET(c, field, v) __atomic_store_n(&(c)->m.field, (uint64_t)(v), __ATOMIC_RELAXED)
#define M_ADD(c, field, v) __atomic_fetch_add(&(c)->m.field, (uint64_t)(v), __ATOMIC_RELAXED)
#define M_GET(c, field)    __atomic_load_n(&(c)->m.field, __ATOMIC_RELAXED)

static unsigned hash_id(const char *s)
{
        unsigned h = 2166136261u;
        for (; *s; s++)
                h = (h ^ (unsigned char)*s) * 16777619u;
        return h % HASH_SIZE;
}

static struct sandbox *find(struct collector *c, const char *id)
{
        for (struct sandbox *s = c->hash[hash_id(id)]; s; s = s->hnext)
                if (strcmp(s->id, id) == 0)
                        return s;
        return NULL;
}

/* Closes a sandbox's counter files and gives their descriptors back to the budget. */
static void close_files(struct collector *c, struct sandbox *s)
{
        if (s->files.version == 0)
                return;
        c->kept_fds -= (size_t)cgroup_files_kept(&s->files);
        if (s->files.transient)
                M_SET(c, sandboxes_transient, M_GET(c, sandboxes_transient) - 1);
        cgroup_files_close(&s->files);
}

/* The network counters file beside the sandbox's disk (registry.h), or -1. */
static int open_net_counters(const char *disk_path)
{
        const char *slash = disk_path ? strrchr(disk_path, '/') : NULL;
        if (!slash)
                return -1;
        char path[PATH_MAX];
        if (snprintf(path, sizeof(path), "%.*s/" SANDBOX_NET_FILE, (int)(slash - disk_path), disk_path) >=
            (int)sizeof(path))
                return -1;
        /* The vmm's file in the host's folder of the sandbox: never a link, a fifo or a device. */
        int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct stat st;
        if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))) {
                close(fd);
                return -1;
        }
        return fd;
}

static void sandbox_free(struct sandbox *s)
{
        if (!s)
                return;
        cgroup_files_close(&s->files);
        if (s->net_fd >= 0)
                close(s->net_fd);
        free(s->cpu_dir);
        free(s->mem_dir);
        free(s->disk_path);
        free(s->pending_buf);
        free(s);
}

static void remove_sandbox(struct collector *c, struct sandbox *s, const char *why)
{
        if (!s->finished)
                log_info("sandbox left the registry without a final sample from this collector",
                         "sandbox=%s reason=%s", s->id, why);
        for (struct sandbox **p = &c->hash[hash_id(s->id)]; *p; p = &(*p)->hnext)
                if (*p == s) {
                        *p = s->hnext;
                        break;
                }
        c->list[s->index] = c->list[--c->n];
        c->list[s->index]->index = s->index;
        if (s->pending)
                c->npending--;
        state_remove_epoch(c->state_dir, s->id);
        close_files(c, s);
        sandbox_free(s);
        M_SET(c, sandboxes, c->n);
}

static int set_str(char **dst, const char *src)
{
        if (*dst && strcmp(*dst, src) == 0)
                return 0;
        char *d = strdup(src);
        if (!d)
                return -ENOMEM;
        free(*dst);
        *dst = d;
        return 1;
}

/* Reads the clocks for a batch of readings: once per tick, not per sample,
 * just before the counters are read (the walk, then files). */
static void stamp(struct collector *c)
{
        int64_t wall;
        time_now3(&wall, &c->stamp_mono, &c->stamp_boot); /* a late final's wall time comes from boot's */
        c->stamp_wall = wall_guard_next(&c->wall, wall, c->stamp_mono);
        M_SET(c, clock_steps_total, c->wall.steps);
}

/* Raises the host's generation for a sandbox whose n ran out (track.h): on disk first. */
static int raise_generation(void *ctx, uint32_t next)
{
        struct collector *c = ctx;
        int r = state_save_generation(c->state_dir, next);
        if (r < 0) {
                M_ADD(c, state_save_errors_total, 1);
                if (!c->gen_error_logged)
                        log_error("could not store a raised generation: the sandbox's samples wait until it is stored",
                                  "generation=%u error=\"%s\"", next, strerror(-r));
                c->gen_error_logged = true;
                return r;
        }
        c->gen_error_logged = false;
        c->gen_raised_mono = time_mono_ns();
        log_info("generation raised: a sandbox's sequence ran out of n", "generation=%u", next);
        return 0;
}

/* Keeps the host's generation with the clock's hours during a long run
 * (state.h), stored before any seq uses it; every sandbox's next seq moves to
 * it (seq_next). Outside the moment lock: it may fsync. */
static void follow_clock(struct collector *c)
{
        uint32_t next = generation_follow_clock(c->generation, c->stamp_wall / NS_PER_SEC,
                                                c->stamp_mono - c->gen_raised_mono);
        if (next == c->generation)
                return;
        int r = state_save_generation(c->state_dir, next);
        if (r < 0) {
                M_ADD(c, state_save_errors_total, 1);
                if (!c->gen_error_logged)
                        log_error("could not store a raised generation: keeping the current one",
                                  "generation=%u error=\"%s\"", next, strerror(-r));
                c->gen_error_logged = true;
                return;
        }
        c->gen_error_logged = false;
        c->generation = next;
        c->gen_raised_mono = c->stamp_mono;
        log_info("generation raised to follow the clock", "generation=%u", next);
}

/* Fills c->ev with s's sample at this stamp. Returns 0, or the -errno of a
 * generation that could not be stored: then nothing may be published for s. */
static int next_event(struct collector *c, struct sandbox *s, uint64_t cpu_ns, const struct cgroup_reading *rd)
{
        uint64_t seq;
        int r = seq_next(&s->seq, &c->generation, raise_generation, c, &seq);
        if (r < 0) {
                M_ADD(c, samples_held_total, 1);
                return r;
        }
        struct usage_event *ev = &c->ev;
        ev->type = EVENT_SAMPLE;
        memcpy(ev->host, *s->host ? s->host : c->host_id, sizeof(ev->host));
        memcpy(ev->sandbox, s->id, sizeof(ev->sandbox));
        memcpy(ev->account, s->account, sizeof(ev->account));
        memcpy(ev->key, s->key, sizeof(ev->key));
        ev->epoch = s->track.epoch;
        ev->seq = seq;
        ev->mono_ns = c->stamp_mono;
        ev->wall_ns = c->stamp_wall;
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
                struct sandbox_record *h = &c->held_rec;
                h->state = s->state;
                h->running_ns = s->running_ns;
                h->paused_ns = s->paused_ns;
                h->state_since_boot_ns = s->state_since_boot_ns;
                /* A running sandbox's own init ends it at its lease, also while no tally-vmm runs to
                 * record the stop (the vmm then dates it at the lease's end): running time is never
                 * extrapolated past the lease. */
                int64_t at = c->stamp_boot;
                if (s->state == STATE_RUNNING && s->lease_wall_ns > 0 && c->stamp_wall > s->lease_wall_ns) {
                        at = c->stamp_boot - (c->stamp_wall - s->lease_wall_ns);
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
static void remember(struct sandbox *s, const struct usage_event *ev)
{
        s->pub_known = true;
        if (ev->held_known) {
                s->pub_running_ns = ev->running_ns;
                s->pub_paused_ns = ev->paused_ns;
        }
        s->pub_wall_ns = ev->wall_ns;
        s->pub_mono_ns = ev->mono_ns;
}

/* Has the walk watch this sandbox's cgroups: the memory one only if it has a
 * memory counter file. Any failure leaves the sandbox to its files. */
static void watch_cgroups(struct collector *c, struct sandbox *s)
{
        struct cgroup_scan_ref cpu, mem = CGROUP_SCAN_REF_NONE;
        s->scan_cpu = s->scan_mem = CGROUP_SCAN_REF_NONE;
        if (!c->scan || cgroup_scan_watch(c->scan, s->cgroup_version, s->cpu_dir, &cpu) < 0 ||
            (s->files.mem_path && cgroup_scan_watch(c->scan, s->cgroup_version, s->mem_dir, &mem) < 0))
                return;
        s->scan_cpu = cpu;
        s->scan_mem = mem;
}

/* This tick's reading of a sandbox from the scan, if it saw the sandbox's
 * cgroups; peak read too when the walk read watermarks. */
static bool read_scanned(struct collector *c, struct sandbox *s, struct cgroup_reading *rd)
{
        struct cgroup_scan_reading sr;
        if (!c->scanned || s->scan_cpu.root < 0 ||
            !cgroup_scan_get(c->scan, &s->scan_cpu, s->scan_mem.root >= 0 ? &s->scan_mem : NULL, &sr))
                return false;
        *rd = (struct cgroup_reading){ .cpu_ns = sr.cpu_ns, .mem_bytes = sr.mem_bytes };
        if (sr.has_peak && s->files.peak_path) {
                s->peak_bytes = sr.mem_peak_bytes;
                s->peak_read = true;
        }
        return true;
}

/* Walks every root once for this tick; on failure this tick reads files. */
static void scan_tick(struct collector *c, bool peaks)
{
        c->scanned = false;
        if (!c->scan)
                return;
        int r = cgroup_scan_run(c->scan, peaks);
        if (r < 0) {
                M_ADD(c, scan_errors_total, 1);
                if (!c->scan_error_logged)
                        log_warn("the cgroup walk failed: reading files this tick", "error=\"%s\"", strerror(-r));
                c->scan_error_logged = true;
                return;
        }
        c->scanned = true;
        M_SET(c, scan_cgroups, cgroup_scan_seen(c->scan));
}

/* Opens a sandbox's counter files, outside the hot path. */
static int open_files(struct collector *c, struct sandbox *s)
{
        /* Two descriptors a sandbox while the budget lasts; the daemon keeps the rest for itself. */
        bool keep = c->kept_fds + 2 <= c->fd_budget;
        int r = cgroup_files_open(s->cgroup_version, s->cpu_dir, s->mem_dir, c->opt.read_peak, keep, &s->files);
        if (r < 0) {
                if (!s->gone_logged)
                        log_warn("could not open a sandbox's cgroup", "sandbox=%s path=%s error=\"%s\"", s->id,
                                 s->cpu_dir, strerror(-r));
                s->gone_logged = true;
                return r;
        }
        c->kept_fds += cgroup_files_kept(&s->files);
        s->reopened = s->opened_before; /* a counter restart after this is a recreated cgroup, not tampering */
        s->opened_before = true;
        watch_cgroups(c, s);
        if (s->files.transient) {
                M_ADD(c, sandboxes_transient, 1);
                if (!c->transient_logged)
                        log_warn("out of file descriptors: counters of further sandboxes are opened on every read",
                                 "sandbox=%s kept=%zu budget=%zu", s->id, c->kept_fds, c->fd_budget);
                c->transient_logged = true;
        }
        return 0;
}

/* Applies the epoch rules to a counter read from s's cgroup, and persists an
 * epoch that changed. Returns true when s may be published: a changed epoch is
 * published only once it is on disk (else a restarted collector could publish
 * a lower one, which an aggregator ignores for good); until then the save is
 * retried at each reading and s's samples wait. */
static bool observe(struct collector *c, struct sandbox *s, uint64_t record_epoch, uint64_t cpu_ns)
{
        uint64_t before = s->track.epoch, before_record = s->track.record_epoch, last = s->track.last_cpu_ns;
        if (epoch_track_observe(&s->track, record_epoch, cpu_ns)) {
                M_ADD(c, epoch_changes_total, 1);
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
                        M_ADD(c, counter_backwards_total, 1);
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
                        ? state_save_epoch(c->state_dir, s->id, s->track.epoch, s->track.record_epoch)
                        : state_remove_epoch(c->state_dir, s->id);
        if (r < 0) {
                M_ADD(c, state_save_errors_total, 1);
                M_ADD(c, samples_held_total, 1);
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

static int produce(struct collector *c, const char *account, const char *payload, size_t len, void *opaque)
{
        rd_kafka_resp_err_t e = rd_kafka_producev(
                c->rk, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_KEY(account, strlen(account)),
                RD_KAFKA_V_VALUE((void *)payload, len), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                RD_KAFKA_V_OPAQUE(opaque), RD_KAFKA_V_END);
        if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                return -ENOBUFS;
        if (e) {
                M_ADD(c, publish_errors_total, 1);
                log_warn("could not queue a sample", "error=\"%s\"", rd_kafka_err2str(e));
                return -EIO;
        }
        return 0;
}

/* An epoch of the collector's own (raised over the record's when the counter
 * went back) is announced with a `restarted` event before any sample under it
 * and again each ANNOUNCE_EVERY_NS while it lasts, so that one announcement
 * lost in a broker outage costs nothing for long: an aggregator bills no epoch
 * the sandbox's host did not announce (docs/events.md, "Provenance"). The
 * vmm announces the record's own epochs. Returns 0, or the -errno of a produce
 * that failed (then the sample waits too). */
#define ANNOUNCE_EVERY_NS (60 * NS_PER_SEC)
static int announce_epoch(struct collector *c, struct sandbox *s)
{
        if (!epoch_track_is_local(&s->track))
                return 0;
        int64_t now = time_mono_ns();
        if (s->announced_epoch == s->track.epoch && now - s->announced_mono_ns < ANNOUNCE_EVERY_NS)
                return 0;
        struct usage_event ev = { .type = EVENT_RESTARTED, .epoch = s->track.epoch, .wall_ns = time_wall_ns(),
                                  .state = s->state, .vcpus = s->vcpus };
        memcpy(ev.host, *s->host ? s->host : c->host_id, sizeof(ev.host));
        memcpy(ev.sandbox, s->id, sizeof(ev.sandbox));
        memcpy(ev.account, s->account, sizeof(ev.account));
        memcpy(ev.key, s->key, sizeof(ev.key));
        snprintf(ev.reason, sizeof(ev.reason), "%s", s->epoch_reason ? s->epoch_reason : "counter_back");
        char buf[2048];
        int len = event_encode(&ev, buf, sizeof(buf));
        if (len < 0)
                return len;
        int r = produce(c, s->account, buf, (size_t)len, NULL);
        if (r < 0)
                return r;
        if (s->announced_epoch != s->track.epoch)
                log_info("new epoch announced", "sandbox=%s epoch=%llu reason=%s", s->id,
                         (unsigned long long)s->track.epoch, ev.reason);
        s->announced_epoch = s->track.epoch;
        s->announced_mono_ns = now;
        return 0;
}

static bool queue_has_room(struct collector *c)
{
        return rd_kafka_outq_len(c->rk) < (int)c->opt.queue_max;
}

/* Publishes c->buf for s, or keeps it as s's newest sample when the queue is full. */
static void publish_sample(struct collector *c, struct sandbox *s, int len)
{
        if (queue_has_room(c) && announce_epoch(c, s) != -ENOBUFS && produce(c, s->account, c->buf, (size_t)len, NULL) != -ENOBUFS) {
                if (s->pending) {
                        /* An older sample waited; this newer one carries the truth. */
                        s->pending = false;
                        c->npending--;
                }
                return;
        }
        memcpy(s->pending_buf, c->buf, (size_t)len);
        s->pending_len = len;
        if (!s->pending) {
                s->pending = true;
                c->npending++;
        }
}

static void publish_pending(struct collector *c)
{
        /* Round robin from where the last call stopped: starting at the list's head every tick
         * would let the first queue_max sandboxes take all the room and starve the rest. */
        for (size_t k = 0; k < c->n && c->npending > 0; k++) {
                size_t i = (c->pending_next + k) % c->n;
                struct sandbox *s = c->list[i];
                if (!s->pending)
                        continue;
                if (!queue_has_room(c) || announce_epoch(c, s) == -ENOBUFS ||
                    produce(c, s->account, s->pending_buf, (size_t)s->pending_len, NULL) == -ENOBUFS) {
                        c->pending_next = i;
                        break;
                }
                s->pending = false;
                c->npending--;
                c->pending_next = i + 1;
        }
        M_SET(c, pending_newest, c->npending);
}

static void publish_spool(struct collector *c)
{
        for (struct spool_entry *e = c->spool.head; e; e = e->next) {
                if (e->in_flight)
                        continue;
                struct sandbox *s = find(c, e->sandbox);
                if (s && announce_epoch(c, s) < 0)
                        continue;
                if (produce(c, e->account, e->payload, e->len, e) == 0)
                        e->in_flight = true;
        }
        M_SET(c, spool_entries, c->spool.count);
        M_SET(c, spool_bytes, c->spool.bytes);
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *msg, void *opaque)
{
        struct collector *c = opaque;
        struct spool_entry *e = msg->_private;
        if (msg->err) {
                M_ADD(c, publish_errors_total, 1);
                log_warn("a sample was not delivered", "error=\"%s\" final=%s", rd_kafka_err2str(msg->err),
                         e ? "true" : "false");
                if (e)
                        e->in_flight = false; /* re-sent on the next tick */
                return;
        }
        M_ADD(c, deliveries_total, 1);
        if (e) {
                log_debug("final sample acknowledged", "sandbox=%s", e->sandbox);
                int r = spool_done(&c->spool, e);
                if (r < 0)
                        log_error("could not delete an acknowledged spool entry", "error=\"%s\"", strerror(-r));
        }
}

/* A fatal producer error (the idempotence guarantee cannot hold) leaves the
 * producer unusable: stop, so the service manager restarts us with the spool. */
static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
        struct collector *c = opaque;
        if (err != RD_KAFKA_RESP_ERR__FATAL) {
                log_debug("kafka client reports", "error=\"%s\"", reason);
                return;
        }
        char why[512];
        rd_kafka_fatal_error(rk, why, sizeof(why));
        log_error("fatal producer error; stopping", "error=\"%s\"", why);
        c->fatal = true;
}

static bool final_marker_exists(struct collector *c, const char *id)
{
        char path[PATH_MAX + 80];
        snprintf(path, sizeof(path), "%s/%s.final", c->registry_dir, id);
        return access(path, F_OK) == 0;
}

/* The cgroup's own counter at the stop, read by the collector (the cgroup
 * stays until <id>.final): opened for this one read if its files are not open
 * (a restarted collector never opens a stopped sandbox's). Returns 0 or -errno. */
static int read_final_counter(struct sandbox *s, uint64_t *ret)
{
        struct cgroup_reading rd;
        if (s->files.version != 0)
                return cgroup_files_read(&s->files, &rd) < 0 ? -ENODEV : (*ret = rd.cpu_ns, 0);
        if (!s->cpu_dir || !*s->cpu_dir)
                return -ENOENT;
        struct cgroup_files f = CGROUP_FILES_NONE;
        int r = cgroup_files_open(s->cgroup_version, s->cpu_dir, s->mem_dir, false, false, &f);
        if (r == 0)
                r = cgroup_files_read(&f, &rd);
        cgroup_files_close(&f);
        if (r < 0)
                return r;
        *ret = rd.cpu_ns;
        return 0;
}

/* The stop handshake (docs/registry.md): spool the final sample durably, then
 * make <id>.final so the vmm may remove the cgroup, then produce. Returns
 * without marking when something could not be done; sample_all retries. */
static void take_final(struct collector *c, struct sandbox *s)
{
        bool marker = final_marker_exists(c, s->id);
        struct spool_entry *e = spool_find(&c->spool, s->id);
        if (!e && !marker) {
                /* The higher of the vmm's last read and the kernel's counter now: the processes are
                 * gone, so the counter holds still, and a record's number never lowers it. */
                uint64_t cpu_ns = s->final_cpu_ns, own = 0;
                if (read_final_counter(s, &own) == 0 && own > cpu_ns) {
                        if (cpu_ns)
                                log_debug("the cgroup's counter is above the record's final one; using it",
                                          "sandbox=%s final_cpu_ns=%llu cpu_ns=%llu", s->id,
                                          (unsigned long long)cpu_ns, (unsigned long long)own);
                        cpu_ns = own;
                }
                if (s->track.have_last && s->record_epoch == s->track.record_epoch && cpu_ns < s->track.last_cpu_ns) {
                        /* Below what we already published in this epoch: a new epoch would bill the
                         * whole counter again, so the final keeps the higher one. */
                        log_warn("final counter below the last published one; keeping the last",
                                 "sandbox=%s final_cpu_ns=%llu last_cpu_ns=%llu", s->id,
                                 (unsigned long long)cpu_ns, (unsigned long long)s->track.last_cpu_ns);
                        cpu_ns = s->track.last_cpu_ns;
                }
                if (!observe(c, s, s->record_epoch, cpu_ns))
                        return;
                stamp(c);
                if (next_event(c, s, cpu_ns, NULL) < 0)
                        return;
                /* Dated at the stop itself, not at this tick: a collector that comes back late (or a
                 * record seen a tick later) must not stretch the sandbox's life. Its held time is the
                 * record's frozen totals (next_event). */
                if (s->state_since_boot_ns > 0 && c->stamp_boot >= s->state_since_boot_ns) {
                        int64_t ago = c->stamp_boot - s->state_since_boot_ns;
                        c->ev.wall_ns = c->stamp_wall - ago;
                        c->ev.mono_ns = c->stamp_mono - ago;
                        if (s->pub_known && c->ev.wall_ns < s->pub_wall_ns)
                                c->ev.wall_ns = s->pub_wall_ns;
                        if (s->pub_known && c->ev.mono_ns < s->pub_mono_ns)
                                c->ev.mono_ns = s->pub_mono_ns;
                }
                int len = event_encode(&c->ev, c->buf, sizeof(c->buf));
                if (len < 0) {
                        log_error("could not encode a final sample", "sandbox=%s error=\"%s\"", s->id, strerror(-len));
                        return;
                }
                e = spool_add(&c->spool, s->id, s->account, c->buf, (size_t)len);
                if (!e) {
                        log_error("could not spool a final sample", "sandbox=%s error=\"%m\"", s->id);
                        return;
                }
                remember(s, &c->ev);
                M_ADD(c, finals_total, 1);
                log_info("final sample", "sandbox=%s account=%s epoch=%llu cpu_ns=%llu running_ns=%llu paused_ns=%llu",
                         s->id, s->account, (unsigned long long)s->track.epoch, (unsigned long long)cpu_ns,
                         (unsigned long long)c->ev.running_ns, (unsigned long long)c->ev.paused_ns);
        }
        if (!marker) {
                char path[PATH_MAX + 80];
                snprintf(path, sizeof(path), "%s/%s.final", c->registry_dir, s->id);
                int r = state_write_atomic(path, "", 0);
                if (r < 0) {
                        log_error("could not mark a final sample taken", "path=%s error=\"%s\"", path, strerror(-r));
                        return;
                }
        }
        if (e && !e->in_flight && announce_epoch(c, s) == 0 && produce(c, e->account, e->payload, e->len, e) == 0)
                e->in_flight = true;
        s->finished = true;
        close_files(c, s); /* the vmm removes the cgroup now */
}

/* Takes in a registry record: a new sandbox, a changed one, or a stopped one. */
static int load_record(struct collector *c, struct sandbox_record *rec)
{
        struct sandbox *s = find(c, rec->id);
        bool fresh = !s;
        if (fresh) {
                s = calloc(1, sizeof(*s));
                if (!s || !(s->pending_buf = malloc(SAMPLE_MAX))) {
                        free(s);
                        return -ENOMEM;
                }
                s->net_fd = -1;
                if (c->n == c->cap) {
                        size_t cap = c->cap ? c->cap * 2 : 256;
                        struct sandbox **l = realloc(c->list, cap * sizeof(*l));
                        if (!l) {
                                sandbox_free(s);
                                return -ENOMEM;
                        }
                        c->list = l;
                        c->cap = cap;
                }
                s->files = CGROUP_FILES_NONE;
                s->scan_cpu = s->scan_mem = CGROUP_SCAN_REF_NONE;
                memcpy(s->id, rec->id, sizeof(s->id));
                uint64_t saved_epoch = 0, saved_record = 0;
                int r = state_load_epoch(c->state_dir, s->id, &saved_epoch, &saved_record);
                if (r < 0)
                        log_warn("could not read a saved epoch", "sandbox=%s error=\"%s\"", s->id, strerror(-r));
                epoch_track_init(&s->track, rec->epoch, saved_epoch, saved_record);
                s->seq = (struct seq_track){ c->generation, c->opt.seq_start };
                s->index = c->n;
                c->list[c->n++] = s;
                unsigned h = hash_id(s->id);
                s->hnext = c->hash[h];
                c->hash[h] = s;
                M_SET(c, sandboxes, c->n);
        }
        memcpy(s->account, rec->account, sizeof(s->account));
        memcpy(s->key, *rec->key ? rec->key : rec->account, sizeof(s->key));
        memcpy(s->host, rec->host, sizeof(s->host));
        s->state = rec->state;
        s->vcpus = rec->vcpus ? rec->vcpus : 1;
        s->mem_size_bytes = rec->mem_size_bytes;
        s->lease_wall_ns = rec->timeout_ns;
        s->final_cpu_ns = rec->final_cpu_ns;
        s->record_epoch = rec->epoch;
        s->running_ns = rec->running_ns;
        s->paused_ns = rec->paused_ns;
        s->state_since_boot_ns = rec->state_since_boot_ns;
        s->starting = rec->starting;
        int moved = set_str(&s->cpu_dir, rec->cgroup_cpu) | set_str(&s->mem_dir, rec->cgroup_memory);
        if (moved < 0 || set_str(&s->disk_path, rec->disk_path) < 0)
                return -ENOMEM;
        /* Its image file's blocks (or every file's under a folder), walked as root by descriptor
         * without following a link or entering another file system: only what is on the disk counts. */
        s->disk_bytes = beneath_usage(s->disk_path);
        if (s->net_fd < 0)
                s->net_fd = open_net_counters(s->disk_path);
        if (moved || s->cgroup_version != rec->cgroup_version)
                close_files(c, s);
        s->cgroup_version = rec->cgroup_version;
        if (fresh)
                log_info("sandbox found", "sandbox=%s account=%s state=%s cgroup_version=%d epoch=%llu", s->id,
                         s->account, sandbox_state_name(s->state), s->cgroup_version,
                         (unsigned long long)s->track.epoch);
        if (s->state != STATE_STOPPED && s->files.version == 0)
                open_files(c, s);
        if (s->state == STATE_STOPPED && !s->finished)
                take_final(c, s);
        return 0;
}

/* Reads one record inotify named into c->changed (nothing for other files). */
static void read_changed(struct collector *c, const char *name, bool *ret_full)
{
        size_t len = strlen(name);
        if (len <= 5 || strcmp(name + len - 5, ".json") != 0 || len - 5 > EVENT_ID_MAX)
                return;
        if (c->nchanged == c->changed_cap) {
                size_t cap = c->changed_cap ? c->changed_cap * 2 : 64;
                struct changed_record *l = realloc(c->changed, cap * sizeof(*l));
                if (!l) {
                        *ret_full = true; /* read every record instead */
                        return;
                }
                c->changed = l;
                c->changed_cap = cap;
        }
        struct changed_record *ch = &c->changed[c->nchanged];
        memcpy(ch->id, name, len - 5);
        ch->id[len - 5] = '\0';
        int r = registry_read(c->state_dir, ch->id, &ch->rec);
        if (r < 0 && r != -ENOENT) {
                log_warn("skipping an invalid registry record", "sandbox=%s", ch->id);
                return;
        }
        ch->gone = r == -ENOENT;
        c->nchanged++;
}

static void clear_changes(struct collector *c)
{
        for (size_t i = 0; i < c->nchanged; i++)
                if (!c->changed[i].gone)
                        sandbox_record_clear(&c->changed[i].rec);
        c->nchanged = 0;
        registry_list_free(c->listed, c->nlisted);
        c->listed = NULL;
        c->nlisted = 0;
        c->full_read = false;
}

/* Reads the records inotify says changed since the last call (or every record
 * if its queue overflowed), without acting on them: quick enough to run under
 * the moment lock. apply_changes acts on them. */
static void collect_changes(struct collector *c)
{
        char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
        bool full = false;
        for (;;) {
                ssize_t n = read(c->inotify_fd, buf, sizeof(buf));
                if (n <= 0)
                        break;
                for (char *p = buf; p < buf + n;) {
                        const struct inotify_event *ev = (const struct inotify_event *)p;
                        if (ev->mask & IN_Q_OVERFLOW)
                                full = true;
                        else if (ev->len > 0 && !full)
                                read_changed(c, ev->name, &full);
                        p += sizeof(*ev) + ev->len;
                }
        }
        if (!full)
                return;
        /* Every record as it is now: newer than anything the queue held. */
        clear_changes(c);
        int n = registry_list(c->state_dir, &c->listed);
        if (n < 0) {
                log_error("could not read the registry", "path=%s error=\"%s\"", c->registry_dir, strerror(-n));
                c->listed = NULL;
                return; /* the periodic rescan catches up */
        }
        c->nlisted = n;
        c->full_read = true;
}

/* Takes in every record of a full read; a sandbox no record names any more is gone. */
static int apply_list(struct collector *c, struct sandbox_record *recs, int n)
{
        bool *seen = calloc(c->n + (size_t)n + 1, sizeof(*seen));
        if (!seen)
                return -ENOMEM;
        for (int i = 0; i < n; i++) {
                int r = load_record(c, &recs[i]);
                struct sandbox *s = find(c, recs[i].id);
                if (r < 0)
                        log_error("could not track a sandbox", "sandbox=%s error=\"%s\"", recs[i].id, strerror(-r));
                else if (s)
                        seen[s->index] = true;
        }
        for (size_t i = c->n; i-- > 0;)
                if (!seen[i])
                        remove_sandbox(c, c->list[i], "record removed");
        free(seen);
        return 0;
}

/* Acts on what collect_changes read, in the order read. The tick's clocks are
 * kept: a final sample taken here reads its own. */
static void apply_changes(struct collector *c)
{
        int64_t wall = c->stamp_wall, mono = c->stamp_mono, boot = c->stamp_boot;
        if (c->full_read && apply_list(c, c->listed, c->nlisted) < 0)
                log_error("could not take in the registry", "error=\"%s\"", strerror(ENOMEM));
        for (size_t i = 0; i < c->nchanged; i++) {
                struct changed_record *ch = &c->changed[i];
                struct sandbox *s;
                int r;
                if (ch->gone) {
                        if ((s = find(c, ch->id)))
                                remove_sandbox(c, s, "record removed");
                } else if ((r = load_record(c, &ch->rec)) < 0) {
                        log_error("could not track a sandbox", "sandbox=%s error=\"%s\"", ch->id, strerror(-r));
                }
        }
        clear_changes(c);
        c->stamp_wall = wall, c->stamp_mono = mono, c->stamp_boot = boot;
}

static int rescan(struct collector *c)
{
        struct sandbox_record *recs = NULL;
        int n = registry_list(c->state_dir, &recs);
        if (n < 0) {
                log_error("could not read the registry", "path=%s error=\"%s\"", c->registry_dir, strerror(-n));
                return n;
        }
        int r = apply_list(c, recs, n);
        registry_list_free(recs, n);
        return r;
}

/* Between ticks: records are taken in as soon as they change, so the tick's
 * locked read finds little left to read. */
static void drain_inotify(struct collector *c)
{
        collect_changes(c);
        apply_changes(c);
}

/* The start of a tick: its clocks, and every record holding a lifecycle moment
 * before them. Under the moment lock held exclusive (registry.h), no vmm is
 * between a moment's clock read and its record's rename, so every moment
 * before the stamp is in a record renamed before it, and its inotify event is
 * already queued: the read below finds it. Only reading is done under the lock
 * (one flock pair a tick); the records are acted on after it is released. A
 * lock not had within REGISTRY_MOMENT_WAIT_MS (a wedged vmm holding it) is
 * counted and the tick goes on without it. */
static void tick_records(struct collector *c)
{
        int lock = registry_moments_quiesce(c->state_dir, REGISTRY_MOMENT_WAIT_MS);
        if (lock < 0) {
                M_ADD(c, moment_lock_timeouts_total, 1);
                if (!c->lock_timed_out)
                        log_warn("could not take the registry's moment lock: sampling without it (held time may run "
                                 "past a moment until its record is read)", "wait_ms=%d error=\"%s\"",
                                 REGISTRY_MOMENT_WAIT_MS, strerror(-lock));
                c->lock_timed_out = true;
        } else if (c->lock_timed_out) {
                log_info("the registry's moment lock is taken again", "timeouts_total=%llu",
                         (unsigned long long)M_GET(c, moment_lock_timeouts_total));
                c->lock_timed_out = false;
        }
        stamp(c);
        collect_changes(c);
        registry_moment_end(lock);
        apply_changes(c);
}

/* One tick: a reading of every live sandbox. */
static void sample_all(struct collector *c)
{
        publish_pending(c);
        tick_records(c); /* the clocks and the records, then the counters */
        follow_clock(c);
        scan_tick(c, c->opt.read_peak && c->ticks % (uint64_t)c->opt.peak_every == 0);
        uint64_t samples = 0, errors = 0, file_reads = 0;
        for (size_t i = 0; i < c->n; i++) {
                struct sandbox *s = c->list[i];
                if (s->finished || s->state == STATE_STOPPED || s->starting)
                        continue;
                if (s->files.version == 0 && open_files(c, s) < 0)
                        continue; /* not there (yet, or any more) */
                struct cgroup_reading rd;
                bool scanned = read_scanned(c, s, &rd);
                int r = scanned ? 0 : cgroup_files_read(&s->files, &rd);
                file_reads += !scanned;
                if (r < 0) {
                        /* Removed between discovery and read (ENODEV/ENOENT): close, and reopen if it
                         * comes back; a recreated cgroup's counter restarts, which the epoch rules catch. */
                        errors++;
                        if (!s->gone_logged)
                                log_warn("could not read a sandbox's cgroup", "sandbox=%s error=\"%s\"", s->id,
                                         strerror(-r));
                        s->gone_logged = true;
                        close_files(c, s);
                        continue;
                }
                /* Read from files: staggered, so each tick reads the peaks of 1/peak_every of the
                 * sandboxes. The scan reads every peak each peak_every ticks. */
                if (s->files.peak_path && (!s->peak_read || (!scanned && (c->ticks + i) % (uint64_t)c->opt.peak_every == 0)) &&
                    cgroup_files_read_peak(&s->files, &s->peak_bytes) < 0)
                        errors++;
                s->peak_read = true;
                s->gone_logged = false;
                if (!observe(c, s, s->record_epoch, rd.cpu_ns) || next_event(c, s, rd.cpu_ns, &rd) < 0)
                        continue; /* its state is not on disk: held, counted */
                int len = event_encode(&c->ev, c->buf, sizeof(c->buf));
                if (len < 0) {
                        errors++;
                        continue;
                }
                remember(s, &c->ev);
                publish_sample(c, s, len);
                samples++;
        }
        /* Final samples that could not be taken when the record said stopped (state not on
         * disk, spool full): again, after this tick's readings, which share its stamp. */
        for (size_t i = 0; i < c->n; i++)
                if (c->list[i]->state == STATE_STOPPED && !c->list[i]->finished)
                        take_final(c, c->list[i]);
        M_ADD(c, samples_total, samples);
        M_ADD(c, read_errors_total, errors);
        M_ADD(c, file_reads_total, file_reads);
        M_SET(c, pending_newest, c->npending);
        publish_spool(c);
        c->ticks++;
}

/* Descriptors the daemon keeps for itself: Kafka sockets, /metrics connections, inotify, files. */
#define FD_RESERVE 512

/* Room for two descriptors a sandbox at 10,000s of sandboxes: raises the limit
 * as far as allowed and returns how many counter descriptors may stay open. */
static size_t raise_nofile(void)
{
        struct rlimit rl;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
                return 0;
        struct rlimit want = { 1 << 20, 1 << 20 };
        if (rl.rlim_max < want.rlim_max && setrlimit(RLIMIT_NOFILE, &want) == 0) {
                rl = want;
        } else {
                rl.rlim_cur = rl.rlim_max;
                setrlimit(RLIMIT_NOFILE, &rl);
                getrlimit(RLIMIT_NOFILE, &rl);
        }
        return rl.rlim_cur > FD_RESERVE ? (size_t)(rl.rlim_cur - FD_RESERVE) : 0;
}

static void default_host_id(char *out, size_t size)
{
        char h[256] = "";
        gethostname(h, sizeof(h) - 1);
        size_t j = 0;
        for (size_t i = 0; h[i] && j + 1 < size; i++) {
                char ch = h[i];
                bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                          ch == '_' || ch == '-' || ch == '.' || ch == ':';
                out[j++] = ok ? ch : '_';
        }
        if (j == 0)
                out[j++] = 'h';
        out[j] = '\0';
}

int collector_new(const struct collector_options *opt, struct collector **ret, char *err, size_t errlen)
{
        struct collector *c = calloc(1, sizeof(*c));
        if (!c) {
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        c->opt = *opt;
        c->inotify_fd = -1;
        int r;
        snprintf(c->state_dir, sizeof(c->state_dir), "%s", opt->state_dir);
        snprintf(c->registry_dir, sizeof(c->registry_dir), "%s/" REGISTRY_DIR, opt->state_dir);
        if (opt->host_id && *opt->host_id) {
                if (!event_id_valid(opt->host_id)) {
                        snprintf(err, errlen, "host_id \"%s\" is not a valid id ([A-Za-z0-9_.:-]{1,64})", opt->host_id);
                        r = -EINVAL;
                        goto fail;
                }
                snprintf(c->host_id, sizeof(c->host_id), "%s", opt->host_id);
        } else {
                default_host_id(c->host_id, sizeof(c->host_id));
        }
        if ((r = state_prepare(c->state_dir)) < 0 ||
            (mkdir(c->registry_dir, 0700) < 0 && errno != EEXIST && (r = -errno))) {
                snprintf(err, errlen, "could not create the state folders under %s: %s", c->state_dir, strerror(-r));
                goto fail;
        }
        c->gen_raised_mono = time_mono_ns();
        if ((r = state_next_generation(c->state_dir, time_wall_ns() / NS_PER_SEC, &c->generation)) < 0) {
                snprintf(err, errlen, "could not store the start generation in %s/" COLLECTOR_DIR ": %s",
                         c->state_dir, strerror(-r));
                goto fail;
        }
        if ((r = spool_open(&c->spool, c->state_dir)) < 0) {
                snprintf(err, errlen, "could not open the spool: %s", strerror(-r));
                goto fail;
        }
        c->inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (c->inotify_fd < 0 ||
            inotify_add_watch(c->inotify_fd, c->registry_dir,
                              IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE) < 0) {
                r = -errno;
                snprintf(err, errlen, "could not watch %s: %s", c->registry_dir, strerror(errno));
                goto fail;
        }
        c->fd_budget = raise_nofile();
        if (strcmp(opt->cgroup_reader, "files") != 0) {
                char serr[256];
                r = cgroup_scan_new(&c->scan, serr, sizeof(serr));
                if (r < 0 && strcmp(opt->cgroup_reader, "scan") == 0) {
                        snprintf(err, errlen, "cgroup_reader is scan, but %s", serr);
                        goto fail;
                }
                if (r < 0)
                        log_info("reading cgroup files: the cgroup walk is not available", "reason=\"%s\"", serr);
        }
        M_SET(c, scan_active, c->scan != NULL);

        char kerr[512], timeout[64], qmax[64];
        snprintf(timeout, sizeof(timeout), "message.timeout.ms=%lld", (long long)opt->delivery_timeout_ms);
        /* The queue holds ordinary samples up to queue_max plus every final in the spool. */
        snprintf(qmax, sizeof(qmax), "queue.buffering.max.messages=%lld", (long long)opt->queue_max + 100000);
        const char *const pairs[] = { timeout, qmax, "client.id=tally-collector", NULL };
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        rd_kafka_conf_set_error_cb(conf, on_error);
        rd_kafka_conf_set_opaque(conf, c);
        /* Partitions added to usage are produced to within 30 s, not
         * librdkafka's 5 min (docs/kafka.md, "Adding partitions"); set before
         * kafka_settings, which may change it. */
        static const char *const defaults[] = { KAFKA_METADATA_REFRESH, NULL };
        if (kafka_conf_set_all(conf, defaults, kerr, sizeof(kerr)) < 0 ||
            kafka_conf_set_client(conf, opt->kafka, kerr, sizeof(kerr)) < 0) {
                rd_kafka_conf_destroy(conf);
                snprintf(err, errlen, "could not apply kafka_settings: %s", kerr);
                r = -EINVAL;
                goto fail;
        }
        c->rk = kafka_producer_new(opt->brokers, conf, pairs, kerr, sizeof(kerr));
        if (!c->rk) {
                snprintf(err, errlen, "could not create the Kafka producer: %s", kerr);
                r = -EINVAL;
                goto fail;
        }
        if (c->spool.count)
                log_info("re-sending final samples left in the spool", "count=%zu", c->spool.count);
        *ret = c;
        return 0;
fail:
        collector_free(c);
        return r;
}

void collector_free(struct collector *c)
{
        if (!c)
                return;
        if (c->rk)
                rd_kafka_destroy(c->rk);
        for (size_t i = 0; i < c->n; i++)
                sandbox_free(c->list[i]);
        free(c->list);
        clear_changes(c);
        free(c->changed);
        spool_close(&c->spool);
        cgroup_scan_free(c->scan);
        if (c->inotify_fd >= 0)
                close(c->inotify_fd);
        free(c);
}

int collector_run(struct collector *c, volatile sig_atomic_t *stop)
{
        const int64_t tick_ns = c->opt.tick_ms * NS_PER_MS;
        int r = rescan(c);
        if (r < 0)
                return r;
        log_info("collector running",
                 "host=%s sandboxes=%zu generation=%u tick_ms=%lld spool=%zu fd_budget=%zu cgroup_reader=%s",
                 c->host_id, c->n, c->generation, (long long)c->opt.tick_ms, c->spool.count, c->fd_budget,
                 c->scan ? "scan" : "files");
        int64_t next_tick = time_mono_ns();
        int64_t next_rescan = next_tick + c->opt.rescan_s * NS_PER_SEC;
        int64_t second_start = next_tick;
        uint64_t second_samples = 0;
        while (!*stop && !c->fatal) {
                int64_t now = time_mono_ns();
                if (now >= next_tick) {
                        sample_all(c);
                        int64_t done = time_mono_ns();
                        M_SET(c, tick_duration_us, (done - now) / NS_PER_US);
                        M_ADD(c, ticks_total, 1);
                        bool overran;
                        next_tick = tick_next(next_tick, tick_ns, done, &overran);
                        if (overran) {
                                M_ADD(c, tick_overruns_total, 1);
                                log_warn("tick overran its interval", "duration_us=%lld tick_ms=%lld",
                                         (long long)((done - now) / NS_PER_US), (long long)c->opt.tick_ms);
                        }
                        if (done - second_start >= NS_PER_SEC) {
                                uint64_t total = M_GET(c, samples_total);
                                M_SET(c, samples_per_second,
                                      (total - second_samples) * (uint64_t)NS_PER_SEC / (uint64_t)(done - second_start));
                                second_samples = total;
                                second_start = done;
                        }
                }
                if (now >= next_rescan) {
                        rescan(c);
                        next_rescan = now + c->opt.rescan_s * NS_PER_SEC;
                }
                daemon_memory_trim(now); /* at most every DAEMON_TRIM_INTERVAL_S */
                int64_t wait_ms = (next_tick - time_mono_ns()) / NS_PER_MS;
                if (wait_ms > 100)
                        wait_ms = 100; /* delivery reports are served between waits */
                if (wait_ms < 0)
                        wait_ms = 0;
                struct pollfd p = { c->inotify_fd, POLLIN, 0 };
                if (poll(&p, 1, (int)wait_ms) > 0)
                        drain_inotify(c);
                rd_kafka_poll(c->rk, 0);
                M_SET(c, queue_depth, rd_kafka_outq_len(c->rk));
                M_SET(c, spool_entries, c->spool.count);
                M_SET(c, spool_bytes, c->spool.bytes);
        }
        if (c->fatal)
                return -EIO;
        log_info("collector stopping", "queued=%d spool=%zu", rd_kafka_outq_len(c->rk), c->spool.count);
        if (rd_kafka_flush(c->rk, 10000) != RD_KAFKA_RESP_ERR_NO_ERROR)
                log_warn("stopped before the broker acknowledged everything; the spool keeps final samples",
                         "queued=%d spool=%zu", rd_kafka_outq_len(c->rk), c->spool.count);
        return 0;
}

int collector_metrics_text(const struct collector *c, char *buf, size_t size)
{
        static const struct {
                const char *name, *type, *help;
                size_t offset;
        } rows[] = {
#define ROW(n, t, h) { "tally_collector_" #n, t, h, offsetof(struct collector_metrics, n) }
                ROW(sandboxes, "gauge", "Sandboxes tracked"),
                ROW(sandboxes_transient, "gauge", "Sandboxes read by opening their files (no descriptors to keep)"),
                ROW(samples_total, "counter", "Samples taken"),
                ROW(samples_per_second, "gauge", "Samples taken in the last second"),
                ROW(finals_total, "counter", "Final samples spooled"),
                ROW(deliveries_total, "counter", "Messages the broker acknowledged"),
                ROW(publish_errors_total, "counter", "Messages that could not be queued or delivered"),
                ROW(queue_depth, "gauge", "Messages waiting for the broker"),
                ROW(pending_newest, "gauge", "Sandboxes whose newest sample waits for room in the queue"),
                ROW(spool_entries, "gauge", "Final samples on disk awaiting acknowledgement"),
                ROW(spool_bytes, "gauge", "Bytes of final samples on disk"),
                ROW(tick_duration_us, "gauge", "Duration of the last tick in microseconds"),
                ROW(tick_overruns_total, "counter", "Ticks that took longer than the tick interval"),
                ROW(ticks_total, "counter", "Ticks run"),
                ROW(read_errors_total, "counter", "Counter reads that failed (cgroup gone, unparseable)"),
                ROW(epoch_changes_total, "counter", "Counter restarts seen (new epochs)"),
                ROW(counter_backwards_total, "counter",
                    "Counters that went backwards in the same cgroup (possible tampering; each a new epoch)"),
                ROW(state_save_errors_total, "counter",
                    "Failed writes of a raised epoch or generation (the sandbox's samples wait)"),
                ROW(samples_held_total, "counter", "Readings not published because their epoch or generation was not on disk"),
                ROW(clock_steps_total, "counter", "Wall clock steps seen"),
                ROW(scan_active, "gauge", "1 when each tick reads every cgroup in one BPF walk; 0 when it reads files"),
                ROW(scan_cgroups, "gauge", "Cgroups the last walk saw"),
                ROW(scan_errors_total, "counter", "Walks that failed (those ticks read files)"),
                ROW(file_reads_total, "counter", "Sandbox readings taken from cgroup files rather than the walk"),
                ROW(moment_lock_timeouts_total, "counter",
                    "Ticks that could not take the registry's moment lock within 2 s (sampled without it)"),
#undef ROW
        };
        size_t len = 0;
        for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
                const uint64_t *v = (const uint64_t *)((const char *)&c->m + rows[i].offset);
                int n = snprintf(buf + len, size - len, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", rows[i].name,
                                 rows[i].help, rows[i].name, rows[i].type, rows[i].name,
                                 (unsigned long long)__atomic_load_n(v, __ATOMIC_RELAXED));
                if (n < 0 || (size_t)n >= size - len)
                        return -ENOBUFS;
                len += (size_t)n;
        }
        return (int)len;
}
