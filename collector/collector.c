/* collector.c — tally-collector's engine (collector.h): start, stop, and the
 * tick loop that reads every live sandbox once per tick. Its modules are
 * listed in engine.h.
 *
 * The hot path (sample_all) makes one pread per counter file, encodes into a
 * reused buffer and hands a copy to librdkafka: no open, no allocation. All
 * registry work (reading records, opening files, taking final samples) happens
 * outside it, when inotify says a record changed (records.c). */
#include "collector.h"
#include "daemon.h"
#include "engine.h"
#include "log.h"
#include "metrics.h"
#include "registry.h"
#include "state.h"
#include "timeutil.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Between ticks: records are taken in as soon as they change, so the tick's
 * locked read finds little left to read. */
static void drain_inotify(struct collector *c)
{
        watch_collect(&c->watch);
        records_apply(c);
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
                M_ADD(&c->m, moment_lock_timeouts_total, 1);
                if (!c->lock_timed_out)
                        log_warn("could not take the registry's moment lock: sampling without it (held time may run "
                                 "past a moment until its record is read)", "wait_ms=%d error=\"%s\"",
                                 REGISTRY_MOMENT_WAIT_MS, strerror(-lock));
                c->lock_timed_out = true;
        } else if (c->lock_timed_out) {
                log_info("the registry's moment lock is taken again", "timeouts_total=%llu",
                         (unsigned long long)M_GET(&c->m, moment_lock_timeouts_total));
                c->lock_timed_out = false;
        }
        encoder_stamp(&c->enc);
        watch_collect(&c->watch);
        registry_moment_end(lock);
        records_apply(c);
}

/* At 10,000s of sandboxes, each sandbox's struct and its walk records are
 * cache misses at every tick, taken one after another by the loop below. So
 * the loop asks for them ahead of time: the structs PREFETCH_FAR places ahead,
 * and, once a struct is in (it says where they are), its records
 * PREFETCH_NEAR places ahead. Hints only: nothing is read early. */
#define PREFETCH_FAR 8
#define PREFETCH_NEAR 4

static void prefetch_ahead(const struct collector *c, size_t i)
{
        if (i + PREFETCH_FAR < c->table.n) {
                const char *s = (const char *)c->table.list[i + PREFETCH_FAR];
                for (size_t off = 0; off < sizeof(struct sandbox); off += 64)
                        __builtin_prefetch(s + off);
        }
        if (i + PREFETCH_NEAR < c->table.n)
                counters_prefetch(&c->counters, c->table.list[i + PREFETCH_NEAR]);
}

/* One tick: a reading of every live sandbox. */
static void sample_all(struct collector *c)
{
        publish_pending(&c->pub, &c->table);
        tick_records(c); /* the clocks and the records, then the counters */
        encoder_follow_clock(&c->enc);
        counters_scan_tick(&c->counters, c->opt.read_peak && c->ticks % (uint64_t)c->opt.peak_every == 0);
        uint64_t samples = 0, errors = 0, file_reads = 0;
        for (size_t i = 0; i < c->table.n; i++) {
                struct sandbox *s = c->table.list[i];
                prefetch_ahead(c, i);
                if (s->finished || s->state == STATE_STOPPED || s->starting)
                        continue;
                if (s->files.version == 0 && counters_open(&c->counters, s) < 0)
                        continue; /* not there (yet, or any more) */
                struct cgroup_reading rd;
                bool scanned = counters_read_scanned(&c->counters, s, &rd);
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
                        counters_close(&c->counters, s);
                        continue;
                }
                /* Read from files: staggered, so each tick reads the peaks of 1/peak_every of the
                 * sandboxes. The scan reads every peak each peak_every ticks. */
                if (s->files.peak_path && (!s->peak_read || (!scanned && (c->ticks + i) % (uint64_t)c->opt.peak_every == 0)) &&
                    cgroup_files_read_peak(&s->files, &s->peak_bytes) < 0)
                        errors++;
                s->peak_read = true;
                s->gone_logged = false;
                if (!encoder_observe(&c->enc, s, s->record_epoch, rd.cpu_ns) ||
                    encoder_next_event(&c->enc, s, rd.cpu_ns, &rd) < 0)
                        continue; /* its state is not on disk: held, counted */
                if (c->pub.v2 && publish_batched(&c->pub, s, &c->enc.ev) == 0) {
                        encoder_remember(s, &c->enc.ev);
                        samples++;
                        continue;
                }
                int len = encoder_encode(&c->enc);
                if (len < 0) {
                        errors++;
                        continue;
                }
                encoder_remember(s, &c->enc.ev);
                publish_sample(&c->pub, s, c->enc.buf, len);
                samples++;
        }
        publish_batches(&c->pub);
        /* Final samples that could not be taken when the record said stopped (state not on
         * disk, spool full): again, after this tick's readings, which share its stamp. */
        for (size_t i = 0; i < c->table.n; i++)
                if (c->table.list[i]->state == STATE_STOPPED && !c->table.list[i]->finished)
                        final_take(c, c->table.list[i]);
        M_ADD(&c->m, samples_total, samples);
        M_ADD(&c->m, read_errors_total, errors);
        M_ADD(&c->m, file_reads_total, file_reads);
        M_SET(&c->m, pending_newest, c->pub.npending);
        publish_spool(&c->pub, &c->table);
        c->ticks++;
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
        c->watch.fd = -1;
        c->pub.wake_fd = -1;
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
        if ((r = encoder_init(&c->enc, c->state_dir, c->host_id, &c->m)) < 0) {
                snprintf(err, errlen, "could not store the start generation in %s/" COLLECTOR_DIR ": %s",
                         c->state_dir, strerror(-r));
                goto fail;
        }
        if ((r = publisher_open_spool(&c->pub, c->state_dir, c->host_id, &c->m)) < 0) {
                snprintf(err, errlen, "could not open the spool: %s", strerror(-r));
                goto fail;
        }
        if ((r = watch_open(&c->watch, c->state_dir, c->registry_dir)) < 0) {
                snprintf(err, errlen, "could not watch %s: %s", c->registry_dir, strerror(-r));
                goto fail;
        }
        if ((r = counters_init(&c->counters, opt->cgroup_reader, opt->read_peak, &c->m, err, errlen)) < 0 ||
            (r = publisher_connect(&c->pub, opt, err, errlen)) < 0)
                goto fail;
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
        publisher_close(&c->pub);
        table_free(&c->table);
        watch_close(&c->watch);
        counters_free(&c->counters);
        free(c);
}

int collector_run(struct collector *c, volatile sig_atomic_t *stop)
{
        const int64_t tick_ns = c->opt.tick_ms * NS_PER_MS;
        int r = records_rescan(c);
        if (r < 0)
                return r;
        log_info("collector running",
                 "host=%s sandboxes=%zu generation=%u tick_ms=%lld spool=%zu fd_budget=%zu cgroup_reader=%s",
                 c->host_id, c->table.n, c->enc.generation, (long long)c->opt.tick_ms, c->pub.spool.count,
                 c->counters.fd_budget, c->counters.scan ? "scan" : "files");
        int64_t next_tick = time_mono_ns();
        int64_t next_rescan = next_tick + c->opt.rescan_s * NS_PER_SEC;
        int64_t second_start = next_tick;
        uint64_t second_samples = 0;
        while (!*stop && !c->pub.fatal) {
                int64_t now = time_mono_ns();
                if (now >= next_tick) {
                        sample_all(c);
                        int64_t done = time_mono_ns();
                        M_SET(&c->m, tick_duration_us, (done - now) / NS_PER_US);
                        M_ADD(&c->m, ticks_total, 1);
                        bool overran;
                        next_tick = tick_next(next_tick, tick_ns, done, &overran);
                        if (overran) {
                                M_ADD(&c->m, tick_overruns_total, 1);
                                log_warn("tick overran its interval", "duration_us=%lld tick_ms=%lld",
                                         (long long)((done - now) / NS_PER_US), (long long)c->opt.tick_ms);
                        }
                        if (done - second_start >= NS_PER_SEC) {
                                uint64_t total = M_GET(&c->m, samples_total);
                                M_SET(&c->m, samples_per_second,
                                      (total - second_samples) * (uint64_t)NS_PER_SEC / (uint64_t)(done - second_start));
                                second_samples = total;
                                second_start = done;
                        }
                }
                if (now >= next_rescan) {
                        records_rescan(c);
                        next_rescan = now + c->opt.rescan_s * NS_PER_SEC;
                }
                daemon_memory_trim(now); /* at most every DAEMON_TRIM_INTERVAL_S */
                /* Asleep until the tick, a record changing, or librdkafka having
                 * something to serve (delivery reports: the publisher's wake_fd), and
                 * at least once a second, for a stop signal another thread took. */
                int64_t until = next_tick < next_rescan ? next_tick : next_rescan;
                int64_t wait_ms = (until - time_mono_ns() + NS_PER_MS - 1) / NS_PER_MS;
                if (wait_ms > 1000)
                        wait_ms = 1000;
                if (wait_ms < 0)
                        wait_ms = 0;
                struct pollfd p[] = { { c->watch.fd, POLLIN, 0 }, { c->pub.wake_fd, POLLIN, 0 } };
                if (poll(p, 2, (int)wait_ms) > 0 && (p[0].revents & POLLIN))
                        drain_inotify(c);
                publisher_poll(&c->pub);
        }
        if (c->pub.fatal)
                return -EIO;
        publisher_flush(&c->pub, 10000);
        return 0;
}
