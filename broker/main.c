/* tally-broker — the Kafka development broker (librdkafka's mock cluster).
 * For development and tests only: it keeps messages in memory and forgets them
 * on exit. It authenticates no one and knows no ACLs (librdkafka's mock cluster
 * has neither a SASL handshake nor an authorizer), so it listens on 127.0.0.1
 * only and says at start that it is for development. Production points every
 * daemon at a real Kafka cluster with SASL and ACLs (docs/kafka.md). */
#include "config.h"
#include "daemon.h"
#include "devbroker.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <poll.h>
#include <unistd.h>

struct broker_config {
        int64_t port;
        int64_t brokers;
        int64_t partitions;
        int64_t keep_bytes_per_partition;
        int64_t keep_batches_per_partition;
        char *bootstrap_file;
        char *control_socket;
        char *log_level;
};

static const struct setting settings[] = {
        { "port", SETTING_INT, "0", false, offsetof(struct broker_config, port), 0, 65535,
          "Bootstrap port on 127.0.0.1; 0 lets the broker pick one" },
        { "brokers", SETTING_INT, "1", false, offsetof(struct broker_config, brokers), 1, 16,
          "Brokers in the development cluster" },
        { "partitions", SETTING_INT, "4", false, offsetof(struct broker_config, partitions), 1, 1024,
          "Partitions of the usage and control topics" },
        { "keep_bytes_per_partition", SETTING_INT, "5242880", false,
          offsetof(struct broker_config, keep_bytes_per_partition), 1024, INT64_C(1) << 40,
          "Bytes of messages each partition keeps in memory before dropping its oldest (librdkafka's own: 5 MiB)" },
        { "keep_batches_per_partition", SETTING_INT, "100000", false,
          offsetof(struct broker_config, keep_batches_per_partition), 1, INT64_C(1) << 40,
          "Producer batches each partition keeps before dropping its oldest (librdkafka's own: 100,000)" },
        { "bootstrap_file", SETTING_STRING, "", false, offsetof(struct broker_config, bootstrap_file), 0, 0,
          "Write the bootstrap address to this file once ready (removed on exit)" },
        { "control_socket", SETTING_STRING, "", false, offsetof(struct broker_config, control_socket), 0, 0,
          "Unix socket for fault injection (see the ctl command)" },
        SETTING_LOG_LEVEL(struct broker_config, log_level),
        SETTINGS_END,
};

static const struct program_info program = {
        .name = "tally-broker",
        .summary = "Kafka development broker: librdkafka's mock cluster on localhost, with tally's topics.\n"
                   "For development and tests only; production uses a real Kafka cluster.",
        .usage = "[options] [ctl COMMAND...]",
        .details = "Without a command it serves until SIGINT or SIGTERM and prints bootstrap=HOST:PORT.\n"
                   "`ctl COMMAND` sends a fault to a running broker's --control-socket and prints the reply:\n"
                   "  down [ID] | up [ID]             brokers refuse / accept connections\n"
                   "  error APIKEY ERRCODE COUNT      fail the next COUNT requests of a protocol API\n"
                   "  clear APIKEY | rtt MS [ID] | topics | watermarks | ping\n"
                   "It keeps messages in memory: by default 5 MiB (or 100,000 producer batches) per partition,\n"
                   "beyond which the oldest are dropped (logged at warning when it happens); the limits in force\n"
                   "are logged at start. A backlog larger than that (benchmarks) needs --keep-bytes-per-partition.",
};


static int write_file_atomic(const char *path, const char *text)
{
        char tmp[4096];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE *f = fopen(tmp, "we");
        if (!f)
                return -errno;
        fprintf(f, "%s\n", text);
        if (fclose(f) != 0 || rename(tmp, path) < 0)
                return -errno;
        return 0;
}

static int open_control(const char *path)
{
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        if (fd < 0 || strlen(path) >= sizeof(a.sun_path)) {
                if (fd >= 0)
                        close(fd);
                return -ENAMETOOLONG;
        }
        strcpy(a.sun_path, path);
        unlink(path);
        if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 16) < 0) {
                int e = errno;
                close(fd);
                return -e;
        }
        return fd;
}

/* One command per connection: read a line, reply with a line. */
static void serve_control(struct devbroker *b, int fd)
{
        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
                return;
        char line[256];
        ssize_t n = read(c, line, sizeof(line) - 1);
        if (n > 0) {
                line[n] = '\0';
                line[strcspn(line, "\r\n")] = '\0';
                char reply[256];
                int r = devbroker_command(b, line, reply, sizeof(reply));
                log_info("fault command", "command=\"%s\" result=%s", line, r == 0 ? "ok" : "refused");
                dprintf(c, "%s\n", reply);
        }
        close(c);
}

static int ctl(const char *path, int argc, char **argv)
{
        if (!path || !*path) {
                fprintf(stderr, "tally-broker: ctl needs --control-socket\n");
                return 2;
        }
        char line[256] = "";
        for (int i = 0; i < argc; i++) {
                strncat(line, argv[i], sizeof(line) - strlen(line) - 2);
                strcat(line, i + 1 < argc ? " " : "\n");
        }
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
                fprintf(stderr, "tally-broker: could not reach %s: %s\n", path, strerror(errno));
                return 1;
        }
        if (write(fd, line, strlen(line)) < 0) {
                close(fd);
                return 1;
        }
        char reply[256];
        ssize_t n = read(fd, reply, sizeof(reply) - 1);
        close(fd);
        if (n <= 0)
                return 1;
        reply[n] = '\0';
        fputs(reply, stdout);
        return strncmp(reply, "ok", 2) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
        struct broker_config cfg = { 0 };
        int argi, r = config_main(&program, settings, &cfg, argc, argv, &argi);
        if (r >= 0)
                return r;
        int status = 1;
        if (argi < argc) {
                if (strcmp(argv[argi], "ctl") != 0 || argi + 1 >= argc) {
                        fprintf(stderr, "tally-broker: unknown command \"%s\" (try --help)\n", argv[argi]);
                        status = 2;
                } else {
                        status = ctl(cfg.control_socket, argc - argi - 1, argv + argi + 1);
                }
                config_free(settings, &cfg);
                return status;
        }

        daemon_handle_signals();

        char err[512], quoted[600];
        struct devbroker *b = NULL;
        struct devbroker_options opt = { (int)cfg.port, (int)cfg.brokers, (int)cfg.partitions,
                                         cfg.keep_bytes_per_partition, cfg.keep_batches_per_partition };
        int ctl_fd = -1;
        if ((r = devbroker_start(&opt, &b, err, sizeof(err))) < 0) {
                log_error("could not start the development broker", "error=%s", log_quote(quoted, sizeof(quoted), err));
                goto out;
        }
        if (*cfg.control_socket && (ctl_fd = open_control(cfg.control_socket)) < 0) {
                log_error("could not open the control socket", "path=%s error=\"%s\"", cfg.control_socket,
                          strerror(-ctl_fd));
                goto out;
        }
        if (*cfg.bootstrap_file && (r = write_file_atomic(cfg.bootstrap_file, devbroker_bootstrap(b))) < 0) {
                log_error("could not write the bootstrap file", "path=%s error=\"%s\"", cfg.bootstrap_file,
                          strerror(-r));
                goto out;
        }
        int64_t keep_bytes, keep_batches;
        devbroker_limits(b, &keep_bytes, &keep_batches);
        log_info("development broker ready",
                 "bootstrap=%s brokers=%lld partitions=%lld keep_bytes_per_partition=%lld keep_batches_per_partition=%lld"
                 " note=\"in memory only; beyond either limit a partition's oldest messages are dropped\"",
                 devbroker_bootstrap(b), (long long)cfg.brokers, (long long)cfg.partitions, (long long)keep_bytes,
                 (long long)keep_batches);
        /* The mock cluster has no SASL handshake and no authorizer: anyone who can reach
         * the loopback port may produce and read every topic. It is never the production path. */
        log_warn("development broker: for development only",
                 "auth=none acls=none listen=127.0.0.1 note=\"any local process may produce and read every topic;"
                 " production runs Apache Kafka with SASL and ACLs (docs/kafka.md)\"");
        printf("bootstrap=%s\n", devbroker_bootstrap(b));
        fflush(stdout);

        int64_t last_watch = 0;
        while (!daemon_stop_requested) {
                struct pollfd p = { ctl_fd, POLLIN, 0 };
                int n = poll(&p, ctl_fd >= 0 ? 1 : 0, 500);
                if (n > 0 && (p.revents & POLLIN))
                        serve_control(b, ctl_fd);
                if (time_mono_ns() - last_watch >= 2 * NS_PER_SEC) {
                        last_watch = time_mono_ns();
                        devbroker_watch(b);
                }
        }
        log_info("development broker stopping", NULL);
        status = 0;
out:
        if (ctl_fd >= 0) {
                close(ctl_fd);
                unlink(cfg.control_socket);
        }
        if (b && *cfg.bootstrap_file)
                unlink(cfg.bootstrap_file);
        devbroker_free(b);
        config_free(settings, &cfg);
        return status;
}
