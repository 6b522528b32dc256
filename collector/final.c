/* final.c — a stopped sandbox's final sample (final_take, engine.h): the
 * counter that is billed last, which must never be lost. It is spooled
 * (fsync'd) before <id>.final tells the vmm it may remove the cgroup, and
 * leaves the spool only on the broker's acknowledgement (publish.h). */
#include "engine.h"
#include "log.h"
#include "metrics.h"
#include "state.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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
void final_take(struct collector *c, struct sandbox *s)
{
        bool marker = final_marker_exists(c, s->id);
        struct spool_entry *e = spool_find(&c->pub.spool, s->id);
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
                if (!encoder_observe(&c->enc, s, s->record_epoch, cpu_ns))
                        return;
                encoder_stamp(&c->enc);
                if (encoder_next_event(&c->enc, s, cpu_ns, NULL) < 0)
                        return;
                /* Dated at the stop itself, not at this tick: a collector that comes back late (or a
                 * record seen a tick later) must not stretch the sandbox's life. Its held time is the
                 * record's frozen totals (encoder_next_event). */
                if (s->state_since_boot_ns > 0 && c->enc.stamp_boot >= s->state_since_boot_ns) {
                        int64_t ago = c->enc.stamp_boot - s->state_since_boot_ns;
                        c->enc.ev.wall_ns = c->enc.stamp_wall - ago;
                        c->enc.ev.mono_ns = c->enc.stamp_mono - ago;
                        if (s->pub_known && c->enc.ev.wall_ns < s->pub_wall_ns)
                                c->enc.ev.wall_ns = s->pub_wall_ns;
                        if (s->pub_known && c->enc.ev.mono_ns < s->pub_mono_ns)
                                c->enc.ev.mono_ns = s->pub_mono_ns;
                }
                int len = encoder_encode(&c->enc);
                if (len < 0) {
                        log_error("could not encode a final sample", "sandbox=%s error=\"%s\"", s->id, strerror(-len));
                        return;
                }
                e = spool_add(&c->pub.spool, s->id, s->account, c->enc.buf, (size_t)len);
                if (!e) {
                        log_error("could not spool a final sample", "sandbox=%s error=\"%m\"", s->id);
                        return;
                }
                encoder_remember(s, &c->enc.ev);
                M_ADD(&c->m, finals_total, 1);
                log_info("final sample", "sandbox=%s account=%s epoch=%llu cpu_ns=%llu running_ns=%llu paused_ns=%llu",
                         s->id, s->account, (unsigned long long)s->track.epoch, (unsigned long long)cpu_ns,
                         (unsigned long long)c->enc.ev.running_ns, (unsigned long long)c->enc.ev.paused_ns);
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
        publish_final(&c->pub, s, e);
        s->finished = true;
        counters_close(&c->counters, s); /* the vmm removes the cgroup now */
}
