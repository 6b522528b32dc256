/* Unit tests of vmm/spec.c and vmm/backend.c: what a create request may ask
 * for, the sentence each refusal gives, and how a backend is chosen. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "backend.h"
#include "spec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct vmm_limits limits = { .host_mem_bytes = 8ULL << 30, .timeout_max_s = 3600 };

/* Parses text; returns the result and leaves the refusal in why. */
static int parse(const char *text, struct create_request *r, char *why)
{
        json_error_t e;
        json_t *j = json_loads(text, 0, &e);
        assert_non_null(j);
        why[0] = '\0';
        int rc = create_request_parse(j, &limits, r, why, 256);
        json_decref(j);
        return rc;
}

static void refused(const char *text, const char *needle)
{
        struct create_request r;
        char why[256];
        assert_int_equal(parse(text, &r, why), -EINVAL);
        if (!strstr(why, needle))
                fail_msg("refusal of %s says \"%s\", wanted \"%s\"", text, why, needle);
}

static void test_defaults(void **state)
{
        struct create_request r;
        char why[256];
        assert_int_equal(parse("{\"account\":\"acc-1\",\"key\":\"key.1\"}", &r, why), 0);
        assert_string_equal(r.account, "acc-1");
        assert_string_equal(r.key, "key.1");
        assert_string_equal(r.backend, "auto");
        assert_int_equal(r.vcpus, 1);
        assert_int_equal(r.mem_bytes, 512ULL << 20);
        assert_int_equal(r.disk_bytes, 1024ULL << 20);
        assert_int_equal(r.timeout_s, 300);
        assert_int_equal(r.pids_max, 1024);
        assert_false(r.net.internet);
        assert_int_equal(r.net.nallow, 0);
        assert_null(r.command);
        assert_int_equal(r.nlabels, 0);
        create_request_clear(&r);
}

static void test_full_request(void **state)
{
        struct create_request r;
        char why[256];
        assert_int_equal(parse("{\"account\":\"a\",\"key\":\"k\",\"vcpus\":16,\"memory_mib\":4096,\"disk_mib\":8192,"
                               "\"timeout_s\":3600,\"network\":true,\"backend\":\"process\",\"image\":\"base\","
                               "\"labels\":{\"agent\":\"coder\",\"task\":\"1234\"},\"command\":[\"sleep\",\"9\"],"
                               "\"pids_max\":64}",
                               &r, why),
                         0);
        assert_int_equal(r.vcpus, 16);
        assert_int_equal(r.mem_bytes, 4096ULL << 20);
        assert_int_equal(r.disk_bytes, 8192ULL << 20);
        assert_true(r.net.internet);
        assert_int_equal(r.net.nallow, 0);
        assert_int_equal(r.pids_max, 64);
        assert_string_equal(r.backend, "process");
        assert_string_equal(r.image, "base");
        assert_int_equal(r.nlabels, 2);
        assert_string_equal(r.command[0], "sleep");
        assert_string_equal(r.command[1], "9");
        assert_null(r.command[2]);
        create_request_clear(&r);
}

static void test_shell_command(void **state)
{
        struct create_request r;
        char why[256];
        assert_int_equal(parse("{\"account\":\"a\",\"key\":\"k\",\"command\":\"echo hi && sleep 1\"}", &r, why), 0);
        assert_string_equal(r.command[0], "/bin/sh");
        assert_string_equal(r.command[1], "-c");
        assert_string_equal(r.command[2], "echo hi && sleep 1");
        assert_null(r.command[3]);
        create_request_clear(&r);
}

static void test_refusals(void **state)
{
        refused("{\"key\":\"k\"}", "account is required");
        refused("{\"account\":\"a b\",\"key\":\"k\"}", "account is required");
        refused("{\"account\":\"a\"}", "key is required");
        refused("{\"account\":\"a\",\"key\":\"k\",\"vcpus\":0}", "vcpus must be an integer from 1 to 16");
        refused("{\"account\":\"a\",\"key\":\"k\",\"vcpus\":17}", "vcpus must be an integer from 1 to 16");
        refused("{\"account\":\"a\",\"key\":\"k\",\"vcpus\":\"2\"}", "vcpus must be an integer");
        refused("{\"account\":\"a\",\"key\":\"k\",\"memory_mib\":8193}", "more than this host's memory (8192 MiB)");
        refused("{\"account\":\"a\",\"key\":\"k\",\"memory_mib\":8}", "memory_mib must be an integer from 16");
        refused("{\"account\":\"a\",\"key\":\"k\",\"disk_mib\":-1}", "disk_mib");
        refused("{\"account\":\"a\",\"key\":\"k\",\"timeout_s\":3601}", "timeout_s must be an integer from 1 to 3600");
        refused("{\"account\":\"a\",\"key\":\"k\",\"timeout_s\":0}", "timeout_s");
        refused("{\"account\":\"a\",\"key\":\"k\",\"network\":1}", "network must be false, true or {");
        refused("{\"account\":\"a\",\"key\":\"k\",\"pids_max\":7}", "pids_max must be an integer from 8 to 65536");
        refused("{\"account\":\"a\",\"key\":\"k\",\"pids_max\":65537}", "pids_max must be an integer from 8");
        refused("{\"account\":\"a\",\"key\":\"k\",\"backend\":\"\"}", "backend must be");
        refused("{\"account\":\"a\",\"key\":\"k\",\"command\":[]}", "command");
        refused("{\"account\":\"a\",\"key\":\"k\",\"command\":[\"ls\",3]}", "command[1]");
        refused("{\"account\":\"a\",\"key\":\"k\",\"command\":[\"\"]}", "command[0]");
        refused("{\"account\":\"a\",\"key\":\"k\",\"vpcus\":2}", "unknown field \"vpcus\"");
        refused("{\"account\":\"a\",\"key\":\"k\",\"labels\":[\"x\"]}", "labels must be an object");
        refused("{\"account\":\"a\",\"key\":\"k\",\"labels\":{\"x\":1}}", "the value must be a string");
        refused("{\"account\":\"a\",\"key\":\"k\",\"labels\":{\"\":\"v\"}}", "1 to 63 allowed");
}

static void test_label_limits(void **state)
{
        char key[80], value[300], text[1024];
        memset(key, 'k', 63);
        key[63] = '\0';
        memset(value, 'v', 255);
        value[255] = '\0';
        struct create_request r;
        char why[256];
        snprintf(text, sizeof(text), "{\"account\":\"a\",\"key\":\"k\",\"labels\":{\"%s\":\"%s\"}}", key, value);
        assert_int_equal(parse(text, &r, why), 0); /* exactly at the limits */
        assert_string_equal(r.labels[0].value, value);
        create_request_clear(&r);
        key[63] = 'k';
        key[64] = '\0';
        snprintf(text, sizeof(text), "{\"account\":\"a\",\"key\":\"k\",\"labels\":{\"%s\":\"v\"}}", key);
        refused(text, "is 64 bytes: 1 to 63 allowed");
        value[255] = 'v';
        value[256] = '\0';
        snprintf(text, sizeof(text), "{\"account\":\"a\",\"key\":\"k\",\"labels\":{\"x\":\"%s\"}}", value);
        refused(text, "the value is 256 bytes, at most 255 allowed");
        /* 33 labels */
        char *p = text + sprintf(text, "{\"account\":\"a\",\"key\":\"k\",\"labels\":{");
        for (int i = 0; i < 33; i++)
                p += sprintf(p, "%s\"l%d\":\"v\"", i ? "," : "", i);
        sprintf(p, "}}");
        refused(text, "too many labels: 33, at most 32");
}

static void test_backend_choice(void **state)
{
        char why[256] = "";
        const char *reason = NULL;
        const struct backend_ops *b = backend_resolve("process", &reason, why, sizeof(why));
        assert_non_null(b);
        assert_string_equal(b->name, "process");
        b = backend_resolve("auto", &reason, why, sizeof(why));
        assert_non_null(b);
        assert_non_null(reason);
        if (!backend_find("qemu")) {
                /* Without the qemu backend built, auto can only mean process, and says why. */
                assert_string_equal(b->name, "process");
                assert_non_null(strstr(reason, "not built"));
        }
        assert_null(backend_resolve("xen", &reason, why, sizeof(why)));
        assert_non_null(strstr(why, "unknown backend \"xen\""));
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_defaults),     cmocka_unit_test(test_full_request),
                cmocka_unit_test(test_shell_command), cmocka_unit_test(test_refusals),
                cmocka_unit_test(test_label_limits), cmocka_unit_test(test_backend_choice),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
