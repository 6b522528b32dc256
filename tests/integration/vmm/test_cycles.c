/* Integration: create → exec → stop cycles through a real tally-vmm daemon,
 * four loops at once, none allowed to take over 15 s (the hang this guards against: an old
 * in-daemon sandbox init, a clone() of the threaded daemon, called fork() and
 * hung on a malloc lock another thread held; create or exec then never
 * answered). Every call has a client-side timeout, so a hang is a failure with
 * a reason, not a test that never ends. Prints the max and the p99.
 *
 * Then the lease a sandbox holds without tally-vmm: a sandbox with a 5 s lease keeps running
 * after tally-vmm is killed with SIGKILL; its processes must be gone within
 * about a second of the deadline, read from the host (its cgroup's tasks).
 *
 * Between them, the jail's layers as the host sees them (the attack suite
 * sandbox-escape tries each escape; this only checks each layer is there):
 * the sandbox's root is an unprivileged uid on the host, writing past
 * disk_mib is ENOSPC, pids.max is set, no cgroup file system or host /proc.
 *
 * TALLY_CYCLES overrides the number of cycles (default 2,000) for development. */
#include "support.h"
#include "vmmtest.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LOOPS 4
/* A hang never answers (each call gives up at CALL_TIMEOUT_MS); a slow create
 * does: its disk image (an ext4 file on a loop device) took up to 8.4 s
 * beside the other tests of a full run, on a machine where its median cycle
 * is 0.2 s. The bound separates those, and each loop's slowest cycle is
 * printed with the time of each call. */
#define CYCLE_LIMIT_MS 15000
#define CALL_TIMEOUT_MS 30000

static char parent[64], account[64];
static char *work, *state, *sock;
static pid_t daemon_pid = -1;

static int64_t wall_ns(void) { return test_clock_ns(CLOCK_REALTIME); }

/* ---- cleaning up ---- */

static int cgroup_version(void)
{
        return access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0 ? 2 : 1;
}

static void cleanup(void)
{
        test_stop_process(&daemon_pid, SIGKILL);
        if (!*parent)
                return;
        test_cgroup_remove(parent, cgroup_version());
        while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
}

static void on_signal(int sig)
{
        (void)sig;
        exit(1); /* atexit cleanup */
}

/* ---- the daemon ---- */

struct buf {
        char *data;
        size_t len;
};

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
        struct buf *b = arg;
        char *d = realloc(b->data, b->len + size * n + 1);
        if (!d)
                return 0;
        memcpy(d + b->len, p, size * n);
        b->len += size * n;
        d[b->len] = '\0';
        b->data = d;
        return size * n;
}

/* One API call over the daemon's socket. Returns the HTTP status (or -1 on a
 * transport error or timeout, with the reason in why) and the parsed answer. */
static long call(CURL *curl, const char *method, const char *path, json_t *body, json_t **ret, char *why,
                 size_t whylen)
{
        char url[256];
        snprintf(url, sizeof(url), "http://localhost%s", path);
        char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
        struct buf b = { 0 };
        struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_reset(curl);
        curl_easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH, sock);
        curl_easy_setopt(curl, CURLOPT_URL, url);
        curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(curl, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long)CALL_TIMEOUT_MS);
        curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
        if (text)
                curl_easy_setopt(curl, CURLOPT_POSTFIELDS, text);
        CURLcode c = curl_easy_perform(curl);
        long status = -1;
        if (c == CURLE_OK)
                curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
        else
                snprintf(why, whylen, "%s %s: %s", method, path, curl_easy_strerror(c));
        *ret = b.data ? json_loads(b.data, 0, NULL) : NULL;
        if (c == CURLE_OK && status >= 300)
                snprintf(why, whylen, "%s %s: HTTP %ld %s", method, path, status, b.data ? b.data : "");
        free(b.data);
        free(text);
        curl_slist_free_all(headers);
        return status;
}

static void start_daemon(void)
{
        char log[1024];
        snprintf(log, sizeof(log), "%s/vmm.log", work);
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state, "--socket", sock,
                         "--kafka-brokers", (char *)test_env("TALLY_TEST_BROKERS"), "--cgroup-parent", parent,
                         "--host-id", "test-cycles-host", "--backend", "process", "--final-wait-ms", "100",
                         "--log-level", "warn", NULL };
        daemon_pid = test_spawn(argv, NULL, log);
        CURL *curl = curl_easy_init();
        int64_t until = test_now_ms() + 20000;
        while (test_now_ms() < until) {
                json_t *j = NULL;
                char why[512];
                long st = call(curl, "GET", "/v1/status", NULL, &j, why, sizeof(why));
                json_decref(j);
                if (st == 200)
                        break;
                test_sleep_ms(50);
        }
        curl_easy_cleanup(curl);
}

/* ---- the cycles ---- */

struct loop {
        pthread_t thread;
        int index, cycles, done, errors;
        int64_t *ms;                 /* each cycle's wall time */
        char first_error[600];
        /* the slowest cycle: its sandbox and each call's time, for a failure's reason */
        int64_t slow_ms, slow_create, slow_exec, slow_stop;
        char slow_id[64];
};

static void loop_error(struct loop *l, const char *what, const char *detail)
{
        if (l->errors++ == 0)
                snprintf(l->first_error, sizeof(l->first_error), "%s: %.500s", what, detail);
}

static void *run_loop(void *arg)
{
        struct loop *l = arg;
        CURL *curl = curl_easy_init();
        for (int i = 0; i < l->cycles; i++) {
                char why[600] = "";
                int64_t t0 = test_now_ms();
                json_t *body = json_pack("{s:s, s:s, s:i, s:i, s:i, s:{s:s}}", "account", account, "key", "k-cycles",
                                         "memory_mib", 64, "disk_mib", 16, "timeout_s", 120, "labels", "suite",
                                         "cycles"), *ans = NULL;
                long st = call(curl, "POST", "/v1/sandboxes", body, &ans, why, sizeof(why));
                json_decref(body);
                const char *id = json_string_value(json_object_get(ans, "id"));
                char path[128];
                if (st != 201 || !id) {
                        loop_error(l, "create", why);
                        json_decref(ans);
                        l->ms[l->done++] = test_now_ms() - t0;
                        continue;
                }
                char sid[64];
                snprintf(sid, sizeof(sid), "%s", id);
                json_decref(ans);
                int64_t t1 = test_now_ms();
                snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", sid);
                body = json_pack("{s:[s,s,s], s:i}", "command", "/bin/sh", "-c", "echo cycle-ok", "timeout_ms", 20000);
                ans = NULL;
                st = call(curl, "POST", path, body, &ans, why, sizeof(why));
                json_decref(body);
                const char *out = json_string_value(json_object_get(ans, "stdout"));
                if (st != 200 || !out || strcmp(out, "cycle-ok\n") != 0) {
                        char *text = ans ? json_dumps(ans, JSON_COMPACT) : NULL;
                        char detail[600];
                        snprintf(detail, sizeof(detail), "%s %s", why, text ? text : "");
                        loop_error(l, "exec", detail);
                        free(text);
                }
                json_decref(ans);
                int64_t t2 = test_now_ms();
                snprintf(path, sizeof(path), "/v1/sandboxes/%s/stop", sid);
                ans = NULL;
                st = call(curl, "POST", path, NULL, &ans, why, sizeof(why));
                if (st != 200)
                        loop_error(l, "stop", why);
                json_decref(ans);
                int64_t t3 = test_now_ms();
                l->ms[l->done++] = t3 - t0;
                if (t3 - t0 > l->slow_ms) {
                        l->slow_ms = t3 - t0;
                        l->slow_create = t1 - t0;
                        l->slow_exec = t2 - t1;
                        l->slow_stop = t3 - t2;
                        snprintf(l->slow_id, sizeof(l->slow_id), "%s", sid);
                }
        }
        curl_easy_cleanup(curl);
        return NULL;
}

static int cmp_ms(const void *a, const void *b)
{
        int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
        return x < y ? -1 : x > y;
}

static void test_cycles(void)
{
        const char *env = getenv("TALLY_CYCLES");
        int total = env && atoi(env) > 0 ? atoi(env) : 2000;
        struct loop loops[LOOPS] = { 0 };
        int64_t *all = calloc((size_t)total, sizeof(*all));
        int at = 0;
        int64_t t0 = test_now_ms();
        for (int i = 0; i < LOOPS; i++) {
                loops[i].index = i;
                loops[i].cycles = total / LOOPS + (i < total % LOOPS);
                loops[i].ms = calloc((size_t)loops[i].cycles, sizeof(int64_t));
                pthread_create(&loops[i].thread, NULL, run_loop, &loops[i]);
        }
        int errors = 0;
        for (int i = 0; i < LOOPS; i++) {
                pthread_join(loops[i].thread, NULL);
                errors += loops[i].errors;
                if (loops[i].errors)
                        fprintf(stderr, "loop %d: %d errors, first: %s\n", i, loops[i].errors, loops[i].first_error);
                if (loops[i].slow_ms > CYCLE_LIMIT_MS / 5)
                        fprintf(stderr, "loop %d: slowest cycle %lld ms (%s: create %lld, exec %lld, stop %lld ms)\n", i,
                                (long long)loops[i].slow_ms, loops[i].slow_id, (long long)loops[i].slow_create,
                                (long long)loops[i].slow_exec, (long long)loops[i].slow_stop);
                memcpy(all + at, loops[i].ms, (size_t)loops[i].done * sizeof(int64_t));
                at += loops[i].done;
                free(loops[i].ms);
        }
        qsort(all, (size_t)at, sizeof(*all), cmp_ms);
        int64_t max = at ? all[at - 1] : 0, p99 = at ? all[(at * 99 + 99) / 100 - 1] : 0, p50 = at ? all[at / 2] : 0;
        int over = 0;
        for (int i = 0; i < at; i++)
                over += all[i] > CYCLE_LIMIT_MS;
        fprintf(stderr, "cycles=%d loops=%d wall_ms=%lld cycle_ms_p50=%lld cycle_ms_p99=%lld cycle_ms_max=%lld over_limit=%d "
                "errors=%d\n", at, LOOPS, (long long)(test_now_ms() - t0), (long long)p50, (long long)p99, (long long)max,
                over, errors);
        CHECK(at == total, "%d of %d cycles ran", at, total);
        CHECK(errors == 0, "%d calls failed (first reasons above)", errors);
        CHECK(over == 0 && max <= CYCLE_LIMIT_MS, "%d cycles took over %d ms (max %lld ms)", over, CYCLE_LIMIT_MS,
              (long long)max);
        free(all);
}

/* ---- the lease while the daemon is down ---- */

static int count_tasks(const char *id)
{
        char path[512];
        if (cgroup_version() == 2)
                snprintf(path, sizeof(path), "/sys/fs/cgroup/%s/%s/cgroup.procs", parent, id);
        else
                snprintf(path, sizeof(path), "/sys/fs/cgroup/pids/%s/%s/tasks", parent, id);
        FILE *f = fopen(path, "re");
        if (!f)
                return -1;
        int n = 0;
        long v;
        while (fscanf(f, "%ld", &v) == 1)
                n++;
        fclose(f);
        return n;
}

static void test_lease_while_down(void)
{
        CURL *curl = curl_easy_init();
        char why[600] = "";
        json_t *body = json_pack("{s:s, s:s, s:i, s:i, s:i, s:[s,s,s]}", "account", account, "key", "k-lease",
                                 "memory_mib", 64, "disk_mib", 16, "timeout_s", 5, "command", "/bin/sh", "-c",
                                 "sleep 1000 & sleep 1000"), *ans = NULL;
        long st = call(curl, "POST", "/v1/sandboxes", body, &ans, why, sizeof(why));
        json_decref(body);
        const char *id_s = json_string_value(json_object_get(ans, "id"));
        int64_t deadline = json_integer_value(json_object_get(ans, "deadline_ns"));
        CHECK(st == 201 && id_s && deadline > 0, "create with a 5 s lease: %s", why);
        char id[64];
        snprintf(id, sizeof(id), "%s", id_s ? id_s : "");
        json_decref(ans);
        curl_easy_cleanup(curl);
        if (st != 201 || !*id)
                return;
        /* The main program and its child are running. */
        int64_t until = test_now_ms() + 3000;
        while (count_tasks(id) < 3 && test_now_ms() < until)
                test_sleep_ms(20);
        int before = count_tasks(id);
        CHECK(before >= 3, "the sandbox's init, shell and sleeps are not all in its cgroup: %d tasks", before);
        kill(daemon_pid, SIGKILL);
        waitpid(daemon_pid, NULL, 0);
        daemon_pid = -1;
        /* From the host: the cgroup's tasks, until a second after the deadline. */
        int64_t gone_at = 0;
        int n = -1;
        while (wall_ns() < deadline + 3000000000LL) {
                n = count_tasks(id);
                if (n == 0) {
                        gone_at = wall_ns();
                        break;
                }
                CHECK(wall_ns() < deadline + 1100000000LL, "the sandbox still runs %lld ms after its lease ended "
                      "with tally-vmm down (%d tasks)", (long long)((wall_ns() - deadline) / 1000000), n);
                if (wall_ns() >= deadline + 1100000000LL)
                        break;
                test_sleep_ms(20);
        }
        if (gone_at)
                fprintf(stderr, "lease: processes gone %lld ms after the deadline (tally-vmm down)\n",
                        (long long)((gone_at - deadline) / 1000000));
        CHECK(gone_at > 0, "the sandbox's processes outlived its lease while tally-vmm was down (%d tasks)", n);
        CHECK(gone_at == 0 || gone_at >= deadline, "the sandbox was ended %lld ms before its lease ended",
              (long long)((deadline - gone_at) / 1000000));
}

/* ---- the jail, seen from the host ---- */

static json_t *exec_json(CURL *curl, const char *id, const char *script, char *why, size_t whylen)
{
        char path[128];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", id);
        json_t *body = json_pack("{s:[s,s,s], s:i}", "command", "/bin/sh", "-c", script, "timeout_ms", 30000), *ans = NULL;
        long st = call(curl, "POST", path, body, &ans, why, whylen);
        json_decref(body);
        if (st != 200) {
                json_decref(ans);
                return NULL;
        }
        return ans;
}

static const char *jout(json_t *j)
{
        const char *s = json_string_value(json_object_get(j, "stdout"));
        return s ? s : "";
}

static void test_jail_layers(void)
{
        CURL *curl = curl_easy_init();
        char why[600] = "";
        json_t *body = json_pack("{s:s, s:s, s:i, s:i, s:i, s:[s,s,s]}", "account", account, "key", "k-jail",
                                 "memory_mib", 128, "disk_mib", 16, "timeout_s", 120, "command", "/bin/sh", "-c",
                                 "sleep 1000"), *ans = NULL;
        long st = call(curl, "POST", "/v1/sandboxes", body, &ans, why, sizeof(why));
        json_decref(body);
        const char *id_s = json_string_value(json_object_get(ans, "id"));
        CHECK(st == 201 && id_s, "create: %s", why);
        char id[64];
        snprintf(id, sizeof(id), "%s", id_s ? id_s : "");
        json_decref(ans);
        if (st != 201 || !*id) {
                curl_easy_cleanup(curl);
                return;
        }
        /* Every process of the sandbox but its init runs as an unprivileged uid on the host. */
        char path[512];
        if (cgroup_version() == 2)
                snprintf(path, sizeof(path), "/sys/fs/cgroup/%s/%s/cgroup.procs", parent, id);
        else
                snprintf(path, sizeof(path), "/sys/fs/cgroup/pids/%s/%s/cgroup.procs", parent, id);
        int64_t until = test_now_ms() + 3000;
        int seen = 0, root_owned = 0, unprivileged = 0;
        while (test_now_ms() < until && seen < 2) {
                FILE *f = fopen(path, "re");
                long pid;
                seen = root_owned = unprivileged = 0;
                while (f && fscanf(f, "%ld", &pid) == 1) {
                        char status[64], line[256];
                        snprintf(status, sizeof(status), "/proc/%ld/status", pid);
                        FILE *s = fopen(status, "re");
                        unsigned long ruid = 0, euid = 0;
                        unsigned long long capeff = ~0ULL;
                        while (s && fgets(line, sizeof(line), s)) {
                                sscanf(line, "Uid: %lu %lu", &ruid, &euid);
                                sscanf(line, "CapEff: %llx", &capeff);
                        }
                        if (s)
                                fclose(s);
                        seen++;
                        if (ruid == 0)
                                root_owned++; /* the init: host root, but with no capability left */
                        if (ruid == 0)
                                CHECK(capeff == 0, "the sandbox's init keeps host capabilities %llx", capeff);
                        if (ruid >= 0x10000 && euid == ruid)
                                unprivileged++;
                }
                if (f)
                        fclose(f);
                if (seen < 2)
                        test_sleep_ms(20);
        }
        CHECK(seen >= 2 && root_owned == 1 && unprivileged == seen - 1,
              "the sandbox's processes are not an unprivileged uid on the host: %d processes, %d host root, "
              "%d unprivileged", seen, root_owned, unprivileged);
        /* pids.max from the default. */
        if (cgroup_version() == 2)
                snprintf(path, sizeof(path), "/sys/fs/cgroup/%s/%s/pids.max", parent, id);
        else
                snprintf(path, sizeof(path), "/sys/fs/cgroup/pids/%s/%s/pids.max", parent, id);
        char *pids_max = test_read_file(path);
        CHECK(pids_max && strcmp(pids_max, "1024") == 0, "pids.max is %s, not the default 1024",
              pids_max ? pids_max : "(unreadable)");
        free(pids_max);
        /* Inside: root of its own user namespace, filtered; the disk stops at 16 MiB. */
        json_t *j = exec_json(curl, id,
                              "cat /proc/self/uid_map; grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status; "
                              "dd if=/dev/zero of=/work/fill bs=1M count=32 2>&1 | grep -c 'No space left'; "
                              "test -e /sys/fs/cgroup && echo cgroupfs-visible; "
                              "cat /proc/1/environ >/dev/null 2>&1 && echo init-environ-readable; "
                              "ls /proc | grep -cE '^[0-9]+$'; id -u",
                              why, sizeof(why));
        CHECK(j != NULL, "exec: %s", why);
        const char *out = jout(j);
        unsigned long in0 = 1, outside = 0, count = 0;
        CHECK(sscanf(out, " %lu %lu %lu", &in0, &outside, &count) == 3 && in0 == 0 && outside >= 0x10000 &&
                      count == 65536,
              "uid 0 inside is not a range of 65536 unprivileged host uids: %s", out);
        CHECK(strstr(out, "Seccomp:\t2") && strstr(out, "NoNewPrivs:\t1"), "no seccomp filter: %s", out);
        CHECK(strstr(out, "\n1\n"), "writing 32 MiB to a 16 MiB disk did not end in ENOSPC: %s", out);
        CHECK(!strstr(out, "cgroupfs-visible") && !strstr(out, "init-environ-readable"),
              "a host cgroup file system or the init's environment is visible: %s", out);
        CHECK(strlen(out) > 2 && strcmp(out + strlen(out) - 2, "0\n") == 0, "the command is not root inside: %s", out);
        json_decref(j);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/stop", id);
        ans = NULL;
        call(curl, "POST", path, NULL, &ans, why, sizeof(why));
        json_decref(ans);
        curl_easy_cleanup(curl);
}

int main(void)
{
        snprintf(parent, sizeof(parent), "tally-test-cycles-%d", (int)getpid());
        snprintf(account, sizeof(account), "acct-cycles-%d", (int)getpid());
        work = test_tmpdir("cycles");
        if (asprintf(&state, "%s/state", work) < 0 || asprintf(&sock, "%s/vmm.sock", work) < 0)
                return 1;
        atexit(cleanup);
        signal(SIGTERM, on_signal);
        signal(SIGINT, on_signal);
        curl_global_init(CURL_GLOBAL_DEFAULT);
        start_daemon();
        const struct test_case cases[] = {
                { "cycles", test_cycles },
                { "jail_layers", test_jail_layers },
                { "lease_while_down", test_lease_while_down },
        };
        TEST_RUN_CASES(cases);
        return test_result();
}
