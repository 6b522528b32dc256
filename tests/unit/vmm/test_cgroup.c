/* Unit tests of vmm/cgroup.c on fake cgroup trees in a temporary folder: how
 * v2 and v1 are told apart, where a sandbox's folders go, and that a cpu and
 * cpuacct hierarchy mounted together is used once. The real kernel side
 * (limits, freezing, counters) is proven by tests/integration/vmm. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cgroup.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[256];

static void make_dir(const char *rel)
{
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", root, rel);
        assert_int_equal(mkdir(path, 0755), 0);
}

static void make_file(const char *rel, const char *text)
{
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", root, rel);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(text, f);
        fclose(f);
}

static int setup(void **state)
{
        snprintf(root, sizeof(root), "/tmp/tally-unit-cgroup-XXXXXX");
        assert_non_null(mkdtemp(root));
        return 0;
}

static int teardown(void **state)
{
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        return system(cmd) == 0 ? 0 : -1;
}

static void test_v2(void **state)
{
        make_file("cgroup.controllers", "cpuset cpu io memory pids\n");
        make_file("cgroup.subtree_control", "");
        make_dir("tally");
        make_file("tally/cgroup.subtree_control", "");
        struct cgroup_host h;
        assert_int_equal(cgroup_host_detect(root, "tally", &h), 0);
        assert_int_equal(h.version, 2);
        struct sandbox_cgroup cg;
        assert_int_equal(cgroup_paths(&h, "sbx-1", &cg), 0);
        char want[512];
        snprintf(want, sizeof(want), "%s/tally/sbx-1", root);
        assert_int_equal(cg.ndirs, 1);
        assert_string_equal(cg.dirs[0], want);
        assert_string_equal(cg.cpuacct, want);
        assert_string_equal(cg.memory, want);
        assert_string_equal(cg.freezer, want);
}

static void test_v2_without_controllers_refused(void **state)
{
        make_file("cgroup.controllers", "");
        /* A file the kernel would refuse to take "+cpu" in: here a folder, so the write fails. */
        make_dir("cgroup.subtree_control");
        struct cgroup_host h;
        assert_true(cgroup_host_detect(root, "tally", &h) < 0);
}

static void test_v1_separate(void **state)
{
        const char *h1[] = { "cpu", "cpuacct", "memory", "freezer", "pids", "unified" };
        for (size_t i = 0; i < 6; i++)
                make_dir(h1[i]);
        struct cgroup_host h;
        assert_int_equal(cgroup_host_detect(root, "tally/inner", &h), 0);
        assert_int_equal(h.version, 1);
        char path[512];
        snprintf(path, sizeof(path), "%s/memory/tally/inner", root);
        struct stat st;
        assert_int_equal(stat(path, &st), 0); /* the parent is made in every hierarchy */
        struct sandbox_cgroup cg;
        assert_int_equal(cgroup_paths(&h, "sbx-2", &cg), 0);
        assert_int_equal(cg.ndirs, 6);
        snprintf(path, sizeof(path), "%s/cpuacct/tally/inner/sbx-2", root);
        assert_string_equal(cg.cpuacct, path);
        snprintf(path, sizeof(path), "%s/freezer/tally/inner/sbx-2", root);
        assert_string_equal(cg.freezer, path);
}

static void test_v1_comounted(void **state)
{
        make_dir("cpu,cpuacct");
        char target[512], link[512];
        snprintf(target, sizeof(target), "%s/cpu,cpuacct", root);
        snprintf(link, sizeof(link), "%s/cpu", root);
        assert_int_equal(symlink(target, link), 0);
        snprintf(link, sizeof(link), "%s/cpuacct", root);
        assert_int_equal(symlink(target, link), 0);
        make_dir("memory");
        make_dir("freezer");
        struct cgroup_host h;
        assert_int_equal(cgroup_host_detect(root, "tally", &h), 0);
        struct sandbox_cgroup cg;
        assert_int_equal(cgroup_paths(&h, "sbx-3", &cg), 0);
        assert_int_equal(cg.ndirs, 3); /* cpu,cpuacct once, memory, freezer */
        assert_string_equal(cg.cpu, cg.cpuacct);
}

static void test_v1_missing_hierarchy(void **state)
{
        make_dir("cpu");
        make_dir("cpuacct");
        make_dir("memory"); /* no freezer: pausing would be impossible */
        struct cgroup_host h;
        assert_int_equal(cgroup_host_detect(root, "tally", &h), -ENOENT);
}

/* pids.max goes to the folders that have it (v1: the pids hierarchy only). */
static void test_pids_max(void **state)
{
        const char *h1[] = { "cpu", "cpuacct", "memory", "freezer", "pids" };
        for (size_t i = 0; i < 5; i++)
                make_dir(h1[i]);
        struct cgroup_host h;
        assert_int_equal(cgroup_host_detect(root, "tally", &h), 0);
        struct sandbox_cgroup cg;
        assert_int_equal(cgroup_paths(&h, "sbx-4", &cg), 0);
        assert_int_equal(cgroup_set_pids_max(&cg, 77), -ENOENT); /* no folder has the file yet */
        make_dir("pids/tally/sbx-4");
        make_dir("memory/tally/sbx-4");
        make_file("pids/tally/sbx-4/pids.max", ""); /* cgroupfs replaces; a plain file is not truncated */
        assert_int_equal(cgroup_set_pids_max(&cg, 77), 0);
        char path[512], buf[32] = "";
        snprintf(path, sizeof(path), "%s/pids/tally/sbx-4/pids.max", root);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        assert_non_null(fgets(buf, sizeof(buf), f));
        fclose(f);
        assert_string_equal(buf, "77");
        snprintf(path, sizeof(path), "%s/memory/tally/sbx-4/pids.max", root);
        assert_int_equal(access(path, F_OK), -1); /* not written where the controller is not */
}

static void test_bad_parent(void **state)
{
        struct cgroup_host h;
        assert_int_equal(cgroup_host_detect(root, "../escape", &h), -EINVAL);
        assert_int_equal(cgroup_host_detect(root, "/abs", &h), -EINVAL);
        assert_int_equal(cgroup_host_detect(root, "", &h), -EINVAL);
        assert_int_equal(cgroup_host_detect(root, "sp ace", &h), -EINVAL);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_v2, setup, teardown),
                cmocka_unit_test_setup_teardown(test_v2_without_controllers_refused, setup, teardown),
                cmocka_unit_test_setup_teardown(test_v1_separate, setup, teardown),
                cmocka_unit_test_setup_teardown(test_v1_comounted, setup, teardown),
                cmocka_unit_test_setup_teardown(test_v1_missing_hierarchy, setup, teardown),
                cmocka_unit_test_setup_teardown(test_bad_parent, setup, teardown),
                cmocka_unit_test_setup_teardown(test_pids_max, setup, teardown),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
