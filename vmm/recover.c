/* recover.c — what a starting tally-vmm takes over from the previous run:
 * the registry's records of this host (live sandboxes found again, sandboxes
 * that ended while no tally-vmm watched stopped at the right moment, stopped
 * ones whose clean-up was pending), and cgroups without a record (removed).
 * See lifecycle.h. */
#include "lifecycle.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int unknown_recover(const struct sandbox_record *rec, const struct sandbox_cgroup *cg, const char *dir,
                           struct backend_sandbox **ret)
{
        return -ESRCH;
}
static int unknown_stop(struct backend_sandbox *sb) { return 0; }
static void unknown_free(struct backend_sandbox *sb) {}

/* For records of a backend this build lacks: the cgroup alone ends the sandbox. */
static const struct backend_ops unknown_backend = {
        .name = "unknown",
        .recover = unknown_recover,
        .stop = unknown_stop,
        .free = unknown_free,
};

void vmm_recover(struct vmm *v)
{
        struct sandbox_record *recs = NULL;
        int n = registry_list(v->s.state_dir, &recs);
        if (n < 0) {
                log_error("could not read the registry", "error=\"%s\"", strerror(-n));
                n = 0;
        }
        int found = 0, died = 0;
        for (int i = 0; i < n; i++) {
                struct sandbox_record *rec = &recs[i];
                if (*rec->host && strcmp(rec->host, v->s.host_id) != 0) {
                        log_warn("registry record of another host left alone", "sandbox=%s host=%s", rec->id, rec->host);
                        continue;
                }
                struct sandbox *sb = sandbox_new();
                if (!sb)
                        break;
                sb->rec = *rec;
                memset(rec, 0, sizeof(*rec)); /* the labels move to sb */
                sandbox_dir_path(v->s.state_dir, sb->rec.id, sb->dir, sizeof(sb->dir));
                sandbox_spec_read(sb->dir, &sb->net, &sb->pids_max);
                sb->ops = backend_find(sb->rec.backend);
                if (!sb->ops) {
                        log_warn("sandbox of a backend this build lacks: ending it", "sandbox=%s backend=%s",
                                 sb->rec.id, sb->rec.backend);
                        sb->ops = &unknown_backend;
                }
                cgroup_paths(&v->cgroups, sb->rec.id, &sb->cg);
                /* The held totals and the moment the state began are in the record. */
                sb->moment = moment_of_record(&sb->rec);
                /* Its `created` event again: one still queued when the last tally-vmm ended was
                 * lost with it, and an aggregator bills no reading of a sandbox without it
                 * (docs/events.md, "Provenance"). Aggregators take a repeat as nothing new. */
                events_publish_created(&v->events, sb);
                if (sb->rec.state != STATE_STOPPED) {
                        int r = sb->ops->recover(&sb->rec, &sb->cg, sb->dir, &sb->bs);
                        char why[256];
                        if (r == 0 && vmm_open_egress(v, sb, sb->rec.pid, why, sizeof(why)) < 0)
                                log_error("could not restart a sandbox's egress proxy: it has no internet until it "
                                          "is stopped", "sandbox=%s reason=\"%s\"", sb->rec.id, why);
                        if (r == 0) {
                                /* What was left of the lease when it paused. */
                                if (sb->rec.state == STATE_PAUSED) {
                                        sb->remaining_ns = sb->rec.timeout_ns - sb->moment.wall;
                                        if (sb->rec.state_since_boot_ns <= 0 || sb->remaining_ns <= 0 ||
                                            sb->remaining_ns > v->s.timeout_max_s * NS_PER_SEC)
                                                sb->remaining_ns = 60 * NS_PER_SEC;
                                }
                                sandbox_watch_main(sb);
                                records_insert(&v->table, sb);
                                found++;
                                log_info("sandbox found again", "sandbox=%s state=%s pid=%d", sb->rec.id,
                                         sandbox_state_name(sb->rec.state), (int)sb->rec.pid);
                                continue;
                        }
                        /* It ended while no tally-vmm watched: its counter is still in the cgroup. */
                        died++;
                        records_insert(&v->table, sb);
                        /* A running sandbox whose lease ran out meanwhile was ended by its
                         * own init at the deadline (set_lease): it held nothing after it. */
                        struct moment deadline;
                        bool at_deadline = lease_end_moment(&sb->rec, &deadline);
                        pthread_mutex_lock(&sb->op);
                        vmm_stop_locked(v, sb, "ended_while_vmm_was_down", at_deadline ? &deadline : NULL, NULL, 0);
                        pthread_mutex_unlock(&sb->op);
                        continue;
                }
                sb->stopped_mono = time_mono_ns();
                records_insert(&v->table, sb); /* the tick publishes its stopped event again, then cleans up */
        }
        registry_list_free(recs, n);

        char **ids = NULL;
        int m = cgroup_list_ids(&v->cgroups, &ids);
        for (int i = 0; i < m; i++) {
                struct sandbox *sb = records_get(&v->table, ids[i]);
                if (sb) {
                        sandbox_unref(&v->table, sb);
                        continue;
                }
                struct sandbox_cgroup cg;
                if (cgroup_paths(&v->cgroups, ids[i], &cg) < 0)
                        continue;
                cgroup_kill_all(&cg, KILL_WAIT_MS);
                int r = cgroup_remove(&v->cgroups, &cg);
                log_info("orphaned cgroup removed", "cgroup=%s result=%s", ids[i], r == 0 ? "ok" : strerror(-r));
        }
        cgroup_ids_free(ids, m);
        log_info("registry recovered", "sandboxes=%d ended_meanwhile=%d records=%d", found, died, n);
}
