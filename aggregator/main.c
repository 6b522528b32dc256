/* tally-aggregator — folds usage samples into hourly usage, rates it, writes
 * the ledger exactly once and enforces daily spend limits. */
#include "aggregator.h"
#include "config.h"
#include "daemon.h"
#include "log.h"

#include <signal.h>
#include <stdio.h>
#include <stddef.h>
#include <string.h>

static const struct setting settings[] = {
        SETTING_DATABASE_URL(struct aggregator_config, database_url),
        SETTING_KAFKA_BROKERS(struct aggregator_config, kafka_brokers),
        SETTING_KAFKA_CLIENT(struct aggregator_config, kafka),
        { "group", SETTING_STRING, "tally-aggregator", false, offsetof(struct aggregator_config, group), 0, 0,
          "Kafka consumer group; every aggregator of one ledger uses the same" },
        { "batch_messages", SETTING_INT, "500000", false, offsetof(struct aggregator_config, batch_messages), 1,
          1000000, "Commit a batch after this many messages..." },
        { "batch_ms", SETTING_INT, "100", false, offsetof(struct aggregator_config, batch_ms), 1, 60000,
          "...or this many milliseconds after its first message (while behind: up to 10 times as long, 5 s at least)" },
        { "commit_groups", SETTING_INT, "2", false, offsetof(struct aggregator_config, commit_groups), 1, 64,
          "While keeping up, a batch takes one of this many groups of the partitions owned, in turn: a sample then "
          "waits for a commit of its own group's sandboxes, not of all (1: every batch takes every partition)" },
        { "consumer_settings", SETTING_STRING, "session.timeout.ms=10000,heartbeat.interval.ms=1000", false,
          offsetof(struct aggregator_config, consumer_settings), 0, 0,
          "Further librdkafka consumer settings, name=value separated by commas" },
        { "max_clock_ahead_ms", SETTING_INT, "300000", false, offsetof(struct aggregator_config, max_clock_ahead_ms),
          1, INT64_C(3153600000000),
          "A reading dated more than this ahead of the aggregator's clock is placed at the aggregator's clock" },
        { "max_clock_behind_ms", SETTING_INT, "34560000000", false,
          offsetof(struct aggregator_config, max_clock_behind_ms), 1, INT64_C(3153600000000),
          "...and so is one dated more than this behind it (default 400 days)" },
        { "provenance_grace_ms", SETTING_INT, "900000", false, offsetof(struct aggregator_config, provenance_grace_ms),
          1, INT64_C(31536000000),
          "A reading of a sandbox with no `created` event, or under an epoch its host did not announce, is held this "
          "long, then dead-lettered" },
        SETTING_METRICS_PORT(struct aggregator_config, metrics_port),
        SETTING_METRICS_ADDRESS(struct aggregator_config, metrics_address),
        { "keep_stopped_ms", SETTING_INT, "60000", false, offsetof(struct aggregator_config, keep_stopped_ms), 0,
          86400000, "A stopped sandbox's state leaves memory this long after its final reading (read back by id)" },
        { "keep_idle_ms", SETTING_INT, "900000", false, offsetof(struct aggregator_config, keep_idle_ms), 0,
          86400000, "Any sandbox's state leaves memory after this long without a reading" },
        SETTING_LOG_LEVEL(struct aggregator_config, log_level),
        SETTINGS_END,
};

static const struct program_info program = {
        .name = "tally-aggregator",
        .summary = "Consume the usage topic, bill it exactly once into the ledger, enforce daily spend limits.",
        .usage = "[options]",
        .details = "Runs until SIGINT or SIGTERM. Several aggregators in one group share the partitions;\n"
                   "Kafka offsets are kept in PostgreSQL with the ledger rows they produced.",
};


int main(int argc, char **argv)
{
        struct aggregator_config cfg = { 0 };
        int r = config_main(&program, settings, &cfg, argc, argv, NULL);
        if (r >= 0)
                return r;
        char kerr[512];
        if (kafka_client_settings_check(&cfg.kafka, kerr, sizeof(kerr)) < 0) {
                fprintf(stderr, "tally-aggregator: invalid value for kafka_settings: %s\n", kerr);
                config_free(settings, &cfg);
                return 2;
        }
        daemon_handle_signals();
        r = aggregator_run(&cfg, &daemon_stop_requested);
        config_free(settings, &cfg);
        return r < 0 ? 1 : 0;
}
