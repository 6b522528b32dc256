/* vmmtest.h — what the tests that run a real tally-vmm share: the clocks they
 * wait by, and removing every cgroup (and process in it) they made, also when a
 * check failed. Cleanup only: nothing here checks tally-vmm's behaviour. */
#pragma once

#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

/* clock id read in nanoseconds (CLOCK_MONOTONIC, CLOCK_BOOTTIME, CLOCK_REALTIME). */
int64_t test_clock_ns(clockid_t id);
/* CLOCK_MONOTONIC in milliseconds. */
int64_t test_now_ms(void);
void test_sleep_ms(int ms);

/* Runs cleanup at exit, and on SIGTERM or SIGINT (then exits 128+signal). */
void test_cleanup_at_exit(void (*cleanup)(void));

/* One case of a test program. */
struct test_case {
        const char *name;
        void (*fn)(void);
};
/* Runs the n cases in order, each followed by "ok   NAME (N ms)" or
 * "FAIL NAME (N ms)" on stderr (FAIL: the case added to test_failures). */
void test_run_cases(const struct test_case *cases, size_t n);
#define TEST_RUN_CASES(cases) test_run_cases(cases, sizeof(cases) / sizeof(cases[0]))

/* Sends *pid sig and reaps it, then sets *pid to -1; nothing when *pid <= 0. */
void test_stop_process(pid_t *pid, int sig);

/* The string at key of JSON object j, "" when there is none (never NULL). */
const char *test_jstr(json_t *j, const char *key);

/* Thaws cgroup folder dir (v1 freezer or v2 cgroup.freeze), SIGKILLs every
 * process in it and its sub-folders, depth first, and removes them; warns on
 * stderr when one would not go within 3 s. */
void test_cgroup_kill_and_remove(const char *dir);

/* The same for cgroup `rel` (e.g. a test's cgroup parent) under /sys/fs/cgroup:
 * version 2: the one folder; version 1: the folder in each v1 hierarchy,
 * freezer first (frozen processes cannot die until thawed); 0 (not known):
 * both. */
void test_cgroup_remove(const char *rel, int cgroup_version);

/* Freezes (on) or thaws cgroup `rel` under /sys/fs/cgroup, version 1 (its
 * freezer folder) or 2: a sandbox made under a frozen parent is frozen too,
 * so its start never finishes until the thaw. Whether the write held. */
bool test_cgroup_freeze(const char *rel, int cgroup_version, bool on);

/* Runs tally-vmm's own client, `$TALLY_VMM_BIN --socket sock ARGS...`, ARGS the
 * NULL-terminated list from first on (at most 59). */
/* Its exit status (or 128+signal); stdout and stderr as test_run. */
int test_vmm_cli_raw_v(const char *sock, char **out, char **err, const char *first, va_list ap);
/* Its stdout as JSON, or {"raw_stdout", "raw_stderr"} when it is not JSON
 * (never NULL; the caller owns it). Its stderr (malloc'd) to *ret_err and exit
 * status to *ret_rc when these are not NULL. */
json_t *test_vmm_cli_v(const char *sock, int *ret_rc, char **ret_err, const char *first, va_list ap);
json_t *test_vmm_cli(const char *sock, int *ret_rc, char **ret_err, const char *first, ...);

/* Asks the daemon at sock for `status` every 100 ms, up to timeout_ms, until it
 * reports control_ready. While *cgroup_version is 0, a status answered sets it
 * to the daemon's cgroup_version. Returns 0, or -ETIMEDOUT (what to do then,
 * the test decides). */
int test_vmm_wait_ready(const char *sock, int timeout_ms, int *cgroup_version);
