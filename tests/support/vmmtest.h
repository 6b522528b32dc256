/* vmmtest.h — what the tests that run a real tally-vmm share: the clocks they
 * wait by, and removing every cgroup (and process in it) they made, also when a
 * check failed. Cleanup only: nothing here checks tally-vmm's behaviour. */
#pragma once

#include <stdint.h>
#include <time.h>

/* clock id read in nanoseconds (CLOCK_MONOTONIC, CLOCK_BOOTTIME, CLOCK_REALTIME). */
int64_t test_clock_ns(clockid_t id);
/* CLOCK_MONOTONIC in milliseconds. */
int64_t test_now_ms(void);
void test_sleep_ms(int ms);

/* Thaws cgroup folder dir (v1 freezer or v2 cgroup.freeze), SIGKILLs every
 * process in it and its sub-folders, depth first, and removes them; warns on
 * stderr when one would not go within 3 s. */
void test_cgroup_kill_and_remove(const char *dir);

/* The same for cgroup `rel` (e.g. a test's cgroup parent) under /sys/fs/cgroup:
 * version 2: the one folder; version 1: the folder in each v1 hierarchy,
 * freezer first (frozen processes cannot die until thawed); 0 (not known):
 * both. */
void test_cgroup_remove(const char *rel, int cgroup_version);
