/* Unit tests of common/registry.c and common/control.c: records survive a
 * write/read round trip, writes are atomic renames, bad files are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "control.h"
#include "registry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static int setup(void **state)
{
        snprintf(dir, sizeof(dir), "/tmp/tally-registry.XXXXXX");
        return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        return system(cmd);
}

static void round_trip(void **state)
{
        struct sandbox_record r = { .state = STATE_PAUSED, .vcpus = 2, .mem_size_bytes = UINT64_C(4) << 30,
                                    .epoch = 3, .created_ns = INT64_C(1795936457000000000), .cgroup_version = 1,
                                    .pid = 4242, .final_cpu_ns = 5 };
        strcpy(r.id, "sb_1");
        strcpy(r.account, "acct");
        strcpy(r.key, "key");
        strcpy(r.backend, "process");
        strcpy(r.cgroup_cpu, "/sys/fs/cgroup/cpuacct/tally/sb_1");
        strcpy(r.cgroup_memory, "/sys/fs/cgroup/memory/tally/sb_1");
        struct usage_event tmp = { 0 };
        assert_int_equal(event_add_label(&tmp, "task", "12\"34"), 0);
        r.labels = tmp.labels;
        r.nlabels = tmp.nlabels;
        assert_int_equal(registry_write(dir, &r), 0);

        struct sandbox_record back;
        assert_int_equal(registry_read(dir, "sb_1", &back), 0);
        assert_string_equal(back.cgroup_cpu, r.cgroup_cpu);
        assert_int_equal(back.state, STATE_PAUSED);
        assert_int_equal(back.pid, 4242);
        assert_true(back.mem_size_bytes == UINT64_C(4) << 30);
        assert_int_equal(back.nlabels, 1);
        assert_string_equal(back.labels[0].value, "12\"34");
        sandbox_record_clear(&back);

        struct sandbox_record *list;
        assert_int_equal(registry_list(dir, &list), 1);
        assert_string_equal(list[0].id, "sb_1");
        registry_list_free(list, 1);

        assert_int_equal(registry_remove(dir, "sb_1"), 0);
        assert_int_equal(registry_remove(dir, "sb_1"), 0);
        assert_int_equal(registry_read(dir, "sb_1", &back), -ENOENT);
        sandbox_record_clear(&r);
}

static void bad_files_refused(void **state)
{
        char path[128];
        snprintf(path, sizeof(path), "%s/" REGISTRY_DIR "/broken.json", dir);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs("{\"id\":\"broken\",\"account\":\"a\",\"state\":\"running\"", f); /* truncated */
        fclose(f);
        struct sandbox_record r;
        assert_int_equal(registry_read_file(path, &r), -EINVAL);
        struct sandbox_record *list;
        assert_int_equal(registry_list(dir, &list), 0); /* skipped, not fatal */
        registry_list_free(list, 0);
        assert_int_equal(registry_read(dir, "../etc/passwd", &r), -EINVAL);
}

static void control_round_trip(void **state)
{
        struct control_command c = { .action = CONTROL_PAUSE, .issued_ns = 99 }, back;
        strcpy(c.account, "acct");
        strcpy(c.key, "key_1");
        strcpy(c.reason, "daily_limit");
        char buf[512], why[64];
        int n = control_encode(&c, buf, sizeof(buf));
        assert_true(n > 0);
        assert_int_equal(control_decode(buf, (size_t)n, &back, why, sizeof(why)), 0);
        assert_int_equal(back.action, CONTROL_PAUSE);
        assert_string_equal(back.key, "key_1");
        assert_int_equal(back.issued_ns, 99);
        const char *bad = "{\"v\":1,\"action\":\"explode\",\"account\":\"a\",\"key\":\"k\"}";
        assert_int_equal(control_decode(bad, strlen(bad), &back, why, sizeof(why)), -EINVAL);
        assert_string_equal(why, "unknown action");
        const char *nokey = "{\"v\":1,\"action\":\"stop\",\"account\":\"a\"}";
        assert_int_equal(control_decode(nokey, strlen(nokey), &back, why, sizeof(why)), -EINVAL);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(round_trip),
                cmocka_unit_test(bad_files_refused),
                cmocka_unit_test(control_round_trip),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}
