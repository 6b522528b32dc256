/* tally-collector — one per host: samples every sandbox's cgroup once per tick
 * and publishes cumulative usage samples to Kafka (see collector.h). */
#include "collector.h"
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "metrics_http.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

struct collector_config {
        char *kafka_brokers;
        struct kafka_client_settings kafka;
        char *state_dir;
        char *host_id;
        int64_t tick_ms;
        int64_t queue_max;
        int64_t delivery_timeout_ms;
        int64_t rescan_s;
        bool read_peak;
        int64_t peak_every;
        char *cgroup_reader;
        int64_t seq_start;
        char *usage_format;
        int64_t metrics_port;
        char *metrics_address;
        char *log_level;
};

/* The /metrics page: the collector's counters, in at most 8 KiB. */
#define COLLECTOR_METRICS_PAGE_MAX 8192
static int metrics_page(const void *c, char *buf, size_t size)
{
        return collector_metrics_text(c, buf, size);
}

static const struct setting settings[] = {
        SETTING_KAFKA_BROKERS(struct collector_config, kafka_brokers),
        SETTING_KAFKA_CLIENT(struct collector_config, kafka),
        SETTING_STATE_DIR(struct collector_config, state_dir),
        { "host_id", SETTING_STRING, "", false, offsetof(struct collector_config, host_id), 0, 0,
          "This host's id in samples when a registry record names none (default: the hostname)" },
        { "tick_ms", SETTING_INT, "1000", false, offsetof(struct collector_config, tick_ms), 10, 600000,
          "Milliseconds between readings of every sandbox's cgroup" },
        { "queue_max", SETTING_INT, "100000", false, offsetof(struct collector_config, queue_max), 1, 10000000,
          "Samples waiting for the broker, at most; beyond it each sandbox keeps only its newest" },
        { "delivery_timeout_ms", SETTING_INT, "300000", false,
          offsetof(struct collector_config, delivery_timeout_ms), 1000, 86400000,
          "A message the broker has not acknowledged by then fails (final samples are re-sent)" },
        { "rescan_s", SETTING_INT, "60", false, offsetof(struct collector_config, rescan_s), 1, 86400,
          "Seconds between full registry rescans (inotify reports changes in between)" },
        { "read_peak", SETTING_BOOL, "true", false, offsetof(struct collector_config, read_peak), 0, 0,
          "Read peak memory (memory.peak, memory.max_usage_in_bytes) where the kernel offers it" },
        { "peak_every", SETTING_INT, "10", false, offsetof(struct collector_config, peak_every), 1, 3600,
          "Ticks between readings of a sandbox's peak memory (a high watermark; staggered across sandboxes)" },
        { "cgroup_reader", SETTING_STRING, "auto", false, offsetof(struct collector_config, cgroup_reader), 0, 0,
          "How counters are read each tick: scan (one BPF walk of the cgroup tree, Linux >= 6.2, root), "
          "files (two preads a sandbox), or auto (scan where it loads, else files)" },
        { "seq_start", SETTING_INT, "0", false, offsetof(struct collector_config, seq_start), 0, 4294967295,
          "For tests only: the n every sandbox's sequence numbers count from (near 2^32 to try the wrap)" },
        { "usage_format", SETTING_STRING, "v1", false, offsetof(struct collector_config, usage_format), 0, 0,
          "How samples go to the usage topic: v1 (a JSON message each) or v2 (a binary batch per partition per "
          "tick; every aggregator must read v2 first: docs/events.md)" },
        SETTING_METRICS_PORT(struct collector_config, metrics_port),
        SETTING_METRICS_ADDRESS(struct collector_config, metrics_address),
        SETTING_LOG_LEVEL(struct collector_config, log_level),
        SETTINGS_END,
};

static const struct program_info program = {
        .name = "tally-collector",
        .summary = "Samples every sandbox's cgroup on this host and publishes cumulative usage samples to Kafka.",
        .usage = "[options]",
        .details = "Sandboxes come from the vmm registry, <state_dir>/sandboxes. Final samples of stopped\n"
                   "sandboxes wait in <state_dir>/collector/spool until the broker acknowledges them.",
};


int main(int argc, char **argv)
{
        struct collector_config cfg = { 0 };
        int r = config_main(&program, settings, &cfg, argc, argv, NULL);
        if (r >= 0)
                return r;
        if (strcmp(cfg.cgroup_reader, "auto") != 0 && strcmp(cfg.cgroup_reader, "scan") != 0 &&
            strcmp(cfg.cgroup_reader, "files") != 0) {
                fprintf(stderr, "tally-collector: cgroup_reader must be auto, scan or files, not \"%s\"\n",
                        cfg.cgroup_reader);
                config_free(settings, &cfg);
                return 2;
        }
        if (strcmp(cfg.usage_format, "v1") != 0 && strcmp(cfg.usage_format, "v2") != 0) {
                fprintf(stderr, "tally-collector: usage_format must be v1 or v2, not \"%s\"\n", cfg.usage_format);
                config_free(settings, &cfg);
                return 2;
        }
        char kerr[512];
        if (kafka_client_settings_check(&cfg.kafka, kerr, sizeof(kerr)) < 0) {
                fprintf(stderr, "tally-collector: invalid value for kafka_settings: %s\n", kerr);
                config_free(settings, &cfg);
                return 2;
        }
        daemon_handle_signals();
        daemon_memory_setup(); /* collector_run trims the heap from its loop */

        int status = 1;
        char err[1024];
        struct collector *c = NULL;
        struct metrics_http *ms = NULL;
        struct collector_options opt = {
                .brokers = cfg.kafka_brokers, .kafka = &cfg.kafka, .state_dir = cfg.state_dir, .host_id = cfg.host_id,
                .tick_ms = cfg.tick_ms, .queue_max = cfg.queue_max, .delivery_timeout_ms = cfg.delivery_timeout_ms,
                .rescan_s = cfg.rescan_s, .read_peak = cfg.read_peak, .peak_every = cfg.peak_every,
                .cgroup_reader = cfg.cgroup_reader, .seq_start = (uint32_t)cfg.seq_start,
                .usage_format = cfg.usage_format,
        };
        if (collector_new(&opt, &c, err, sizeof(err)) < 0) {
                log_error("could not start", "error=\"%s\"", err);
                goto out;
        }
        if ((r = metrics_http_start(cfg.metrics_address, (int)cfg.metrics_port, metrics_page, c, COLLECTOR_METRICS_PAGE_MAX, &ms)) < 0) {
                log_error("could not serve /metrics", "address=%s port=%lld error=\"%s\"", cfg.metrics_address,
                          (long long)cfg.metrics_port, strerror(-r));
                goto out;
        }
        if (ms)
                log_info("metrics served", "url=http://%s:%lld/metrics", cfg.metrics_address,
                         (long long)cfg.metrics_port);
        if (collector_run(c, &daemon_stop_requested) == 0)
                status = 0;
out:
        metrics_http_stop(ms);
        collector_free(c);
        config_free(settings, &cfg);
        return status;
}
