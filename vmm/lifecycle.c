/* lifecycle.c — what tally-vmm does to a sandbox that exists: exec, pause,
 * resume, stop, a new lease, and what it shows of it (show, list, status);
 * and the control topic's commands. See vmm.h and lifecycle.h. */
#include "lifecycle.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int vmm_open_egress(struct vmm *v, struct sandbox *sb, pid_t pid, char *why, size_t whylen)
{
        if (!sb->net.internet || sb->egress)
                return 0;
        return egress_open(&v->s.egress, sb->rec.id, pid, sb->dir, &sb->net, &sb->egress, why, whylen);
}

int vmm_set_lease(struct sandbox *sb, int64_t deadline_wall_ns)
{
        if (!sb->ops->set_lease || !sb->bs)
                return 0;
        int r = sb->ops->set_lease(sb->bs, deadline_wall_ns);
        if (r < 0)
                log_error("could not set a sandbox's lease", "sandbox=%s deadline_ns=%lld error=\"%s\"", sb->rec.id,
                          (long long)deadline_wall_ns, strerror(-r));
        return r;
}

/* The counters the egress proxy left in the sandbox's folder; 0 if none. */
static void read_net_counters(const char *dir, uint64_t *ret_rx, uint64_t *ret_tx)
{
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/" SANDBOX_NET_FILE, dir);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        *ret_rx = *ret_tx = 0;
        if (fd >= 0) {
                sandbox_net_read(fd, ret_rx, ret_tx);
                close(fd);
        }
}

json_t *vmm_describe(struct vmm *v, struct sandbox *sb)
{
        pthread_mutex_lock(&v->table.lock);
        const struct sandbox_record *r = &sb->rec;
        json_t *labels = json_object();
        for (size_t i = 0; i < r->nlabels; i++)
                json_object_set_new(labels, r->labels[i].key, json_string(r->labels[i].value));
        json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:o, s:i, s:s, s:s, "
                              "s:i, s:s, s:o}",
                              "id", r->id, "account", r->account, "key", r->key, "host", r->host, "backend",
                              r->backend, "state", sandbox_state_name(r->state), "vcpus", (json_int_t)r->vcpus,
                              "memory_mib", (json_int_t)(r->mem_size_bytes >> 20), "disk_mib",
                              (json_int_t)(r->disk_size_bytes >> 20), "created_ns", (json_int_t)r->created_ns,
                              "deadline_ns", (json_int_t)r->timeout_ns, "network", net_policy_json(&sb->net), "cgroup_version",
                              r->cgroup_version, "cgroup_cpu", r->cgroup_cpu, "cgroup_memory", r->cgroup_memory,
                              "pid", (int)r->pid, "dir", sb->dir, "labels", labels);
        if (*r->parent)
                json_object_set_new(j, "parent", json_string(r->parent));
        bool stopped = r->state == STATE_STOPPED;
        uint64_t final = r->final_cpu_ns, running, paused;
        registry_held_at(r, time_boot_ns(), &running, &paused);
        json_object_set_new(j, "running_ns", json_integer((json_int_t)running));
        json_object_set_new(j, "paused_ns", json_integer((json_int_t)paused));
        if (sb->record_dirty)
                json_object_set_new(j, "record_pending", json_true());
        uint64_t rx, tx;
        egress_counts(sb->egress, &rx, &tx);
        if (sb->net.internet && !sb->egress)
                read_net_counters(sb->dir, &rx, &tx); /* stopped: what the proxy counted in all */
        json_object_set_new(j, "net_rx_bytes", json_integer((json_int_t)rx));
        json_object_set_new(j, "net_tx_bytes", json_integer((json_int_t)tx));
        pthread_mutex_unlock(&v->table.lock);
        uint64_t cpu = final;
        if (stopped || cgroup_cpu_ns(&sb->cg, &cpu) == 0)
                json_object_set_new(j, "cpu_ns", json_integer((json_int_t)cpu));
        if (stopped)
                json_object_set_new(j, "final_cpu_ns", json_integer((json_int_t)final));
        /* Measured memory (not billed: held memory is memory_mib), read from the
         * cgroup now while it runs or is paused; the kernel's names for them
         * are in cgroup.h. A file the kernel lacks leaves its field out. */
        uint64_t mem, peak;
        if (!stopped && cgroup_memory_bytes(&sb->cg, &mem) == 0)
                json_object_set_new(j, "mem_bytes", json_integer((json_int_t)mem));
        if (!stopped && cgroup_memory_peak_bytes(&sb->cg, &peak) == 0)
                json_object_set_new(j, "mem_peak_bytes", json_integer((json_int_t)peak));
        return j;
}

struct sandbox *vmm_find(struct vmm *v, const char *id, char *why, size_t whylen)
{
        struct sandbox *sb = event_id_valid(id) ? records_get(&v->table, id) : NULL;
        if (!sb)
                snprintf(why, whylen, "no sandbox %.64s on this host", id);
        return sb;
}

static int exec_in(struct vmm *v, const char *id, const struct exec_request *req, struct exec_result *ret, char *why,
                   size_t whylen)
{
        struct sandbox *sb = vmm_find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        pthread_mutex_lock(&v->table.lock);
        enum sandbox_state st = sb->rec.state;
        pthread_mutex_unlock(&v->table.lock);
        int r;
        if (st != STATE_RUNNING) {
                snprintf(why, whylen, "sandbox %s is %s: %s", id, sandbox_state_name(st),
                         st == STATE_PAUSED ? "resume it first" : "it cannot run commands any more");
                r = -EBUSY;
                goto out;
        }
        struct exec_request mine = *req;
        mine.cancel = &v->stopping;
        if (!sb->ops->concurrent_exec)
                pthread_mutex_lock(&sb->exec_lock);
        r = sb->ops->exec(sb->bs, &mine, ret, why, whylen);
        if (!sb->ops->concurrent_exec)
                pthread_mutex_unlock(&sb->exec_lock);
out:
        sandbox_unref(&v->table, sb);
        return r;
}

int vmm_exec(struct vmm *v, const char *id, const struct exec_request *req, struct exec_result *ret, char *why,
             size_t whylen)
{
        int64_t start = time_mono_ns();
        int r = exec_in(v, id, req, ret, why, whylen);
        vmm_op_done(&v->metrics.execs, start, r);
        return r;
}

int vmm_pause_locked(struct vmm *v, struct sandbox *sb, const char *reason, char *why, size_t whylen)
{
        pthread_mutex_lock(&v->table.lock);
        enum sandbox_state st = sb->rec.state;
        pthread_mutex_unlock(&v->table.lock);
        if (st == STATE_PAUSED)
                return 0;
        if (st == STATE_STOPPED) {
                snprintf(why, whylen, "sandbox %s is stopped", sb->rec.id);
                return -EBUSY;
        }
        int r = sb->ops->pause ? sb->ops->pause(sb->bs) : 0;
        if (r == 0)
                r = cgroup_freeze(&sb->cg, FREEZE_WAIT_MS);
        if (r < 0) {
                snprintf(why, whylen, "could not freeze sandbox %s: %s", sb->rec.id, strerror(-r));
                cgroup_thaw(&sb->cg, FREEZE_WAIT_MS);
                if (sb->ops->resume)
                        sb->ops->resume(sb->bs);
                return r;
        }
        /* The freeze has completed: from here on the sandbox is paused. */
        int lock = moment_begin(v->s.state_dir, sb->rec.id);
        struct moment m = moment_now();
        pthread_mutex_lock(&v->table.lock);
        registry_set_state(&sb->rec, STATE_PAUSED, m.boot);
        sb->moment = m;
        sb->remaining_ns = sb->rec.timeout_ns - m.wall;
        if (sb->remaining_ns < 0)
                sb->remaining_ns = 0;
        r = records_save(&v->table, sb);
        pthread_mutex_unlock(&v->table.lock);
        moment_end(lock);
        events_publish_simple(&v->events, sb, EVENT_PAUSED);
        log_info("sandbox paused", "sandbox=%s reason=%s", sb->rec.id, reason ? reason : "request");
        return r < 0 ? record_failed(sb, r, "paused", why, whylen) : 0;
}

int vmm_pause(struct vmm *v, const char *id, const char *reason, char *why, size_t whylen)
{
        struct sandbox *sb = vmm_find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        pthread_mutex_lock(&sb->op);
        int r = vmm_pause_locked(v, sb, reason, why, whylen);
        pthread_mutex_unlock(&sb->op);
        sandbox_unref(&v->table, sb);
        return r;
}

int vmm_resume(struct vmm *v, const char *id, char *why, size_t whylen)
{
        struct sandbox *sb = vmm_find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        int r = 0;
        char account[EVENT_ID_MAX + 1], key[EVENT_ID_MAX + 1];
        pthread_mutex_lock(&sb->op);
        pthread_mutex_lock(&v->table.lock);
        enum sandbox_state st = sb->rec.state;
        snprintf(account, sizeof(account), "%s", sb->rec.account);
        snprintf(key, sizeof(key), "%s", sb->rec.key);
        int64_t remaining = sb->remaining_ns > 0 ? sb->remaining_ns : 60 * NS_PER_SEC;
        pthread_mutex_unlock(&v->table.lock);
        if (st == STATE_RUNNING)
                goto out;
        if (st == STATE_STOPPED) {
                snprintf(why, whylen, "sandbox %s is stopped", id);
                r = -EBUSY;
                goto out;
        }
        /* A resume starts the sandbox burning again: refused like a create while
         * the key is blocked for today (invariant 5). */
        if ((r = spend_limits_check_key(&v->spend, account, key, why, whylen)) < 0)
                goto out;
        /* The lease did not run down while paused. It is handed to the sandbox
         * before it thaws, so its own init never acts on the old deadline. */
        int64_t deadline = time_wall_ns() + remaining;
        if ((r = vmm_set_lease(sb, deadline)) < 0) {
                snprintf(why, whylen, "could not renew sandbox %s's lease: %s", id, strerror(-r));
                goto out;
        }
        if ((r = cgroup_thaw(&sb->cg, FREEZE_WAIT_MS)) < 0) {
                snprintf(why, whylen, "could not resume sandbox %s: %s", id, strerror(-r));
                goto out;
        }
        /* Thawed: from here on the sandbox runs. The record is written before the backend's own
         * resume (a QMP round trip for qemu), so the moment lock is never held across it. */
        int lock = moment_begin(v->s.state_dir, id);
        struct moment m = moment_now();
        pthread_mutex_lock(&v->table.lock);
        registry_set_state(&sb->rec, STATE_RUNNING, m.boot);
        sb->moment = m;
        sb->rec.timeout_ns = deadline;
        r = records_save(&v->table, sb);
        pthread_mutex_unlock(&v->table.lock);
        moment_end(lock);
        int rb;
        if (sb->ops->resume && (rb = sb->ops->resume(sb->bs)) < 0)
                log_error("could not resume a sandbox's backend after the thaw", "sandbox=%s error=\"%s\"", id,
                          strerror(-rb));
        events_publish_simple(&v->events, sb, EVENT_RESUMED);
        log_info("sandbox resumed", "sandbox=%s", id);
        if (r < 0)
                r = record_failed(sb, r, "running", why, whylen);
out:
        pthread_mutex_unlock(&sb->op);
        sandbox_unref(&v->table, sb);
        return r;
}

int vmm_stop_locked(struct vmm *v, struct sandbox *sb, const char *reason, const struct moment *at, char *why,
                    size_t whylen)
{
        pthread_mutex_lock(&v->table.lock);
        enum sandbox_state st = sb->rec.state;
        pid_t init = sb->rec.pid;
        pthread_mutex_unlock(&v->table.lock);
        if (st == STATE_STOPPED)
                return 0;
        int r;
        /* A frozen process cannot die, so a backend waiting for it would wait forever:
         * a paused sandbox is killed through its cgroup (which thaws it) first. */
        if (st == STATE_PAUSED && (r = cgroup_kill_all(&sb->cg, KILL_WAIT_MS)) < 0)
                log_error("could not empty a paused sandbox's cgroup", "sandbox=%s error=\"%s\"", sb->rec.id,
                          strerror(-r));
        if (sb->bs)
                sb->ops->stop(sb->bs);
        /* Its proxy's last counters are in the folder before the record says stopped (the
         * collector's final sample reads them). */
        pthread_mutex_lock(&v->table.lock);
        struct egress *eg = sb->egress;
        sb->egress = NULL;
        pthread_mutex_unlock(&v->table.lock);
        egress_close(eg);
        r = cgroup_kill_all(&sb->cg, KILL_WAIT_MS);
        if (r < 0)
                log_error("could not empty a sandbox's cgroup", "sandbox=%s error=\"%s\"", sb->rec.id, strerror(-r));
        /* Gone from cgroup.procs is not gone: a dying task is charged the rest of
         * its exit until it is released. The daemon that started the sandbox
         * waited for its init, and so for its whole pid namespace; a restarted
         * one cannot, and saw cgroup.procs empty up to 3 ms of CPU before the
         * kernel's final counter. So the final counter is read once every task
         * is released, and that is the stop's moment: from here on the sandbox
         * holds nothing. (Not under the moment lock: the collector's tick must
         * not wait for it.) */
        uint64_t cpu = 0;
        if ((r = cgroup_cpu_final(&sb->cg, init, RELEASE_WAIT_MS, &cpu)) == -EAGAIN)
                log_warn("a stopped sandbox's tasks were not seen released; its final CPU counter is the one that held "
                         "still", "sandbox=%s cpu_ns=%" PRIu64, sb->rec.id, cpu);
        else if (r < 0)
                log_error("could not read a stopped sandbox's CPU counter", "sandbox=%s error=\"%s\"", sb->rec.id,
                          strerror(-r));
        int lock = moment_begin(v->s.state_dir, sb->rec.id);
        struct moment m = at ? *at : moment_now();
        pthread_mutex_lock(&v->table.lock);
        registry_set_state(&sb->rec, STATE_STOPPED, m.boot);
        sb->moment = m;
        if (cpu > sb->rec.final_cpu_ns)
                sb->rec.final_cpu_ns = cpu;
        sb->stopped_mono = time_mono_ns();
        r = records_save(&v->table, sb);
        pthread_mutex_unlock(&v->table.lock);
        moment_end(lock);
        events_publish_stopped(&v->events, sb);
        log_info("sandbox stopped", "sandbox=%s reason=%s final_cpu_ns=%" PRIu64 " running_ns=%" PRIu64
                 " paused_ns=%" PRIu64, sb->rec.id, reason, sb->rec.final_cpu_ns, sb->rec.running_ns,
                 sb->rec.paused_ns);
        return r < 0 ? record_failed(sb, r, "stopped", why, whylen) : 0;
}

int vmm_stop(struct vmm *v, const char *id, const char *reason, char *why, size_t whylen)
{
        struct sandbox *sb = vmm_find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        pthread_mutex_lock(&sb->op);
        int r = vmm_stop_locked(v, sb, reason ? reason : "request", NULL, why, whylen);
        pthread_mutex_unlock(&sb->op);
        sandbox_unref(&v->table, sb);
        return r;
}

int vmm_set_timeout(struct vmm *v, const char *id, int64_t timeout_s, char *why, size_t whylen)
{
        if (timeout_s < 1 || timeout_s > v->s.timeout_max_s) {
                snprintf(why, whylen, "timeout_s must be from 1 to %lld", (long long)v->s.timeout_max_s);
                return -EINVAL;
        }
        struct sandbox *sb = vmm_find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        int r = 0;
        pthread_mutex_lock(&sb->op);
        pthread_mutex_lock(&v->table.lock);
        enum sandbox_state st = sb->rec.state;
        pthread_mutex_unlock(&v->table.lock);
        int64_t deadline = time_wall_ns() + timeout_s * NS_PER_SEC;
        if (st == STATE_STOPPED) {
                snprintf(why, whylen, "sandbox %s is stopped", id);
                r = -EBUSY;
                goto out;
        }
        /* A paused sandbox gets its lease when it resumes (it does not run down meanwhile). */
        if (st == STATE_RUNNING && (r = vmm_set_lease(sb, deadline)) < 0) {
                snprintf(why, whylen, "could not set sandbox %s's lease: %s", id, strerror(-r));
                goto out;
        }
        pthread_mutex_lock(&v->table.lock);
        sb->rec.timeout_ns = deadline;
        sb->remaining_ns = timeout_s * NS_PER_SEC;
        r = records_save(&v->table, sb);
        pthread_mutex_unlock(&v->table.lock);
        if (r < 0) {
                snprintf(why, whylen, "sandbox %s's lease was changed, but its registry record could not be written "
                         "(%s); tally-vmm keeps retrying", id, strerror(-r));
                r = -EIO;
        }
out:
        pthread_mutex_unlock(&sb->op);
        sandbox_unref(&v->table, sb);
        return r;
}

int vmm_show(struct vmm *v, const char *id, json_t **ret, char *why, size_t whylen)
{
        struct sandbox *sb = vmm_find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        *ret = vmm_describe(v, sb);
        sandbox_unref(&v->table, sb);
        return 0;
}

json_t *vmm_list(struct vmm *v, const char *account)
{
        json_t *list = json_array();
        struct sandbox **all;
        int n = records_snapshot(&v->table, &all);
        if (n < 0)
                return list;
        for (int i = 0; i < n; i++)
                if (!account || strcmp(all[i]->rec.account, account) == 0)
                        json_array_append_new(list, vmm_describe(v, all[i]));
        records_snapshot_free(&v->table, all, n);
        return list;
}

json_t *vmm_status(struct vmm *v)
{
        int n = records_count(&v->table);
        bool ready = atomic_load(&v->events.control_ready);
        struct capacity cap;
        struct capacity_use p;
        vmm_capacity_report(v, &cap, &p, NULL);
        const struct capacity_use *lim = &cap.limit;
        /* (what tally-api places creates by: the most that may be promised, and what is) */
        return json_pack("{s:s, s:i, s:s, s:s, s:s, s:b, s:i, s:b, s:{s:I, s:I, s:I}, s:{s:I, s:I, s:I}}", "host",
                         v->s.host_id, "cgroup_version", v->cgroups.version, "cgroup_parent", v->cgroups.parent,
                         "backend_default", v->default_backend->name, "backend_reason", v->default_reason,
                         "control_ready", ready, "sandboxes", n, "spend_limit_check", spend_limits_enabled(&v->spend),
                         "capacity", "vcpus", (json_int_t)lim->vcpus, "memory_mib", (json_int_t)(lim->mem_bytes >> 20),
                         "disk_mib", (json_int_t)(lim->disk_bytes >> 20), "promised", "vcpus", (json_int_t)p.vcpus,
                         "memory_mib", (json_int_t)(p.mem_bytes >> 20), "disk_mib", (json_int_t)(p.disk_bytes >> 20));
}

int vmm_apply_control(struct vmm *v, const struct control_command *c)
{
        struct sandbox **all;
        int n = records_snapshot(&v->table, &all), changed = 0;
        if (n < 0)
                return n;
        for (int i = 0; i < n; i++) {
                struct sandbox *sb = all[i];
                pthread_mutex_lock(&v->table.lock);
                bool match = strcmp(sb->rec.account, c->account) == 0 &&
                             (*c->sandbox ? strcmp(sb->rec.id, c->sandbox) == 0 : strcmp(sb->rec.key, c->key) == 0) &&
                             sb->rec.state != STATE_STOPPED &&
                             /* A command decided before the sandbox existed is not about it. */
                             (c->issued_ns == 0 || *c->sandbox || c->issued_ns >= sb->rec.created_ns);
                enum sandbox_state st = sb->rec.state;
                pthread_mutex_unlock(&v->table.lock);
                if (!match || (c->action == CONTROL_PAUSE && st == STATE_PAUSED))
                        continue;
                char why[256] = "";
                const char *reason = *c->reason ? c->reason : "control";
                pthread_mutex_lock(&sb->op);
                int r = c->action == CONTROL_PAUSE ? vmm_pause_locked(v, sb, reason, why, sizeof(why))
                                                   : vmm_stop_locked(v, sb, reason, NULL, why, sizeof(why));
                pthread_mutex_unlock(&sb->op);
                if (r == 0)
                        changed++;
                else
                        log_warn("could not carry out a control command", "sandbox=%s action=%s error=\"%s\"",
                                 sb->rec.id, control_action_name(c->action), why);
        }
        records_snapshot_free(&v->table, all, n);
        atomic_fetch_add_explicit(&v->metrics.control_applied, (uint64_t)changed, memory_order_relaxed);
        if (changed)
                log_info("control command carried out", "action=%s account=%s key=%s sandbox=%s reason=%s changed=%d "
                         "latency_ms=%lld", control_action_name(c->action), c->account, *c->key ? c->key : "-",
                         *c->sandbox ? c->sandbox : "-", *c->reason ? c->reason : "-", changed,
                         c->issued_ns ? (long long)((time_wall_ns() - c->issued_ns) / NS_PER_MS) : -1LL);
        return changed;
}
