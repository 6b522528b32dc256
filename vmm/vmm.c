/* vmm.c — see vmm.h: opening and closing the sandbox manager, and its
 * /metrics page. The rest of it is in the modules lifecycle.h lists. */
#include "lifecycle.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t host_memory(void)
{
        long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

const struct vmm_settings *vmm_get_settings(const struct vmm *v)
{
        return &v->s;
}

const struct vmm_limits *vmm_get_limits(const struct vmm *v)
{
        return &v->limits;
}

/* The control topic's commands, counted (events.h calls it on its thread). */
static int apply_control(void *arg, const struct control_command *c)
{
        struct vmm *v = arg;
        atomic_fetch_add_explicit(&v->metrics.control_commands, 1, memory_order_relaxed);
        return vmm_apply_control(v, c);
}

int vmm_open(const struct vmm_settings *s, struct vmm **ret, char *err, size_t errlen)
{
        struct vmm *v = calloc(1, sizeof(*v));
        int r;
        if (!v)
                return -ENOMEM;
        v->s = *s;
        records_init(&v->table, v->s.state_dir);
        spend_limits_init(&v->spend, v->s.limits_database_url, v->s.blocked_key_query);
        atomic_init(&v->quit, false);
        atomic_init(&v->stopping, 0);
        bool events_opened = false;
        v->limits.host_mem_bytes = host_memory();
        v->limits.timeout_max_s = s->timeout_max_s;
        if (!event_id_valid(s->host_id)) {
                snprintf(err, errlen, "host_id \"%s\" is not an id (1 to 64 of A-Z a-z 0-9 _ . : -)", s->host_id);
                r = -EINVAL;
                goto fail;
        }
        if (!(v->default_backend = backend_resolve(s->backend, &v->default_reason, err, errlen))) {
                r = -EINVAL;
                goto fail;
        }
        if ((r = cgroup_host_detect(s->cgroup_mount, s->cgroup_parent, &v->cgroups)) < 0) {
                snprintf(err, errlen, "could not set up the cgroup parent \"%s\" under %s: %s", s->cgroup_parent,
                         *s->cgroup_mount ? s->cgroup_mount : "/sys/fs/cgroup", strerror(-r));
                goto fail;
        }
        /* The meter's inputs are root's alone: the registry (tenants' account and
         * key ids) and the sandboxes' folders are 0700, also when an older
         * tally-vmm made them 0755. A state folder tally-vmm creates is 0700; one
         * that exists keeps its mode (scripts/up shares it with PostgreSQL's data). */
        if (mkdir(s->state_dir, 0700) < 0 && errno != EEXIST) {
                r = -errno;
                snprintf(err, errlen, "could not create the state folder %s: %s", s->state_dir, strerror(errno));
                goto fail;
        }
        static const char *const private_dirs[] = { REGISTRY_DIR, SANDBOX_DIR };
        for (size_t i = 0; i < sizeof(private_dirs) / sizeof(private_dirs[0]); i++) {
                char path[PATH_MAX];
                snprintf(path, sizeof(path), "%s/%s", s->state_dir, private_dirs[i]);
                if ((mkdir(path, 0700) < 0 && errno != EEXIST) || chmod(path, 0700) < 0) {
                        r = -errno;
                        snprintf(err, errlen, "could not make %s private: %s", path, strerror(errno));
                        goto fail;
                }
        }
        if ((r = capacity_init(&v->capacity, &s->capacity, s->state_dir, err, errlen)) < 0)
                goto fail;
        log_info("capacity", "memory_mib=%" PRIu64 " vcpus=%" PRIu64 " disk_mib=%" PRIu64 " memory_promise_mib=%" PRIu64
                 " vcpu_promise=%" PRIu64 " disk_promise_mib=%" PRIu64,
                 v->capacity.host.mem_bytes >> 20, v->capacity.host.vcpus, v->capacity.host.disk_bytes >> 20,
                 v->capacity.limit.mem_bytes >> 20, v->capacity.limit.vcpus, v->capacity.limit.disk_bytes >> 20);
        if ((r = events_open(&v->events, s, &v->table, apply_control, v, err, errlen)) < 0)
                goto fail;
        events_opened = true;
        log_info("tally-vmm starting", "host=%s cgroup_version=%d cgroup_parent=%s backend=%s backend_reason=\"%s\" "
                 "spend_limit_check=%s", s->host_id, v->cgroups.version, v->cgroups.parent, v->default_backend->name,
                 v->default_reason, spend_limits_enabled(&v->spend) ? "on" : "off");
        vmm_recover(v);
        if ((r = vmm_tick_start(v)) < 0)
                goto fail;
        if ((r = events_start_control(&v->events)) < 0) {
                vmm_tick_stop(v);
                goto fail;
        }
        *ret = v;
        return 0;
fail:
        if (events_opened)
                events_stop_control(&v->events);
        /* Sandboxes vmm_recover took over keep running; only the memory goes. */
        records_free(&v->table);
        if (events_opened)
                events_free(&v->events);
        spend_limits_free(&v->spend);
        free(v);
        return r;
}

void vmm_begin_shutdown(struct vmm *v)
{
        atomic_store(&v->stopping, 1);
}

void vmm_flush(struct vmm *v, int64_t timeout_ms)
{
        events_flush(&v->events, timeout_ms);
}

void vmm_close(struct vmm *v, int64_t deadline_mono_ns)
{
        if (!v)
                return;
        atomic_store(&v->quit, true); /* both threads end together */
        events_stop_control(&v->events);
        vmm_tick_stop(v);
        /* A stopped event lost here is published again by the next run (its record says stopped). */
        events_flush_or_purge(&v->events, (deadline_mono_ns - time_mono_ns()) / NS_PER_MS - 200);
        records_free(&v->table);
        events_free(&v->events);
        spend_limits_free(&v->spend);
        free(v);
}

int vmm_metrics_page(const void *arg, char *buf, size_t size)
{
        struct vmm *v = (struct vmm *)arg;
        struct vmm_state_counts states = { 0 };
        pthread_mutex_lock(&v->table.lock);
        for (struct sandbox *sb = v->table.list; sb; sb = sb->next)
                switch (sb->rec.state) {
                case STATE_RUNNING: states.running++; break;
                case STATE_PAUSED: states.paused++; break;
                default: states.stopped++; break;
                }
        pthread_mutex_unlock(&v->table.lock);
        return vmm_metrics_text(&v->metrics, &states, atomic_load(&v->table.write_failures), buf, size);
}
