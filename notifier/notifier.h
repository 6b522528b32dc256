/* notifier.h — tally-notifier: sends the alert outbox (alert_deliveries,
 * sql/009) to its destinations. Several notifiers may share one database:
 * each claims due rows with FOR UPDATE SKIP LOCKED inside a transaction that
 * stays open while it sends them, so a notifier that dies mid-send leaves the
 * row pending (same event id) for the next attempt, never lost, never marked
 * delivered unsent. */
#pragma once

#include "send.h"

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

struct notifier_config {
        char *database_url;
        char *allow_http;
        char *ca_file;
        char *smtp_url;
        char *smtp_from;
        char *smtp_username;
        char *smtp_password;
        char *dashboard_url;
        int64_t timeout_ms;
        int64_t workers;
        int64_t batch;
        int64_t poll_ms;
        int64_t retry_base_ms;
        int64_t retry_max_ms;
        int64_t give_up_after_s;
        int64_t metrics_port;
        char *metrics_address;
        char *log_level;
};

/* The wait before attempt `attempts + 1` after `attempts` failed ones:
 * retry_base_ms x 2^(attempts-1), at most retry_max_ms, then a random half of
 * it taken off (jitter: [d/2, d]). rnd is any random 64-bit value. */
int64_t notifier_backoff_ms(const struct notifier_config *cfg, int attempts, uint64_t rnd);

/* Runs until *stop. Returns 0, or a negative errno when it could not start. */
int notifier_run(const struct notifier_config *cfg, volatile sig_atomic_t *stop);
