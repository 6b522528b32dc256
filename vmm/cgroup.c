/* cgroup.c — see cgroup.h. Plain file I/O on the cgroup file systems; no
 * backend knowledge here. cgroup_enter() must stay async-signal-safe: it runs
 * in children forked from a threaded daemon before they exec. */
#include "cgroup.h"
#include "cgroup_counter.h"
#include "fileutil.h"
#include "timeutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define CPU_PERIOD_US 100000

static int path_join(char *buf, size_t size, const char *a, const char *b, const char *c)
{
        int n = snprintf(buf, size, "%s%s%s%s%s", a, b ? "/" : "", b ? b : "", c ? "/" : "", c ? c : "");
        return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

static int write_file(const char *dir, const char *name, const char *text)
{
        char path[PATH_MAX + 64];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        size_t len = strlen(text);
        ssize_t n = write(fd, text, len);
        int r = n == (ssize_t)len ? 0 : n < 0 ? -errno : -EIO;
        close(fd);
        return r;
}

static int read_file(const char *dir, const char *name, char *buf, size_t size)
{
        char path[PATH_MAX + 64];
        snprintf(path, sizeof(path), "%s/%s", dir, name);
        return file_read_small(path, buf, size);
}

static bool is_dir(const char *path)
{
        struct stat st;
        return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int mkdir_p(const char *path)
{
        char tmp[PATH_MAX];
        if (snprintf(tmp, sizeof(tmp), "%s", path) >= (int)sizeof(tmp))
                return -ENAMETOOLONG;
        for (char *p = tmp + 1; *p; p++) {
                if (*p != '/')
                        continue;
                *p = '\0';
                if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
                        return -errno;
                *p = '/';
        }
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
                return -errno;
        return 0;
}

static bool parent_valid(const char *parent)
{
        if (!*parent || parent[0] == '/' || strstr(parent, ".."))
                return false;
        for (const char *p = parent; *p; p++)
                if (!(('a' <= *p && *p <= 'z') || ('A' <= *p && *p <= 'Z') || ('0' <= *p && *p <= '9') ||
                      strchr("_.-/", *p)))
                        return false;
        return true;
}

/* The v1 hierarchies a sandbox needs (required) or gets when present. */
static const struct {
        const char *name;
        bool required;
} v1_hierarchies[] = {
        { "cpu", true }, { "cpuacct", true }, { "memory", true }, { "freezer", true },
        { "pids", false }, { "unified", false },
};

int cgroup_host_detect(const char *mount, const char *parent, struct cgroup_host *ret)
{
        struct cgroup_host h = { 0 };
        if (!mount || !*mount)
                mount = "/sys/fs/cgroup";
        if (!parent_valid(parent) || strlen(parent) >= sizeof(h.parent) ||
            snprintf(h.mount, sizeof(h.mount), "%s", mount) >= (int)sizeof(h.mount))
                return -EINVAL;
        snprintf(h.parent, sizeof(h.parent), "%s", parent);
        char probe[PATH_MAX];
        if (path_join(probe, sizeof(probe), mount, "cgroup.controllers", NULL) < 0)
                return -ENAMETOOLONG;
        if (access(probe, F_OK) == 0) {
                h.version = 2;
                /* Let the parent's children have the controllers tally limits. */
                char dir[PATH_MAX];
                if (path_join(dir, sizeof(dir), mount, parent, NULL) < 0)
                        return -ENAMETOOLONG;
                int r = mkdir_p(dir);
                if (r < 0)
                        return r;
                /* Every folder from the root down to the parent delegates cpu, memory and pids. */
                char walk[PATH_MAX];
                snprintf(walk, sizeof(walk), "%s", mount);
                const char *rest = parent;
                for (;;) {
                        write_file(walk, "cgroup.subtree_control", "+cpu +memory +pids");
                        const char *slash = strchr(rest, '/');
                        size_t len = slash ? (size_t)(slash - rest) : strlen(rest);
                        size_t at = strlen(walk);
                        if (at + 1 + len >= sizeof(walk))
                                return -ENAMETOOLONG;
                        walk[at] = '/';
                        memcpy(walk + at + 1, rest, len);
                        walk[at + 1 + len] = '\0';
                        if (!slash)
                                break;
                        rest = slash + 1;
                }
                r = write_file(walk, "cgroup.subtree_control", "+cpu +memory +pids");
                char have[256];
                if (read_file(walk, "cgroup.subtree_control", have, sizeof(have)) < 0 || !strstr(have, "cpu") ||
                    !strstr(have, "memory"))
                        return r < 0 ? r : -EACCES;
                *ret = h;
                return 0;
        }
        h.version = 1;
        for (size_t i = 0; i < sizeof(v1_hierarchies) / sizeof(v1_hierarchies[0]); i++) {
                char dir[PATH_MAX];
                if (path_join(dir, sizeof(dir), mount, v1_hierarchies[i].name, NULL) < 0)
                        return -ENAMETOOLONG;
                if (!is_dir(dir)) {
                        if (v1_hierarchies[i].required)
                                return -ENOENT;
                        continue;
                }
                if (path_join(dir, sizeof(dir), mount, v1_hierarchies[i].name, parent) < 0)
                        return -ENAMETOOLONG;
                int r = mkdir_p(dir);
                if (r < 0)
                        return r;
        }
        *ret = h;
        return 0;
}

static int add_dir(struct sandbox_cgroup *cg, const char *dir)
{
        for (size_t i = 0; i < cg->ndirs; i++)
                if (strcmp(cg->dirs[i], dir) == 0)
                        return 0;
        if (cg->ndirs == CGROUP_MAX_DIRS)
                return -E2BIG;
        snprintf(cg->dirs[cg->ndirs++], PATH_MAX, "%s", dir);
        return 0;
}

int cgroup_paths(const struct cgroup_host *host, const char *id, struct sandbox_cgroup *ret)
{
        struct sandbox_cgroup *cg = calloc(1, sizeof(*cg));
        if (!cg)
                return -ENOMEM;
        int r = 0;
        cg->version = host->version;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof(sub), "%s/%s", host->parent, id) >= (int)sizeof(sub)) {
                r = -ENAMETOOLONG;
                goto out;
        }
        if (host->version == 2) {
                char dir[PATH_MAX];
                if ((r = path_join(dir, sizeof(dir), host->mount, sub, NULL)) < 0)
                        goto out;
                snprintf(cg->cpu, PATH_MAX, "%s", dir);
                snprintf(cg->cpuacct, PATH_MAX, "%s", dir);
                snprintf(cg->memory, PATH_MAX, "%s", dir);
                snprintf(cg->freezer, PATH_MAX, "%s", dir);
                r = add_dir(cg, dir);
                goto out;
        }
        for (size_t i = 0; i < sizeof(v1_hierarchies) / sizeof(v1_hierarchies[0]); i++) {
                char root[PATH_MAX], real[PATH_MAX], dir[PATH_MAX];
                if ((r = path_join(root, sizeof(root), host->mount, v1_hierarchies[i].name, NULL)) < 0)
                        goto out;
                /* cpu and cpuacct may be one co-mounted hierarchy reached by two
                 * symbolic links: its folder is then created and entered once. */
                if (!is_dir(root) || !realpath(root, real))
                        continue;
                if ((r = path_join(dir, sizeof(dir), real, sub, NULL)) < 0)
                        goto out;
                const char *name = v1_hierarchies[i].name;
                if (strcmp(name, "cpu") == 0)
                        snprintf(cg->cpu, PATH_MAX, "%s", dir);
                else if (strcmp(name, "cpuacct") == 0)
                        snprintf(cg->cpuacct, PATH_MAX, "%s", dir);
                else if (strcmp(name, "memory") == 0)
                        snprintf(cg->memory, PATH_MAX, "%s", dir);
                else if (strcmp(name, "freezer") == 0)
                        snprintf(cg->freezer, PATH_MAX, "%s", dir);
                if ((r = add_dir(cg, dir)) < 0)
                        goto out;
        }
out:
        if (r == 0)
                *ret = *cg;
        free(cg);
        return r;
}

static int rmdir_retry(const char *dir)
{
        /* A killed process leaves its cgroup a moment after it is reaped. */
        for (int i = 0; i < 200; i++) {
                if (rmdir(dir) == 0 || errno == ENOENT)
                        return 0;
                if (errno != EBUSY)
                        return -errno;
                struct timespec ts = { 0, 5 * 1000 * 1000 };
                nanosleep(&ts, NULL);
        }
        return -EBUSY;
}

int cgroup_create(const struct cgroup_host *host, const char *id, uint32_t vcpus, uint64_t mem_bytes,
                  struct sandbox_cgroup *ret)
{
        struct sandbox_cgroup *cg = malloc(sizeof(*cg));
        if (!cg)
                return -ENOMEM;
        int r = cgroup_paths(host, id, cg);
        size_t made = 0;
        if (r < 0)
                goto fail;
        for (; made < cg->ndirs; made++) {
                if (mkdir(cg->dirs[made], 0755) < 0) {
                        r = -errno;
                        goto fail;
                }
        }
        char quota[64], mem[32];
        snprintf(mem, sizeof(mem), "%" PRIu64, mem_bytes);
        if (host->version == 2) {
                snprintf(quota, sizeof(quota), "%" PRIu64 " %d", (uint64_t)vcpus * CPU_PERIOD_US, CPU_PERIOD_US);
                if ((r = write_file(cg->cpu, "cpu.max", quota)) < 0 ||
                    (r = write_file(cg->memory, "memory.max", mem)) < 0)
                        goto fail;
                write_file(cg->memory, "memory.swap.max", "0"); /* absent without swap accounting */
        } else {
                snprintf(quota, sizeof(quota), "%" PRIu64, (uint64_t)vcpus * CPU_PERIOD_US);
                if ((r = write_file(cg->cpu, "cpu.cfs_period_us", "100000")) < 0 ||
                    (r = write_file(cg->cpu, "cpu.cfs_quota_us", quota)) < 0 ||
                    (r = write_file(cg->memory, "memory.limit_in_bytes", mem)) < 0)
                        goto fail;
                /* No swapping past the limit where the kernel accounts swap. */
                write_file(cg->memory, "memory.memsw.limit_in_bytes", mem);
        }
        *ret = *cg;
        free(cg);
        return 0;
fail:
        while (made > 0)
                rmdir(cg->dirs[--made]);
        free(cg);
        return r;
}

int cgroup_set_pids_max(const struct sandbox_cgroup *cg, uint64_t max)
{
        char text[32];
        snprintf(text, sizeof(text), "%" PRIu64, max);
        int set = 0;
        for (size_t i = 0; i < cg->ndirs; i++) {
                char path[PATH_MAX + 16];
                snprintf(path, sizeof(path), "%s/pids.max", cg->dirs[i]);
                if (access(path, F_OK) < 0)
                        continue;
                int r = write_file(cg->dirs[i], "pids.max", text);
                if (r < 0)
                        return r;
                set++;
        }
        return set ? 0 : -ENOENT;
}

int cgroup_enter(const struct sandbox_cgroup *cg, pid_t pid)
{
        char num[24];
        int len = 0;
        char rev[24];
        unsigned long v = (unsigned long)(pid < 0 ? 0 : pid);
        do {
                rev[len++] = (char)('0' + v % 10);
                v /= 10;
        } while (v);
        for (int i = 0; i < len; i++)
                num[i] = rev[len - 1 - i];
        for (size_t i = 0; i < cg->ndirs; i++) {
                char path[PATH_MAX + 16];
                size_t dl = strlen(cg->dirs[i]);
                if (dl + sizeof("/cgroup.procs") > sizeof(path))
                        return -ENAMETOOLONG;
                memcpy(path, cg->dirs[i], dl);
                memcpy(path + dl, "/cgroup.procs", sizeof("/cgroup.procs"));
                int fd = open(path, O_WRONLY | O_CLOEXEC);
                if (fd < 0)
                        return -errno;
                ssize_t n = write(fd, num, (size_t)len);
                int e = errno;
                close(fd);
                if (n != len)
                        return n < 0 ? -e : -EIO;
        }
        return 0;
}

static int wait_state(const struct sandbox_cgroup *cg, bool frozen, int timeout_ms)
{
        struct timespec ts = { 0, 1000 * 1000 };
        for (int waited = 0;; waited++) {
                char buf[512];
                int r;
                if (cg->version == 2) {
                        if ((r = read_file(cg->freezer, "cgroup.events", buf, sizeof(buf))) < 0)
                                return r;
                        char *f = strstr(buf, "frozen ");
                        if (f && (f[7] == '1') == frozen)
                                return 0;
                } else {
                        if ((r = read_file(cg->freezer, "freezer.state", buf, sizeof(buf))) < 0)
                                return r;
                        if (frozen ? strncmp(buf, "FROZEN", 6) == 0 : strncmp(buf, "THAWED", 6) == 0)
                                return 0;
                }
                if (waited >= timeout_ms)
                        return -ETIMEDOUT;
                nanosleep(&ts, NULL);
        }
}

int cgroup_freeze(const struct sandbox_cgroup *cg, int timeout_ms)
{
        int r = cg->version == 2 ? write_file(cg->freezer, "cgroup.freeze", "1")
                                 : write_file(cg->freezer, "freezer.state", "FROZEN");
        return r < 0 ? r : wait_state(cg, true, timeout_ms);
}

int cgroup_thaw(const struct sandbox_cgroup *cg, int timeout_ms)
{
        int r = cg->version == 2 ? write_file(cg->freezer, "cgroup.freeze", "0")
                                 : write_file(cg->freezer, "freezer.state", "THAWED");
        return r < 0 ? r : wait_state(cg, false, timeout_ms);
}

static int parse_u64(const char *s, uint64_t *ret)
{
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s)
                return -EINVAL;
        *ret = v;
        return 0;
}

int cgroup_cpu_ns(const struct sandbox_cgroup *cg, uint64_t *ret)
{
        char buf[1024];
        int r = read_file(cg->cpuacct, cg->version == 1 ? "cpuacct.usage" : "cpu.stat", buf, sizeof(buf));
        return r < 0 ? r : cgroup_counter_parse_cpu(cg->version, buf, strlen(buf), ret);
}

static int read_memory(const struct sandbox_cgroup *cg, const char *name, uint64_t *ret)
{
        char buf[64];
        int r = read_file(cg->memory, name, buf, sizeof(buf));
        return r < 0 ? r : cgroup_counter_parse_u64(buf, strlen(buf), ret);
}

int cgroup_memory_bytes(const struct sandbox_cgroup *cg, uint64_t *ret)
{
        return read_memory(cg, cg->version == 1 ? "memory.usage_in_bytes" : "memory.current", ret);
}

int cgroup_memory_peak_bytes(const struct sandbox_cgroup *cg, uint64_t *ret)
{
        return read_memory(cg, cg->version == 1 ? "memory.max_usage_in_bytes" : "memory.peak", ret);
}

int cgroup_pids(const struct sandbox_cgroup *cg, pid_t **ret)
{
        pid_t *list = NULL;
        int n = 0, cap = 0;
        /* Every folder: a process in one hierarchy but not another is still the sandbox's. */
        for (size_t d = 0; d < cg->ndirs; d++) {
                char path[PATH_MAX + 16];
                snprintf(path, sizeof(path), "%s/cgroup.procs", cg->dirs[d]);
                FILE *f = fopen(path, "re");
                if (!f) {
                        if (errno == ENOENT)
                                continue;
                        free(list);
                        return -errno;
                }
                long v;
                while (fscanf(f, "%ld", &v) == 1) {
                        bool seen = false;
                        for (int i = 0; i < n && !seen; i++)
                                seen = list[i] == (pid_t)v;
                        if (seen)
                                continue;
                        if (n == cap) {
                                cap = cap ? cap * 2 : 16;
                                pid_t *l = realloc(list, (size_t)cap * sizeof(*l));
                                if (!l) {
                                        fclose(f);
                                        free(list);
                                        return -ENOMEM;
                                }
                                list = l;
                        }
                        list[n++] = (pid_t)v;
                }
                fclose(f);
        }
        *ret = list;
        return n;
}

int cgroup_kill_all(const struct sandbox_cgroup *cg, int timeout_ms)
{
        struct timespec ts = { 0, 2 * 1000 * 1000 };
        bool thawed = false;
        for (int waited = 0;; waited += 2) {
                pid_t *pids = NULL;
                int n = cgroup_pids(cg, &pids);
                if (n < 0)
                        return n;
                for (int i = 0; i < n; i++)
                        kill(pids[i], SIGKILL);
                free(pids);
                if (n == 0)
                        return 0;
                if (!thawed) {
                        /* Frozen processes cannot act on SIGKILL until thawed. */
                        if (cg->version == 2)
                                write_file(cg->freezer, "cgroup.kill", "1");
                        cg->version == 2 ? write_file(cg->freezer, "cgroup.freeze", "0")
                                         : write_file(cg->freezer, "freezer.state", "THAWED");
                        thawed = true;
                }
                if (waited >= timeout_ms)
                        return -ETIMEDOUT;
                nanosleep(&ts, NULL);
        }
}

/* pids.current of cg's pids folder (v1: the pids hierarchy; v2: the folder
 * itself when its parent delegates pids): -ENOENT when it has none. */
static int pids_current(const struct sandbox_cgroup *cg, uint64_t *ret)
{
        char buf[64];
        for (size_t i = 0; i < cg->ndirs; i++) {
                int r = read_file(cg->dirs[i], "pids.current", buf, sizeof(buf));
                if (r == -ENOENT)
                        continue;
                return r < 0 ? r : parse_u64(buf, ret);
        }
        return -ENOENT;
}

/* Whether pid has ended and waits to be reaped (state Z in /proc/PID/stat). */
static bool is_zombie(pid_t pid)
{
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        if (file_read_small(path, buf, sizeof(buf)) < 0)
                return false;
        const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
        return p && p[1] == ' ' && p[2] == 'Z';
}

int cgroup_cpu_final(const struct sandbox_cgroup *cg, pid_t init, int timeout_ms, uint64_t *ret)
{
        /* Bounded by the clock, not by a count of sleeps: on a loaded host each
         * sleep and read takes longer than it asks for. */
        int64_t until = time_mono_ns() + timeout_ms * NS_PER_MS;
        uint64_t tasks = 0, cpu = 0, last;
        int r;
        /* A task leaves cgroup.procs early in its exit, and is charged CPU for
         * the rest of it (and its last slice) until it is released; the pids
         * controller counts it until then. The one exception is the init once
         * it is a zombie: its exit is done (and its pid namespace's with it),
         * it waits only for its reaper, which for a sandbox a restarted daemon
         * took over is the host's init (seen taking 1.5 s). */
        bool released = false;
        while (pids_current(cg, &tasks) == 0) {
                if (tasks == 0 || (tasks == 1 && init > 0 && is_zombie(init))) {
                        released = true;
                        break;
                }
                if (time_mono_ns() >= until)
                        break;
                time_sleep_ns(NS_PER_MS);
        }
        if ((r = cgroup_cpu_ns(cg, &cpu)) < 0)
                return r;
        /* Released is not yet charged: a task reaped by its own exit (the
         * kernel's autoreap) leaves pids.current before its last slice is
         * accounted, at its final switch. So the counter once it holds still
         * for 20 ms, released or not (no pids controller, or a task never
         * reaped); at most timeout_ms more. 2 ms after a release was too
         * short: a cgroup v2 guest under TCG saw 20 ms of a fork's CPU land
         * after the release, and, in CI, a fork bomb's 24 dying tasks 202 µs
         * after 2 ms of stillness. */
        until = time_mono_ns() + timeout_ms * NS_PER_MS;
        int64_t still_ns = 20 * NS_PER_MS;
        do {
                last = cpu;
                time_sleep_ns(still_ns);
                if ((r = cgroup_cpu_ns(cg, &cpu)) < 0)
                        return r;
        } while (cpu != last && time_mono_ns() < until);
        *ret = cpu;
        return released ? 0 : -EAGAIN;
}

int cgroup_remove(const struct cgroup_host *host, const struct sandbox_cgroup *cg)
{
        (void)host;
        int first = 0;
        for (size_t i = cg->ndirs; i > 0; i--) {
                int r = rmdir_retry(cg->dirs[i - 1]);
                if (r < 0 && first == 0)
                        first = r;
        }
        return first;
}

void cgroup_ids_free(char **ids, int n)
{
        for (int i = 0; ids && i < n; i++)
                free(ids[i]);
        free(ids);
}

int cgroup_list_ids(const struct cgroup_host *host, char ***ret)
{
        char dir[PATH_MAX];
        int r = host->version == 2 ? path_join(dir, sizeof(dir), host->mount, host->parent, NULL)
                                   : path_join(dir, sizeof(dir), host->mount, "memory", host->parent);
        if (r < 0)
                return r;
        char **ids = NULL;
        int n = 0, cap = 0;
        /* On v1 a sandbox may exist in some hierarchies only (a crash mid-create):
         * gather names from every hierarchy. */
        for (size_t h = 0; h < (host->version == 2 ? 1 : sizeof(v1_hierarchies) / sizeof(v1_hierarchies[0])); h++) {
                if (host->version == 1 &&
                    path_join(dir, sizeof(dir), host->mount, v1_hierarchies[h].name, host->parent) < 0)
                        continue;
                DIR *d = opendir(dir);
                if (!d)
                        continue;
                struct dirent *de;
                while ((de = readdir(d))) {
                        if (de->d_type != DT_DIR || de->d_name[0] == '.')
                                continue;
                        bool seen = false;
                        for (int i = 0; i < n && !seen; i++)
                                seen = strcmp(ids[i], de->d_name) == 0;
                        if (seen)
                                continue;
                        if (n == cap) {
                                cap = cap ? cap * 2 : 16;
                                char **l = realloc(ids, (size_t)cap * sizeof(*l));
                                if (!l)
                                        goto nomem;
                                ids = l;
                        }
                        if (!(ids[n] = strdup(de->d_name)))
                                goto nomem;
                        n++;
                        continue;
nomem:
                        closedir(d);
                        cgroup_ids_free(ids, n);
                        return -ENOMEM;
                }
                closedir(d);
        }
        *ret = ids;
        return n;
}
