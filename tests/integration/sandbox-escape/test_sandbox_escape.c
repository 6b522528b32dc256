/* Integration: the sandbox-escape suite. A real tally-vmm daemon (process
 * backend) on this machine's real cgroups makes real sandboxes; inside each,
 * escape-helper (a static program this test puts into the sandbox's disk
 * through the sandbox's own exec: base64 on stdin, decoded by base64(1)
 * inside) tries one attack of docs/security.md's list and the test checks, from the host,
 * that it failed. The same helper with the same arguments also runs as host root
 * outside any sandbox — against a scratch cgroup, a scratch registry copy, a
 * private mount namespace, a victim process this test started — and the test
 * checks that it succeeds there: a helper that cannot attack cannot make this
 * suite pass.
 *
 * Ground truth is read from the host, never from the helper's own report: the
 * cgroup files, /proc/PID/cgroup of every process in the sandbox's pid
 * namespace, the registry file's bytes, the daemon's sandbox list, a TCP
 * listener in the host's network namespace, a victim process's exit status.
 * After each attack the sandbox's processes must all sit in its cgroup in
 * every hierarchy, its CPU counter must not have gone backwards, and the
 * final counter tally-vmm reports at stop must equal the one read here.
 * Everything the test makes is removed at exit, also when a check fails. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "support.h"
#include "vmmtest.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CG "/sys/fs/cgroup"
#define DISK_MIB 32

static char parent[64];     /* the daemon's cgroup parent: tally-test-escape-<pid> */
static char ctl_parent[64]; /* the controls' scratch cgroups: tally-test-escctl-<pid> */
static char account[64], token[32];
static char *work, *state, *sock, *ctl_dir;
static char *hosts_file; /* the daemon's egress_hosts_file: names of the test's own internet */
static const char *helper;
static pid_t daemon_pid = -1;
/* the rest of the pipeline: a private Kafka (other tests' usage stays out of this
 * ledger), the collector, the aggregator and a database of its own */
static pid_t collector_pid = -1, aggregator_pid = -1;
static struct test_kafka kafka; /* the development broker, or Apache Kafka under TALLY_TEST_KAFKA=apache */
static char *brokers, *db_url;
/* each stopped sandbox's final counter as read here, for the ledger check at the end */
static struct billed {
        char id[64], attack[32];
        uint64_t counter;
} stopped[32];
static int nstopped;
static int cgroup_version;
static pid_t inits[64];
static ino_t init_ns[64];
static int ninits;
static pid_t victims[2] = { -1, -1 };
static unsigned long long victim_addr[2];
static char victim_file[2][1024];

/* v1: the hierarchies tally-vmm makes a folder in (those mounted here) */
static const char *v1_names[] = { "cpu", "cpuacct", "memory", "freezer", "pids", "unified", NULL };

static bool dir_exists(const char *path)
{
        struct stat st;
        return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static ino_t pidns_of(pid_t pid)
{
        char path[64];
        struct stat st;
        snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)pid);
        return stat(path, &st) == 0 ? st.st_ino : 0;
}

static int write_text(const char *path, const char *text)
{
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        int r = write(fd, text, strlen(text)) < 0 ? -errno : 0;
        close(fd);
        return r;
}

static char *fmt(const char *f, ...)
{
        va_list ap;
        char *s;
        va_start(ap, f);
        if (vasprintf(&s, f, ap) < 0)
                abort();
        va_end(ap);
        return s;
}

/* The folder of cgroup `rel` (parent/name) in hierarchy h (v1), or the one folder (v2). */
static char *cg_dir(const char *h, const char *rel)
{
        return cgroup_version == 2 ? fmt(CG "/%s", rel) : fmt(CG "/%s/%s", h, rel);
}

/* ---- cleaning up whatever the test made ---- */

static void net_cleanup(void);

/* Whether the named cgroup v1 hierarchy exists (every process is in each
 * hierarchy, so each one is a line of /proc/self/cgroup, mounted or not). */
static bool hierarchy_exists(const char *name)
{
        char want[96];
        snprintf(want, sizeof(want), ":name=%s:", name);
        char *t = test_read_file("/proc/self/cgroup");
        bool found = t && strstr(t, want);
        free(t);
        return found;
}

static int rmdir_below(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)st;
        if (flag == FTW_DP && ftw->level > 0)
                rmdir(path);
        return 0;
}

/* The release_agent attack mounts a named cgroup v1 hierarchy of this run's
 * (name=tallyesc<token>c as the control; ...i from inside a sandbox, which must
 * be refused). Unmounted, a hierarchy lives on in the kernel while it has a
 * child cgroup, and a child removed just before the unmount still counts until
 * the kernel has freed it: each run left one behind. Mounted again by name,
 * emptied and unmounted, it goes. Returns how many of the two are left. */
static int release_agent_cleanup(void)
{
        if (!*token)
                return 0;
        char dir[96];
        snprintf(dir, sizeof(dir), "/tmp/tally-escape-ra-%d", (int)getpid());
        int left = 0;
        for (const char *suffix = "ci"; *suffix; suffix++) {
                char name[64], opts[96];
                snprintf(name, sizeof(name), "tallyesc%s%c", token, *suffix);
                snprintf(opts, sizeof(opts), "none,name=%s", name);
                for (int tries = 0; tries < 50 && hierarchy_exists(name); tries++) {
                        if (mkdir(dir, 0700) == 0 || errno == EEXIST) {
                                if (mount("cgroup", dir, "cgroup", 0, opts) == 0) {
                                        nftw(dir, rmdir_below, 16, FTW_DEPTH | FTW_PHYS);
                                        umount2(dir, 0);
                                }
                                rmdir(dir);
                        }
                        test_sleep_ms(100);
                }
                if (hierarchy_exists(name)) {
                        fprintf(stderr, "could not remove the cgroup v1 hierarchy name=%s\n", name);
                        left++;
                }
        }
        return left;
}

static void cleanup(void)
{
        net_cleanup();
        release_agent_cleanup();
        /* A sandbox's init takes its whole pid namespace with it, escaped processes too. */
        for (int i = 0; i < ninits; i++)
                if (init_ns[i] && pidns_of(inits[i]) == init_ns[i])
                        kill(inits[i], SIGKILL);
        test_stop_process(&daemon_pid, SIGKILL);
        pid_t *others[] = { &collector_pid, &aggregator_pid };
        for (int i = 0; i < 2; i++)
                test_stop_process(others[i], SIGKILL);
        test_kafka_stop(&kafka);
        for (int i = 0; i < 2; i++)
                test_stop_process(&victims[i], SIGKILL);
        if (*parent)
                test_cgroup_remove(parent, cgroup_version);
        if (*ctl_parent)
                test_cgroup_remove(ctl_parent, cgroup_version);
        while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
        if (db_url) {
                test_db_drop(db_url);
                db_url = NULL;
        }
}

/* ---- the daemon, through its own command line client ---- */

static int cli_raw(char **out, char **err, const char *first, ...)
{
        va_list ap;
        va_start(ap, first);
        int rc = test_vmm_cli_raw_v(sock, out, err, first, ap);
        va_end(ap);
        return rc;
}

static json_t *cli(int *ret_rc, const char *first, ...)
{
        va_list ap;
        va_start(ap, first);
        json_t *j = test_vmm_cli_v(sock, ret_rc, NULL, first, ap);
        va_end(ap);
        return j;
}

/* In the daemon's environment only: seen by whoever may ptrace-read the daemon. */
static char daemon_secret[64];

static void start_daemon(void)
{
        snprintf(daemon_secret, sizeof(daemon_secret), "daemon-secret-%s", token);
        setenv("TALLY_ESCAPE_DAEMON_SECRET", daemon_secret, 1);
        char *log = fmt("%s/vmm.log", work);
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state, "--socket", sock,
                         "--kafka-brokers", brokers, "--cgroup-parent", parent,
                         "--host-id", "test-escape-host", "--backend", "process", "--final-wait-ms", "3000",
                         "--log-level", "debug", NULL };
        /* the names of the test's own internet (the egress_hosts_file setting, as its TALLY_ variable) */
        setenv("TALLY_EGRESS_HOSTS_FILE", hosts_file, 1);
        daemon_pid = test_spawn(argv, NULL, log);
        unsetenv("TALLY_EGRESS_HOSTS_FILE");
        if (test_vmm_wait_ready(sock, 20000, &cgroup_version) == 0) {
                free(log);
                return;
        }
        char *l = test_read_file(log);
        fprintf(stderr, "FAIL: tally-vmm did not become ready in 20 s; its log:\n%s\n", l ? l : "");
        exit(1);
}

/* ---- a sandbox under attack ---- */

struct sandbox {
        char id[64];
        char dir[1024];      /* the daemon's folder for it (disk/ inside) */
        char cpu_dir[1024];  /* cgroup_cpu: where its CPU counter is */
        pid_t init;          /* its init, a host pid */
        ino_t pidns;         /* its pid namespace */
        const char *hiers[8]; /* v1: the hierarchies it has a folder in */
        int nhiers;
        uint64_t last_cpu;   /* the counter as last read here */
};

static uint64_t read_u64(const char *path)
{
        char *t = test_read_file(path);
        CHECK(t != NULL, "could not read %s", path);
        uint64_t v = t ? strtoull(t, NULL, 10) : 0;
        free(t);
        return v;
}

/* A cgroup's CPU counter in ns, read from the kernel's file (v1 cpuacct folder, v2 the folder). */
static uint64_t cpu_counter(const char *dir)
{
        char path[1100];
        if (cgroup_version == 1) {
                snprintf(path, sizeof(path), "%s/cpuacct.usage", dir);
                return read_u64(path);
        }
        snprintf(path, sizeof(path), "%s/cpu.stat", dir);
        char *t = test_read_file(path);
        char *u = t ? strstr(t, "usage_usec ") : NULL;
        CHECK(u != NULL, "could not read usage_usec from %s", path);
        uint64_t v = u ? strtoull(u + 11, NULL, 10) * 1000 : 0;
        free(t);
        return v;
}

static char *base64(const unsigned char *in, size_t len)
{
        static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        char *out = malloc((len + 2) / 3 * 4 + 1), *o = out;
        for (size_t i = 0; i < len; i += 3) {
                uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0) |
                             (i + 2 < len ? in[i + 2] : 0);
                *o++ = tab[v >> 18 & 63];
                *o++ = tab[v >> 12 & 63];
                *o++ = i + 1 < len ? tab[v >> 6 & 63] : '=';
                *o++ = i + 2 < len ? tab[v & 63] : '=';
        }
        *o = '\0';
        return out;
}

/* One request to the daemon's API over its unix socket (HTTP/1.0: the answer ends at
 * close). Returns the HTTP status, or -errno; *ret_body gets the answer's body. */
static int api(const char *method, const char *path, const char *body, char **ret_body)
{
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", sock);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
                int r = -errno;
                if (fd >= 0)
                        close(fd);
                return r;
        }
        char *req = fmt("%s %s HTTP/1.0\r\nHost: vmm\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                        method, path, strlen(body));
        size_t hl = strlen(req), bl = strlen(body);
        bool ok = write(fd, req, hl) == (ssize_t)hl;
        for (size_t off = 0; ok && off < bl;) {
                ssize_t w = write(fd, body + off, bl - off);
                ok = w > 0;
                off += w > 0 ? (size_t)w : 0;
        }
        free(req);
        size_t cap = 1 << 16, n = 0;
        char *buf = malloc(cap + 1);
        ssize_t r;
        while ((r = read(fd, buf + n, cap - n)) > 0) {
                n += (size_t)r;
                if (n == cap)
                        buf = realloc(buf, (cap *= 2) + 1);
        }
        close(fd);
        buf[n] = '\0';
        int status = 0;
        sscanf(buf, "HTTP/%*s %d", &status);
        char *b = strstr(buf, "\r\n\r\n");
        *ret_body = strdup(b ? b + 4 : "");
        free(buf);
        return ok ? status : -EIO;
}

/* The helper, into the sandbox's working folder (its disk), through the sandbox's own
 * exec: base64 on stdin, decoded inside by the sandbox's base64(1). */
static bool put_helper(struct sandbox *sb)
{
        int fd = open(helper, O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0) {
                CHECK(0, "could not open %s", helper);
                return false;
        }
        unsigned char *bin = malloc((size_t)st.st_size);
        bool ok = read(fd, bin, (size_t)st.st_size) == st.st_size;
        close(fd);
        char *b64 = base64(bin, (size_t)st.st_size);
        free(bin);
        json_t *body = json_pack("{s:[s,s,s], s:s, s:i}", "command", "/bin/sh", "-c",
                                 "base64 -d > escape-helper && chmod 755 escape-helper && ls -l escape-helper",
                                 "stdin", b64, "timeout_ms", 30000);
        char *text = json_dumps(body, JSON_COMPACT), *answer = NULL, *path = fmt("/v1/sandboxes/%s/exec", sb->id);
        int status = api("POST", path, text, &answer);
        json_t *j = json_loads(answer, 0, NULL);
        ok = ok && status == 200 && json_integer_value(json_object_get(j, "exit_code")) == 0;
        CHECK(ok, "could not put the helper into the sandbox: HTTP %d %s", status, answer);
        json_decref(j);
        json_decref(body);
        free(text);
        free(answer);
        free(path);
        free(b64);
        return ok;
}

/* Fills sb from the daemon's description of a sandbox (create's answer, or one
 * of fork's copies). */
static void adopt(struct sandbox *sb, json_t *j)
{
        memset(sb, 0, sizeof(*sb));
        snprintf(sb->id, sizeof(sb->id), "%s", test_jstr(j, "id"));
        snprintf(sb->dir, sizeof(sb->dir), "%s", test_jstr(j, "dir"));
        snprintf(sb->cpu_dir, sizeof(sb->cpu_dir), "%s", test_jstr(j, "cgroup_cpu"));
        sb->init = (pid_t)json_integer_value(json_object_get(j, "pid"));
        sb->pidns = pidns_of(sb->init);
        if (ninits < 64) {
                init_ns[ninits] = sb->pidns;
                inits[ninits++] = sb->init;
        }
        CHECK(sb->pidns != 0, "could not read the pid namespace of the sandbox's init %d", (int)sb->init);
        for (const char **h = v1_names; cgroup_version == 1 && *h; h++) {
                char *d = fmt(CG "/%s/%s/%s", *h, parent, sb->id);
                if (dir_exists(d))
                        sb->hiers[sb->nhiers++] = *h;
                else
                        CHECK(strcmp(*h, "unified") == 0, "the sandbox has no folder in the %s hierarchy", *h);
                free(d);
        }
        sb->last_cpu = cpu_counter(sb->cpu_dir);
}

/* A fresh sandbox for one attack; network is the create request's "network"
 * (JSON text, sent to the daemon's API as a product's client would), or NULL
 * for the default (loopback only). */
static bool create_net(struct sandbox *sb, const char *name, const char *network)
{
        memset(sb, 0, sizeof(*sb));
        int rc;
        char disk[16];
        snprintf(disk, sizeof(disk), "%d", DISK_MIB);
        json_t *j;
        if (network) {
                const char *eq = strchr(name, '=');
                char *body = fmt("{\"account\":\"%s\",\"key\":\"key-escape\",\"vcpus\":1,\"memory_mib\":128,"
                                 "\"disk_mib\":%d,\"timeout_s\":300,\"labels\":{\"suite\":\"sandbox-escape\","
                                 "\"attack\":\"%s\"},\"network\":%s}",
                                 account, DISK_MIB, eq ? eq + 1 : name, network);
                char *answer = NULL;
                int st = api("POST", "/v1/sandboxes", body, &answer);
                rc = st == 201 ? 0 : 1;
                j = json_loads(answer ? answer : "", 0, NULL);
                if (!j)
                        j = json_pack("{s:i, s:s}", "http_status", st, "body", answer ? answer : "");
                free(body);
                free(answer);
        } else {
                j = cli(&rc, "create", "--account", account, "--key", "key-escape", "--vcpus", "1", "--memory-mib",
                        "128", "--disk-mib", disk, "--timeout", "300", "--label", "suite=sandbox-escape", "--label",
                        name, NULL);
        }
        CHECK(rc == 0 && *test_jstr(j, "id"), "create failed: rc=%d %s", rc, json_dumps(j, 0));
        if (rc != 0 || !*test_jstr(j, "id")) {
                json_decref(j);
                return false;
        }
        adopt(sb, j);
        json_decref(j);
        return put_helper(sb);
}

static bool create(struct sandbox *sb, const char *name)
{
        return create_net(sb, name, NULL);
}

static int count_ns(ino_t ns);

static char *read_status(pid_t pid)
{
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        return test_read_file(path);
}
#define in_sandbox(sb, out, ...) in_sandbox_w(sb, out, &(struct watch){ 0 }, __VA_ARGS__)

static int attack_failures; /* checks failed inside the sandbox (the attack worked) */
static int control_failures;

#define ESCAPED(...) do { attack_failures++; CHECK(0, __VA_ARGS__); } while (0)
/* cond is evaluated once: some read what they consume (a connection) */
#define CTL(cond, ...)                                \
        do {                                          \
                bool ctl_ok_ = (cond);                \
                if (!ctl_ok_)                         \
                        control_failures++;           \
                CHECK(ctl_ok_, __VA_ARGS__);          \
        } while (0)

/* What the test saw from the host while a command ran inside. */
struct watch {
        uint64_t max_cpu;     /* the highest CPU counter read */
        uint64_t drop;        /* the largest fall of the counter between two reads */
        int tracer;           /* a TracerPid the sandbox's init had, 0 if never traced */
        int max_live;         /* with count_procs: the most processes of the pid namespace at once */
        long max_pids_current;
        bool count_procs;
};

/* Runs the helper inside the sandbox: ./escape-helper ARGS... (the sandbox's working
 * folder), reading the sandbox's CPU counter from the host every few ms meanwhile. */
static int in_sandbox_w(struct sandbox *sb, char **out, struct watch *w, const char *first, ...)
{
        char *argv[32];
        int n = 0;
        argv[n++] = (char *)test_env("TALLY_VMM_BIN");
        argv[n++] = "--socket";
        argv[n++] = sock;
        argv[n++] = "exec";
        argv[n++] = sb->id;
        argv[n++] = "--timeout-ms";
        argv[n++] = "40000";
        argv[n++] = "--";
        argv[n++] = "./escape-helper";
        va_list ap;
        va_start(ap, first);
        for (const char *a = first; a && n < 30; a = va_arg(ap, const char *))
                argv[n++] = (char *)a;
        va_end(ap);
        argv[n] = NULL;
        char *out_path = fmt("%s/exec.out", work), *err_path = fmt("%s/exec.err", work);
        char *cur_path = NULL;
        if (w->count_procs) {
                char *rel = fmt("%s/%s", parent, sb->id), *d = cg_dir("pids", rel);
                cur_path = fmt("%s/pids.current", d);
                free(rel);
                free(d);
        }
        pid_t client = test_spawn(argv, out_path, err_path);
        int status = 0;
        uint64_t last = sb->last_cpu;
        w->max_cpu = last;
        for (;;) {
                pid_t r = waitpid(client, &status, WNOHANG);
                uint64_t cpu = cpu_counter(sb->cpu_dir);
                if (cpu < last && last - cpu > w->drop)
                        w->drop = last - cpu;
                if (cpu > w->max_cpu)
                        w->max_cpu = cpu;
                last = cpu;
                char *st = read_status(sb->init);
                char *tp = st ? strstr(st, "TracerPid:") : NULL;
                if (tp && atoi(tp + 10) != 0 && !w->tracer)
                        w->tracer = atoi(tp + 10);
                free(st);
                if (w->count_procs) {
                        int live = count_ns(sb->pidns);
                        char *t = test_read_file(cur_path);
                        long c = t ? strtol(t, NULL, 10) : -1;
                        free(t);
                        if (live > w->max_live)
                                w->max_live = live;
                        if (c > w->max_pids_current)
                                w->max_pids_current = c;
                }
                if (r == client)
                        break;
                test_sleep_ms(5);
        }
        int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        *out = test_read_file(out_path);
        char *err = test_read_file(err_path);
        fprintf(stderr, "--- inside %s: %s (exit %d)\n%s\n%s%s", sb->id, argv[9], rc, *out ? *out : "",
                err ? err : "", err && *err ? "\n" : "");
        fprintf(stderr, "    seen from the host meanwhile: CPU counter up to %" PRIu64 " ns, largest fall %" PRIu64
                        " ns\n", w->max_cpu, w->drop);
        CHECK(*out && strstr(*out, "helper-started"), "the helper did not run inside the sandbox (exit %d): %s", rc,
              err ? err : "");
        if (w->tracer)
                ESCAPED("%s: the sandbox's init (pid %d on the host) was ptraced by pid %d", argv[9], (int)sb->init,
                        w->tracer);
        uint64_t now = cpu_counter(sb->cpu_dir);
        if (w->drop > 0 || now < w->max_cpu)
                ESCAPED("%s: the sandbox's CPU counter went backwards while it ran: by up to %" PRIu64
                        " ns, %" PRIu64 " ns now after %" PRIu64 " ns seen",
                        argv[9], w->drop, now, w->max_cpu);
        sb->last_cpu = now > w->max_cpu ? now : w->max_cpu;
        free(err);
        free(out_path);
        free(err_path);
        free(cur_path);
        return rc;
}

/* How many processes of the sandbox's pid namespace sit outside its cgroup, in
 * any hierarchy it has a folder in (from /proc/PID/cgroup, read on the host);
 * each one is printed. *ret_n: how many processes the sandbox has. */
static int outside(struct sandbox *sb, int *ret_n, pid_t want_nspid, bool *ret_seen)
{
        char want[256];
        snprintf(want, sizeof(want), "/%s/%s", parent, sb->id);
        size_t wl = strlen(want);
        int bad = 0, n = 0;
        DIR *d = opendir("/proc");
        struct dirent *de;
        while (d && (de = readdir(d))) {
                if (de->d_name[0] < '1' || de->d_name[0] > '9')
                        continue;
                pid_t pid = (pid_t)atoi(de->d_name);
                if (pidns_of(pid) != sb->pidns)
                        continue;
                char path[64];
                snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
                char *t = test_read_file(path);
                if (!t)
                        continue; /* gone meanwhile */
                n++;
                snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
                char *st = test_read_file(path), *nsl = st ? strstr(st, "NSpid:") : NULL;
                if (nsl && want_nspid > 0) {
                        char *last = NULL;
                        long v = 0;
                        for (char *p = nsl + 6; *p && *p != '\n';) {
                                v = strtol(p, &last, 10);
                                if (last == p)
                                        break;
                                p = last;
                        }
                        if (v == want_nspid)
                                *ret_seen = true;
                }
                free(st);
                for (char *save = NULL, *l = strtok_r(t, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
                        char *c1 = strchr(l, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
                        if (!c2)
                                continue;
                        *c1 = '\0';
                        *c2 = '\0';
                        const char *path_in = c2 + 1, *ctrls = c1 + 1, *h = NULL;
                        if (cgroup_version == 2 || strcmp(l, "0") == 0)
                                h = "unified";
                        for (int i = 0; !h && i < sb->nhiers; i++) {
                                char copy[256], *p = copy;
                                snprintf(copy, sizeof(copy), "%s", ctrls);
                                for (char *tok; (tok = strsep(&p, ","));)
                                        if (strcmp(tok, sb->hiers[i]) == 0)
                                                h = sb->hiers[i];
                        }
                        bool managed = cgroup_version == 2;
                        for (int i = 0; !managed && h && i < sb->nhiers; i++)
                                managed = strcmp(h, sb->hiers[i]) == 0;
                        if (!managed)
                                continue;
                        if (strncmp(path_in, want, wl) != 0 || (path_in[wl] && path_in[wl] != '/')) {
                                fprintf(stderr, "    pid %d of %s is outside its cgroup in %s: %s\n", (int)pid, sb->id,
                                        h, path_in);
                                bad++;
                        }
                }
                free(t);
        }
        if (d)
                closedir(d);
        *ret_n = n;
        return bad;
}

/* After an attack: every process still in the sandbox's cgroup, the counter not gone back. */
static void check_metered(struct sandbox *sb, const char *attack)
{
        int n = 0;
        bool seen = false;
        int bad = outside(sb, &n, 0, &seen);
        if (bad)
                ESCAPED("%s: %d cgroup membership(s) of the sandbox's processes are outside %s/%s", attack, bad,
                        parent, sb->id);
        uint64_t cpu = cpu_counter(sb->cpu_dir);
        if (cpu < sb->last_cpu)
                ESCAPED("%s: the sandbox's CPU counter went backwards: %" PRIu64 " -> %" PRIu64, attack, sb->last_cpu,
                        cpu);
        sb->last_cpu = cpu;
}

/* Reads the counter of a cgroup folder without failing the test when it is gone. */
static bool try_counter(const char *dir, uint64_t *ret)
{
        char *path = fmt(cgroup_version == 1 ? "%s/cpuacct.usage" : "%s/cpu.stat", dir);
        char *t = test_read_file(path);
        free(path);
        if (!t)
                return false;
        char *u = cgroup_version == 1 ? t : strstr(t, "usage_usec ");
        bool ok = u != NULL;
        if (ok)
                *ret = cgroup_version == 1 ? strtoull(u, NULL, 10) : strtoull(u + 11, NULL, 10) * 1000;
        free(t);
        return ok;
}

/* Whether the cgroup folder holds no process (false when it cannot be read). */
static bool empty(const char *dir)
{
        char *path = fmt("%s/cgroup.procs", dir);
        char *t = test_read_file(path);
        bool e = t && !*t;
        free(t);
        free(path);
        return e;
}

/* Stops the sandbox: the final counter tally-vmm bills equals the one read here.
 * The folder goes soon after the stop (once the collector's final sample is
 * taken), so the test reads it every millisecond meanwhile and keeps the last
 * reading taken with no process left in the folder: nothing can add to it then. */
static void stop(struct sandbox *sb, const char *attack)
{
        if (!*sb->id)
                return;
        check_metered(sb, attack);
        char *out_path = fmt("%s/stop.out", work);
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--socket", sock, "stop", sb->id, NULL };
        pid_t client = test_spawn(argv, out_path, NULL);
        int status = 0;
        uint64_t mine = 0;
        bool have = false, exited = false;
        int64_t until = test_now_ms() + 30000;
        while (test_now_ms() < until) {
                if (!exited && waitpid(client, &status, WNOHANG) == client)
                        exited = true;
                uint64_t v;
                if (try_counter(sb->cpu_dir, &v) && empty(sb->cpu_dir)) {
                        uint64_t again;
                        /* still there after the emptiness was seen: the reading is the final one */
                        if (try_counter(sb->cpu_dir, &again) && again == v) {
                                mine = v;
                                have = true;
                        }
                }
                /* the folder may stay a while yet (final_wait_ms): once empty, its reading is final */
                if (exited && (have || !dir_exists(sb->cpu_dir)))
                        break;
                test_sleep_ms(1);
        }
        if (!exited) {
                kill(client, SIGKILL);
                waitpid(client, &status, 0);
        }
        char *out = test_read_file(out_path);
        json_t *j = out ? json_loads(out, 0, NULL) : NULL;
        int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
        uint64_t final = (uint64_t)json_integer_value(json_object_get(j, "final_cpu_ns"));
        CHECK(have, "%s: the test could not read the stopped sandbox's counter before its cgroup went", attack);
        if (rc == 0 && have && nstopped < 32) {
                struct billed *b = &stopped[nstopped++];
                snprintf(b->id, sizeof(b->id), "%s", sb->id);
                snprintf(b->attack, sizeof(b->attack), "%s", attack);
                b->counter = mine;
        }
        CHECK(rc == 0 && final == mine && final >= sb->last_cpu,
              "%s: the stopped sandbox's final counter %" PRIu64 " is not the cgroup's %" PRIu64 " (last seen %" PRIu64
              "): %s",
              attack, final, mine, sb->last_cpu, out ? out : "");
        json_decref(j);
        free(out);
        free(out_path);
}

/* ---- the controls: the same helper as host root, outside any sandbox ---- */

static void ctl_mkdir(const char *name)
{
        if (cgroup_version == 2) {
                char *p = fmt(CG "/%s", ctl_parent), *ctl = fmt("%s/cgroup.subtree_control", p);
                mkdir(p, 0755);
                write_text(ctl, "+cpu +memory +pids");
                char *d = fmt("%s/%s", p, name);
                CHECK(mkdir(d, 0755) == 0 || errno == EEXIST, "could not make %s: %s", d, strerror(errno));
                free(p);
                free(ctl);
                free(d);
                return;
        }
        for (const char **h = v1_names; *h; h++) {
                char *root = fmt(CG "/%s", *h);
                if (!dir_exists(root)) {
                        free(root);
                        continue;
                }
                char *p = fmt("%s/%s", root, ctl_parent), *d = fmt("%s/%s", p, name);
                mkdir(p, 0755);
                CHECK(mkdir(d, 0755) == 0 || errno == EEXIST, "could not make %s: %s", d, strerror(errno));
                free(root);
                free(p);
                free(d);
        }
}

static void ctl_set(const char *name, const char *h, const char *file, const char *value)
{
        char *rel = fmt("%s/%s", ctl_parent, name), *d = cg_dir(h, rel), *path = fmt("%s/%s", d, file);
        int r = write_text(path, value);
        CHECK(r == 0, "could not write %s to %s: %s", value, path, strerror(-r));
        free(rel);
        free(d);
        free(path);
}

static char *ctl_read(const char *name, const char *h, const char *file)
{
        char *rel = fmt("%s/%s", ctl_parent, name), *d = cg_dir(h, rel), *path = fmt("%s/%s", d, file);
        char *t = test_read_file(path);
        free(rel);
        free(d);
        free(path);
        return t ? t : strdup("");
}

struct control {
        const char *cgroup;  /* scratch cgroup to run in, or NULL */
        int unshare_flags;   /* namespaces of its own (a private mount namespace always) */
        int preburn_ms;      /* CPU to burn in the scratch cgroup, then stop for the test to read */
        void (*on_stopped)(void);
        bool leak_dir_fd;    /* an inherited directory descriptor (host-proc's climb) */
};

/* Starts the helper as host root: in the scratch cgroup, a private mount
 * namespace (its /proc unmounts never reach the host's), working in ctl_dir. */
static pid_t control_start(const struct control *c, char *const args[], const char *out_path)
{
        char *argv[32];
        int n = 0;
        argv[n++] = (char *)helper;
        for (int i = 0; args[i] && n < 31; i++)
                argv[n++] = args[i];
        argv[n] = NULL;
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0)
                abort();
        if (pid == 0) {
                if (c->cgroup) {
                        char *rel = fmt("%s/%s", ctl_parent, c->cgroup);
                        for (const char **h = v1_names; *h; h++) {
                                char *d = cg_dir(*h, rel), *procs = fmt("%s/cgroup.procs", d);
                                char me[32];
                                snprintf(me, sizeof(me), "%d", (int)getpid());
                                if (dir_exists(d) && write_text(procs, me) < 0)
                                        _exit(120);
                                if (cgroup_version == 2)
                                        break;
                        }
                }
                if (unshare(CLONE_NEWNS | c->unshare_flags) < 0 ||
                    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
                        _exit(121);
                if ((c->unshare_flags & CLONE_NEWUTS) && sethostname("escape-control", 14) < 0)
                        _exit(122);
                if (chdir(ctl_dir) < 0)
                        _exit(123);
                int fd = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                if (fd < 0)
                        _exit(124);
                /* a directory descriptor left open across exec, as a leaky launcher would */
                if (c->leak_dir_fd && open(work, O_RDONLY | O_DIRECTORY) < 0)
                        _exit(126);
                dup2(fd, 1);
                dup2(fd, 2);
                if (c->preburn_ms) {
                        int64_t until = test_now_ms() + c->preburn_ms;
                        volatile uint64_t x = 0;
                        while (test_now_ms() < until)
                                x++;
                        raise(SIGSTOP);
                }
                execv(argv[0], argv);
                _exit(125);
        }
        if (c->preburn_ms) {
                int status;
                waitpid(pid, &status, WUNTRACED);
                if (c->on_stopped)
                        c->on_stopped();
                kill(pid, SIGCONT);
        }
        return pid;
}

static char *control_wait(pid_t pid, const char *out_path)
{
        int status = 0;
        waitpid(pid, &status, 0);
        char *out = test_read_file(out_path);
        fprintf(stderr, "--- control as host root (status %d)\n%s\n", status, out ? out : "");
        CHECK(out && strstr(out, "helper-started"), "the control's helper did not run (status %d)", status);
        return out ? out : strdup("");
}

static char *control(const struct control *c, char *const args[])
{
        char *path = fmt("%s/control.out", work);
        char *out = control_wait(control_start(c, args, path), path);
        free(path);
        return out;
}

/* ---- the attacks ---- */


/* Per hierarchy, whether host pid is outside the scratch cgroup ctl_parent/name. */
static int left_scratch(pid_t pid, const char *name, int *ret_total)
{
        char want[128], path[64];
        snprintf(want, sizeof(want), "/%s/%s", ctl_parent, name);
        snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)pid);
        char *t = test_read_file(path);
        int left = 0, total = 0;
        for (char *save = NULL, *l = t ? strtok_r(t, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save)) {
                char *c1 = strchr(l, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
                if (!c2)
                        continue;
                *c1 = '\0';
                *c2 = '\0';
                bool managed = cgroup_version == 2 || strcmp(l, "0") == 0;
                for (int i = 0; !managed && i < 5; i++) {
                        char copy[256], *p = copy;
                        snprintf(copy, sizeof(copy), "%s", c1 + 1);
                        for (char *tok; (tok = strsep(&p, ","));)
                                managed |= strcmp(tok, v1_names[i]) == 0;
                }
                if (!managed)
                        continue;
                total++;
                if (strncmp(c2 + 1, want, strlen(want)) != 0)
                        left++;
        }
        free(t);
        *ret_total = total;
        return left;
}

static long field_after(const char *out, const char *key)
{
        const char *p = out ? strstr(out, key) : NULL;
        return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

/* 1. Leave the cgroup on every hierarchy: own pid into a parent's or the root's cgroup.procs. */
static void attack_leave_cgroup(void)
{
        ctl_mkdir("leave");
        char *args[] = { "leave-cgroup", NULL };
        char *out = control(&(struct control){ .cgroup = "leave" }, args);
        long pid = field_after(out, "lingerer pid=");
        int total = 0, left = pid > 0 ? left_scratch((pid_t)pid, "leave", &total) : 0;
        CTL(pid > 0 && total > 0 && left == total,
            "control: the helper left its scratch cgroup in %d of %d hierarchies", left, total);
        free(out);

        struct sandbox sb;
        if (!create(&sb, "attack=leave-cgroup"))
                return;
        out = NULL;
        in_sandbox(&sb, &out, "leave-cgroup", NULL);
        long inner = field_after(out, "lingerer pid=");
        int n = 0;
        bool seen = false;
        int bad = outside(&sb, &n, (pid_t)inner, &seen);
        CHECK(inner > 0 && seen, "the helper's lingering process (pid %ld inside) was not found on the host", inner);
        if (bad)
                ESCAPED("leave-cgroup: %d cgroup membership(s) outside the sandbox's cgroup", bad);
        free(out);
        stop(&sb, "leave-cgroup");
}

struct limits {
        uint64_t cpu;
        char *quota, *mem, *pids;
};

static void read_limits(const char *rel, const char *cpu_dir, struct limits *l)
{
        char *cpu = cg_dir("cpu", rel), *mem = cg_dir("memory", rel), *pids = cg_dir("pids", rel);
        char *q = fmt("%s/%s", cpu, cgroup_version == 2 ? "cpu.max" : "cpu.cfs_quota_us");
        char *m = fmt("%s/%s", mem, cgroup_version == 2 ? "memory.max" : "memory.limit_in_bytes");
        char *p = fmt("%s/pids.max", pids);
        l->cpu = cpu_counter(cpu_dir);
        l->quota = test_read_file(q);
        l->mem = test_read_file(m);
        l->pids = test_read_file(p);
        free(cpu);
        free(mem);
        free(pids);
        free(q);
        free(m);
        free(p);
}

static void free_limits(struct limits *l)
{
        free(l->quota);
        free(l->mem);
        free(l->pids);
}

static struct limits ctl_before;
static void read_ctl_counters(void)
{
        char *rel = fmt("%s/counters", ctl_parent), *cpu = cg_dir("cpuacct", rel);
        read_limits(rel, cpu, &ctl_before);
        free(rel);
        free(cpu);
}

static bool same(const char *a, const char *b)
{
        return a && b && strcmp(a, b) == 0;
}

/* 2. Reset or raise the counters and limits. */
static void attack_counters(void)
{
        ctl_mkdir("counters");
        if (cgroup_version == 2) {
                ctl_set("counters", "cpu", "cpu.max", "50000 100000");
                ctl_set("counters", "memory", "memory.max", "268435456");
        } else {
                ctl_set("counters", "cpu", "cpu.cfs_quota_us", "50000");
                ctl_set("counters", "memory", "memory.limit_in_bytes", "268435456");
        }
        ctl_set("counters", "pids", "pids.max", "100");
        char *args[] = { "counters", NULL };
        char *out = control(&(struct control){ .cgroup = "counters", .preburn_ms = 300, .on_stopped = read_ctl_counters },
                            args);
        struct limits after;
        char *rel = fmt("%s/counters", ctl_parent), *cpu = cg_dir("cpuacct", rel);
        read_limits(rel, cpu, &after);
        if (cgroup_version == 1)
                CTL(after.cpu < ctl_before.cpu, "control: cpuacct.usage was not reset: %" PRIu64 " -> %" PRIu64,
                    ctl_before.cpu, after.cpu);
        CTL(!same(after.quota, ctl_before.quota), "control: the CPU quota stayed %s", after.quota);
        CTL(!same(after.mem, ctl_before.mem), "control: the memory limit stayed %s", after.mem);
        CTL(!same(after.pids, ctl_before.pids), "control: pids.max stayed %s", after.pids);
        free_limits(&after);
        free_limits(&ctl_before);
        free(rel);
        free(cpu);
        free(out);

        struct sandbox sb;
        if (!create(&sb, "attack=counters"))
                return;
        struct limits before;
        rel = fmt("%s/%s", parent, sb.id);
        read_limits(rel, sb.cpu_dir, &before);
        out = NULL;
        in_sandbox(&sb, &out, "counters", NULL);
        read_limits(rel, sb.cpu_dir, &after);
        if (!same(after.quota, before.quota))
                ESCAPED("counters: the CPU quota changed %s -> %s", before.quota, after.quota);
        if (!same(after.mem, before.mem))
                ESCAPED("counters: the memory limit changed %s -> %s", before.mem, after.mem);
        if (!same(after.pids, before.pids))
                ESCAPED("counters: pids.max changed %s -> %s", before.pids, after.pids);
        free_limits(&before);
        free_limits(&after);
        free(rel);
        free(out);
        stop(&sb, "counters");
}

static bool frozen(const char *freezer_dir)
{
        char *path = fmt(cgroup_version == 2 ? "%s/cgroup.events" : "%s/freezer.state", freezer_dir);
        char *t = test_read_file(path);
        bool f = t && (cgroup_version == 2 ? strstr(t, "frozen 1") != NULL : strcmp(t, "FROZEN") == 0);
        free(t);
        free(path);
        return f;
}

/* 3. Thaw itself after a pause, from a helper started before the pause. */
static void attack_thaw(void)
{
        ctl_mkdir("thaw");
        char *args[] = { "thaw", NULL };
        char *out = control(&(struct control){ .cgroup = "thaw" }, args);
        char *rel = fmt("%s/thaw", ctl_parent), *fz = cg_dir("freezer", rel), *cpu = cg_dir("cpuacct", rel);
        char *ctl = fmt(cgroup_version == 2 ? "%s/cgroup.freeze" : "%s/freezer.state", fz);
        test_sleep_ms(200);
        write_text(ctl, cgroup_version == 2 ? "1" : "FROZEN");
        test_sleep_ms(300);
        uint64_t c0 = cpu_counter(cpu);
        test_sleep_ms(1500);
        uint64_t c1 = cpu_counter(cpu);
        fprintf(stderr, "control: %" PRIu64 " ns of CPU burned in 1.5 s with the scratch cgroup paused\n", c1 - c0);
        CTL(c1 - c0 >= 100000000, "control: the paused scratch cgroup burned only %" PRIu64 " ns in 1.5 s", c1 - c0);
        write_text(ctl, cgroup_version == 2 ? "0" : "THAWED");
        long thawer = field_after(out, "thawer pid="), burner = field_after(out, "burner pid=");
        if (thawer > 0)
                kill((pid_t)thawer, SIGKILL);
        if (burner > 0)
                kill((pid_t)burner, SIGKILL);
        free(rel);
        free(fz);
        free(cpu);
        free(ctl);
        free(out);

        struct sandbox sb;
        if (!create(&sb, "attack=thaw"))
                return;
        out = NULL;
        in_sandbox(&sb, &out, "thaw", NULL);
        /* the burner must be burning before the pause, or a quiet counter proves nothing */
        uint64_t b0 = cpu_counter(sb.cpu_dir);
        test_sleep_ms(200);
        uint64_t b1 = cpu_counter(sb.cpu_dir);
        CHECK(b1 > b0 + 2000000, "thaw: the helper's burner did not burn before the pause (%" PRIu64 " ns in 200 ms)",
              b1 - b0);
        int rc;
        int64_t t0 = test_now_ms();
        json_t *j = cli(&rc, "pause", sb.id, NULL);
        CHECK(rc == 0, "pause failed (%lld ms): %s", (long long)(test_now_ms() - t0), json_dumps(j, 0));
        json_decref(j);
        rel = fmt("%s/%s", parent, sb.id);
        fz = cg_dir("freezer", rel);
        uint64_t p0 = cpu_counter(sb.cpu_dir);
        test_sleep_ms(1500);
        uint64_t p1 = cpu_counter(sb.cpu_dir);
        bool still = frozen(fz);
        fprintf(stderr, "sandbox: %" PRIu64 " ns of CPU burned in 1.5 s while paused; frozen at the end: %s\n",
                p1 - p0, still ? "yes" : "no");
        if (p1 != p0 || !still)
                ESCAPED("thaw: the paused sandbox burned %" PRIu64 " ns of CPU in 1.5 s (frozen at the end: %s)",
                        p1 - p0, still ? "yes" : "no");
        j = cli(&rc, "resume", sb.id, NULL);
        json_decref(j);
        free(rel);
        free(fz);
        free(out);
        stop(&sb, "thaw");
}

/* 4. Write its registry record under the state folder. */
static void attack_registry(void)
{
        struct sandbox sb;
        if (!create(&sb, "attack=registry"))
                return;
        char *rec = fmt("%s/sandboxes/%s.json", state, sb.id);
        char *before = test_read_file(rec);
        CHECK(before != NULL, "no registry record at %s", rec);
        /* control: the same attack on a copy in a scratch state folder */
        char *cstate = fmt("%s/ctl-state", work), *csb = fmt("%s/sandboxes", cstate);
        char *crec = fmt("%s/%s.json", csb, sb.id);
        mkdir(cstate, 0700);
        mkdir(csb, 0700);
        FILE *f = fopen(crec, "we");
        if (f) {
                fputs(before ? before : "", f);
                fclose(f);
        }
        char *args[] = { "registry", cstate, sb.id, NULL };
        char *out = control(&(struct control){ 0 }, args);
        char *cafter = test_read_file(crec);
        json_t *cj = cafter ? json_loads(cafter, 0, NULL) : NULL;
        CTL(cj && strcmp(test_jstr(cj, "account"), "escaped") == 0, "control: the scratch record was not rewritten: %s",
            cafter ? cafter : "(none)");
        json_decref(cj);
        free(cafter);
        free(out);

        out = NULL;
        in_sandbox(&sb, &out, "registry", state, sb.id, NULL);
        char *after = test_read_file(rec);
        if (!same(before, after))
                ESCAPED("registry: the record changed from inside the sandbox: %s", after ? after : "(gone)");
        int rc;
        json_t *j = cli(&rc, "show", sb.id, NULL);
        if (strcmp(test_jstr(j, "account"), account) != 0)
                ESCAPED("registry: the daemon now shows account %s", test_jstr(j, "account"));
        json_decref(j);
        free(after);
        free(before);
        free(out);
        free(rec);
        free(cstate);
        free(csb);
        free(crec);
        stop(&sb, "registry");
}

/* The ids of an account's sandboxes in the daemon's list (from `ls`). */
static int listed(const char *acct, char ids[][64], int max)
{
        char *out = NULL;
        int rc = cli_raw(&out, NULL, "ls", "--account", acct, NULL);
        CHECK(rc == 0, "ls --account %s failed", acct);
        int n = 0;
        for (char *save = NULL, *l = out ? strtok_r(out, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save))
                if (strncmp(l, "sbx-", 4) == 0 && n < max)
                        sscanf(l, "%63s", ids[n++]);
        free(out);
        return n;
}

/* 5. Reach the vmm's unix socket: create a sandbox for an account of its choosing. */
static void attack_vmm_socket(void)
{
        char in_acct[96], ctl_acct[96], ids[8][64];
        snprintf(in_acct, sizeof(in_acct), "acct-escape-in-%s", token);
        snprintf(ctl_acct, sizeof(ctl_acct), "acct-escape-ctl-%s", token);
        char *args[] = { "vmm-socket", sock, ctl_acct, NULL };
        char *out = control(&(struct control){ 0 }, args);
        int n = listed(ctl_acct, ids, 8);
        CTL(n == 1, "control: %d sandboxes were created through the socket, wanted 1", n);
        for (int i = 0; i < n; i++) {
                int rc;
                json_decref(cli(&rc, "stop", ids[i], NULL));
        }
        free(out);

        struct sandbox sb;
        if (!create(&sb, "attack=vmm-socket"))
                return;
        out = NULL;
        in_sandbox(&sb, &out, "vmm-socket", sock, in_acct, NULL);
        n = listed(in_acct, ids, 8);
        if (n > 0)
                ESCAPED("vmm-socket: the sandbox created %d sandbox(es) through the daemon's socket", n);
        if (out && strstr(out, "test-escape-host"))
                ESCAPED("vmm-socket: the daemon answered the sandbox (its host id is in the helper's output)");
        for (int i = 0; i < n; i++) {
                int rc;
                json_decref(cli(&rc, "stop", ids[i], NULL));
        }
        free(out);
        stop(&sb, "vmm-socket");
}

/* 6. See the host's /proc (umount /proc, then look for a host process; read /proc/1/root). */
static void attack_host_proc(void)
{
        char *secret = fmt("%s/secret", work), *secret_text = fmt("secret-%s", token);
        FILE *f = fopen(secret, "we");
        if (f) {
                fputs(secret_text, f);
                fclose(f);
        }
        chmod(secret, 0600);
        char suffix_ctl[48], suffix_in[48], want[64];
        snprintf(suffix_ctl, sizeof(suffix_ctl), "%sb", token);
        snprintf(suffix_in, sizeof(suffix_in), "%sa", token);
        char *args[] = { "host-proc", "escmark", suffix_ctl, secret, NULL };
        char *out = control(&(struct control){ .leak_dir_fd = true }, args);
        snprintf(want, sizeof(want), "marker pid=%d\n", (int)victims[1]);
        CTL(strstr(out, want) && strstr(out, secret_text),
            "control: the host's marker process (%s) or the secret was not seen", want);
        char *via_fd = strstr(out, "secret via-fd-");
        CTL(via_fd && strstr(via_fd, secret_text) && strchr(via_fd, '\n') > strstr(via_fd, secret_text),
            "control: the secret was not read through an inherited directory descriptor");
        free(out);

        struct sandbox sb;
        if (!create(&sb, "attack=host-proc"))
                return;
        out = NULL;
        in_sandbox(&sb, &out, "host-proc", "escmark", suffix_in, secret, NULL);
        if (out && strstr(out, "marker pid="))
                ESCAPED("host-proc: a host process was seen from inside the sandbox");
        if (out && strstr(out, secret_text))
                ESCAPED("host-proc: a host file (mode 0600) was read from inside the sandbox");
        free(out);
        free(secret);
        free(secret_text);
        stop(&sb, "host-proc");
}

/* Accepts on a listening socket for up to ms; returns what the first connection carrying `want` sent. */
static bool heard(int lfd, const char *want, int ms)
{
        int64_t until = test_now_ms() + ms;
        bool got = false;
        while (!got && test_now_ms() < until) {
                int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (c < 0) {
                        test_sleep_ms(20);
                        continue;
                }
                char buf[128] = "";
                test_sleep_ms(20);
                ssize_t r = read(c, buf, sizeof(buf) - 1);
                if (r > 0) {
                        buf[r] = '\0';
                        got = strstr(buf, want) != NULL;
                }
                close(c);
        }
        return got;
}

/* 7. Enter the host's namespaces: setns to /proc/1/ns/... of the host, or through any fd. */
static void attack_setns(void)
{
        int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        struct sockaddr_in a = { .sin_family = AF_INET };
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t al = sizeof(a);
        CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(lfd, 16) == 0 &&
                      getsockname(lfd, (struct sockaddr *)&a, &al) == 0,
              "could not listen on the host's loopback: %s", strerror(errno));
        char port[16], tok_ctl[64], tok_in[64], host[256] = "", want_host[300];
        snprintf(port, sizeof(port), "%d", ntohs(a.sin_port));
        snprintf(tok_ctl, sizeof(tok_ctl), "setns-ctl-%s", token);
        snprintf(tok_in, sizeof(tok_in), "setns-in-%s", token);
        gethostname(host, sizeof(host));
        snprintf(want_host, sizeof(want_host), "hostname=%s\n", host);
        char *args[] = { "setns", port, tok_ctl, NULL };
        char *out = control(&(struct control){ .unshare_flags = CLONE_NEWNET | CLONE_NEWUTS }, args);
        CTL(heard(lfd, tok_ctl, 1000), "control: no connection from the host's network namespace");
        CTL(strstr(out, want_host) != NULL, "control: the host's uts namespace was not entered");
        free(out);

        struct sandbox sb;
        if (!create(&sb, "attack=setns")) {
                close(lfd);
                return;
        }
        out = NULL;
        in_sandbox(&sb, &out, "setns", port, tok_in, NULL);
        if (heard(lfd, tok_in, 1000))
                ESCAPED("setns: the sandbox connected to the host's loopback from the host's network namespace");
        if (out && strstr(out, want_host))
                ESCAPED("setns: the sandbox entered the host's uts namespace (%s)", host);
        close(lfd);
        free(out);
        stop(&sb, "setns");
}

/* 8. cgroup v1 release_agent: a program run as host root outside every sandbox. */
static void attack_release_agent(void)
{
        char *ran_ctl = fmt("%s/ra-ran-ctl", work), *ran_in = fmt("%s/ra-ran-in", work);
        char *pay_ctl = fmt("%s/ra-payload-ctl", work), *pay_in = fmt("%s/ra-payload-in", work);
        const char *pays[] = { pay_ctl, pay_in }, *rans[] = { ran_ctl, ran_in };
        for (int i = 0; i < 2; i++) {
                FILE *f = fopen(pays[i], "we");
                if (f) {
                        fprintf(f, "#!/bin/sh\necho \"release agent ran as uid $(id -u) for $1\" > %s\n", rans[i]);
                        fclose(f);
                }
                chmod(pays[i], 0755);
        }
        char tok_ctl[48], tok_in[48];
        snprintf(tok_ctl, sizeof(tok_ctl), "%sc", token);
        snprintf(tok_in, sizeof(tok_in), "%si", token);
        char *args[] = { "release-agent", pay_ctl, tok_ctl, NULL };
        char *out = control(&(struct control){ 0 }, args);
        CTL(test_wait_file(ran_ctl, 3000) == 0, "control: the release agent did not run");
        free(out);

        struct sandbox sb;
        if (create(&sb, "attack=release-agent")) {
                out = NULL;
                in_sandbox(&sb, &out, "release-agent", pay_in, tok_in, NULL);
                if (test_wait_file(ran_in, 3000) == 0) {
                        char *t = test_read_file(ran_in);
                        ESCAPED("release-agent: a program ran on the host: %s", t ? t : "");
                        free(t);
                }
                free(out);
                stop(&sb, "release-agent");
        }
        /* The hierarchies the attack mounted go with it, not with the host. */
        CHECK(release_agent_cleanup() == 0, "release-agent: a named cgroup v1 hierarchy tallyesc%s* stays", token);
        free(ran_ctl);
        free(ran_in);
        free(pay_ctl);
        free(pay_in);
}

/* The host-side count of processes in a sandbox's pid namespace. */
static int count_ns(ino_t ns)
{
        int n = 0;
        DIR *d = opendir("/proc");
        struct dirent *de;
        while (d && (de = readdir(d)))
                if (de->d_name[0] >= '1' && de->d_name[0] <= '9' && pidns_of((pid_t)atoi(de->d_name)) == ns)
                        n++;
        if (d)
                closedir(d);
        return n;
}

/* 9. Fork beyond pids.max: the live processes stay within it. */
static void attack_forkbomb(void)
{
        struct sandbox sb;
        if (!create(&sb, "attack=forkbomb"))
                return;
        char *rel = fmt("%s/%s", parent, sb.id), *pd = cg_dir("pids", rel), *pmax = fmt("%s/pids.max", pd);
        char *cur = fmt("%s/pids.current", pd);
        char *limit = test_read_file(pmax);
        long lim = limit && strcmp(limit, "max") != 0 ? strtol(limit, NULL, 10) : -1;
        if (lim <= 0)
                ESCAPED("forkbomb: the sandbox has no pids limit (pids.max %s)", limit ? limit : "unreadable");
        int target = lim > 0 ? (int)lim + 32 : 512;
        char tgt[16];
        snprintf(tgt, sizeof(tgt), "%d", target);

        /* control: the same bomb in a scratch cgroup without a limit reaches its target */
        ctl_mkdir("fork");
        char *cout = fmt("%s/control-fork.out", work);
        char *args[] = { "forkbomb", tgt, "1500", NULL };
        pid_t k = control_start(&(struct control){ .cgroup = "fork" }, args, cout);
        int64_t until = test_now_ms() + 20000;
        char *t = NULL;
        while (test_now_ms() < until && !((t = test_read_file(cout)) && strstr(t, "holding"))) {
                free(t);
                t = NULL;
                test_sleep_ms(50);
        }
        free(t);
        char *cc = ctl_read("fork", "pids", "pids.current");
        long ccur = strtol(cc, NULL, 10);
        CTL(ccur > target, "control: only %ld processes live in the scratch cgroup, wanted over %d", ccur, target);
        free(cc);
        free(control_wait(k, cout));
        free(cout);

        struct watch w = { .count_procs = true };
        char *out = NULL;
        in_sandbox_w(&sb, &out, &w, "forkbomb", tgt, "1500", NULL);
        fprintf(stderr, "    forkbomb: at most %d live processes counted on the host, pids.current up to %ld, "
                        "pids.max %s\n", w.max_live, w.max_pids_current, limit ? limit : "?");
        /* the bomb must have pressed on the limit, or staying under it proves nothing */
        CHECK(lim <= 0 || w.max_pids_current >= lim - 16,
              "forkbomb: the bomb never came near pids.max %ld (pids.current up to %ld)", lim, w.max_pids_current);
        if (lim > 0 && (w.max_live > lim || w.max_pids_current > lim))
                ESCAPED("forkbomb: %d live processes (pids.current %ld) over pids.max %ld", w.max_live,
                        w.max_pids_current, lim);
        if (lim <= 0)
                fprintf(stderr, "    forkbomb: %d processes lived in the sandbox at once, with no limit\n", w.max_live);
        free(out);
        free(limit);
        free(rel);
        free(pd);
        free(pmax);
        free(cur);
        stop(&sb, "forkbomb");
}

/* 10. Write past the disk size: ENOSPC inside. */
static void attack_disk_fill(void)
{
        long long want = (long long)(DISK_MIB + 16) << 20;
        char bytes[32];
        snprintf(bytes, sizeof(bytes), "%lld", want);
        char *cdisk = fmt("%s/ctl-disk", work);
        mkdir(cdisk, 0755);
        char *args[] = { "disk-fill", cdisk, bytes, NULL };
        char *out = control(&(struct control){ 0 }, args);
        CTL(field_after(out, "wrote ") == want && field_after(out, "write error ") == 0,
            "control: the helper did not write %lld bytes outside a sandbox", want);
        free(out);
        free(cdisk);

        struct sandbox sb;
        if (!create(&sb, "attack=disk-fill"))
                return;
        out = NULL;
        in_sandbox(&sb, &out, "disk-fill", ".", bytes, NULL);
        long wrote = field_after(out, "wrote "), werr = field_after(out, "write error "),
             ferr = field_after(out, "fsync error ");
        CHECK(wrote >= 0, "disk-fill: the helper could not write its disk at all");
        if (wrote >= 0 && (wrote > ((long)DISK_MIB << 20) || (werr != ENOSPC && ferr != ENOSPC)))
                ESCAPED("disk-fill: %ld bytes written into a %d MiB disk (write error %ld, fsync error %ld; "
                        "wanted ENOSPC within the size)",
                        wrote, DISK_MIB, werr, ferr);
        free(out);
        stop(&sb, "disk-fill");
}

/* 11. ptrace a process outside: write a victim's memory (a process this test
 * started on the host), read the daemon's environment (a ptrace-mode read). */
static void attack_ptrace(void)
{
        char pid[16], addr[32], dpid[16];
        snprintf(pid, sizeof(pid), "%d", (int)victims[1]);
        snprintf(addr, sizeof(addr), "%llx", victim_addr[1]);
        snprintf(dpid, sizeof(dpid), "%d", (int)daemon_pid);
        char *args[] = { "ptrace", pid, addr, dpid, NULL };
        char *out = control(&(struct control){ 0 }, args);
        CTL(strstr(out, daemon_secret) != NULL, "control: the daemon's environment was not read");
        int status = 0;
        pid_t w = 0;
        for (int i = 0; i < 100 && w == 0; i++) {
                w = waitpid(victims[1], &status, WNOHANG);
                if (w == 0)
                        test_sleep_ms(20);
        }
        CTL(w == victims[1] && WIFEXITED(status) && WEXITSTATUS(status) == 42,
            "control: the victim's memory was not written (it did not exit 42)");
        if (w == victims[1])
                victims[1] = -1;
        free(out);

        struct sandbox sb;
        if (!create(&sb, "attack=ptrace"))
                return;
        snprintf(pid, sizeof(pid), "%d", (int)victims[0]);
        snprintf(addr, sizeof(addr), "%llx", victim_addr[0]);
        out = NULL;
        in_sandbox(&sb, &out, "ptrace", pid, addr, dpid, NULL);
        if (out && strstr(out, daemon_secret))
                ESCAPED("ptrace: the daemon's environment was read from inside the sandbox");
        test_sleep_ms(500);
        w = waitpid(victims[0], &status, WNOHANG);
        if (w == victims[0]) {
                victims[0] = -1;
                ESCAPED("ptrace: the host victim's memory was written from inside the sandbox (status %d)", status);
        }
        free(out);
        stop(&sb, "ptrace");
}

/* ---- fork: host-root work on the source's files ---- */

/* Asks the daemon for count copies of sb; returns the HTTP status, the copies in
 * copies[] (adopted, their inits known for the cleanup) and the answer in *ret_body. */
static int fork_sandbox(struct sandbox *sb, int count, struct sandbox *copies, int *ret_n, char **ret_body)
{
        char *path = fmt("/v1/sandboxes/%s/fork", sb->id), *body = fmt("{\"count\":%d}", count);
        int status = api("POST", path, body, ret_body);
        json_t *j = status == 201 ? json_loads(*ret_body, 0, NULL) : NULL;
        json_t *list = json_object_get(j, "sandboxes");
        int n = 0;
        for (size_t i = 0; i < json_array_size(list) && n < count; i++)
                adopt(&copies[n++], json_array_get(list, i));
        *ret_n = n;
        json_decref(j);
        free(path);
        free(body);
        return status;
}

/* A refusal must be a fixed sentence: no errno text, which for a host path the
 * sandbox named would say whether that path exists. */
static void check_no_errno(const char *what, const char *answer)
{
        for (int e = 1; e < 134 && answer; e++)
                if (strstr(answer, strerror(e)))
                        ESCAPED("%s: the fork's error carries a host errno (\"%s\"): %s", what, strerror(e), answer);
}

/* The copy's /tmp, seen from the host: a folder on the copy's own disk, never target. */
static void check_private_tmp(const char *what, struct sandbox *copy, const char *target)
{
        char *tmp = fmt("/proc/%d/root/tmp", (int)copy->init), *wk = fmt("/proc/%d/root/work", (int)copy->init);
        struct stat t, w, h;
        bool have = stat(tmp, &t) == 0 && stat(wk, &w) == 0;
        CHECK(have, "%s: could not read the copy's /tmp and /work from the host: %s", what, strerror(errno));
        if (have && stat(target, &h) == 0 && t.st_dev == h.st_dev && t.st_ino == h.st_ino)
                ESCAPED("%s: the copy's /tmp is the host's %s", what, target);
        else if (have && t.st_dev != w.st_dev)
                ESCAPED("%s: the copy's /tmp (device %lu) is not on its disk (device %lu)", what,
                        (unsigned long)t.st_dev, (unsigned long)w.st_dev);
        free(tmp);
        free(wk);
}

/* 12. /work/.tmp replaced by a link to a host path, then fork: the copy's init
 * (host root) must not bind the link's target as the copy's /tmp. */
static void attack_fork_tmp_to(const char *label, const char *target)
{
        struct sandbox sb;
        char *name = fmt("attack=fork-tmp-%s", label), *what = fmt("fork-tmp-%s", label);
        if (!create(&sb, name)) {
                free(name);
                free(what);
                return;
        }
        char *out = NULL;
        in_sandbox(&sb, &out, "plant-tmp", target, NULL);
        free(out);
        /* the attack is in place: the host reads the link in the source's disk */
        char *link = fmt("/proc/%d/root/work/.tmp", (int)sb.init), back[1024] = "";
        ssize_t n = readlink(link, back, sizeof(back) - 1);
        if (n > 0)
                back[n] = '\0';
        CTL(n > 0 && strcmp(back, target) == 0, "%s: the link was not planted (%s -> %s)", what, link, back);
        struct sandbox copy;
        int ncopies = 0;
        char *answer = NULL;
        int status = fork_sandbox(&sb, 1, &copy, &ncopies, &answer);
        fprintf(stderr, "    %s: fork answered %d: %.300s\n", what, status, answer ? answer : "");
        if (status == 201 && ncopies == 1)
                check_private_tmp(what, &copy, target);
        else
                CHECK(status == 409 || status == 500 || status == 503 || status == 400,
                      "%s: the fork answered %d: %s", what, status, answer ? answer : "");
        check_no_errno(what, answer);
        if (ncopies == 1)
                stop(&copy, what);
        free(answer);
        free(link);
        stop(&sb, what);
        free(name);
        free(what);
}

static void attack_fork_tmp(void)
{
        attack_fork_tmp_to("root", "/");
        attack_fork_tmp_to("proc", "/proc");
        /* the daemon's own cgroup parent: every tenant's counters */
        char *rel = fmt("%s", parent), *cg = cg_dir("cpuacct", rel);
        attack_fork_tmp_to("cgroup", cg);
        free(rel);
        free(cg);
}

static const char *marker_secret;
static int marker_hits;
static int find_host_marker(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
        (void)st, (void)ftw;
        char *t = type == FTW_F ? test_read_file(path) : NULL;
        if (t && strstr(t, marker_secret)) {
                fprintf(stderr, "    host file in the copy: %s\n", path);
                marker_hits++;
        }
        free(t);
        return 0;
}

/* 13. A rename race during the copy: folders of the source flip with links to a
 * host folder (renameat2 exchange) while the fork copies them. The host folder
 * holds files of the same names as the sandbox's folders (so a copier that
 * follows a flipped name finds every file it expects), each with a secret only
 * the host has. The copy must hold no file with that secret: its disk is read
 * from the host. Three forks, one copy each, during one race. */
static void attack_fork_race(void)
{
        char *host = fmt("%s/host-marker", work), *secret = fmt("host-secret-%s", token);
        mkdir(host, 0755);
        for (int k = 0; k < 8; k++) {
                char *f = fmt("%s/file%d", host, k);
                int fd = open(f, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
                CHECK(fd >= 0 && write(fd, secret, strlen(secret)) > 0, "could not write %s", f);
                if (fd >= 0)
                        close(fd);
                free(f);
        }
        struct sandbox sb;
        if (!create(&sb, "attack=fork-race"))
                goto out;
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--socket", sock, "exec", sb.id, "--timeout-ms", "40000",
                         "--", "./escape-helper", "race", "8", host, "8000", NULL };
        char *rout = fmt("%s/race.out", work), *rerr = fmt("%s/race.err", work);
        pid_t racer = test_spawn(argv, rout, rerr);
        /* the race runs (exec answers only at the end): seen from the host, a contested
         * name is a link at times and a folder at others */
        char *name0 = fmt("/proc/%d/root/work/race0", (int)sb.init);
        int links = 0, dirs = 0;
        int64_t until = test_now_ms() + 20000;
        while (test_now_ms() < until && (links < 3 || dirs < 3)) {
                struct stat st;
                if (lstat(name0, &st) == 0)
                        S_ISLNK(st.st_mode) ? links++ : dirs++;
                test_sleep_ms(1);
        }
        CTL(links > 0 && dirs > 0, "fork-race: the source's folder never flipped (%d links, %d folders seen)", links,
            dirs);
        marker_secret = secret;
        int made = 0;
        for (int f = 0; f < 3; f++) {
                struct sandbox copy;
                int ncopies = 0;
                char *answer = NULL;
                int status = fork_sandbox(&sb, 1, &copy, &ncopies, &answer);
                fprintf(stderr, "    fork-race: fork %d answered %d during the race: %.200s\n", f + 1, status,
                        answer ? answer : "");
                check_no_errno("fork-race", answer);
                free(answer);
                if (status != 201 || ncopies != 1)
                        continue;
                made++;
                char *wk = fmt("/proc/%d/root/work", (int)copy.init);
                marker_hits = 0;
                nftw(wk, find_host_marker, 16, FTW_PHYS | FTW_MOUNT);
                if (marker_hits)
                        ESCAPED("fork-race: copy %s holds %d file(s) of the host's %s", copy.id, marker_hits, host);
                free(wk);
                stop(&copy, "fork-race");
        }
        CHECK(made == 3, "fork-race: %d of 3 forks made a copy during the race", made);
        int status_r = 0;
        waitpid(racer, &status_r, 0);
        char *rt = test_read_file(rout);
        fprintf(stderr, "--- inside %s: race (exit %d)\n%s\n", sb.id, WIFEXITED(status_r) ? WEXITSTATUS(status_r) : -1,
                rt ? rt : "");
        free(rt);
        free(name0);
        free(rout);
        free(rerr);
        stop(&sb, "fork-race");
out:
        for (int k = 0; k < 8; k++) {
                char *f = fmt("%s/file%d", host, k);
                unlink(f);
                free(f);
        }
        rmdir(host);
        free(host);
        free(secret);
}

/* ---- admission: what one key can make this host promise ---- */

static uint64_t host_mem_mib(void)
{
        char *t = test_read_file("/proc/meminfo"), *m = t ? strstr(t, "MemTotal:") : NULL;
        uint64_t kib = m ? strtoull(m + 9, NULL, 10) : 0;
        free(t);
        return kib / 1024;
}

/* A create through the daemon's API; status, and the sandbox in *sb on 201. */
static int api_create(struct sandbox *sb, uint64_t memory_mib, uint64_t disk_mib, char **ret_body)
{
        char *body = fmt("{\"account\":\"%s\",\"key\":\"key-escape\",\"vcpus\":1,\"memory_mib\":%" PRIu64
                         ",\"disk_mib\":%" PRIu64 ",\"timeout_s\":300,\"labels\":{\"attack\":\"admission\"}}",
                         account, memory_mib, disk_mib);
        int status = api("POST", "/v1/sandboxes", body, ret_body);
        free(body);
        if (status == 201) {
                json_t *j = json_loads(*ret_body, 0, NULL);
                adopt(sb, j);
                json_decref(j);
        }
        return status;
}

/* How many of the account's sandboxes the daemon lists as not stopped. */
static int live_sandboxes(void)
{
        char *path = fmt("/v1/sandboxes?account=%s", account), *answer = NULL;
        api("GET", path, "", &answer);
        json_t *j = json_loads(answer, 0, NULL), *sb;
        size_t i;
        int n = 0;
        json_array_foreach(json_object_get(j, "sandboxes"), i, sb)
                n += strcmp(test_jstr(sb, "state"), "stopped") != 0;
        json_decref(j);
        free(answer);
        free(path);
        return n;
}

/* 14. One key asks this host for more than it has: a sandbox with 90 % of the
 * host's memory (MemTotal, read here), forked 10 times at once and then once;
 * a 1 TiB disk. Each refusal is a 507 naming what is short, and nothing is
 * made; an honest create still works. */
static void attack_admission(void)
{
        uint64_t mem = host_mem_mib();
        struct statvfs fs;
        CTL(mem > 1024 && statvfs(state, &fs) == 0, "admission: could not read the host's memory or free space");
        uint64_t free_mib = (uint64_t)fs.f_bavail * fs.f_frsize >> 20;
        CTL(free_mib < 1024 * 1024, "admission: the host has %" PRIu64 " MiB free: a 1 TiB disk would fit", free_mib);
        struct sandbox big, small, copies[10];
        char *answer = NULL;
        uint64_t ninety = mem * 9 / 10;
        int status = api_create(&big, ninety, DISK_MIB, &answer);
        CHECK(status == 201, "admission: a sandbox of %" PRIu64 " of %" PRIu64 " MiB was refused: %d %s", ninety, mem,
              status, answer);
        free(answer);
        if (status != 201)
                return;
        int ncopies = 0;
        answer = NULL;
        status = fork_sandbox(&big, 10, copies, &ncopies, &answer);
        fprintf(stderr, "    admission: fork of 10 answered %d: %.300s\n", status, answer ? answer : "");
        if (status != 507 || !strstr(answer, "memory"))
                ESCAPED("admission: 10 copies of a sandbox with 90 %% of the host's memory answered %d (%d made), "
                        "not 507 naming memory: %s", status, ncopies, answer);
        for (int i = 0; i < ncopies; i++)
                stop(&copies[i], "admission");
        free(answer);
        answer = NULL;
        ncopies = 0;
        status = fork_sandbox(&big, 1, copies, &ncopies, &answer);
        fprintf(stderr, "    admission: fork of 1 answered %d: %.300s\n", status, answer ? answer : "");
        if (status != 507)
                ESCAPED("admission: a copy of a sandbox with 90 %% of the host's memory answered %d: %s", status,
                        answer);
        for (int i = 0; i < ncopies; i++)
                stop(&copies[i], "admission");
        free(answer);
        int live = live_sandboxes();
        if (live != 1)
                ESCAPED("admission: %d sandboxes of the account live after the refused forks, not 1", live);
        answer = NULL;
        status = api_create(&small, 128, DISK_MIB, &answer);
        CHECK(status == 201, "admission: an honest 128 MiB sandbox was refused beside the big one: %d %s", status,
              answer);
        free(answer);
        if (status == 201)
                stop(&small, "admission");
        struct sandbox huge;
        answer = NULL;
        status = api_create(&huge, 128, 1024 * 1024, &answer);
        fprintf(stderr, "    admission: a 1 TiB disk answered %d: %.300s\n", status, answer ? answer : "");
        if (status != 507 || !strstr(answer, "disk"))
                ESCAPED("admission: a 1 TiB disk on a host with %" PRIu64 " MiB free answered %d, not 507 naming "
                        "the disk: %s", free_mib, status, answer);
        if (status == 201)
                stop(&huge, "admission");
        free(answer);
        stop(&big, "admission");
}

/* Two host processes: markers for the host-proc attack (argv[0] escmark<token>a|b)
 * and targets of the ptrace one. */
/* ---- the network: the host's services and the test's own "internet" ---- */

/* The test's "internet": a network namespace this test makes (ip netns), joined
 * to the host by a veth pair in a documentation range (203.0.113.0/24, a /30
 * of it per run), with a TCP server on port 80 that logs every connection
 * (bytes in, bytes out, first line). A second address of that namespace in the
 * benchmarking range (198.18.0.0/15) stands for a private service: the host
 * reaches it, a sandbox must not. Nothing here ever reaches an outside address. */
static char netns_name[64], veth_host[16], veth_ns[16];
static char host_ip[32], inet_ip[32], bench_ip[32];
static char *inet_log;
static pid_t inet_server = -1;
/* net-allow's sandbox and the bytes the test server counted, for the ledger's check */
static char net_allow_id[64];
static long net_allow_rx = -1, net_allow_tx = -1;
/* Wildcard listeners on the host (every address of it, IPv4 and IPv6): they
 * stand for its loopback services (tally-api, /metrics, PostgreSQL, Kafka). */
static int lis4 = -1, lis6 = -1, lport4, lport6;
static char pg_port[16], kafka_port[16];

static int sh(const char *cmd)
{
        char *argv[] = { "/bin/sh", "-c", (char *)cmd, NULL };
        char *err = NULL;
        int rc = test_run(argv, NULL, &err);
        if (rc != 0)
                fprintf(stderr, "command failed (%d): %s: %s\n", rc, cmd, err ? err : "");
        free(err);
        return rc;
}

static void net_cleanup(void)
{
        test_stop_process(&inet_server, SIGKILL);
        if (*netns_name) {
                char *c = fmt("ip netns del %s 2>/dev/null; ip link del %s 2>/dev/null; true", netns_name, veth_host);
                sh(c);
                free(c);
        }
}

/* The server in the test's namespace: one connection at a time; reads a line, answers
 * "inet-ok" and 20,000 bytes, then reads to the end and logs what it saw. */
static _Noreturn void inet_serve(void)
{
        char *path = fmt("/run/netns/%s", netns_name);
        int ns = open(path, O_RDONLY | O_CLOEXEC);
        if (ns < 0 || setns(ns, CLONE_NEWNET) < 0)
                _exit(1);
        int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(80) };
        setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 64) < 0)
                _exit(1);
        static char reply[20008];
        memcpy(reply, "inet-ok\n", 8);
        memset(reply + 8, 'x', 20000);
        for (;;) {
                int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
                if (c < 0)
                        continue;
                struct timeval tv = { 3, 0 };
                setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
                char buf[8192], first[256] = "";
                long in = 0, out = 0;
                ssize_t n;
                while (!memchr(buf, '\n', (size_t)(in < (long)sizeof(buf) ? in : 0)) && in < (long)sizeof(buf) &&
                       (n = read(c, buf + in, sizeof(buf) - (size_t)in)) > 0)
                        in += n;
                size_t k = 0;
                while (k < (size_t)in && k < sizeof(first) - 1 && buf[k] != '\r' && buf[k] != '\n')
                        k++;
                memcpy(first, buf, k);
                first[k] = '\0';
                for (size_t at = 0; at < sizeof(reply);) {
                        ssize_t w = send(c, reply + at, sizeof(reply) - at, MSG_NOSIGNAL);
                        if (w <= 0)
                                break;
                        at += (size_t)w;
                        out += w;
                }
                shutdown(c, SHUT_WR);
                while ((n = read(c, buf, sizeof(buf))) > 0)
                        in += n;
                close(c);
                char line[512];
                int len = snprintf(line, sizeof(line), "in=%ld out=%ld first=%s\n", in, out, first);
                int f = open(inet_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
                if (f >= 0) {
                        ssize_t w = write(f, line, (size_t)len);
                        (void)w;
                        close(f);
                }
        }
}

static int listen_any(int family, int *ret_port)
{
        int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), one = 1;
        struct sockaddr_storage ss = { 0 };
        socklen_t len = family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
        ss.ss_family = (sa_family_t)family;
        if (family == AF_INET6)
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
        if (fd < 0 || bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 64) < 0 ||
            getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
                fprintf(stderr, "FAIL: could not listen on the host: %s\n", strerror(errno));
                exit(1);
        }
        *ret_port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                            : ((struct sockaddr_in6 *)&ss)->sin6_port);
        return fd;
}

/* Connections the host's listeners took since the last call; their first bytes go to seen. */
static int heard_on_host(char *seen, size_t seenlen)
{
        int n = 0;
        if (seen)
                seen[0] = '\0';
        test_sleep_ms(100);
        for (int k = 0; k < 2; k++) {
                int c;
                while ((c = accept4(k ? lis6 : lis4, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
                        char buf[128] = "";
                        test_sleep_ms(20);
                        ssize_t r = read(c, buf, sizeof(buf) - 1);
                        if (r > 0 && seen) {
                                buf[r] = '\0';
                                strncat(seen, buf, seenlen - strlen(seen) - 1);
                        }
                        close(c);
                        n++;
                }
        }
        return n;
}

static void setup_internet(void)
{
        int k = (int)(getpid() % 60);
        snprintf(netns_name, sizeof(netns_name), "tally-esc-%d", (int)getpid());
        snprintf(veth_host, sizeof(veth_host), "tesc%da", (int)getpid() % 1000000);
        snprintf(veth_ns, sizeof(veth_ns), "tesc%db", (int)getpid() % 1000000);
        snprintf(host_ip, sizeof(host_ip), "203.0.113.%d", k * 4 + 1);
        snprintf(inet_ip, sizeof(inet_ip), "203.0.113.%d", k * 4 + 2);
        snprintf(bench_ip, sizeof(bench_ip), "198.18.%d.2", k);
        inet_log = fmt("%s/inet.log", work);
        char *c = fmt("set -e; ip netns add %1$s; ip link add %2$s type veth peer name %3$s; "
                      "ip link set %3$s netns %1$s; ip addr add %4$s/30 dev %2$s; ip link set %2$s up; "
                      "ip -n %1$s addr add %5$s/30 dev %3$s; ip -n %1$s addr add %6$s/32 dev %3$s; "
                      "ip -n %1$s link set %3$s up; ip -n %1$s link set lo up; ip route add %6$s/32 dev %2$s",
                      netns_name, veth_host, veth_ns, host_ip, inet_ip, bench_ip);
        if (sh(c) != 0) {
                fprintf(stderr, "FAIL: could not build the test's own internet (ip netns, veth)\n");
                exit(1);
        }
        free(c);
        fflush(stderr);
        inet_server = fork();
        if (inet_server == 0)
                inet_serve();
        hosts_file = fmt("%s/egress-hosts", work);
        char *pins = fmt("%1$s inet.test sub.inet.test other.test\n127.0.0.1 loop.test loop.inet.test\n"
                         "::1 loop6.test loop6.inet.test\n%2$s host.test host.inet.test\n"
                         "%3$s bench.test bench.inet.test\n169.254.169.254 meta.inet.test\n",
                         inet_ip, host_ip, bench_ip);
        int hf = open(hosts_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        CHECK(hf >= 0 && write(hf, pins, strlen(pins)) == (ssize_t)strlen(pins), "could not write %s", hosts_file);
        if (hf >= 0)
                close(hf);
        free(pins);
        lis4 = listen_any(AF_INET, &lport4);
        lis6 = listen_any(AF_INET6, &lport6);
        PGconn *pg = PQconnectdb(db_url);
        const char *h = PQhost(pg), *p = PQport(pg);
        snprintf(pg_port, sizeof(pg_port), "%s", h && *h != '/' && p ? p : "");
        PQfinish(pg);
        const char *colon = strrchr(brokers, ':');
        snprintf(kafka_port, sizeof(kafka_port), "%s", colon ? colon + 1 : "");
        /* the server answers before any attack runs */
        for (int i = 0; i < 100; i++) {
                char *ctl = fmt("d|%s|80|inet-ready-%s", inet_ip, token), *args[] = { "net", ctl, NULL };
                char *out = control(&(struct control){ 0 }, args);
                bool up = strstr(out, "inet-ok") != NULL;
                free(out);
                free(ctl);
                if (up)
                        break;
                test_sleep_ms(100);
        }
}

/* The host's own addresses (every interface; IPv6 link-local left out: it needs a scope). */
static int host_addresses(char addrs[][64], int max)
{
        struct ifaddrs *ifs = NULL;
        int n = 0;
        if (getifaddrs(&ifs) < 0)
                return 0;
        for (struct ifaddrs *i = ifs; i && n < max; i = i->ifa_next) {
                if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
                        continue;
                const void *a = i->ifa_addr->sa_family == AF_INET
                                        ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
                                        : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
                if (i->ifa_addr->sa_family == AF_INET6 && IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)a))
                        continue;
                inet_ntop(i->ifa_addr->sa_family, a, addrs[n], 64);
                bool dup = false;
                for (int k = 0; k < n; k++)
                        dup |= strcmp(addrs[k], addrs[n]) == 0;
                if (!dup)
                        n++;
        }
        freeifaddrs(ifs);
        return n;
}

/* Appends "KIND|HOST|PORT|TOKEN," to a spec list. */
static void spec_add(char *list, size_t cap, char kind, const char *host, const char *port, const char *tok)
{
        size_t n = strlen(list);
        snprintf(list + n, cap - n, "%c|%s|%s|%s,", kind, host, port, tok);
}

/* Lines of the test server's log whose first line holds needle; their bytes in and out summed. */
static int inet_seen(const char *needle, long *ret_in, long *ret_out)
{
        char *t = test_read_file(inet_log);
        int n = 0;
        long in = 0, out = 0;
        for (char *l = t, *e; l && *l; l = e ? e + 1 : l + strlen(l)) {
                e = strchr(l, '\n');
                if (e)
                        *e = '\0';
                char *first = strstr(l, "first=");
                if (first && strstr(first, needle)) {
                        long i = 0, o = 0;
                        sscanf(l, "in=%ld out=%ld", &i, &o);
                        in += i;
                        out += o;
                        n++;
                }
                if (!e)
                        break;
        }
        free(t);
        if (ret_in)
                *ret_in = in;
        if (ret_out)
                *ret_out = out;
        return n;
}

/* The host's listeners and addresses as direct tries (d) of a spec list, and, with
 * proxy, through the egress proxy by address (c and g). */
static void host_specs(char *list, size_t cap, const char *tok, bool proxy)
{
        char addrs[32][64], p4[16], p6[16];
        int n = host_addresses(addrs, 32);
        snprintf(p4, sizeof(p4), "%d", lport4);
        snprintf(p6, sizeof(p6), "%d", lport6);
        for (int i = 0; i < n; i++) {
                const char *port = strchr(addrs[i], ':') ? p6 : p4;
                spec_add(list, cap, 'd', addrs[i], port, tok);
                if (proxy) {
                        spec_add(list, cap, 'c', addrs[i], port, tok);
                        spec_add(list, cap, 'g', addrs[i], port, tok);
                }
        }
        const char *services[2] = { pg_port, kafka_port };
        for (int i = 0; i < 2; i++)
                if (*services[i]) {
                        spec_add(list, cap, 'd', "127.0.0.1", services[i], tok);
                        if (proxy)
                                spec_add(list, cap, 'c', "127.0.0.1", services[i], tok);
                }
}

/* What a sandbox must never get from any try of the host: a connection a listener
 * took, the host's sockets in its /proc/net, a connection to PostgreSQL or Kafka. */
static void check_host_untouched(const char *attack, const char *out)
{
        char seen[512];
        int n = heard_on_host(seen, sizeof(seen));
        if (n > 0)
                ESCAPED("%s: the host's listeners took %d connection(s) from the sandbox (\"%.200s\")", attack, n, seen);
        char hex4[16], hex6[16];
        snprintf(hex4, sizeof(hex4), ":%04X ", lport4);
        snprintf(hex6, sizeof(hex6), ":%04X ", lport6);
        if (out && (strstr(out, hex4) || strstr(out, hex6)))
                ESCAPED("%s: the sandbox's /proc/net/tcp lists the host's listening sockets", attack);
        const char *services[2] = { pg_port, kafka_port };
        for (int i = 0; i < 2 && out; i++) {
                if (!*services[i])
                        continue;
                char *d = fmt("net d 127.0.0.1:%s: connected", services[i]);
                char *c = fmt("net c 127.0.0.1:%s: connected, proxy said HTTP/1.1 200", services[i]);
                if (strstr(out, d) || strstr(out, c))
                        ESCAPED("%s: the sandbox connected to the host's %s (port %s)", attack,
                                i ? "Kafka broker" : "PostgreSQL", services[i]);
                free(d);
                free(c);
        }
}

/* 12. No internet (the default): nothing of the host, nothing of the test's internet. */
static void attack_net_none(void)
{
        char tok[64], ctl_tok[64], list[8192] = "";
        snprintf(tok, sizeof(tok), "net-none-%s", token);
        snprintf(ctl_tok, sizeof(ctl_tok), "net-none-ctl-%s", token);
        heard_on_host(NULL, 0);
        /* control: as host root, the helper reaches every listener and the test's internet */
        host_specs(list, sizeof(list), ctl_tok, false);
        spec_add(list, sizeof(list), 'd', inet_ip, "80", ctl_tok);
        char *args[] = { "net", list, NULL };
        char *out = control(&(struct control){ 0 }, args);
        CTL(heard_on_host(NULL, 0) > 0, "control: the helper reached none of the host's listeners");
        CTL(inet_seen(ctl_tok, NULL, NULL) > 0, "control: the helper did not reach the test's internet");
        free(out);

        struct sandbox sb;
        if (!create(&sb, "attack=net-none"))
                return;
        list[0] = '\0';
        host_specs(list, sizeof(list), tok, true);
        spec_add(list, sizeof(list), 'd', inet_ip, "80", tok);
        spec_add(list, sizeof(list), 'd', bench_ip, "80", tok);
        spec_add(list, sizeof(list), 'c', inet_ip, "80", tok);
        spec_add(list, sizeof(list), 't', "", "", "");
        out = NULL;
        in_sandbox(&sb, &out, "net", list, NULL);
        check_host_untouched("net-none", out);
        if (inet_seen(tok, NULL, NULL) > 0)
                ESCAPED("net-none: a sandbox without internet reached the test's internet");
        free(out);
        stop(&sb, "net-none");
}

/* 13. Internet without an allow-list (network: true): still nothing of the host,
 * by address or by a name that resolves to it, over IPv4 or IPv6. */
static void attack_net_host(void)
{
        char tok[64], ok_tok[64], p4[16], p6[16], list[16384] = "";
        snprintf(tok, sizeof(tok), "net-host-%s", token);
        snprintf(ok_tok, sizeof(ok_tok), "net-host-ok-%s", token);
        snprintf(p4, sizeof(p4), "%d", lport4);
        snprintf(p6, sizeof(p6), "%d", lport6);
        /* control: the private service (198.18/15) answers the host */
        char *ctl = fmt("d|%s|80|net-host-ctl-%s", bench_ip, token), *args[] = { "net", ctl, NULL };
        char *out = control(&(struct control){ 0 }, args);
        CTL(strstr(out, "inet-ok") != NULL, "control: the test's private address %s does not answer the host", bench_ip);
        free(out);
        free(ctl);
        heard_on_host(NULL, 0);

        struct sandbox sb;
        if (!create_net(&sb, "attack=net-host", "true"))
                return;
        host_specs(list, sizeof(list), tok, true);
        spec_add(list, sizeof(list), 'd', inet_ip, "80", tok);
        const char *names[][2] = { { "loop.test", p4 }, { "localhost", p4 }, { "loop6.test", p6 }, { "host.test", p4 },
                                   { "bench.test", "80" }, { bench_ip, "80" }, { "169.254.169.254", "80" },
                                   { "::ffff:127.0.0.1", p4 }, { "0.0.0.0", p4 }, { "::", p6 } };
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
                spec_add(list, sizeof(list), 'c', names[i][0], names[i][1], tok);
                spec_add(list, sizeof(list), 'g', names[i][0], names[i][1], tok);
        }
        /* the proxy works: a public address of the test's internet is reached */
        spec_add(list, sizeof(list), 'c', inet_ip, "80", ok_tok);
        spec_add(list, sizeof(list), 't', "", "", "");
        out = NULL;
        in_sandbox(&sb, &out, "net", list, NULL);
        check_host_untouched("net-host", out);
        if (inet_seen(tok, NULL, NULL) > 0)
                ESCAPED("net-host: the sandbox reached the test's internet directly, or its private address");
        CHECK(inet_seen(ok_tok, NULL, NULL) == 1,
              "net-host: a sandbox with internet did not reach %s:80 through the egress proxy", inet_ip);
        free(out);
        stop(&sb, "net-host");
}

/* 14. An allow-list: only its names, and never where they resolve to the host or a
 * private address; bytes relayed counted exactly (the test server's own count). */
static void attack_net_allow(void)
{
        char c_tok[64], g_tok[64], deny[64], p4[16], p6[16], list[8192] = "";
        snprintf(c_tok, sizeof(c_tok), "net-allow-c-%s", token);
        snprintf(g_tok, sizeof(g_tok), "net-allow-g-%s", token);
        snprintf(deny, sizeof(deny), "net-deny-%s", token);
        snprintf(p4, sizeof(p4), "%d", lport4);
        snprintf(p6, sizeof(p6), "%d", lport6);
        heard_on_host(NULL, 0);
        struct sandbox sb;
        if (!create_net(&sb, "attack=net-allow", "{\"internet\":true,\"allow\":[\"inet.test\",\"*.inet.test\"]}"))
                return;
        spec_add(list, sizeof(list), 'c', "inet.test", "80", c_tok);
        spec_add(list, sizeof(list), 'g', "sub.inet.test", "80", g_tok);
        const char *denied[][2] = { { "other.test", "80" },      { inet_ip, "80" },         { "loop.inet.test", p4 },
                                    { "loop6.inet.test", p6 },   { "host.inet.test", p4 },  { "bench.inet.test", "80" },
                                    { "meta.inet.test", "80" },  { "inet.test.other.test", "80" },
                                    { "xinet.test", "80" } };
        for (size_t i = 0; i < sizeof(denied) / sizeof(denied[0]); i++) {
                spec_add(list, sizeof(list), 'c', denied[i][0], denied[i][1], deny);
                spec_add(list, sizeof(list), 'g', denied[i][0], denied[i][1], deny);
        }
        spec_add(list, sizeof(list), 'd', inet_ip, "80", deny);
        char *out = NULL;
        in_sandbox(&sb, &out, "net", list, NULL);
        check_host_untouched("net-allow", out);
        if (inet_seen(deny, NULL, NULL) > 0)
                ESCAPED("net-allow: the sandbox reached the test's internet by a name or address not allowed, or "
                        "its private address by an allowed name");
        long in_c = 0, out_c = 0, in_g = 0, out_g = 0;
        int64_t until = test_now_ms() + 5000;
        while (test_now_ms() < until && (inet_seen(c_tok, NULL, NULL) < 1 || inet_seen(g_tok, NULL, NULL) < 1))
                test_sleep_ms(50);
        CHECK(inet_seen(c_tok, &in_c, &out_c) == 1, "net-allow: CONNECT to an allowed name did not arrive");
        CHECK(inet_seen(g_tok, &in_g, &out_g) == 1, "net-allow: GET of a name under an allowed wildcard did not arrive");
        /* the proxy's counters: to the sandbox what the server sent, from it what the server got */
        long rx = -1, tx = -1;
        until = test_now_ms() + 5000;
        while (test_now_ms() < until) {
                int rc;
                json_t *j = cli(&rc, "show", sb.id, NULL);
                rx = (long)json_integer_value(json_object_get(j, "net_rx_bytes"));
                tx = (long)json_integer_value(json_object_get(j, "net_tx_bytes"));
                json_decref(j);
                if (rx == out_c + out_g && tx == in_c + in_g)
                        break;
                test_sleep_ms(50);
        }
        snprintf(net_allow_id, sizeof(net_allow_id), "%s", sb.id);
        net_allow_rx = out_c + out_g;
        net_allow_tx = in_c + in_g;
        CHECK(rx == out_c + out_g && tx == in_c + in_g,
              "net-allow: the sandbox's counters say %ld bytes in, %ld out; the server sent %ld and got %ld", rx, tx,
              out_c + out_g, in_c + in_g);
        /* the collector's source: the counters file in the sandbox's folder, which the
         * proxy rewrites at most every 200 ms while bytes flow (show reads its live counts) */
        char *counts = NULL, *counts_path = fmt("%s/net", sb.dir);
        unsigned long long frx = 0, ftx = 0;
        until = test_now_ms() + 5000;
        do {
                free(counts);
                counts = test_read_file(counts_path);
                if (counts && sscanf(counts, "%llu %llu", &frx, &ftx) == 2 && (long)frx == rx && (long)ftx == tx)
                        break;
                test_sleep_ms(50);
        } while (test_now_ms() < until);
        CHECK(counts && sscanf(counts, "%llu %llu", &frx, &ftx) == 2 && (long)frx == rx && (long)ftx == tx,
              "net-allow: the counters file says \"%s\", wanted %ld %ld", counts ? counts : "(none)", rx, tx);
        free(counts);
        free(counts_path);
        free(out);

        /* A fork's copies keep the allow-list, and the proxy enforces it for them. */
        char fork_tok[64], restart_tok[64], more[2048] = "";
        snprintf(fork_tok, sizeof(fork_tok), "net-allow-fork-%s", token);
        snprintf(restart_tok, sizeof(restart_tok), "net-allow-restart-%s", token);
        spec_add(more, sizeof(more), 'c', "other.test", "80", deny);
        spec_add(more, sizeof(more), 'c', "loop.inet.test", p4, deny);
        spec_add(more, sizeof(more), 'c', "bench.inet.test", "80", deny);
        int rc;
        json_t *fj = cli(&rc, "fork", sb.id, NULL);
        json_t *cj = json_array_get(json_object_get(fj, "sandboxes"), 0), *cnet = json_object_get(cj, "network");
        CHECK(rc == 0 && cj && json_is_true(json_object_get(cnet, "internet")) &&
                      json_array_size(json_object_get(cnet, "allow")) == 2,
              "net-allow: the fork's copy does not keep the allow-list: %s", fj ? json_dumps(fj, 0) : "(no answer)");
        if (rc == 0 && cj) {
                struct sandbox copy;
                adopt(&copy, cj);
                char *list2 = fmt("%sc|inet.test|80|%s,", more, fork_tok);
                out = NULL;
                in_sandbox(&copy, &out, "net", list2, NULL);
                check_host_untouched("net-allow (fork)", out);
                for (int64_t end = test_now_ms() + 5000; test_now_ms() < end && inet_seen(fork_tok, NULL, NULL) < 1;)
                        test_sleep_ms(50);
                CHECK(inet_seen(fork_tok, NULL, NULL) == 1, "net-allow: the fork's copy did not reach an allowed name");
                free(list2);
                free(out);
                stop(&copy, "net-allow-fork");
        }
        json_decref(fj);

        /* A restarted tally-vmm enforces the same list (spec.json) and counts on from the file. */
        kill(daemon_pid, SIGTERM);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = -1;
        start_daemon();
        char *list3 = fmt("%sc|inet.test|80|%s,", more, restart_tok);
        out = NULL;
        in_sandbox(&sb, &out, "net", list3, NULL);
        check_host_untouched("net-allow (restart)", out);
        if (inet_seen(deny, NULL, NULL) > 0)
                ESCAPED("net-allow: after a fork or a restart of tally-vmm, a name not allowed (or a private address) "
                        "was reached");
        long in_r = 0, out_r = 0;
        for (int64_t end = test_now_ms() + 5000; test_now_ms() < end && inet_seen(restart_tok, NULL, NULL) < 1;)
                test_sleep_ms(50);
        CHECK(inet_seen(restart_tok, &in_r, &out_r) == 1,
              "net-allow: after tally-vmm restarted, the sandbox did not reach an allowed name");
        net_allow_rx += out_r;
        net_allow_tx += in_r;
        until = test_now_ms() + 5000;
        while (test_now_ms() < until) {
                json_t *j = cli(&rc, "show", sb.id, NULL);
                rx = (long)json_integer_value(json_object_get(j, "net_rx_bytes"));
                tx = (long)json_integer_value(json_object_get(j, "net_tx_bytes"));
                json_decref(j);
                if (rx == net_allow_rx && tx == net_allow_tx)
                        break;
                test_sleep_ms(50);
        }
        CHECK(rx == net_allow_rx && tx == net_allow_tx,
              "net-allow: after a restart the counters say %ld in, %ld out; the server sent %ld and got %ld in all", rx,
              tx, net_allow_rx, net_allow_tx);
        free(list3);
        free(out);
        stop(&sb, "net-allow");
}

static void start_victims(void)
{
        for (int i = 0; i < 2; i++) {
                char *argv0 = fmt("escmark%s%c", token, 'a' + i);
                snprintf(victim_file[i], sizeof(victim_file[i]), "%s/victim-%d", work, i);
                pid_t p = fork();
                if (p == 0) {
                        execl(helper, argv0, "victim", victim_file[i], (char *)NULL);
                        _exit(127);
                }
                victims[i] = p;
                CHECK(test_wait_file(victim_file[i], 5000) == 0, "the victim did not start");
                char *t = test_read_file(victim_file[i]);
                victim_addr[i] = t ? strtoull(t, NULL, 16) : 0;
                free(t);
                free(argv0);
        }
}

/* The ledger, the broker and the daemons that fill it, all real processes. */
static void start_pipeline(void)
{
        db_url = test_db_create("escape");
        char *migrate[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", db_url, NULL };
        char *err = NULL;
        int rc = test_run(migrate, NULL, &err);
        if (rc != 0) {
                fprintf(stderr, "FAIL: tally-migrate: %s\n", err ? err : "");
                exit(1);
        }
        free(err);
        char *sql = fmt("INSERT INTO accounts (id, name) VALUES ('%s', 'sandbox-escape');"
                        "INSERT INTO api_keys (id, account_id, key_hash) VALUES ('key-escape', '%s', "
                        "sha256('key-escape-%s'))",
                        account, account, account);
        PGconn *c = PQconnectdb(db_url);
        PGresult *r = PQexec(c, sql);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
                fprintf(stderr, "FAIL: %s: %s\n", sql, PQerrorMessage(c));
                exit(1);
        }
        PQclear(r);
        PQfinish(c);
        free(sql);
        test_kafka_start(&kafka, work, 2, 1);
        brokers = strdup(kafka.bootstrap);
        char *log = fmt("%s/collector.log", work);
        char *collector[] = { (char *)test_env("TALLY_COLLECTOR_BIN"), "--state-dir", state, "--kafka-brokers", brokers,
                              "--tick-ms", "200", "--metrics-port", "0", NULL };
        collector_pid = test_spawn(collector, NULL, log);
        free(log);
        log = fmt("%s/aggregator.log", work);
        char *aggregator[] = { (char *)test_env("TALLY_AGGREGATOR_BIN"), "--database-url", db_url, "--kafka-brokers",
                               brokers, "--batch-ms", "100", NULL };
        aggregator_pid = test_spawn(aggregator, NULL, log);
        free(log);
}

/* the attacks whose sandbox the ledger billed wrongly */
static char ledger_bad[32][32];

/* Billed CPU in the ledger equals each stopped sandbox's counter as this test read it. */
static void check_ledger(void)
{
        int64_t until = test_now_ms() + 60000;
        int left = nstopped;
        bool done[32] = { false };
        char *got[32] = { NULL };
        while (left > 0 && test_now_ms() < until) {
                for (int i = 0; i < nstopped; i++) {
                        if (done[i])
                                continue;
                        char *q = fmt("SELECT sum(cpu_ns)::text FROM usage_hourly WHERE sandbox_id = '%s'",
                                      stopped[i].id);
                        free(got[i]);
                        got[i] = test_db_value(db_url, q);
                        free(q);
                        if (got[i] && strtoull(got[i], NULL, 10) == stopped[i].counter) {
                                done[i] = true;
                                left--;
                        }
                }
                if (left > 0)
                        test_sleep_ms(250);
        }
        char *want = fmt("%s/key-escape", account);
        int nbad = 0;
        for (int i = 0; i < nstopped; i++) {
                char *q = fmt("SELECT string_agg(DISTINCT account_id || '/' || key_id, ',') FROM usage_hourly "
                              "WHERE sandbox_id = '%s'",
                              stopped[i].id);
                char *who = test_db_value(db_url, q);
                fprintf(stderr, "ledger: %-14s %s billed %s ns of CPU to %s, its cgroup's final counter %" PRIu64 " ns\n",
                        stopped[i].attack, stopped[i].id, got[i] ? got[i] : "none", who ? who : "nobody",
                        stopped[i].counter);
                if ((!done[i] || !who || strcmp(who, want) != 0) && nbad < 32)
                        snprintf(ledger_bad[nbad++], sizeof(ledger_bad[0]), "%s", stopped[i].attack);
                if (!done[i])
                        ESCAPED("%s: billed CPU %s ns is not the sandbox's final counter %" PRIu64 " ns",
                                stopped[i].attack, got[i] ? got[i] : "none", stopped[i].counter);
                if (!who || strcmp(who, want) != 0)
                        ESCAPED("%s: the sandbox's usage was billed to %s, not %s", stopped[i].attack,
                                who ? who : "nobody", want);
                free(who);
                free(q);
                free(got[i]);
        }
        free(want);
        /* The network counters reached the ledger (recorded, not priced): what the test server counted. */
        if (*net_allow_id) {
                char *q = fmt("SELECT net_rx_bytes || ' ' || net_tx_bytes FROM sandboxes WHERE id = '%s'", net_allow_id);
                char *net = NULL, *expect = fmt("%ld %ld", net_allow_rx, net_allow_tx);
                for (int64_t end = test_now_ms() + 20000; test_now_ms() < end; test_sleep_ms(250)) {
                        free(net);
                        net = test_db_value(db_url, q);
                        if (net && strcmp(net, expect) == 0)
                                break;
                }
                fprintf(stderr, "ledger: net-allow      %s net_rx_bytes net_tx_bytes %s, the test server's %s\n",
                        net_allow_id, net ? net : "none", expect);
                CHECK(net && strcmp(net, expect) == 0,
                      "net-allow: the ledger records network bytes %s, the test server counted %s", net ? net : "none",
                      expect);
                free(net);
                free(expect);
                free(q);
        }
}

int main(void)
{
        snprintf(parent, sizeof(parent), "tally-test-escape-%d", (int)getpid());
        snprintf(ctl_parent, sizeof(ctl_parent), "tally-test-escctl-%d", (int)getpid());
        snprintf(account, sizeof(account), "acct-escape-%d", (int)getpid());
        snprintf(token, sizeof(token), "%d%04x", (int)getpid(), (unsigned)(test_now_ms() & 0xffff));
        helper = test_env("TALLY_ESCAPE_HELPER");
        work = test_tmpdir("escape");
        chmod(work, 0755);
        state = fmt("%s/state", work);
        sock = fmt("%s/vmm.sock", work);
        ctl_dir = fmt("%s/ctl", work);
        mkdir(ctl_dir, 0755);
        test_cleanup_at_exit(cleanup);
        start_pipeline();
        setup_internet();
        start_daemon();
        unsetenv("TALLY_ESCAPE_DAEMON_SECRET");
        start_victims();
        struct {
                const char *name;
                void (*fn)(void);
        } cases[] = {
                { "leave-cgroup", attack_leave_cgroup }, { "counters", attack_counters },
                { "thaw", attack_thaw },                 { "registry", attack_registry },
                { "vmm-socket", attack_vmm_socket },     { "host-proc", attack_host_proc },
                { "setns", attack_setns },               { "release-agent", attack_release_agent },
                { "forkbomb", attack_forkbomb },         { "disk-fill", attack_disk_fill },
                { "ptrace", attack_ptrace },             { "fork-tmp", attack_fork_tmp },
                { "fork-race", attack_fork_race },       { "admission", attack_admission },
                { "net-none", attack_net_none },         { "net-host", attack_net_host },
                { "net-allow", attack_net_allow },
        };
        enum { N = sizeof(cases) / sizeof(cases[0]) };
        bool escaped[N], other[N], ctl_failed[N];
        int64_t took[N];
        /* TALLY_ESCAPE_ONLY=name,name: only those attacks (while working on one) */
        const char *only = getenv("TALLY_ESCAPE_ONLY");
        bool skipped[N];
        for (size_t i = 0; i < N; i++) {
                char *want = only && *only ? fmt(",%s,", only) : NULL, *me = fmt(",%s,", cases[i].name);
                skipped[i] = want && !strstr(want, me);
                free(want);
                free(me);
                if (skipped[i])
                        continue;
                int before = test_failures, esc = attack_failures, ctl = control_failures;
                int64_t t0 = test_now_ms();
                fprintf(stderr, "=== attack %s\n", cases[i].name);
                cases[i].fn();
                escaped[i] = attack_failures > esc;
                ctl_failed[i] = control_failures > ctl;
                other[i] = test_failures > before;
                took[i] = test_now_ms() - t0;
        }
        fprintf(stderr, "=== the ledger (tally-collector, the broker, tally-aggregator, PostgreSQL)\n");
        check_ledger();
        fprintf(stderr, "=== sandbox-escape summary (attack: outcome inside a real sandbox)\n");
        for (size_t i = 0; i < N; i++) {
                if (skipped[i]) {
                        fprintf(stderr, "%-14s not run (TALLY_ESCAPE_ONLY)\n", cases[i].name);
                        continue;
                }
                bool ledger = false;
                for (int k = 0; k < 32; k++)
                        ledger |= strcmp(ledger_bad[k], cases[i].name) == 0;
                fprintf(stderr, "%-14s %s%s%s (%lld ms)\n", cases[i].name,
                        escaped[i] || ledger ? "SUCCEEDED inside the sandbox" :
                        other[i] && !ctl_failed[i] ? "blocked, other checks failed" : "blocked",
                        ledger ? "; the ledger does not match the cgroup" : "",
                        ctl_failed[i] ? "; CONTROL FAILED (the test is broken here)" : "", (long long)took[i]);
        }
        kill(daemon_pid, SIGTERM);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = -1;
        int rc = test_result();
        for (size_t i = 0; i < N && rc == 0; i++)
                if (skipped[i])
                        rc = 77; /* a part of the suite passed: not a pass (meson: skipped) */
        return rc;
}
