/* records.c — taking in the vmm's registry records (registry.h): a sandbox
 * found, changed, stopped (its final sample: final.c) or gone. Everything
 * here runs outside the tick's hot path: it may open files, walk a disk
 * folder (its usage, by descriptor: beneath.h) or fsync. */
#include "engine.h"
#include "beneath.h"
#include "log.h"
#include "metrics.h"
#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static void remove_sandbox(struct collector *c, struct sandbox *s, const char *why)
{
        if (!s->finished)
                log_info("sandbox left the registry without a final sample from this collector",
                         "sandbox=%s reason=%s", s->id, why);
        table_remove(&c->table, s);
        publish_forget(&c->pub, s);
        state_remove_epoch(c->state_dir, s->id);
        counters_close(&c->counters, s);
        sandbox_free(s);
        M_SET(&c->m, sandboxes, c->table.n);
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

/* Takes in a registry record: a new sandbox, a changed one, or a stopped one. */
static int load_record(struct collector *c, struct sandbox_record *rec)
{
        struct sandbox *s = table_find(&c->table, rec->id);
        bool fresh = !s;
        if (fresh) {
                int r = table_add(&c->table, rec->id, &s);
                if (r < 0)
                        return r;
                uint64_t saved_epoch = 0, saved_record = 0;
                r = state_load_epoch(c->state_dir, s->id, &saved_epoch, &saved_record);
                if (r < 0)
                        log_warn("could not read a saved epoch", "sandbox=%s error=\"%s\"", s->id, strerror(-r));
                epoch_track_init(&s->track, rec->epoch, saved_epoch, saved_record);
                s->seq = (struct seq_track){ c->enc.generation, c->opt.seq_start };
                M_SET(&c->m, sandboxes, c->table.n);
        }
        memcpy(s->account, rec->account, sizeof(s->account));
        s->partition_of = 0; /* its partition worked out again (publish.h) */
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
                counters_close(&c->counters, s);
        s->cgroup_version = rec->cgroup_version;
        if (fresh)
                log_info("sandbox found", "sandbox=%s account=%s state=%s cgroup_version=%d epoch=%llu", s->id,
                         s->account, sandbox_state_name(s->state), s->cgroup_version,
                         (unsigned long long)s->track.epoch);
        if (s->state != STATE_STOPPED && s->files.version == 0)
                counters_open(&c->counters, s);
        if (s->state == STATE_STOPPED && !s->finished)
                final_take(c, s);
        return 0;
}

/* Takes in every record of a full read; a sandbox no record names any more is gone. */
static int apply_list(struct collector *c, struct sandbox_record *recs, int n)
{
        bool *seen = calloc(c->table.n + (size_t)n + 1, sizeof(*seen));
        if (!seen)
                return -ENOMEM;
        for (int i = 0; i < n; i++) {
                int r = load_record(c, &recs[i]);
                struct sandbox *s = table_find(&c->table, recs[i].id);
                if (r < 0)
                        log_error("could not track a sandbox", "sandbox=%s error=\"%s\"", recs[i].id, strerror(-r));
                else if (s)
                        seen[s->index] = true;
        }
        for (size_t i = c->table.n; i-- > 0;)
                if (!seen[i])
                        remove_sandbox(c, c->table.list[i], "record removed");
        free(seen);
        return 0;
}

/* Acts on what watch_collect read, in the order read. The tick's clocks are
 * kept: a final sample taken here reads its own. */
void records_apply(struct collector *c)
{
        int64_t wall = c->enc.stamp_wall, mono = c->enc.stamp_mono, boot = c->enc.stamp_boot;
        if (c->watch.full_read && apply_list(c, c->watch.listed, c->watch.nlisted) < 0)
                log_error("could not take in the registry", "error=\"%s\"", strerror(ENOMEM));
        for (size_t i = 0; i < c->watch.nchanged; i++) {
                struct changed_record *ch = &c->watch.changed[i];
                struct sandbox *s;
                int r;
                if (ch->gone) {
                        if ((s = table_find(&c->table, ch->id)))
                                remove_sandbox(c, s, "record removed");
                } else if ((r = load_record(c, &ch->rec)) < 0) {
                        log_error("could not track a sandbox", "sandbox=%s error=\"%s\"", ch->id, strerror(-r));
                }
        }
        watch_clear(&c->watch);
        c->enc.stamp_wall = wall, c->enc.stamp_mono = mono, c->enc.stamp_boot = boot;
}

int records_rescan(struct collector *c)
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
