/* tally-api — the HTTP front door: agents' sandboxes, people's keys and
 * limits, usage and spend for dashboards (docs/api.md). */
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "server.h"

#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define C(field) offsetof(struct api_config, field)

static const struct setting settings[] = {
        SETTING_DATABASE_URL(struct api_config, database_url),
        { "listen_address", SETTING_STRING, "127.0.0.1", false, C(listen_address), 0, 0,
          "Address to listen on (IPv4 or IPv6)" },
        { "port", SETTING_INT, "8080", false, C(port), 0, 65535, "TCP port (0: any free port, logged at start)" },
        { "vmm_sockets", SETTING_STRING, "./var/vmm.sock", false, C(vmm_sockets), 0, 0,
          "tally-vmm daemons, comma-separated: a unix socket's path, or HOST_ID=https://ADDRESS:PORT (mutual TLS, "
          "the host's certificate named HOST_ID); creates go to each in turn" },
        { "vmm_tls_cert", SETTING_STRING, "", false, C(vmm_tls_cert), 0, 0,
          "tally-api's client certificate (PEM) for the https vmm_sockets entries" },
        { "vmm_tls_key", SETTING_STRING, "", false, C(vmm_tls_key), 0, 0, "The key of vmm_tls_cert (keep it 0600)" },
        { "vmm_tls_ca", SETTING_STRING, "", false, C(vmm_tls_ca), 0, 0,
          "The CA that signs the hosts' certificates: the only one trusted for https vmm_sockets entries" },
        { "vmm_calls_per_host", SETTING_INT, "8", false, C(vmm_calls_per_host), 1, 4096,
          "Calls tally-api runs at once on one tally-vmm (keep it below tally-vmm's api_connections_per_client); "
          "a call that finds none free within 0.5 s gets 503 host_busy, so a hung host holds at most this many "
          "workers" },
        { "vmm_registry", SETTING_BOOL, "true", false, C(vmm_registry), 0, 0,
          "Also reach every host the host registry lists with an https address (its certificate must name its host "
          "id, as for a vmm_sockets entry); false: vmm_sockets' hosts only" },
        { "vmm_create_timeout_s", SETTING_INT, "90", false, C(vmm_create_timeout_s), 1, 3600,
          "How long tally-api waits for a host to make a sandbox; a create not answered by then gets 504 and is "
          "cancelled on its host, which stops the sandbox if it makes it later" },
        { "threads", SETTING_INT, "8", false, C(threads), 1, 256,
          "HTTP threads (each polls its connections with epoll; none ever waits on a tally-vmm)" },
        { "workers", SETTING_INT, "16", false, C(workers), 2, 1024,
          "Threads that run sandbox requests (each holds a connection to a tally-vmm while it waits: keep it "
          "within tally-vmm's api_connections_per_client)" },
        { "workers_per_key", SETTING_INT, "4", false, C(workers_per_key), 1, 1024,
          "Sandbox requests one API key (or person) runs at once; more wait" },
        { "workers_per_account", SETTING_INT, "8", false, C(workers_per_account), 1, 1023,
          "Sandbox requests one account runs at once (below workers: no account holds them all)" },
        { "queue_per_account", SETTING_INT, "64", false, C(queue_per_account), 0, 100000,
          "Sandbox requests one account may have waiting; beyond, 429" },
        { "queue_max", SETTING_INT, "1024", false, C(queue_max), 0, 1000000,
          "Sandbox requests waiting in all; beyond, 429" },
        { "max_connections", SETTING_INT, "1024", false, C(max_connections), 1, 65536, "Open connections at most" },
        { "per_ip_connections", SETTING_INT, "256", false, C(per_ip_connections), 1, 65536,
          "Open connections from one address at most" },
        { "connection_timeout_s", SETTING_INT, "120", false, C(connection_timeout_s), 1, 86400,
          "Idle connection timeout, seconds (an exec may take longer: it is not idle)" },
        { "body_max_bytes", SETTING_INT, "1048576", false, C(body_max_bytes), 1, 67108864,
          "Largest request body; larger ones get 413" },
        { "db_pool_size", SETTING_INT, "8", false, C(db_pool_size), 1, 256, "PostgreSQL connections" },
        { "statement_timeout_ms", SETTING_INT, "10000", false, C(statement_timeout_ms), 0, 3600000,
          "A query running longer is cancelled and its request gets 503 (0: no bound): one caller's costly "
          "query cannot hold the pool" },
        { "session_ttl_s", SETTING_INT, "43200", false, C(session_ttl_s), 60, 31536000,
          "How long a person's session lasts" },
        { "cookie_secure", SETTING_BOOL, "true", false, C(cookie_secure), 0, 0,
          "Mark the session cookie Secure (only sent over HTTPS); false only for plain-HTTP development" },
        { "rate_per_s", SETTING_INT, "100", false, C(rate_per_s), 1, 1000000,
          "Requests a second one key or person may make, sustained..." },
        { "rate_burst", SETTING_INT, "200", false, C(rate_burst), 1, 1000000, "...and in a burst; beyond: 429" },
        { "signin_max_failures", SETTING_INT, "5", false, C(signin_max_failures), 1, 1000,
          "Failed sign-ins per email and per address..." },
        { "signin_window_s", SETTING_INT, "900", false, C(signin_window_s), 1, 86400,
          "...within this many seconds, beyond which sign-in gets 429" },
        { "idempotency_wait_ms", SETTING_INT, "10000", false, C(idempotency_wait_ms), 0, 600000,
          "How long a retry waits for the first request with its Idempotency-Key before 409" },
        SETTING_LOG_LEVEL(struct api_config, log_level),
        SETTINGS_END,
};

static const struct program_info program = {
        .name = "tally-api",
        .summary = "Serve tally's HTTP API: sandboxes for API keys, keys and limits for people, usage and spend.",
        .usage = "[options]",
        .details = "Runs until SIGINT or SIGTERM. Routes, authentication and errors: docs/api.md.",
};

int main(int argc, char **argv)
{
        struct api_config cfg = { 0 };
        int argi = argc;
        int r = config_main(&program, settings, &cfg, argc, argv, &argi);
        if (r >= 0)
                return r;
        if (argi < argc) {
                fprintf(stderr, "tally-api: unexpected argument \"%s\" (tally-api takes only options; see --help)\n",
                        argv[argi]);
                config_free(settings, &cfg);
                return 2;
        }
        /* Only this thread takes SIGINT and SIGTERM (in daemon_wait_stop, which
         * also trims the heap): the HTTP threads, started below, inherit the
         * mask that blocks them. */
        daemon_block_stop_signals();
        daemon_memory_setup();
        char err[512] = "";
        struct api_server *s = NULL;
        if ((r = api_server_start(&cfg, &s, err, sizeof(err))) < 0) {
                log_error("could not start", "error=\"%s\"", err);
                config_free(settings, &cfg);
                return 1;
        }
        log_info("listening", "address=%s port=%d threads=%lld vmm_sockets=%s", cfg.listen_address,
                 api_server_port(s), (long long)cfg.threads, cfg.vmm_sockets);
        daemon_wait_stop();
        log_info("stopping", NULL);
        api_server_stop(s);
        config_free(settings, &cfg);
        return 0;
}
