/* create.c — making sandboxes: admission against this host's capacity, the
 * start of one sandbox (cgroup first, then its folder and record, then the
 * backend), create, and fork (all copies or none). See vmm.h and lifecycle.h. */
#include "lifecycle.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* What this host has promised (table lock held): the live sandboxes' (memory
 * and disk of running and paused ones, vCPUs of running ones) and the
 * reservations of creates under way; with ret_live, how many are live. */
static struct capacity_use promised_locked(struct vmm *v, int *ret_live)
{
        struct capacity_use promised = v->reserved;
        int live = 0;
        for (struct sandbox *sb = v->table.list; sb; sb = sb->next) {
                if (sb->rec.state == STATE_STOPPED)
                        continue;
                live++;
                promised.mem_bytes += sb->rec.mem_size_bytes;
                promised.disk_bytes += sb->rec.disk_size_bytes;
                if (sb->rec.state == STATE_RUNNING)
                        promised.vcpus += sb->rec.vcpus;
        }
        if (ret_live)
                *ret_live = live;
        return promised;
}

void vmm_capacity_report(struct vmm *v, struct capacity *ret_capacity, struct capacity_use *ret_promised,
                         int *ret_live)
{
        pthread_mutex_lock(&v->table.lock);
        *ret_promised = promised_locked(v, ret_live);
        pthread_mutex_unlock(&v->table.lock);
        *ret_capacity = v->capacity; /* set once by vmm_open */
}

/* Reserves what req asks of this host's capacity, or refuses it (-ENOSPC,
 * why names what is short). Promised = the live sandboxes' (memory and disk of
 * running and paused ones, vCPUs of running ones) + the reservations of
 * creates under way, so two creates at once cannot both take the last room.
 * The caller releases the reservation once the sandbox is in the list (or
 * failed). */
static int admit(struct vmm *v, const struct create_request *req, char *why, size_t whylen)
{
        int r = capacity_check_free(v->s.state_dir, req->disk_bytes, why, whylen);
        if (r < 0) {
                if (r != -ENOSPC)
                        snprintf(why, whylen, "could not read the free space for sandboxes' disks");
                return r;
        }
        struct capacity_use want = { req->mem_bytes, req->vcpus, req->disk_bytes };
        pthread_mutex_lock(&v->table.lock);
        struct capacity_use promised = promised_locked(v, NULL);
        r = capacity_check(&v->capacity, &promised, &want, why, whylen);
        if (r == 0) {
                v->reserved.mem_bytes += want.mem_bytes;
                v->reserved.vcpus += want.vcpus;
                v->reserved.disk_bytes += want.disk_bytes;
        }
        pthread_mutex_unlock(&v->table.lock);
        if (r < 0)
                log_info("sandbox refused", "account=%s key=%s reason=\"%s\"", req->account, req->key, why);
        return r;
}

static void admit_release(struct vmm *v, const struct create_request *req)
{
        pthread_mutex_lock(&v->table.lock);
        v->reserved.mem_bytes -= req->mem_bytes;
        v->reserved.vcpus -= req->vcpus;
        v->reserved.disk_bytes -= req->disk_bytes;
        pthread_mutex_unlock(&v->table.lock);
}

/* Creates one sandbox: cgroup, record, backend start (or fork of src), and its created event.
 * *ret_sb holds a reference. */
static int start_sandbox(struct vmm *v, const struct create_request *req, const struct backend_ops *ops,
                         struct sandbox *src, bool *ret_copied, struct sandbox **ret_sb, char *why, size_t whylen)
{
        struct sandbox_spec spec = { 0 };
        bool cgroup_made = false, dir_made = false, record_made = false;
        int r = admit(v, req, why, whylen);
        if (r < 0)
                return r;
        struct sandbox *sb = sandbox_new();
        if (!sb) {
                admit_release(v, req);
                return -ENOMEM;
        }
        struct sandbox_record *rec = &sb->rec;
        if ((r = sandbox_new_id(rec->id, sizeof(rec->id))) < 0)
                goto fail;
        snprintf(rec->account, sizeof(rec->account), "%s", req->account);
        snprintf(rec->key, sizeof(rec->key), "%s", req->key);
        snprintf(rec->host, sizeof(rec->host), "%s", v->s.host_id);
        snprintf(rec->backend, sizeof(rec->backend), "%s", ops->name);
        if (src)
                snprintf(rec->parent, sizeof(rec->parent), "%s", src->rec.id);
        rec->state = STATE_RUNNING;
        rec->vcpus = req->vcpus;
        rec->mem_size_bytes = req->mem_bytes;
        rec->disk_size_bytes = req->disk_bytes;
        rec->epoch = 1;
        rec->created_ns = time_wall_ns();
        rec->timeout_ns = rec->created_ns + req->timeout_s * NS_PER_SEC;
        rec->cgroup_version = v->cgroups.version;
        if (req->nlabels) {
                if (!(rec->labels = malloc(req->nlabels * sizeof(*rec->labels)))) {
                        r = -ENOMEM;
                        goto fail;
                }
                memcpy(rec->labels, req->labels, req->nlabels * sizeof(*rec->labels));
                rec->nlabels = req->nlabels;
        }
        sb->ops = ops;
        sb->net = req->net;
        sandbox_dir_path(v->s.state_dir, rec->id, sb->dir, sizeof(sb->dir));
        if (snprintf(rec->disk_path, sizeof(rec->disk_path), "%s/disk", sb->dir) >= (int)sizeof(rec->disk_path)) {
                r = -ENAMETOOLONG;
                snprintf(why, whylen, "the state folder's path is too long");
                goto fail;
        }

        /* The cgroup first: nothing of the sandbox may run outside it. */
        if ((r = cgroup_create(&v->cgroups, rec->id, rec->vcpus, rec->mem_size_bytes + ops->memory_overhead_bytes,
                               &sb->cg)) < 0) {
                snprintf(why, whylen, "could not create the sandbox's cgroup: %s", strerror(-r));
                goto fail;
        }
        cgroup_made = true;
        snprintf(rec->cgroup_cpu, sizeof(rec->cgroup_cpu), "%s", sb->cg.cpuacct);
        snprintf(rec->cgroup_memory, sizeof(rec->cgroup_memory), "%s", sb->cg.memory);
        char parent_dir[PATH_MAX];
        snprintf(parent_dir, sizeof(parent_dir), "%s/" SANDBOX_DIR, v->s.state_dir);
        if ((mkdir(parent_dir, 0700) < 0 && errno != EEXIST) || mkdir(sb->dir, 0755) < 0) {
                r = -errno;
                snprintf(why, whylen, "could not create the sandbox's folder: %s", strerror(-r));
                goto fail;
        }
        dir_made = true;
        /* Written before the start (a restarted vmm finds the cgroup by it), marked starting: the
         * collector samples it only once the record with the start's moment replaces it, so no
         * sample without held time falls between the two (docs/registry.md, "Moments and ticks"). */
        rec->starting = true;
        if ((r = sandbox_spec_write(sb->dir, &req->net, req->pids_max)) < 0 || (r = records_write(&v->table, rec)) < 0) {
                snprintf(why, whylen, "could not write the sandbox's record: %s", strerror(-r));
                goto fail;
        }
        record_made = true;

        snprintf(spec.id, sizeof(spec.id), "%s", rec->id);
        snprintf(spec.account, sizeof(spec.account), "%s", rec->account);
        snprintf(spec.key, sizeof(spec.key), "%s", rec->key);
        spec.vcpus = rec->vcpus;
        spec.mem_bytes = rec->mem_size_bytes;
        spec.disk_bytes = rec->disk_size_bytes;
        spec.internet = req->net.internet;
        spec.pids_max = req->pids_max;
        sb->pids_max = req->pids_max;
        spec.command = req->command;
        spec.image = req->image;
        pid_t pid = 0;
        int64_t start_mono = time_mono_ns();
        /* The moment the sandbox may first run: held time starts here, and the
         * lease counts from here. */
        sb->moment = moment_now();
        rec->created_ns = sb->moment.wall;
        rec->timeout_ns = rec->created_ns + req->timeout_s * NS_PER_SEC;
        registry_set_state(rec, STATE_RUNNING, sb->moment.boot);
        spec.lease_deadline_wall_ns = rec->timeout_ns;
        if (src) {
                if (!ops->fork) {
                        r = -EOPNOTSUPP;
                        snprintf(why, whylen, "the %s backend cannot fork a sandbox", ops->name);
                } else {
                        r = ops->fork(src->bs, &spec, &sb->cg, sb->dir, &sb->bs, &pid, ret_copied, why, whylen);
                }
        } else {
                r = ops->start(&spec, &sb->cg, sb->dir, &sb->bs, &pid, why, whylen);
        }
        if (r < 0)
                goto fail;
        rec->pid = pid;
        if ((r = vmm_open_egress(v, sb, pid, why, whylen)) < 0)
                goto fail;
        if ((r = vmm_set_lease(sb, rec->timeout_ns)) < 0) {
                snprintf(why, whylen, "could not set the sandbox's lease: %s", strerror(-r));
                goto fail;
        }
        if ((r = records_write(&v->table, rec)) < 0) {
                snprintf(why, whylen, "could not write the sandbox's record: %s", strerror(-r));
                goto fail;
        }
        sb->refs++; /* the list's and the caller's */
        sandbox_watch_main(sb);
        records_insert(&v->table, sb);
        admit_release(v, req); /* it is in the list now: counted there */
        events_publish_created(&v->events, sb);
        log_info("sandbox created", "sandbox=%s account=%s key=%s backend=%s vcpus=%u memory_mib=%" PRIu64
                 " pid=%d parent=%s start_us=%lld", rec->id, rec->account, rec->key, rec->backend, rec->vcpus,
                 rec->mem_size_bytes >> 20, (int)pid, *rec->parent ? rec->parent : "-",
                 (long long)((time_mono_ns() - start_mono) / NS_PER_US));
        *ret_sb = sb;
        return 0;
fail:
        egress_close(sb->egress);
        sb->egress = NULL;
        if (sb->bs) {
                ops->stop(sb->bs);
                ops->free(sb->bs);
                sb->bs = NULL;
        }
        if (cgroup_made) {
                cgroup_kill_all(&sb->cg, KILL_WAIT_MS);
                cgroup_remove(&v->cgroups, &sb->cg);
        }
        if (record_made)
                registry_remove(v->s.state_dir, rec->id);
        if (dir_made)
                sandbox_remove_dir(sb->dir);
        sandbox_unref(&v->table, sb);
        admit_release(v, req);
        return r;
}

static int create(struct vmm *v, const struct create_request *req, json_t **ret, char *why, size_t whylen)
{
        const char *reason = NULL;
        const struct backend_ops *ops =
                strcmp(req->backend, "auto") == 0 ? v->default_backend : backend_resolve(req->backend, &reason, why,
                                                                                         whylen);
        if (!ops)
                return -EINVAL;
        int r = spend_limits_check_key(&v->spend, req->account, req->key, why, whylen);
        if (r < 0)
                return r;
        struct sandbox *sb;
        if ((r = start_sandbox(v, req, ops, NULL, NULL, &sb, why, whylen)) < 0)
                return r;
        *ret = vmm_describe(v, sb);
        sandbox_unref(&v->table, sb);
        return 0;
}

static int fork_sandbox(struct vmm *v, const char *id, int count, json_t **ret, char *why, size_t whylen)
{
        if (count < 1 || count > FORK_MAX) {
                snprintf(why, whylen, "count must be from 1 to %d", FORK_MAX);
                return -EINVAL;
        }
        struct sandbox *src = vmm_find(v, id, why, whylen);
        if (!src)
                return -ENOENT;
        struct sandbox *copies[FORK_MAX] = { 0 };
        int made = 0, r = 0;
        bool copied = false;
        pthread_mutex_lock(&src->op);
        struct create_request req = { 0 };
        pthread_mutex_lock(&v->table.lock);
        enum sandbox_state st = src->rec.state;
        snprintf(req.account, sizeof(req.account), "%s", src->rec.account);
        snprintf(req.key, sizeof(req.key), "%s", src->rec.key);
        req.vcpus = src->rec.vcpus;
        req.mem_bytes = src->rec.mem_size_bytes;
        req.disk_bytes = src->rec.disk_size_bytes;
        req.net = src->net;
        req.pids_max = src->pids_max;
        int64_t left = src->rec.timeout_ns - time_wall_ns();
        req.timeout_s = left > NS_PER_SEC ? left / NS_PER_SEC : 1;
        req.labels = src->rec.labels;
        req.nlabels = src->rec.nlabels;
        pthread_mutex_unlock(&v->table.lock);
        if (st != STATE_RUNNING) {
                snprintf(why, whylen, "sandbox %s is %s: only a running sandbox can be forked", id,
                         sandbox_state_name(st));
                r = -EBUSY;
                goto out;
        }
        if ((r = spend_limits_check_key(&v->spend, req.account, req.key, why, whylen)) < 0)
                goto out;
        for (; made < count; made++) {
                bool c = false;
                if ((r = start_sandbox(v, &req, src->ops, src, &c, &copies[made], why, whylen)) < 0)
                        break;
                copied = c;
        }
        if (r < 0) {
                /* All or nothing: a fork that could not make every copy makes none. */
                for (int i = 0; i < made; i++) {
                        pthread_mutex_lock(&copies[i]->op);
                        vmm_stop_locked(v, copies[i], "fork_failed", NULL, NULL, 0);
                        pthread_mutex_unlock(&copies[i]->op);
                        sandbox_unref(&v->table, copies[i]);
                }
                goto out;
        }
        struct usage_event ev;
        struct moment now = moment_now();
        pthread_mutex_lock(&v->table.lock);
        event_from_record(&ev, EVENT_FORKED, &src->rec, &now);
        pthread_mutex_unlock(&v->table.lock);
        ev.fork_count = (uint32_t)count;
        events_publish(&v->events, &ev, false);
        json_t *list = json_array();
        for (int i = 0; i < made; i++) {
                json_array_append_new(list, vmm_describe(v, copies[i]));
                sandbox_unref(&v->table, copies[i]);
        }
        *ret = json_pack("{s:o, s:b, s:s}", "sandboxes", list, "processes_copied", copied, "note",
                         copied ? "each copy continues the source's processes"
                                : "each copy has the source's files and spec and started its main program afresh; "
                                  "the source's running processes were not copied (the process backend cannot)");
        log_info("sandbox forked", "sandbox=%s copies=%d processes_copied=%s", id, count, copied ? "yes" : "no");
out:
        pthread_mutex_unlock(&src->op);
        sandbox_unref(&v->table, src);
        return r;
}

int vmm_create(struct vmm *v, const struct create_request *req, json_t **ret, char *why, size_t whylen)
{
        int64_t start = time_mono_ns();
        int r = create(v, req, ret, why, whylen);
        vmm_op_done(&v->metrics.creates, start, r);
        return r;
}

int vmm_fork(struct vmm *v, const char *id, int count, json_t **ret, char *why, size_t whylen)
{
        int64_t start = time_mono_ns();
        int r = fork_sandbox(v, id, count, ret, why, whylen);
        vmm_op_done(&v->metrics.forks, start, r);
        if (r == 0)
                atomic_fetch_add_explicit(&v->metrics.fork_copies, (uint64_t)count, memory_order_relaxed);
        return r;
}
