/* vmmtest.c — clocks and cgroup cleanup for the tests that run a real tally-vmm
 * (see vmmtest.h). It must never leave a test's processes running. */
#include "vmmtest.h"
#include "support.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

int64_t test_clock_ns(clockid_t id)
{
        struct timespec ts;
        clock_gettime(id, &ts);
        return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t test_now_ms(void)
{
        return test_clock_ns(CLOCK_MONOTONIC) / 1000000;
}

void test_sleep_ms(int ms)
{
        struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
        nanosleep(&ts, NULL);
}

static void (*exit_cleanup)(void);

static void on_signal(int sig)
{
        exit_cleanup();
        _exit(128 + sig);
}

void test_cleanup_at_exit(void (*cleanup)(void))
{
        exit_cleanup = cleanup;
        atexit(cleanup);
        signal(SIGTERM, on_signal);
        signal(SIGINT, on_signal);
}

/* TALLY_TEST_CASES (a comma-separated list of names) runs only those cases: for
 * replaying one by hand; unset, every case runs. A name that matches no case
 * is a failure (a misspelt name would otherwise run nothing and pass). */
static bool case_selected(const char *name)
{
        const char *only = getenv("TALLY_TEST_CASES");
        if (!only || !*only)
                return true;
        size_t len = strlen(name);
        for (const char *p = only; *p;) {
                const char *end = strchr(p, ',');
                size_t n = end ? (size_t)(end - p) : strlen(p);
                if (n == len && strncmp(p, name, len) == 0)
                        return true;
                p += n + (end != NULL);
        }
        return false;
}

/* Fails every name in TALLY_TEST_CASES that is none of the cases. */
static void check_case_names(const struct test_case *cases, size_t n)
{
        const char *only = getenv("TALLY_TEST_CASES");
        if (!only || !*only)
                return;
        for (const char *p = only; *p;) {
                const char *end = strchr(p, ',');
                size_t len = end ? (size_t)(end - p) : strlen(p);
                bool found = false;
                for (size_t i = 0; i < n && !found; i++)
                        found = strlen(cases[i].name) == len && strncmp(cases[i].name, p, len) == 0;
                CHECK(found, "TALLY_TEST_CASES names '%.*s', which is none of this test's cases", (int)len, p);
                p += len + (end != NULL);
        }
}

void test_run_cases(const struct test_case *cases, size_t n)
{
        check_case_names(cases, n);
        for (size_t i = 0; i < n; i++) {
                if (!case_selected(cases[i].name))
                        continue;
                int before = test_failures;
                int64_t t0 = test_now_ms();
                cases[i].fn();
                fprintf(stderr, "%s %s (%lld ms)\n", test_failures == before ? "ok  " : "FAIL", cases[i].name,
                        (long long)(test_now_ms() - t0));
        }
}

void test_stop_process(pid_t *pid, int sig)
{
        if (*pid <= 0)
                return;
        kill(*pid, sig);
        waitpid(*pid, NULL, 0);
        *pid = -1;
}

const char *test_jstr(json_t *j, const char *key)
{
        const char *s = json_string_value(json_object_get(j, key));
        return s ? s : "";
}

static void write_if_there(const char *dir, const char *file, const char *text)
{
        char path[1100];
        snprintf(path, sizeof(path), "%s/%s", dir, file);
        FILE *f = fopen(path, "we");
        if (f) {
                fputs(text, f);
                fclose(f);
        }
}

void test_cgroup_kill_and_remove(const char *dir)
{
        DIR *d = opendir(dir);
        if (!d)
                return;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_type == DT_DIR && de->d_name[0] != '.') {
                        char sub[1024];
                        snprintf(sub, sizeof(sub), "%s/%s", dir, de->d_name);
                        test_cgroup_kill_and_remove(sub);
                }
        }
        closedir(d);
        write_if_there(dir, "freezer.state", "THAWED");
        write_if_there(dir, "cgroup.freeze", "0");
        char procs[1100];
        snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
        for (int i = 0; i < 300; i++) {
                FILE *f = fopen(procs, "re");
                long pid;
                while (f && fscanf(f, "%ld", &pid) == 1)
                        kill((pid_t)pid, SIGKILL);
                if (f)
                        fclose(f);
                if (rmdir(dir) == 0 || errno == ENOENT)
                        return;
                test_sleep_ms(10);
        }
        fprintf(stderr, "warning: could not remove %s\n", dir);
}

void test_cgroup_remove(const char *rel, int cgroup_version)
{
        char dir[512];
        if (cgroup_version != 1) {
                snprintf(dir, sizeof(dir), "/sys/fs/cgroup/%s", rel);
                test_cgroup_kill_and_remove(dir);
        }
        if (cgroup_version == 2)
                return;
        const char *roots[] = { "freezer", "cpu", "cpuacct", "memory", "pids", "unified", NULL };
        for (const char **r = roots; *r; r++) {
                snprintf(dir, sizeof(dir), "/sys/fs/cgroup/%s/%s", *r, rel);
                test_cgroup_kill_and_remove(dir);
        }
}

bool test_cgroup_freeze(const char *rel, int cgroup_version, bool on)
{
        char path[512];
        if (cgroup_version == 1)
                snprintf(path, sizeof(path), "/sys/fs/cgroup/freezer/%s/freezer.state", rel);
        else
                snprintf(path, sizeof(path), "/sys/fs/cgroup/%s/cgroup.freeze", rel);
        FILE *f = fopen(path, "we");
        if (!f)
                return false;
        bool ok = fputs(cgroup_version == 1 ? (on ? "FROZEN" : "THAWED") : (on ? "1" : "0"), f) >= 0;
        return fclose(f) == 0 && ok;
}

int test_vmm_cli_raw_v(const char *sock, char **out, char **err, const char *first, va_list ap)
{
        char *argv[64];
        int n = 0;
        argv[n++] = (char *)test_env("TALLY_VMM_BIN");
        argv[n++] = "--socket";
        argv[n++] = (char *)sock;
        for (const char *a = first; a && n < 62; a = va_arg(ap, const char *))
                argv[n++] = (char *)a;
        argv[n] = NULL;
        return test_run(argv, out, err);
}

json_t *test_vmm_cli_v(const char *sock, int *ret_rc, char **ret_err, const char *first, va_list ap)
{
        char *out = NULL, *err = NULL;
        int rc = test_vmm_cli_raw_v(sock, &out, &err, first, ap);
        json_t *j = out ? json_loads(out, 0, NULL) : NULL;
        if (!j)
                j = json_pack("{s:s, s:s}", "raw_stdout", out ? out : "", "raw_stderr", err ? err : "");
        free(out);
        if (ret_err)
                *ret_err = err;
        else
                free(err);
        if (ret_rc)
                *ret_rc = rc;
        return j;
}

json_t *test_vmm_cli(const char *sock, int *ret_rc, char **ret_err, const char *first, ...)
{
        va_list ap;
        va_start(ap, first);
        json_t *j = test_vmm_cli_v(sock, ret_rc, ret_err, first, ap);
        va_end(ap);
        return j;
}

int test_vmm_wait_ready(const char *sock, int timeout_ms, int *cgroup_version)
{
        int64_t until = test_now_ms() + timeout_ms;
        while (test_now_ms() < until) {
                int rc;
                json_t *st = test_vmm_cli(sock, &rc, NULL, "status", NULL);
                bool ready = rc == 0 && json_is_true(json_object_get(st, "control_ready"));
                if (rc == 0 && !*cgroup_version)
                        *cgroup_version = (int)json_integer_value(json_object_get(st, "cgroup_version"));
                json_decref(st);
                if (ready)
                        return 0;
                test_sleep_ms(100);
        }
        return -ETIMEDOUT;
}
