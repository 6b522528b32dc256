/* tick.c — tally-vmm's background thread: every 50 ms it serves the
 * producer's delivery callbacks and runs the tick, which stops sandboxes whose
 * lease ran out or whose main process ended on its own, publishes again a
 * stopped event the broker did not take, rewrites records behind their
 * sandbox, and removes stopped sandboxes whose final counter is safe (the
 * broker acknowledged their stopped event and the collector took its final
 * sample, or final_wait_ms passed). See lifecycle.h. */
#include "lifecycle.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* False once pid has exited (gone, or a zombie not yet reaped). */
static bool process_alive(pid_t pid)
{
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "re");
        if (!f)
                return errno != ENOENT && errno != ESRCH; /* out of descriptors is not a death */
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *paren = strrchr(buf, ')');
        return !paren || (paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X');
}

/* Stops sandboxes whose lease ran out or whose main process ended on its own;
 * removes stopped ones whose final counter is safe. */
static void tick(struct vmm *v)
{
        struct sandbox **all;
        int n = records_snapshot(&v->table, &all);
        if (n < 0)
                return;
        int64_t now = time_wall_ns(), mono = time_mono_ns();
        /* Liveness once a second is plenty: a dead sandbox burns nothing. */
        static int64_t last_alive_check;
        bool check_alive = mono - last_alive_check >= NS_PER_SEC;
        if (check_alive)
                last_alive_check = mono;
        /* Which main processes ended: one poll over every pidfd. */
        struct pollfd *ended = calloc((size_t)n + 1, sizeof(*ended));
        if (ended) {
                pthread_mutex_lock(&v->table.lock);
                for (int i = 0; i < n; i++)
                        ended[i] = (struct pollfd){ all[i]->rec.state == STATE_STOPPED ? -1 : all[i]->pidfd, POLLIN, 0 };
                pthread_mutex_unlock(&v->table.lock);
                if (poll(ended, (nfds_t)n, 0) < 0)
                        memset(ended, 0, ((size_t)n + 1) * sizeof(*ended));
        }
        for (int i = 0; i < n; i++) {
                struct sandbox *sb = all[i];
                bool gone = ended && (ended[i].revents & (POLLIN | POLLHUP));
                pthread_mutex_lock(&v->table.lock);
                enum sandbox_state st = sb->rec.state;
                bool expired = st == STATE_RUNNING && sb->rec.timeout_ns > 0 && sb->rec.timeout_ns <= now;
                pid_t pid = sb->rec.pid;
                bool republish = st == STATE_STOPPED && !sb->stop_published;
                bool acked = sb->stop_acked;
                int64_t since = mono - sb->stopped_mono;
                /* A record behind its sandbox is rewritten once a second until it holds. */
                if (sb->record_dirty && check_alive)
                        records_save(&v->table, sb);
                bool dirty = sb->record_dirty;
                pthread_mutex_unlock(&v->table.lock);
                if (expired || (st != STATE_STOPPED && pid > 0 && (gone || (check_alive && !process_alive(pid))))) {
                        /* A sandbox still running at its deadline is stopped now; one
                         * found already ended after it was ended by its lease then. */
                        pthread_mutex_lock(&sb->op);
                        pthread_mutex_lock(&v->table.lock);
                        struct sandbox_record rec = sb->rec;
                        pthread_mutex_unlock(&v->table.lock);
                        bool alive = pid > 0 && process_alive(pid);
                        struct moment deadline;
                        bool at_deadline = !alive && lease_end_moment(&rec, &deadline);
                        if (rec.state == STATE_RUNNING && rec.timeout_ns > 0 && rec.timeout_ns <= now)
                                vmm_stop_locked(v, sb, "timeout", at_deadline ? &deadline : NULL, NULL, 0);
                        else if (rec.state != STATE_STOPPED && !alive)
                                vmm_stop_locked(v, sb, "main_process_ended", at_deadline ? &deadline : NULL, NULL, 0);
                        pthread_mutex_unlock(&sb->op);
                        continue;
                }
                if (republish) {
                        events_publish_stopped(&v->events, sb);
                        continue;
                }
                /* The collector takes its final sample when the record says stopped. */
                if (st != STATE_STOPPED || !acked || dirty)
                        continue;
                char final[PATH_MAX];
                snprintf(final, sizeof(final), "%s/" REGISTRY_DIR "/%s.final", v->s.state_dir, sb->rec.id);
                bool collected = access(final, F_OK) == 0;
                if (!collected && since < v->s.final_wait_ms * NS_PER_MS)
                        continue;
                int r = cgroup_remove(&v->cgroups, &sb->cg);
                if (r < 0) {
                        log_warn("could not remove a stopped sandbox's cgroup", "sandbox=%s error=\"%s\"", sb->rec.id,
                                 strerror(-r));
                        continue;
                }
                registry_remove(v->s.state_dir, sb->rec.id);
                unlink(final);
                sandbox_remove_dir(sb->dir);
                log_info("sandbox removed", "sandbox=%s collector=%s", sb->rec.id, collected ? "yes" : "timed_out");
                records_unlink(&v->table, sb);
        }
        free(ended);
        records_snapshot_free(&v->table, all, n);
}

static void *background(void *arg)
{
        struct vmm *v = arg;
        while (!atomic_load(&v->quit)) {
                events_poll(&v->events, 50);
                tick(v);
        }
        return NULL;
}

int vmm_tick_start(struct vmm *v)
{
        if (pthread_create(&v->thread, NULL, background, v) != 0)
                return -EAGAIN;
        v->thread_started = true;
        return 0;
}

void vmm_tick_stop(struct vmm *v)
{
        atomic_store(&v->quit, true);
        if (v->thread_started)
                pthread_join(v->thread, NULL);
        v->thread_started = false;
}
