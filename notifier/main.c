/* tally-notifier — sends spend alerts (the alert_deliveries outbox, sql/009)
 * as signed webhooks and emails, with retries (docs/alerts.md). */
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "notifier.h"

#include <stddef.h>

static const struct setting settings[] = {
        SETTING_DATABASE_URL(struct notifier_config, database_url),
        { "allow_http", SETTING_STRING, "", false, offsetof(struct notifier_config, allow_http), 0, 0,
          "Hosts a webhook may reach over plain http, comma separated (default none: https only)" },
        { "ca_file", SETTING_STRING, "", false, offsetof(struct notifier_config, ca_file), 0, 0,
          "CA bundle for webhook and SMTP certificates (default: the system's)" },
        { "timeout_ms", SETTING_INT, "10000", false, offsetof(struct notifier_config, timeout_ms), 100, 120000,
          "Time allowed for one attempt (connect, send, answer)" },
        { "workers", SETTING_INT, "4", false, offsetof(struct notifier_config, workers), 1, 64,
          "Senders in this process, each with its own database connection" },
        { "batch", SETTING_INT, "20", false, offsetof(struct notifier_config, batch), 1, 1000,
          "Deliveries a sender claims per transaction and sends at once (one per destination)" },
        { "poll_ms", SETTING_INT, "1000", false, offsetof(struct notifier_config, poll_ms), 10, 60000,
          "Look for due deliveries at least this often (new ones wake it at once)" },
        { "retry_base_ms", SETTING_INT, "10000", false, offsetof(struct notifier_config, retry_base_ms), 1,
          INT64_C(86400000), "Wait after a first failed attempt; doubled after each, with jitter" },
        { "retry_max_ms", SETTING_INT, "21600000", false, offsetof(struct notifier_config, retry_max_ms), 1,
          INT64_C(86400000), "Longest wait between attempts" },
        { "give_up_after_s", SETTING_INT, "259200", false, offsetof(struct notifier_config, give_up_after_s), 1,
          INT64_C(31536000), "A delivery not made this long after the alert is marked failed (3 days)" },
        { "smtp_url", SETTING_STRING, "", false, offsetof(struct notifier_config, smtp_url), 0, 0,
          "SMTP relay for email destinations: smtp://host:port (STARTTLS when offered) or smtps://host:port" },
        { "smtp_from", SETTING_STRING, "tally <alerts@localhost>", false,
          offsetof(struct notifier_config, smtp_from), 0, 0, "From: address of alert emails" },
        { "smtp_username", SETTING_STRING, "", false, offsetof(struct notifier_config, smtp_username), 0, 0,
          "SMTP user name (empty: no authentication)" },
        { "smtp_password", SETTING_STRING, "", false, offsetof(struct notifier_config, smtp_password), 0, 0,
          "SMTP password; best given as TALLY_SMTP_PASSWORD" },
        { "dashboard_url", SETTING_STRING, "http://127.0.0.1:8080/", false,
          offsetof(struct notifier_config, dashboard_url), 0, 0, "Dashboard link written in alert emails" },
        SETTING_METRICS_PORT(struct notifier_config, metrics_port),
        SETTING_METRICS_ADDRESS(struct notifier_config, metrics_address),
        SETTING_LOG_LEVEL(struct notifier_config, log_level),
        SETTINGS_END,
};

static const struct program_info program = {
        .name = "tally-notifier",
        .summary = "Send spend alerts to their destinations: signed webhooks and email, retried with backoff.",
        .usage = "[options]",
        .details = "Runs until SIGINT or SIGTERM. Several notifiers may share one database: each claims\n"
                   "due deliveries with FOR UPDATE SKIP LOCKED. See docs/alerts.md.",
};

int main(int argc, char **argv)
{
        struct notifier_config cfg = { 0 };
        int r = config_main(&program, settings, &cfg, argc, argv, NULL);
        if (r >= 0)
                return r;
        daemon_handle_signals();
        r = notifier_run(&cfg, &daemon_stop_requested);
        config_free(settings, &cfg);
        return r < 0 ? 1 : 0;
}
