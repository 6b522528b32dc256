/* Unit tests of collector/cgroup.c: the kernel's file formats parse (v2
 * fixtures in fixtures/: cpu.stat as a v2 host with the cpu controller writes
 * it, memory.current and memory.peak, which this machine's v2 tree lacks; and
 * this machine's own controller-less cpu.stat), garbage is refused, and the
 * open-once/pread reader reads files through their kept descriptors. */
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
#include <sys/resource.h>
#include <unistd.h>

#ifndef FIXTURES
#error FIXTURES must name the fixtures folder
#endif

static void read_v2_fixtures(void **state)
{
        struct cgroup_files f;
        assert_int_equal(cgroup_files_open(2, FIXTURES "/v2-host", FIXTURES "/v2-host", 1, true, &f), 0);
        assert_int_equal(cgroup_files_kept(&f), 2);
        assert_non_null(f.peak_path);
        struct cgroup_reading rd;
        for (int i = 0; i < 3; i++) { /* the same descriptors, re-read at offset 0 */
                assert_int_equal(cgroup_files_read(&f, &rd), 0);
                assert_true(rd.cpu_ns == UINT64_C(1196389000000));
                assert_true(rd.mem_bytes == UINT64_C(218103808));
                assert_int_equal(rd.mem_peak_bytes, 0); /* read on its own */
                uint64_t peak = 0;
                assert_int_equal(cgroup_files_read_peak(&f, &peak), 0);
                assert_true(peak == UINT64_C(536870912));
        }
        cgroup_files_close(&f);
        assert_int_equal(f.cpu_fd, -1);
        cgroup_files_close(&f); /* twice is fine */
        cgroup_files_close(NULL);
}

static void read_v2_without_memory(void **state)
{
        /* This machine's v2 tree: cpu.stat only (no controllers), memory reads as 0. */
        struct cgroup_files f;
        assert_int_equal(cgroup_files_open(2, FIXTURES "/v2-nocontrollers", FIXTURES "/v2-nocontrollers", 1, true, &f), 0);
        assert_int_equal(cgroup_files_kept(&f), 1);
        assert_null(f.mem_path);
        assert_null(f.peak_path);
        struct cgroup_reading rd;
        assert_int_equal(cgroup_files_read(&f, &rd), 0);
        assert_true(rd.cpu_ns == UINT64_C(500247149000));
        assert_int_equal(rd.mem_bytes, 0);
        assert_int_equal(rd.mem_peak_bytes, 0);
        uint64_t peak = 9;
        assert_int_equal(cgroup_files_read_peak(&f, &peak), 0);
        assert_int_equal(peak, 0);
        cgroup_files_close(&f);
}

static void missing_and_changed(void **state)
{
        struct cgroup_files f = CGROUP_FILES_NONE;
        assert_int_equal(cgroup_files_open(2, "/nonexistent/tally", "/nonexistent/tally", 1, true, &f), -ENOENT);
        assert_int_equal(f.cpu_fd, -1); /* untouched */
        assert_null(f.cpu_path);
        assert_int_equal(cgroup_files_open(3, FIXTURES "/v2-host", FIXTURES "/v2-host", 1, true, &f), -EINVAL);

        /* A v1-shaped folder whose counter changes between reads: the kept descriptor sees it. */
        char dir[] = "/tmp/tally-cgroup-unit.XXXXXX";
        assert_non_null(mkdtemp(dir));
        char path[128];
        snprintf(path, sizeof(path), "%s/cpuacct.usage", dir);
        FILE *fp = fopen(path, "w");
        fputs("123456789\n", fp);
        fclose(fp);
        assert_int_equal(cgroup_files_open(1, dir, dir, 1, true, &f), 0);
        assert_int_equal(cgroup_files_kept(&f), 1);
        struct cgroup_reading rd;
        assert_int_equal(cgroup_files_read(&f, &rd), 0);
        assert_int_equal(rd.cpu_ns, 123456789);
        fp = fopen(path, "r+");
        fputs("987654321\n", fp);
        fclose(fp);
        assert_int_equal(cgroup_files_read(&f, &rd), 0);
        assert_int_equal(rd.cpu_ns, 987654321);
        /* Emptied (as a removed cgroup's file reads): refused, the reading untouched. */
        truncate(path, 0);
        assert_int_equal(cgroup_files_read(&f, &rd), -ENODEV);
        assert_int_equal(rd.cpu_ns, 987654321);
        cgroup_files_close(&f);
        unlink(path);
        rmdir(dir);
}

static void out_of_descriptors(void **state)
{
        /* With no descriptor to spare, the files are opened per read, and the reading is the same. */
        struct rlimit old, tight;
        getrlimit(RLIMIT_NOFILE, &old);
        int probe = dup(0);
        tight.rlim_cur = (rlim_t)probe; /* every descriptor from here on is refused */
        tight.rlim_max = old.rlim_max;
        close(probe);
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &tight), 0);
        struct cgroup_files f;
        int r = cgroup_files_open(2, FIXTURES "/v2-host", FIXTURES "/v2-host", 1, true, &f);
        setrlimit(RLIMIT_NOFILE, &old);
        assert_int_equal(r, 0);
        assert_true(f.transient);
        assert_int_equal(cgroup_files_kept(&f), 0);
        struct cgroup_reading rd;
        assert_int_equal(cgroup_files_read(&f, &rd), 0);
        assert_true(rd.cpu_ns == UINT64_C(1196389000000));
        assert_true(rd.mem_bytes == UINT64_C(218103808));
        cgroup_files_close(&f);

        /* The caller's budget is spent: the same, by choice. */
        assert_int_equal(cgroup_files_open(2, FIXTURES "/v2-host", FIXTURES "/v2-host", 1, false, &f), 0);
        assert_true(f.transient);
        assert_int_equal(cgroup_files_kept(&f), 0);
        assert_int_equal(cgroup_files_read(&f, &rd), 0);
        assert_true(rd.cpu_ns == UINT64_C(1196389000000));
        uint64_t peak = 0;
        assert_int_equal(cgroup_files_read_peak(&f, &peak), 0);
        assert_true(peak == UINT64_C(536870912));
        cgroup_files_close(&f);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(read_v2_fixtures),
                cmocka_unit_test(read_v2_without_memory),
                cmocka_unit_test(missing_and_changed),
                cmocka_unit_test(out_of_descriptors),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
