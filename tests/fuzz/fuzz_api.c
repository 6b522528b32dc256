/* fuzz_api.c — tally-api's request handling (api/router.c, dispatch.c, http.c: routing, query
 * strings, headers, cookies, JSON bodies, and every handler a request
 * reaches) on hostile bytes.
 *
 * The real server runs in this process (api_server_start on 127.0.0.1, any
 * port) over a real, migrated PostgreSQL database with an account and an API
 * key (Authorization: Bearer fuzz_key) so authenticated routes are reached.
 * Each input is sent as the raw bytes of an HTTP request on a fresh TCP
 * connection; the answer is read to the end. libmicrohttpd parses the
 * request line and headers, the server does the rest. Sandbox routes reach a
 * tally-vmm socket that does not exist (their vmm call fails).
 *
 * Needs TALLY_TEST_PG_URL and TALLY_MIGRATE_BIN (scripts/test and
 * scripts/fuzz provide both). Checked beyond "no crash, no sanitizer report":
 * every answer is an HTTP/1.x status line, a whole request without a body
 * gets one (test_http_answer_due: a connection closed without an answer is a
 * handler that refused to make one), and the server still answers
 * GET /healthz after each input. */
#include "log.h"
#include "server.h"
#include "support.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "fuzz_api: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static struct api_config cfg;
static struct api_server *srv;
static int port;
static char *db_url;
static char *api_url; /* db_url as tally_api, the role tally-api logs in as */

static void seed(void)
{
        char *migrate[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", db_url, NULL };
        char *err = NULL;
        if (test_run(migrate, NULL, &err) != 0)
                FAIL("tally-migrate: %s", err ? err : "");
        free(err);
        PGconn *c = PQconnectdb(db_url);
        PGresult *r = PQexec(c, "INSERT INTO accounts (id, name) VALUES ('acct_fuzz', 'fuzz');"
                                "INSERT INTO api_keys (id, account_id, key_hash) VALUES"
                                " ('key_fuzz', 'acct_fuzz', sha256('fuzz_key'))");
        if (PQresultStatus(r) != PGRES_COMMAND_OK)
                FAIL("seeding the database: %s", PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
}

static void stop(void)
{
        api_server_stop(srv);
        srv = NULL;
        if (db_url)
                test_db_drop(db_url);
        db_url = NULL;
        free(api_url);
        api_url = NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
        (void)argc, (void)argv;
        log_set_level(LOG_LEVEL_ERROR);
        db_url = test_db_create("fuzz_api");
        seed();
        api_url = test_role_url(db_url, "tally_api");
        cfg = (struct api_config){
                .database_url = api_url, .listen_address = "127.0.0.1", .port = 0,
                .vmm_sockets = "/nonexistent/tally-fuzz-vmm.sock", .threads = 2, .max_connections = 64,
                .per_ip_connections = 64, .connection_timeout_s = 5, .body_max_bytes = 65536, .db_pool_size = 2,
                .session_ttl_s = 3600, .cookie_secure = false, .rate_per_s = 1000000, .rate_burst = 1000000,
                .signin_max_failures = 1000, .signin_window_s = 1, .idempotency_wait_ms = 50, .workers = 4,
                .workers_per_key = 2, .workers_per_account = 3, .queue_per_account = 8, .queue_max = 32,
                .log_level = "error",
        };
        char err[512] = "";
        if (api_server_start(&cfg, &srv, err, sizeof(err)) < 0)
                FAIL("could not start the server: %s", err);
        port = api_server_port(srv);
        atexit(stop);
        return 0;
}

/* Sends req on a fresh connection, reads the answer to the end (at most cap
 * bytes kept) into out; returns its length, or -1 if the connection failed.
 * keep_open: the connection stays open both ways until the answer is in, as
 * an ordinary client's does (a client that half-closes while its request
 * waits for a worker may lose the answer: libmicrohttpd drops a suspended
 * connection whose client has closed its side). */
static ssize_t exchange(const void *req, size_t len, char *out, size_t cap, bool keep_open)
{
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
                if (fd >= 0)
                        close(fd);
                return -1;
        }
        return (ssize_t)test_http_exchange(fd, req, len, out, cap, 10, keep_open);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        if (!srv)
                LLVMFuzzerInitialize(NULL, NULL);
        static char out[1 << 16];
        /* A whole request without a body is sent as a client waiting for its answer does;
         * anything else half-closed, so that the server sees where the input ends. */
        bool whole = test_http_answer_due((const char *)data, size);
        ssize_t n = exchange(data, size, out, sizeof(out) - 1, whole);
        if (n < 0)
                FAIL("could not connect to the server");
        if (n == 0 && whole) {
                const char *eol = memchr(data, '\r', size);
                FAIL("a whole request without a body got no answer: %.*s", (int)(eol ? eol - (const char *)data : 0),
                     (const char *)data);
        }
        out[n] = '\0';
        if (n > 0 && strncmp(out, "HTTP/1.", 7) != 0)
                FAIL("an answer that is not HTTP: %.80s", out);
        static const char health[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        n = exchange(health, sizeof(health) - 1, out, sizeof(out) - 1, true);
        if (n < 12 || strncmp(out + 9, "200", 3) != 0) {
                out[n < 0 ? 0 : n] = '\0';
                FAIL("the server stopped answering /healthz: %.200s", out);
        }
        return 0;
}
