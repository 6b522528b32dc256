/* registry.c — see registry.h.
 *
 * Records name tenants (account and key ids): the folder is 0700 and each
 * file 0600, so only root (tally-vmm, tally-collector) reads them. */
#include "registry.h"
#include "fileutil.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int registry_path(char *buf, size_t size, const char *state_dir, const char *id)
{
        int n = snprintf(buf, size, "%s/" REGISTRY_DIR "/%s.json", state_dir, id);
        return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

void sandbox_record_clear(struct sandbox_record *rec)
{
        if (!rec)
                return;
        free(rec->labels);
        memset(rec, 0, sizeof(*rec));
}

static json_t *to_json(const struct sandbox_record *r)
{
        json_t *labels = json_object();
        for (size_t i = 0; i < r->nlabels; i++)
                json_object_set_new(labels, r->labels[i].key, json_string(r->labels[i].value));
        return json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, "
                         "s:s, s:s, s:s, s:i, s:I, s:I, s:I, s:o}",
                         "v", 1, "id", r->id, "account", r->account, "key", r->key, "host", r->host,
                         "parent", r->parent, "backend", r->backend, "state", sandbox_state_name(r->state),
                         "vcpus", (json_int_t)r->vcpus, "mem_size_bytes", (json_int_t)r->mem_size_bytes,
                         "disk_size_bytes", (json_int_t)r->disk_size_bytes, "epoch", (json_int_t)r->epoch,
                         "created_ns", (json_int_t)r->created_ns, "timeout_ns", (json_int_t)r->timeout_ns,
                         "final_cpu_ns", (json_int_t)r->final_cpu_ns, "cgroup_version", r->cgroup_version,
                         "cgroup_cpu", r->cgroup_cpu, "cgroup_memory", r->cgroup_memory, "disk_path",
                         r->disk_path, "pid", (int)r->pid, "running_ns", (json_int_t)r->running_ns, "paused_ns",
                         (json_int_t)r->paused_ns, "state_since_boot_ns", (json_int_t)r->state_since_boot_ns,
                         "labels", labels);
}

int registry_write(const char *state_dir, const struct sandbox_record *rec)
{
        if (!event_id_valid(rec->id))
                return -EINVAL;
        char dir[PATH_MAX], path[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/" REGISTRY_DIR, state_dir);
        if (mkdir(state_dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
                return -errno;
        if (registry_path(path, sizeof(path), state_dir, rec->id) < 0)
                return -ENAMETOOLONG;
        json_t *j = to_json(rec);
        if (!j)
                return -ENOMEM;
        if (rec->starting)
                json_object_set_new(j, "starting", json_true());
        char *text = json_dumps(j, JSON_INDENT(1) | JSON_SORT_KEYS);
        json_decref(j);
        if (!text)
                return -ENOMEM;
        int r = file_write_atomic(path, text, strlen(text), 0600);
        free(text);
        return r;
}

static int copy_str(json_t *o, const char *name, char *out, size_t size, bool required)
{
        json_t *v = json_object_get(o, name);
        if (!v)
                return required ? -EINVAL : 0;
        if (!json_is_string(v) || json_string_length(v) >= size)
                return -EINVAL;
        memcpy(out, json_string_value(v), json_string_length(v) + 1);
        return 0;
}

static int get_u64(json_t *o, const char *name, uint64_t *out)
{
        json_t *v = json_object_get(o, name);
        if (!v)
                return 0;
        if (!json_is_integer(v) || json_integer_value(v) < 0)
                return -EINVAL;
        *out = (uint64_t)json_integer_value(v);
        return 0;
}

int registry_read_file(const char *path, struct sandbox_record *ret)
{
        json_error_t err;
        json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
        if (!o) {
                if (access(path, F_OK) < 0)
                        return -ENOENT;
                return -EINVAL;
        }
        struct sandbox_record r = { 0 };
        char state[16] = "";
        uint64_t vcpus = 0, created = 0, timeout = 0, version = 0, pid = 0, since = 0;
        int bad = !json_is_object(o) || copy_str(o, "id", r.id, sizeof(r.id), true) ||
                  copy_str(o, "account", r.account, sizeof(r.account), true) ||
                  copy_str(o, "key", r.key, sizeof(r.key), false) ||
                  copy_str(o, "host", r.host, sizeof(r.host), false) ||
                  copy_str(o, "parent", r.parent, sizeof(r.parent), false) ||
                  copy_str(o, "backend", r.backend, sizeof(r.backend), false) ||
                  copy_str(o, "state", state, sizeof(state), true) ||
                  copy_str(o, "cgroup_cpu", r.cgroup_cpu, sizeof(r.cgroup_cpu), true) ||
                  copy_str(o, "cgroup_memory", r.cgroup_memory, sizeof(r.cgroup_memory), true) ||
                  copy_str(o, "disk_path", r.disk_path, sizeof(r.disk_path), false) ||
                  get_u64(o, "vcpus", &vcpus) || get_u64(o, "mem_size_bytes", &r.mem_size_bytes) ||
                  get_u64(o, "disk_size_bytes", &r.disk_size_bytes) || get_u64(o, "epoch", &r.epoch) ||
                  get_u64(o, "created_ns", &created) || get_u64(o, "timeout_ns", &timeout) ||
                  get_u64(o, "final_cpu_ns", &r.final_cpu_ns) || get_u64(o, "cgroup_version", &version) ||
                  get_u64(o, "pid", &pid) || get_u64(o, "running_ns", &r.running_ns) ||
                  get_u64(o, "paused_ns", &r.paused_ns) || get_u64(o, "state_since_boot_ns", &since) ||
                  sandbox_state_parse(state, &r.state) < 0 ||
                  !event_id_valid(r.id) || !event_id_valid(r.account) || (version != 1 && version != 2);
        r.vcpus = (uint32_t)vcpus;
        r.created_ns = (int64_t)created;
        r.timeout_ns = (int64_t)timeout;
        r.cgroup_version = (int)version;
        r.pid = (pid_t)pid;
        r.state_since_boot_ns = (int64_t)since;
        json_t *starting = json_object_get(o, "starting");
        if (starting && !json_is_boolean(starting))
                bad = 1;
        r.starting = json_is_true(starting);
        json_t *labels = json_object_get(o, "labels");
        if (!bad && labels && json_is_object(labels)) {
                struct usage_event tmp = { 0 };
                const char *k;
                json_t *v;
                json_object_foreach(labels, k, v) {
                        if (!json_is_string(v) || event_add_label(&tmp, k, json_string_value(v)) < 0) {
                                bad = 1;
                                break;
                        }
                }
                r.labels = tmp.labels;
                r.nlabels = tmp.nlabels;
        }
        json_decref(o);
        if (bad) {
                sandbox_record_clear(&r);
                return -EINVAL;
        }
        *ret = r;
        return 0;
}

int registry_read(const char *state_dir, const char *id, struct sandbox_record *ret)
{
        char path[PATH_MAX];
        if (!event_id_valid(id) || registry_path(path, sizeof(path), state_dir, id) < 0)
                return -EINVAL;
        return registry_read_file(path, ret);
}

int registry_remove(const char *state_dir, const char *id)
{
        char path[PATH_MAX];
        if (!event_id_valid(id) || registry_path(path, sizeof(path), state_dir, id) < 0)
                return -EINVAL;
        if (unlink(path) < 0 && errno != ENOENT)
                return -errno;
        return 0;
}

void registry_list_free(struct sandbox_record *list, int n)
{
        for (int i = 0; list && i < n; i++)
                sandbox_record_clear(&list[i]);
        free(list);
}

int registry_list(const char *state_dir, struct sandbox_record **ret)
{
        char dir[PATH_MAX];
        snprintf(dir, sizeof(dir), "%s/" REGISTRY_DIR, state_dir);
        DIR *d = opendir(dir);
        if (!d) {
                if (errno == ENOENT) {
                        *ret = NULL;
                        return 0;
                }
                return -errno;
        }
        struct sandbox_record *list = NULL;
        int n = 0, cap = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                size_t len = strlen(de->d_name);
                if (len < 6 || strcmp(de->d_name + len - 5, ".json") != 0)
                        continue;
                char path[PATH_MAX + 256];
                snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
                struct sandbox_record rec;
                int r = registry_read_file(path, &rec);
                if (r < 0) {
                        if (r != -ENOENT)
                                log_warn("skipping an invalid registry record", "path=%s", path);
                        continue;
                }
                if (n == cap) {
                        cap = cap ? cap * 2 : 64;
                        struct sandbox_record *l = realloc(list, (size_t)cap * sizeof(*l));
                        if (!l) {
                                sandbox_record_clear(&rec);
                                registry_list_free(list, n);
                                closedir(d);
                                return -ENOMEM;
                        }
                        list = l;
                }
                list[n++] = rec;
        }
        closedir(d);
        *ret = list;
        return n;
}

void registry_held_at(const struct sandbox_record *rec, int64_t boot_now, uint64_t *ret_running_ns,
                      uint64_t *ret_paused_ns)
{
        uint64_t running = rec->running_ns, paused = rec->paused_ns;
        uint64_t in_state = boot_now > rec->state_since_boot_ns ? (uint64_t)(boot_now - rec->state_since_boot_ns) : 0;
        if (rec->state_since_boot_ns > 0 && rec->state == STATE_RUNNING)
                running += in_state;
        else if (rec->state_since_boot_ns > 0 && rec->state == STATE_PAUSED)
                paused += in_state;
        *ret_running_ns = running;
        *ret_paused_ns = paused;
}

void registry_set_state(struct sandbox_record *rec, enum sandbox_state to, int64_t boot_now)
{
        registry_held_at(rec, boot_now, &rec->running_ns, &rec->paused_ns);
        rec->state = to;
        rec->starting = false;
        if (boot_now > rec->state_since_boot_ns)
                rec->state_since_boot_ns = boot_now;
}

/* Opens the lock file (creating the folders and the file) and takes it with
 * op (LOCK_SH or LOCK_EX), polling for at most wait_ms: a blocking flock could
 * not be bounded without signals. The polls start short, so the collector finds
 * the gaps between moments, and back off to 1 ms. */
static int moments_lock(const char *state_dir, int op, int64_t wait_ms)
{
        char dir[PATH_MAX], path[PATH_MAX];
        if (snprintf(dir, sizeof(dir), "%s/" REGISTRY_DIR, state_dir) >= (int)sizeof(dir) ||
            snprintf(path, sizeof(path), "%s/" REGISTRY_MOMENTS_LOCK, dir) >= (int)sizeof(path))
                return -ENAMETOOLONG;
        /* Read-only: its close is no IN_CLOSE_WRITE for the collector's watch. */
        int fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0 && errno == ENOENT) {
                if ((mkdir(state_dir, 0700) < 0 && errno != EEXIST) || (mkdir(dir, 0700) < 0 && errno != EEXIST))
                        return -errno;
                fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        }
        if (fd < 0)
                return -errno;
        struct timespec now, until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += wait_ms / 1000;
        until.tv_nsec += (wait_ms % 1000) * 1000000;
        if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
        }
        long pause_ns = 50000;
        for (;;) {
                if (flock(fd, op | LOCK_NB) == 0)
                        return fd;
                if (errno != EWOULDBLOCK && errno != EINTR) {
                        int r = -errno;
                        close(fd);
                        return r;
                }
                clock_gettime(CLOCK_MONOTONIC, &now);
                if (now.tv_sec > until.tv_sec || (now.tv_sec == until.tv_sec && now.tv_nsec >= until.tv_nsec)) {
                        close(fd);
                        return -ETIMEDOUT;
                }
                struct timespec p = { 0, pause_ns };
                nanosleep(&p, NULL);
                if (pause_ns < 1000000)
                        pause_ns *= 2;
        }
}

int registry_moment_begin(const char *state_dir, int64_t wait_ms)
{
        return moments_lock(state_dir, LOCK_SH, wait_ms);
}

int registry_moments_quiesce(const char *state_dir, int64_t wait_ms)
{
        return moments_lock(state_dir, LOCK_EX, wait_ms);
}

void registry_moment_end(int fd)
{
        if (fd >= 0)
                close(fd); /* the last descriptor of its open file description: the lock goes with it */
}

int sandbox_net_read(int fd, uint64_t *ret_rx, uint64_t *ret_tx)
{
        char buf[SANDBOX_NET_LINE_LEN + 1];
        ssize_t n = pread(fd, buf, SANDBOX_NET_LINE_LEN, 0);
        if (n < 0)
                return -errno;
        if (n != SANDBOX_NET_LINE_LEN || buf[20] != ' ' || buf[41] != '\n')
                return -EINVAL;
        buf[20] = buf[41] = '\0';
        for (int i = 0; i < 41; i++)
                if (i != 20 && (buf[i] < '0' || buf[i] > '9'))
                        return -EINVAL;
        *ret_rx = strtoull(buf, NULL, 10);
        *ret_tx = strtoull(buf + 21, NULL, 10);
        return 0;
}

int sandbox_net_write(int fd, uint64_t rx, uint64_t tx)
{
        char buf[SANDBOX_NET_LINE_LEN + 1];
        snprintf(buf, sizeof(buf), "%020" PRIu64 " %020" PRIu64 "\n", rx, tx);
        ssize_t n = pwrite(fd, buf, SANDBOX_NET_LINE_LEN, 0);
        return n == SANDBOX_NET_LINE_LEN ? 0 : n < 0 ? -errno : -EIO;
}
