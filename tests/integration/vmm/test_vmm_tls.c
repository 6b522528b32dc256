/* Integration: tally-vmm's API over TCP with mutual TLS (issue 30), with a real
 * daemon on 127.0.0.1 (process backend, this machine's cgroups, the development
 * broker) and certificates made by scripts/ca in the test's folder:
 *   - tally-api's certificate gets /v1/status and runs a sandbox's life
 *     (create, exec, delete);
 *   - no client certificate, one from another CA, one from the right CA with
 *     another name, and plain HTTP are each refused before any answer;
 *   - the client refuses a daemon whose certificate names another host;
 *   - tally-api's vmm_hosts, given "HOST_ID=https://127.0.0.1:PORT", reaches
 *     the daemon; tally-api refuses to start with an https entry and no TLS
 *     settings, and tally-vmm with tls_listen and no certificate.
 * Ground truth: HTTP statuses and answers the test reads itself with libcurl. */
#include "support.h"
#include "vmmtest.h"
#include "vmm_hosts.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define HOST_ID "test-tls-host"

static char parent[64];
static char account[64];
static char base[64];
static char *state, *sock, *log_path, *ca, *other_ca;
static pid_t daemon_pid = -1;
static int port, cgroup_version;

static void cleanup(void)
{
        test_stop_process(&daemon_pid, SIGKILL);
        if (*parent) {
                test_cgroup_remove(parent, cgroup_version);
                *parent = '\0';
        }
        while (waitpid(-1, NULL, WNOHANG) > 0)
                ;
        if (*base) {
                char *l = log_path ? test_read_file(log_path) : NULL;
                if (l && test_failures)
                        fprintf(stderr, "---- tally-vmm's log ----\n%s\n", l);
                free(l);
                test_remove_tree(base);
                *base = '\0';
        }
}

struct answer {
        char *data;
        size_t len;
};

static size_t on_data(char *p, size_t size, size_t n, void *ud)
{
        struct answer *b = ud;
        char *d = realloc(b->data, b->len + size * n + 1);
        if (!d)
                return 0;
        memcpy(d + b->len, p, size * n);
        b->len += size * n;
        d[b->len] = '\0';
        b->data = d;
        return size * n;
}

/* The client's side of one request to the TLS port. */
struct tls_client {
        const char *cert_dir;   /* NULL: no client certificate */
        const char *cert_name;  /* NAME of cert_dir/NAME.crt */
        const char *server_name; /* the name the daemon's certificate must carry */
        bool plain;             /* plain HTTP instead */
};

/* One request; returns the HTTP status (0: no answer) with the answer's JSON
 * in *ret (may be NULL) and libcurl's result in *ret_cr. */
static long call(const struct tls_client *tc, const char *method, const char *path, const char *body, json_t **ret,
                 CURLcode *ret_cr)
{
        CURL *c = curl_easy_init();
        struct answer b = { 0 };
        char url[256], cert[600], key[600], cafile[600], to[128];
        struct curl_slist *connect_to = NULL, *headers = curl_slist_append(NULL, "Content-Type: application/json");
        if (tc->plain) {
                snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
        } else {
                snprintf(url, sizeof(url), "https://%s:%d%s", tc->server_name, port, path);
                snprintf(to, sizeof(to), "%s:%d:127.0.0.1:%d", tc->server_name, port, port);
                connect_to = curl_slist_append(NULL, to);
                curl_easy_setopt(c, CURLOPT_CONNECT_TO, connect_to);
                snprintf(cafile, sizeof(cafile), "%s/ca.crt", ca);
                curl_easy_setopt(c, CURLOPT_CAINFO, cafile);
                curl_easy_setopt(c, CURLOPT_CAPATH, NULL);
                if (tc->cert_dir) {
                        snprintf(cert, sizeof(cert), "%s/%s.crt", tc->cert_dir, tc->cert_name);
                        snprintf(key, sizeof(key), "%s/%s.key", tc->cert_dir, tc->cert_name);
                        curl_easy_setopt(c, CURLOPT_SSLCERT, cert);
                        curl_easy_setopt(c, CURLOPT_SSLKEY, key);
                }
        }
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_PROXY, "");
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
        if (body)
                curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 30000L);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        CURLcode cr = curl_easy_perform(c);
        long status = 0;
        if (cr == CURLE_OK)
                curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (ret)
                *ret = b.data ? json_loadb(b.data, b.len, JSON_ALLOW_NUL, NULL) : NULL;
        if (ret_cr)
                *ret_cr = cr;
        free(b.data);
        curl_slist_free_all(connect_to);
        curl_slist_free_all(headers);
        curl_easy_cleanup(c);
        return status;
}

static const struct tls_client tally_api = { .cert_name = "tally-api", .server_name = HOST_ID };

static void test_status(void)
{
        struct tls_client tc = tally_api;
        tc.cert_dir = ca;
        json_t *j = NULL;
        CURLcode cr;
        long st = call(&tc, "GET", "/v1/status", NULL, &j, &cr);
        CHECK(st == 200, "GET /v1/status with tally-api's certificate: %ld (%s)", st, curl_easy_strerror(cr));
        CHECK(strcmp(test_jstr(j, "host"), HOST_ID) == 0, "status names host %s", test_jstr(j, "host"));
        json_decref(j);
}

static void test_lifecycle(void)
{
        struct tls_client tc = tally_api;
        tc.cert_dir = ca;
        char body[256];
        snprintf(body, sizeof(body), "{\"account\": \"%s\", \"key\": \"key-tls\", \"memory_mib\": 64, \"timeout_s\": 120}",
                 account);
        json_t *j = NULL;
        long st = call(&tc, "POST", "/v1/sandboxes", body, &j, NULL);
        CHECK(st == 201 && *test_jstr(j, "id"), "create over TLS: %ld %s", st, j ? json_dumps(j, 0) : "");
        char id[128], path[256];
        snprintf(id, sizeof(id), "%s", test_jstr(j, "id"));
        json_decref(j);
        if (!*id)
                return;
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", id);
        st = call(&tc, "POST", path, "{\"command\": [\"echo\", \"over tls\"]}", &j, NULL);
        CHECK(st == 200 && strcmp(test_jstr(j, "stdout"), "over tls\n") == 0 &&
                      json_integer_value(json_object_get(j, "exit_code")) == 0,
              "exec over TLS: %ld %s", st, j ? json_dumps(j, 0) : "");
        json_decref(j);
        snprintf(path, sizeof(path), "/v1/sandboxes/%s", id);
        st = call(&tc, "DELETE", path, NULL, &j, NULL);
        CHECK(st == 200 && strcmp(test_jstr(j, "state"), "stopped") == 0, "delete over TLS: %ld %s", st,
              j ? json_dumps(j, 0) : "");
        json_decref(j);
}

/* A refused client gets no HTTP answer at all: not a status, not a byte of
 * JSON. Each refusal is also one that the status check above would pass but
 * for the certificate. */
static void expect_refused(const char *what, const struct tls_client *tc)
{
        json_t *j = NULL;
        CURLcode cr;
        long st = call(tc, "GET", "/v1/status", NULL, &j, &cr);
        CHECK(st == 0 && !j && cr != CURLE_OK, "%s: answered %ld %s (want: refused)", what, st,
              j ? json_dumps(j, 0) : "");
        if (st == 0)
                fprintf(stderr, "     %s: refused (%s)\n", what, curl_easy_strerror(cr));
        json_decref(j);
        /* The same for a create: nothing is made for a refused client. */
        st = call(tc, "POST", "/v1/sandboxes", "{\"account\": \"refused\", \"key\": \"k\"}", &j, &cr);
        CHECK(st == 0 && !j, "%s: a create was answered %ld", what, st);
        json_decref(j);
}

static void test_no_client_cert(void)
{
        struct tls_client tc = tally_api; /* cert_dir NULL */
        expect_refused("no client certificate", &tc);
}

static void test_other_ca(void)
{
        struct tls_client tc = tally_api;
        tc.cert_dir = other_ca; /* tally-api, signed by another CA */
        expect_refused("tally-api's name from another CA", &tc);
}

static void test_other_name(void)
{
        struct tls_client tc = tally_api;
        tc.cert_dir = ca;
        tc.cert_name = "intruder"; /* the right CA, another name */
        expect_refused("the right CA, name intruder", &tc);
        tc.cert_name = HOST_ID; /* a host's own certificate is no client of another host */
        expect_refused("the right CA, a host's certificate", &tc);
}

static void test_plain_http(void)
{
        struct tls_client tc = { .plain = true };
        expect_refused("plain HTTP", &tc);
}

/* The client's side: a daemon whose certificate names another host is not
 * spoken to (libcurl's name check, as vmm/client.c uses it). */
static void test_server_name(void)
{
        struct tls_client tc = tally_api;
        tc.cert_dir = ca;
        tc.server_name = "another-host";
        CURLcode cr;
        long st = call(&tc, "GET", "/v1/status", NULL, NULL, &cr);
        CHECK(st == 0 && cr == CURLE_PEER_FAILED_VERIFICATION,
              "a client expecting another-host got %ld (%s), want a failed name check", st, curl_easy_strerror(cr));
}

/* tally-api's own code path: vmm_hosts from a vmm_sockets entry. */
static void test_api_hosts(void)
{
        char entry[128], cert[600], key[600], cafile[600], err[512] = "";
        snprintf(entry, sizeof(entry), "%s=https://127.0.0.1:%d", HOST_ID, port);
        snprintf(cert, sizeof(cert), "%s/tally-api.crt", ca);
        snprintf(key, sizeof(key), "%s/tally-api.key", ca);
        snprintf(cafile, sizeof(cafile), "%s/ca.crt", ca);
        struct vmm_hosts_tls tls = { cert, key, cafile };
        struct vmm_hosts *h = NULL;
        char list[800];
        snprintf(list, sizeof(list), "%s,%s", sock, entry); /* a plain socket beside it still works */
        int r = vmm_hosts_new(list, &tls, &h, err, sizeof(err));
        CHECK(r == 0 && h && vmm_hosts_count(h) == 2, "vmm_hosts_new(%s): %d %s", list, r, err);
        for (int i = 0; h && i < vmm_hosts_count(h); i++) {
                json_t *j = NULL;
                long st = vmm_hosts_call(h, i, "GET", "/v1/status", NULL, VMM_CALL_SHORT_MS, &j);
                CHECK(st == 200 && strcmp(test_jstr(j, "host"), HOST_ID) == 0, "host %d: GET /v1/status: %ld", i,
                      st);
                json_decref(j);
        }
        vmm_hosts_free(h);
        /* The host's name is checked: the same address under another host id is not reached. */
        snprintf(entry, sizeof(entry), "another-host=https://127.0.0.1:%d", port);
        h = NULL;
        r = vmm_hosts_new(entry, &tls, &h, err, sizeof(err));
        CHECK(r == 0, "vmm_hosts_new(%s): %s", entry, err);
        if (h) {
                json_t *j = NULL;
                long st = vmm_hosts_call(h, 0, "GET", "/v1/status", NULL, VMM_CALL_SHORT_MS, &j);
                CHECK(st < 0, "another-host=... reached a host named %s: %ld", HOST_ID, st);
                json_decref(j);
        }
        vmm_hosts_free(h);
        /* An https entry without the TLS settings is refused. */
        struct vmm_hosts_tls none = { 0 };
        h = NULL;
        r = vmm_hosts_new(entry, &none, &h, err, sizeof(err));
        CHECK(r == -EINVAL && !h && strstr(err, "vmm_tls_cert"), "an https entry without TLS settings: %d %s", r,
              err);
        snprintf(entry, sizeof(entry), "https://127.0.0.1:%d", port);
        r = vmm_hosts_new(entry, &tls, &h, err, sizeof(err));
        CHECK(r == -EINVAL && !h, "an https entry without HOST_ID: %d", r);
}

/* tally-api and tally-vmm refuse to start without what TLS needs. */
/* Anyone who can reach the TLS port can open connections and never finish a
 * handshake. One address holds at most api_connections_per_client (16) of
 * them (the rest are closed at once), and tally-api, from another address,
 * is still answered at once. The flood comes from 127.0.0.2, tally-api from
 * 127.0.0.1. */
static void test_handshake_flood(void)
{
        enum { FLOOD = 40, PER_ADDRESS = 16 };
        int fds[FLOOD], opened = 0;
        struct sockaddr_in from = { .sin_family = AF_INET }, to = { .sin_family = AF_INET, .sin_port = htons(port) };
        inet_pton(AF_INET, "127.0.0.2", &from.sin_addr);
        inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
        for (int i = 0; i < FLOOD; i++) {
                fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                if (fds[i] >= 0 && (bind(fds[i], (struct sockaddr *)&from, sizeof(from)) < 0 ||
                                    connect(fds[i], (struct sockaddr *)&to, sizeof(to)) < 0)) {
                        close(fds[i]);
                        fds[i] = -1;
                }
                opened += fds[i] >= 0;
        }
        test_sleep_ms(500);
        int held = 0;
        for (int i = 0; i < FLOOD; i++) {
                char b;
                if (fds[i] >= 0 && recv(fds[i], &b, 1, MSG_DONTWAIT) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                        held++;
        }
        struct tls_client tc = tally_api;
        tc.cert_dir = ca;
        int64_t t0 = test_now_ms();
        long st = call(&tc, "GET", "/v1/status", NULL, NULL, NULL);
        long took = (long)(test_now_ms() - t0);
        fprintf(stderr, "handshake_flood: %d connections opened from 127.0.0.2, %d held open; tally-api's status "
                        "%ld in %ld ms\n", opened, held, st, took);
        CHECK(opened == FLOOD, "only %d of %d connections could be opened", opened, FLOOD);
        CHECK(held <= PER_ADDRESS, "one address holds %d connections without a handshake (at most %d)", held,
              PER_ADDRESS);
        CHECK(st == 200 && took < 2000, "tally-api's status during the flood: %ld in %ld ms", st, took);
        for (int i = 0; i < FLOOD; i++)
                if (fds[i] >= 0)
                        close(fds[i]);
}

static void test_start_refused(void)
{
        char entry[128], *err = NULL;
        snprintf(entry, sizeof(entry), "%s=https://127.0.0.1:%d", HOST_ID, port);
        char *api[] = { (char *)test_env("TALLY_API_BIN"), "--database-url", "postgresql://nobody@127.0.0.1:1/none",
                        "--port", "0", "--vmm-sockets", entry, NULL };
        int rc = test_run(api, NULL, &err);
        CHECK(rc != 0 && err && strstr(err, "vmm_tls_cert"), "tally-api with an https entry and no TLS settings: "
                                                             "rc=%d %s", rc, err ? err : "");
        free(err);
        err = NULL;
        char listen[64], cert[600], missing[600];
        snprintf(listen, sizeof(listen), "127.0.0.1:%d", test_free_port());
        snprintf(cert, sizeof(cert), "%s/%s.crt", ca, HOST_ID);
        snprintf(missing, sizeof(missing), "%s/no-such.key", ca);
        char *vmm[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state, "--socket", "/nonexistent/x.sock",
                        "--kafka-brokers", "127.0.0.1:1", "--tls-listen", listen, "--tls-cert", cert, NULL };
        rc = test_run(vmm, NULL, &err);
        CHECK(rc == 2 && err && strstr(err, "tls_client_ca"), "tally-vmm with tls_listen and no key or CA: rc=%d %s",
              rc, err ? err : "");
        free(err);
        err = NULL;
        char *vmm2[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state, "--socket", "/nonexistent/x.sock",
                         "--kafka-brokers", "127.0.0.1:1", "--tls-listen", listen, "--tls-cert", cert, "--tls-key",
                         missing, "--tls-client-ca", cert, NULL };
        rc = test_run(vmm2, NULL, &err);
        CHECK(rc == 2 && err && strstr(err, "no-such.key"), "tally-vmm with an unreadable key: rc=%d %s", rc,
              err ? err : "");
        free(err);
}

int main(void)
{
        snprintf(parent, sizeof(parent), "tally-test-vmmtls-%d", (int)getpid());
        snprintf(account, sizeof(account), "acct-vmmtls-%d", (int)getpid());
        snprintf(base, sizeof(base), "/tmp/tally-vmmtls-XXXXXX");
        if (!mkdtemp(base) || chmod(base, 0755) < 0)
                return 1;
        if (asprintf(&state, "%s/state", base) < 0 || asprintf(&sock, "%s/vmm.sock", base) < 0 ||
            asprintf(&log_path, "%s/vmm.log", base) < 0 || asprintf(&ca, "%s/ca", base) < 0 ||
            asprintf(&other_ca, "%s/other-ca", base) < 0)
                return 1;
        test_cleanup_at_exit(cleanup);
        curl_global_init(CURL_GLOBAL_DEFAULT);
        test_ca("init", ca, NULL);
        test_ca("issue", ca, HOST_ID);
        test_ca("issue", ca, "tally-api");
        test_ca("issue", ca, "intruder");
        test_ca("init", other_ca, NULL);
        test_ca("issue", other_ca, "tally-api");
        port = test_free_port();
        char listen[64], cert[600], key[600], client_ca[600];
        snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
        snprintf(cert, sizeof(cert), "%s/%s.crt", ca, HOST_ID);
        snprintf(key, sizeof(key), "%s/%s.key", ca, HOST_ID);
        snprintf(client_ca, sizeof(client_ca), "%s/ca.crt", ca);
        char *argv[] = { (char *)test_env("TALLY_VMM_BIN"), "--state-dir", state, "--socket", sock,
                         "--kafka-brokers", (char *)test_env("TALLY_TEST_BROKERS"), "--cgroup-parent", parent,
                         "--host-id", HOST_ID, "--backend", "process", "--final-wait-ms", "1000",
                         "--tls-listen", listen, "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", client_ca,
                         "--log-level", "debug", NULL };
        daemon_pid = test_spawn(argv, NULL, log_path);
        if (test_vmm_wait_ready(sock, 20000, &cgroup_version) < 0) {
                fprintf(stderr, "FAIL: tally-vmm did not become ready in 20 s\n");
                test_failures++;
                return test_result();
        }
        const struct test_case cases[] = {
                { "status", test_status },
                { "lifecycle", test_lifecycle },
                { "no_client_cert", test_no_client_cert },
                { "other_ca", test_other_ca },
                { "other_name", test_other_name },
                { "plain_http", test_plain_http },
                { "server_name", test_server_name },
                { "api_hosts", test_api_hosts },
                { "handshake_flood", test_handshake_flood },
                { "start_refused", test_start_refused },
        };
        TEST_RUN_CASES(cases);
        /* The daemon is still there to serve tally-api after all the refusals. */
        struct tls_client tc = tally_api;
        tc.cert_dir = ca;
        CHECK(call(&tc, "GET", "/v1/status", NULL, NULL, NULL) == 200, "status after the refusals");
        char *l = test_read_file(log_path);
        CHECK(l && strstr(l, "refusing a TLS client"), "the daemon logged no refusal");
        free(l);
        test_stop_process(&daemon_pid, SIGTERM);
        curl_global_cleanup();
        return test_result();
}
