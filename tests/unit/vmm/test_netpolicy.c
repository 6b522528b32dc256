/* Unit tests of vmm/netpolicy.c: the "network" field's forms, the names an
 * allow-list takes, what a name matches, and the addresses no sandbox may
 * reach whatever its allow-list (the ranges are the IANA special-purpose
 * registries', written out here by hand). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "netpolicy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <string.h>

static int parse(const char *text, struct net_policy *p, char *why)
{
        json_t *j = json_loads(text, JSON_DECODE_ANY, NULL);
        assert_non_null(j);
        why[0] = '\0';
        int r = net_policy_parse(j, p, why, 256);
        json_decref(j);
        return r;
}

static void refused(const char *text, const char *needle)
{
        struct net_policy p;
        char why[256];
        assert_int_equal(parse(text, &p, why), -EINVAL);
        if (!strstr(why, needle))
                fail_msg("refusal of %s says \"%s\", wanted \"%s\"", text, why, needle);
}

static void test_forms(void **state)
{
        struct net_policy p;
        char why[256];
        assert_int_equal(parse("false", &p, why), 0);
        assert_false(p.internet);
        assert_int_equal(parse("true", &p, why), 0);
        assert_true(p.internet);
        assert_int_equal(p.nallow, 0);
        assert_int_equal(parse("{\"internet\":true,\"allow\":[\"GitHub.com\",\"*.github.com\"]}", &p, why), 0);
        assert_true(p.internet);
        assert_int_equal(p.nallow, 2);
        assert_string_equal(p.allow[0], "github.com");
        assert_string_equal(p.allow[1], "*.github.com");
        assert_int_equal(parse("{\"internet\":false}", &p, why), 0);
        assert_false(p.internet);
        /* the JSON form reads back to the same policy */
        assert_int_equal(parse("{\"internet\":true,\"allow\":[\"a.example\"]}", &p, why), 0);
        json_t *j = net_policy_json(&p);
        struct net_policy q;
        assert_int_equal(net_policy_parse(j, &q, why, sizeof(why)), 0);
        json_decref(j);
        assert_true(q.internet);
        assert_int_equal(q.nallow, 1);
        assert_string_equal(q.allow[0], "a.example");
}

static void test_refusals(void **state)
{
        refused("1", "network must be false, true or {");
        refused("{\"internet\":1}", "network.internet must be true or false");
        refused("{\"internet\":true,\"allow\":\"github.com\"}", "network.allow must be an array");
        refused("{\"internet\":true,\"proxy\":1}", "unknown field \"proxy\"");
        refused("{\"allow\":[\"github.com\"]}", "needs network.internet true");
        refused("{\"internet\":true,\"allow\":[\"github.*.com\"]}", "network.allow[0]");
        refused("{\"internet\":true,\"allow\":[\"a.com\",\"*github.com\"]}", "network.allow[1]");
        refused("{\"internet\":true,\"allow\":[\"*\"]}", "network.allow[0]");
        refused("{\"internet\":true,\"allow\":[\"*.com.\"]}", "network.allow[0]");
        refused("{\"internet\":true,\"allow\":[\"localhost\"]}", "network.allow[0]");
        refused("{\"internet\":true,\"allow\":[\"-a.com\"]}", "network.allow[0]");
        refused("{\"internet\":true,\"allow\":[\"a b.com\"]}", "network.allow[0]");
        refused("{\"internet\":true,\"allow\":[3]}", "network.allow[0]");
        char text[2048], label[70];
        memset(label, 'a', 64);
        label[64] = '\0';
        snprintf(text, sizeof(text), "{\"internet\":true,\"allow\":[\"%s.com\"]}", label);
        refused(text, "network.allow[0]"); /* a label of 64 */
        char longname[300] = "";
        for (int i = 0; i < 8; i++)
                strcat(longname, "abcdefghijklmnopqrstuvwxyzabcdef."); /* 8 x 33 = 264 */
        strcat(longname, "com");
        snprintf(text, sizeof(text), "{\"internet\":true,\"allow\":[\"%s\"]}", longname);
        refused(text, "network.allow[0]");
        int n = snprintf(text, sizeof(text), "{\"internet\":true,\"allow\":[");
        for (int i = 0; i < NET_ALLOW_MAX + 1; i++)
                n += snprintf(text + n, sizeof(text) - (size_t)n, "%s\"h%d.example\"", i ? "," : "", i);
        snprintf(text + n, sizeof(text) - (size_t)n, "]}");
        refused(text, "at most 64");
}

static void test_matching(void **state)
{
        struct net_policy p;
        char why[256];
        assert_int_equal(parse("{\"internet\":true,\"allow\":[\"github.com\",\"*.githubusercontent.com\"]}", &p, why),
                         0);
        assert_true(net_policy_allows(&p, "github.com"));
        assert_true(net_policy_allows(&p, "GITHUB.COM."));
        assert_false(net_policy_allows(&p, "api.github.com"));   /* not a wildcard */
        assert_false(net_policy_allows(&p, "evilgithub.com"));
        assert_false(net_policy_allows(&p, "github.com.evil.example"));
        assert_true(net_policy_allows(&p, "raw.githubusercontent.com"));
        assert_true(net_policy_allows(&p, "a.b.githubusercontent.com"));
        assert_false(net_policy_allows(&p, "githubusercontent.com")); /* the apex is not below itself */
        assert_false(net_policy_allows(&p, "xgithubusercontent.com"));
        assert_false(net_policy_allows(&p, "127.0.0.1"));
        assert_false(net_policy_allows(&p, ""));
        assert_int_equal(parse("true", &p, why), 0);
        assert_true(net_policy_allows(&p, "anything.example"));
        assert_int_equal(parse("false", &p, why), 0);
        assert_false(net_policy_allows(&p, "github.com"));
}

static bool pub(const char *text)
{
        struct sockaddr_storage ss = { 0 };
        struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        if (inet_pton(AF_INET, text, &a4->sin_addr) == 1)
                a4->sin_family = AF_INET;
        else if (inet_pton(AF_INET6, text, &a6->sin6_addr) == 1)
                a6->sin6_family = AF_INET6;
        else
                fail_msg("not an address: %s", text);
        return net_addr_public((struct sockaddr *)&ss);
}

static void test_addresses(void **state)
{
        static const char *const closed[] = {
                "0.0.0.0", "0.1.2.3", "10.0.0.1", "10.255.255.255", "100.64.0.1", "100.127.255.254", "127.0.0.1",
                "127.1.2.3", "169.254.169.254", "169.254.0.1", "172.16.0.1", "172.31.255.255", "192.168.1.1",
                "192.0.0.8", "198.18.0.1", "198.19.255.255", "224.0.0.1", "239.255.255.250", "240.0.0.1",
                "255.255.255.255", "::", "::1", "::127.0.0.1", "::ffff:127.0.0.1", "::ffff:10.1.2.3",
                "::ffff:169.254.169.254", "64:ff9b::a00:1", "64:ff9b::7f00:1", "2002:7f00:1::1", "2002:a9fe:a9fe::",
                "fc00::1", "fd12:3456::1", "fe80::1", "febf::1", "fec0::1", "ff02::1", "100::1",
        };
        static const char *const open_[] = {
                "1.1.1.1", "8.8.8.8", "100.63.255.255", "100.128.0.0", "172.15.255.255", "172.32.0.0",
                "192.167.255.255", "192.169.0.0", "169.253.255.255", "198.17.255.255", "198.20.0.0",
                "203.0.113.7", "198.51.100.2", "223.255.255.255", "2606:4700::1111", "::ffff:1.1.1.1",
                "64:ff9b::101:101", "2002:101:101::1", "2001:db8::1",
        };
        for (size_t i = 0; i < sizeof(closed) / sizeof(closed[0]); i++)
                if (pub(closed[i]))
                        fail_msg("%s must not be reachable from a sandbox", closed[i]);
        for (size_t i = 0; i < sizeof(open_) / sizeof(open_[0]); i++)
                if (!pub(open_[i]))
                        fail_msg("%s is a public address", open_[i]);
        struct sockaddr_un_like {
                sa_family_t f;
        } unix_ = { AF_UNIX };
        assert_false(net_addr_public((struct sockaddr *)&unix_));
}

static void test_same(void **state)
{
        struct sockaddr_in a = { .sin_family = AF_INET };
        struct sockaddr_in6 b = { .sin6_family = AF_INET6 };
        inet_pton(AF_INET, "203.0.113.1", &a.sin_addr);
        inet_pton(AF_INET6, "::ffff:203.0.113.1", &b.sin6_addr);
        assert_true(net_addr_same((struct sockaddr *)&a, (struct sockaddr *)&b));
        inet_pton(AF_INET6, "::ffff:203.0.113.2", &b.sin6_addr);
        assert_false(net_addr_same((struct sockaddr *)&a, (struct sockaddr *)&b));
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_forms),     cmocka_unit_test(test_refusals), cmocka_unit_test(test_matching),
                cmocka_unit_test(test_addresses), cmocka_unit_test(test_same),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}
