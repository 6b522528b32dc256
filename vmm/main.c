/* tally-vmm — the host's sandbox launcher: a daemon (no command) and the
 * command line client of that daemon (a command). */
#include "api.h"
#include "cli.h"
#include "config.h"
#include "daemon.h"
#include "host_registry.h"
#include "log.h"
#include "metrics_http.h"
#include "spend_limits.h"
#include "timeutil.h"
#include "vmm.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct vmm_config {
        char *socket;
        char *state_dir;
        char *host_id;
        char *backend;
        char *cgroup_mount;
        char *cgroup_parent;
        char *kafka_brokers;
        struct kafka_client_settings kafka;
        char *limits_database_url;
        char *blocked_key_query;
        char *host_registry_database_url;
        char *host_registry_address;
        int64_t timeout_max_s;
        int64_t final_wait_ms;
        int64_t exec_timeout_ms;
        int64_t exec_output_cap;
        int64_t exec_output_held_max;
        int64_t api_idle_timeout_s;
        int64_t api_connections_max;
        int64_t api_connections_per_client;
        char *tls_listen;
        char *tls_cert;
        char *tls_key;
        char *tls_client_ca;
        char *tls_client_name;
        struct capacity_settings capacity;
        char *egress_hosts_file;
        int64_t egress_connections_max;
        int64_t egress_connect_timeout_ms;
        int64_t egress_idle_timeout_s;
        int64_t metrics_port;
        char *metrics_address;
        char *log_level;
};

/* A stop completes within this, whatever is in flight (a request stuck in a
 * backend call that does not return is left to the exit). */
#define SHUTDOWN_MS          4500
/* ... of which requests being answered get this to finish. */
#define SHUTDOWN_REQUESTS_MS 3000
/* ... and the host registry's heartbeat this to end its beat (it marks nothing). */
#define SHUTDOWN_REGISTRY_MS 500


static const struct setting settings[] = {
        { "socket", SETTING_STRING, "", false, offsetof(struct vmm_config, socket), 0, 0,
          "Unix socket of the local API (default: STATE_DIR/vmm.sock)" },
        SETTING_STATE_DIR(struct vmm_config, state_dir),
        { "host_id", SETTING_STRING, "", false, offsetof(struct vmm_config, host_id), 0, 0,
          "This host's id in events and records (default: the host name)" },
        { "backend", SETTING_STRING, "auto", false, offsetof(struct vmm_config, backend), 0, 0,
          "Default backend: auto (qemu with KVM when built, else process), process or qemu" },
        { "cgroup_mount", SETTING_STRING, "", false, offsetof(struct vmm_config, cgroup_mount), 0, 0,
          "Where the cgroup file systems are mounted (default /sys/fs/cgroup)" },
        { "cgroup_parent", SETTING_STRING, "tally", false, offsetof(struct vmm_config, cgroup_parent), 0, 0,
          "Parent cgroup of the sandboxes' cgroups, relative to each hierarchy's root" },
        { "kafka_brokers", SETTING_STRING, "", false, offsetof(struct vmm_config, kafka_brokers), 0, 0,
          "Kafka bootstrap servers, host:port[,...] (required by the daemon, not by the client commands)" },
        SETTING_KAFKA_CLIENT(struct vmm_config, kafka),
        { "limits_database_url", SETTING_STRING, "", false, offsetof(struct vmm_config, limits_database_url), 0, 0,
          "PostgreSQL URL to check that a key is not blocked before creating (empty: no check)" },
        { "blocked_key_query", SETTING_STRING, SPEND_LIMITS_DEFAULT_QUERY, false,
          offsetof(struct vmm_config, blocked_key_query), 0, 0,
          "Query run with $1 account and $2 key: any row means blocked for today" },
        { "host_registry_database_url", SETTING_STRING, "", false,
          offsetof(struct vmm_config, host_registry_database_url), 0, 0,
          "PostgreSQL URL of the host registry this host beats into every 5 s: its address, capacity and what it "
          "has promised (empty: off)" },
        { "host_registry_address", SETTING_STRING, "", false, offsetof(struct vmm_config, host_registry_address), 0,
          0, "What tally-api dials to reach this host, as the registry records it (default: https://TLS_LISTEN when "
          "tls_listen names an address)" },
        { "timeout_max_s", SETTING_INT, "3600", false, offsetof(struct vmm_config, timeout_max_s), 1, 31536000,
          "Longest lease one create or extension may ask for, seconds" },
        { "final_wait_ms", SETTING_INT, "30000", false, offsetof(struct vmm_config, final_wait_ms), 0, 86400000,
          "How long a stopped sandbox's cgroup waits for the collector's final sample" },
        { "exec_timeout_ms", SETTING_INT, "60000", false, offsetof(struct vmm_config, exec_timeout_ms), 1, 86400000,
          "Default timeout of a command run with exec" },
        { "exec_output_cap", SETTING_INT, "65536", false, offsetof(struct vmm_config, exec_output_cap), 0,
          VMM_EXEC_OUTPUT_CAP_MAX, "Default bytes of stdout and of stderr an exec returns (at most 16 MiB)" },
        { "exec_output_held_max", SETTING_INT, "268435456", false, offsetof(struct vmm_config, exec_output_held_max),
          2 * VMM_EXEC_OUTPUT_CAP_MAX, INT64_C(1) << 40,
          "Bytes of commands' output held at once by all execs (each reserves twice its output cap)" },
        { "api_idle_timeout_s", SETTING_INT, "10", false, offsetof(struct vmm_config, api_idle_timeout_s), 1, 3600,
          "Seconds after which an idle connection to the local API is closed" },
        { "api_connections_max", SETTING_INT, "256", false, offsetof(struct vmm_config, api_connections_max), 4, 4096,
          "Connections to the local API open at once" },
        { "api_connections_per_client", SETTING_INT, "16", false,
          offsetof(struct vmm_config, api_connections_per_client), 1, 4096,
          "Connections one client (a root process, or any other user id) may hold open" },
        { "tls_listen", SETTING_STRING, "", false, offsetof(struct vmm_config, tls_listen), 0, 0,
          "Also serve the API over TCP with mutual TLS on ADDRESS:PORT ([IPV6]:PORT) for tally-api (empty: off)" },
        { "tls_cert", SETTING_STRING, "", false, offsetof(struct vmm_config, tls_cert), 0, 0,
          "PEM certificate (chain) of the TLS listener, named by this host's host_id" },
        { "tls_key", SETTING_STRING, "", false, offsetof(struct vmm_config, tls_key), 0, 0,
          "PEM private key of tls_cert (keep it 0600)" },
        { "tls_client_ca", SETTING_STRING, "", false, offsetof(struct vmm_config, tls_client_ca), 0, 0,
          "PEM certificate of the CA that signs the TLS clients' certificates" },
        { "tls_client_name", SETTING_STRING, "tally-api", false, offsetof(struct vmm_config, tls_client_name), 0, 0,
          "The name (subjectAltName DNS) a TLS client's certificate must carry; any other is refused" },
        { "capacity_memory_mib", SETTING_INT, "0", false, offsetof(struct vmm_config, capacity.memory_mib), 0,
          INT64_C(1) << 40, "Memory this host gives sandboxes, MiB (0: the host's MemTotal)" },
        { "capacity_vcpus", SETTING_INT, "0", false, offsetof(struct vmm_config, capacity.vcpus), 0, 1 << 20,
          "vCPUs this host gives sandboxes (0: its online CPUs)" },
        { "capacity_disk_mib", SETTING_INT, "0", false, offsetof(struct vmm_config, capacity.disk_mib), 0,
          INT64_C(1) << 40, "Disk this host gives sandboxes, MiB (0: the free space under state_dir at start)" },
        { "memory_overcommit_percent", SETTING_INT, "100", false,
          offsetof(struct vmm_config, capacity.memory_overcommit_pct), 1, 10000,
          "Memory the live sandboxes (running and paused) may be promised, percent of capacity_memory_mib" },
        { "vcpu_overcommit_percent", SETTING_INT, "1600", false,
          offsetof(struct vmm_config, capacity.vcpu_overcommit_pct), 1, 10000,
          "vCPUs the running sandboxes may be promised, percent of capacity_vcpus (billed by use, capped by quota)" },
        { "disk_overcommit_percent", SETTING_INT, "100", false,
          offsetof(struct vmm_config, capacity.disk_overcommit_pct), 1, 10000,
          "Disk the live sandboxes (running and paused) may be promised, percent of capacity_disk_mib" },
        { "egress_hosts_file", SETTING_STRING, "", false, offsetof(struct vmm_config, egress_hosts_file), 0, 0,
          "For tests and pinned services: a file of \"address name...\" lines the egress proxy consults before "
          "DNS (an answer that is loopback, private, link-local or this host's own is refused all the same)" },
        { "egress_connections_max", SETTING_INT, "64", false, offsetof(struct vmm_config, egress_connections_max), 1,
          4096, "Connections one sandbox with internet may have open through the egress proxy at once" },
        { "egress_connect_timeout_ms", SETTING_INT, "10000", false,
          offsetof(struct vmm_config, egress_connect_timeout_ms), 100, 600000,
          "How long the egress proxy waits for an outside server to accept a connection" },
        { "egress_idle_timeout_s", SETTING_INT, "600", false, offsetof(struct vmm_config, egress_idle_timeout_s), 1,
          86400, "A connection through the egress proxy with no byte either way this long is closed" },
        { "metrics_port", SETTING_INT, "0", false, offsetof(struct vmm_config, metrics_port), 0, 65535,
          "Serve Prometheus /metrics on this port (0: off)" },
        { "metrics_address", SETTING_STRING, "127.0.0.1", false, offsetof(struct vmm_config, metrics_address), 0, 0,
          "IPv4 address /metrics listens on" },
        SETTING_LOG_LEVEL(struct vmm_config, log_level),
        SETTINGS_END,
};

static const struct program_info program = {
        .name = "tally-vmm",
        .summary = "Launches this host's sandboxes, one cgroup each, publishes their lifecycle events and\n"
                   "carries out the control topic's pause and stop commands.",
        .usage = "[options] [COMMAND [ARGS...]]",
        .details =
                "Without a command it runs the daemon. A command talks to a running daemon over --socket:\n"
                "  create --account ID --key ID [--vcpus N] [--memory-mib N] [--disk-mib N] [--label K=V]...\n"
                "         [--timeout S] [--network] [--allow NAME]... [--backend B] [--image NAME] [--pids-max N]\n"
                "         [-- COMMAND...]\n"
                "  ls [--account ID]          show ID          status\n"
                "  exec ID [--timeout-ms N] [--output-cap N] [--stdin TEXT] -- COMMAND...\n"
                "                             (prints the command's output, exits with its status; 124 on timeout)\n"
                "  pause ID | resume ID | stop ID | fork ID [--count N] | timeout ID SECONDS",
};


/* The most a certificate, key or CA file may hold. */
#define PEM_MAX (1024 * 1024)

/* The whole of the PEM file at path, NUL-terminated, in *ret (free it).
 * Returns 0, or -errno with err filled (naming the setting). */
static int read_pem(const char *setting, const char *path, char **ret, char *err, size_t errlen)
{
        FILE *f = fopen(path, "re");
        char *buf = f ? malloc(PEM_MAX + 1) : NULL;
        size_t n = buf ? fread(buf, 1, PEM_MAX + 1, f) : 0;
        int r = 0;
        if (!f || !buf || ferror(f)) {
                r = errno ? -errno : -EIO;
                snprintf(err, errlen, "could not read %s %s: %s", setting, path, strerror(-r));
        } else if (n == 0 || n > PEM_MAX) {
                r = -EINVAL;
                snprintf(err, errlen, "%s %s is %s", setting, path, n ? "larger than 1 MiB" : "empty");
        }
        if (f)
                fclose(f);
        if (r < 0) {
                free(buf);
                return r;
        }
        buf[n] = '\0';
        *ret = buf;
        return 0;
}

/* The heartbeat's figures (host_registry.h): the vmm's. */
static void registry_sample(void *arg, struct host_registry_report *ret)
{
        vmm_capacity_report(arg, &ret->capacity, &ret->promised, &ret->live);
}

/* The last resort of a stop: whatever is still running at the deadline is left. */
static void *shutdown_watchdog(void *arg)
{
        int64_t deadline = *(const int64_t *)arg;
        for (int64_t now; (now = time_mono_ns()) < deadline;)
                time_sleep_ns(deadline - now);
        log_error("could not stop cleanly in time; exiting now (sandboxes keep running)", "waited_ms=%d",
                  SHUTDOWN_MS);
        _exit(0);
        return NULL;
}

int main(int argc, char **argv)
{
        struct vmm_config cfg = { 0 };
        int argi, r = config_main(&program, settings, &cfg, argc, argv, &argi);
        if (r >= 0)
                return r;
        int status = 1;
        char socket_path[4096], host[256] = "";
        if (*cfg.socket)
                snprintf(socket_path, sizeof(socket_path), "%s", cfg.socket);
        else
                snprintf(socket_path, sizeof(socket_path), "%s/vmm.sock", cfg.state_dir);
        curl_global_init(CURL_GLOBAL_DEFAULT);
        if (argi < argc && strcmp(argv[argi], "serve") != 0) {
                if (!vmm_cli_is_command(argv[argi])) {
                        fprintf(stderr, "tally-vmm: unknown command \"%s\" (try --help)\n", argv[argi]);
                        status = 2;
                } else {
                        status = vmm_cli(socket_path, argc - argi, argv + argi);
                }
                goto out;
        }
        if (!*cfg.kafka_brokers) {
                fprintf(stderr, "tally-vmm: missing required setting kafka_brokers (set kafka_brokers in the config "
                                "file, TALLY_KAFKA_BROKERS, or --kafka_brokers)\n");
                status = 2;
                goto out;
        }
        char kerr[512];
        if (kafka_client_settings_check(&cfg.kafka, kerr, sizeof(kerr)) < 0) {
                fprintf(stderr, "tally-vmm: invalid value for kafka_settings: %s\n", kerr);
                status = 2;
                goto out;
        }
        /* The TLS listener's files are read before anything starts: a missing or
         * unreadable one refuses the start with its reason. */
        char *tls_cert = NULL, *tls_key = NULL, *tls_client_ca = NULL;
        if (*cfg.tls_listen) {
                char terr[1024];
                if (!*cfg.tls_cert || !*cfg.tls_key || !*cfg.tls_client_ca) {
                        fprintf(stderr, "tally-vmm: tls_listen is set: tls_cert, tls_key and tls_client_ca are "
                                        "required too\n");
                        status = 2;
                        goto out;
                }
                if (read_pem("tls_cert", cfg.tls_cert, &tls_cert, terr, sizeof(terr)) < 0 ||
                    read_pem("tls_key", cfg.tls_key, &tls_key, terr, sizeof(terr)) < 0 ||
                    read_pem("tls_client_ca", cfg.tls_client_ca, &tls_client_ca, terr, sizeof(terr)) < 0) {
                        fprintf(stderr, "tally-vmm: %s\n", terr);
                        status = 2;
                        goto out_tls;
                }
        }
        if (*cfg.host_id)
                snprintf(host, sizeof(host), "%s", cfg.host_id);
        else if (gethostname(host, sizeof(host) - 1) < 0)
                snprintf(host, sizeof(host), "localhost");
        struct vmm_settings s = {
                .state_dir = cfg.state_dir, .host_id = host, .backend = cfg.backend,
                .cgroup_mount = cfg.cgroup_mount, .cgroup_parent = cfg.cgroup_parent,
                .kafka_brokers = cfg.kafka_brokers, .kafka = &cfg.kafka, .limits_database_url = cfg.limits_database_url,
                .blocked_key_query = cfg.blocked_key_query, .timeout_max_s = cfg.timeout_max_s,
                .final_wait_ms = cfg.final_wait_ms, .exec_timeout_default_ms = cfg.exec_timeout_ms,
                .exec_output_cap_default = cfg.exec_output_cap, .capacity = cfg.capacity,
                .egress = { .hosts_file = cfg.egress_hosts_file, .connections_max = cfg.egress_connections_max,
                            .connect_timeout_ms = cfg.egress_connect_timeout_ms,
                            .idle_timeout_ms = cfg.egress_idle_timeout_s * 1000 },
        };
        /* Before any thread starts, so each inherits it: SIGINT and SIGTERM reach only daemon_wait_stop. */
        daemon_block_stop_signals();
        daemon_memory_setup(); /* daemon_wait_stop, below, trims the heap while it waits */
        char err[1024];
        struct vmm *v = NULL;
        struct vmm_api *api = NULL;
        struct metrics_http *ms = NULL;
        if ((r = vmm_open(&s, &v, err, sizeof(err))) < 0) {
                log_error("could not start", "error=\"%s\"", err);
                goto out_tls;
        }
        if ((r = metrics_http_start(cfg.metrics_address, (int)cfg.metrics_port, vmm_metrics_page, v,
                                    METRICS_HTTP_PAGE_MAX, &ms)) < 0) {
                log_error("could not serve /metrics", "address=%s port=%lld error=\"%s\"", cfg.metrics_address,
                          (long long)cfg.metrics_port, strerror(-r));
                vmm_close(v, time_mono_ns() + SHUTDOWN_MS * NS_PER_MS);
                goto out_tls;
        }
        if (ms)
                log_info("metrics served", "url=http://%s:%lld/metrics", cfg.metrics_address,
                         (long long)cfg.metrics_port);
        struct vmm_api_settings as = {
                .idle_timeout_s = (unsigned int)cfg.api_idle_timeout_s,
                .connections_max = (unsigned int)cfg.api_connections_max,
                .connections_per_client = (unsigned int)cfg.api_connections_per_client,
                .output_held_max = cfg.exec_output_held_max,
                .tls_listen = cfg.tls_listen, .tls_cert_pem = tls_cert, .tls_key_pem = tls_key,
                .tls_client_ca_pem = tls_client_ca, .tls_client_name = cfg.tls_client_name,
        };
        if ((r = vmm_api_start(v, socket_path, &as, &api, err, sizeof(err))) < 0) {
                log_error("could not start the local API", "error=\"%s\"", err);
                metrics_http_stop(ms);
                vmm_close(v, time_mono_ns() + SHUTDOWN_MS * NS_PER_MS);
                goto out_tls;
        }
        if (tls_key) /* the key is held by the TLS library now: not a copy more than needed */
                explicit_bzero(tls_key, strlen(tls_key));
        if (vmm_api_tls_port(api))
                log_info("API served over mutual TLS", "listen=%s port=%d client_name=%s", cfg.tls_listen,
                         vmm_api_tls_port(api), cfg.tls_client_name);
        struct host_registry *registry = NULL;
        if (*cfg.host_registry_database_url) {
                char address[600];
                host_registry_address(cfg.host_registry_address, cfg.tls_listen, address, sizeof(address));
                if (!*address)
                        log_warn("the host registry gets no address for this host: tally-api cannot find it there",
                                 "host=%s hint=\"set host_registry_address, or tls_listen to an address\"", host);
                struct host_registry_settings hs = { .database_url = cfg.host_registry_database_url, .host_id = host,
                                                     .address = address };
                /* Not fatal: sandboxes run without it; the host reads down until it beats. */
                if ((r = host_registry_start(&hs, registry_sample, v, &registry)) < 0)
                        log_error("could not start the host registry's heartbeat", "error=\"%s\"", strerror(-r));
        }
        log_info("tally-vmm ready", "socket=%s", socket_path);
        int sig = daemon_wait_stop();
        int64_t start = time_mono_ns();
        static int64_t deadline;
        deadline = start + SHUTDOWN_MS * NS_PER_MS;
        log_info("tally-vmm stopping; sandboxes keep running", "signal=%s", sig == SIGINT ? "SIGINT" : "SIGTERM");
        pthread_t watchdog;
        if (pthread_create(&watchdog, NULL, shutdown_watchdog, &deadline) == 0)
                pthread_detach(watchdog);
        host_registry_stop(registry, start + SHUTDOWN_REGISTRY_MS * NS_PER_MS); /* it reads the vmm: first */
        vmm_begin_shutdown(v); /* running execs end */
        if (vmm_api_stop(api, start + SHUTDOWN_REQUESTS_MS * NS_PER_MS) < 0) {
                /* A request is stuck in a call that does not return (a backend waiting on a
                 * sandbox that does not answer): its thread still uses the vmm, so nothing is
                 * freed. Queued events get what time is left; a stopped event lost here is
                 * published again by the next run (its record says stopped). */
                log_error("could not finish the requests being answered; leaving them", "requests=%d",
                          vmm_api_active(api));
                vmm_flush(v, (deadline - time_mono_ns()) / NS_PER_MS - 200);
                _exit(0);
        }
        metrics_http_stop(ms);
        vmm_close(v, deadline);
        status = 0;
out_tls:
        free(tls_cert);
        free(tls_key);
        free(tls_client_ca);
out:
        curl_global_cleanup();
        config_free(settings, &cfg);
        return status;
}
