/* config.h — one table per daemon describes every setting.
 *
 * The table drives everything about a setting: its default, the config file
 * (`--config FILE`, INI, keys outside any section or in a section named for the
 * program), the environment (`TALLY_<NAME>`), command-line flags (`--name=value`
 * or `--name value`, dashes or underscores), `--help`, and validation. Later
 * sources win: default < file < environment < flag. An unknown key in the file,
 * an unknown flag, a bad value or a missing required setting stops start-up with
 * a message naming it. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum setting_type {
        SETTING_STRING, /* char *, owned by the config struct, freed by config_free */
        SETTING_INT,    /* int64_t, checked against [min, max] */
        SETTING_BOOL,   /* bool: true/false, yes/no, on/off, 1/0 */
};

struct setting {
        const char *name;          /* snake_case key */
        enum setting_type type;
        const char *default_value; /* NULL: none (required or optional-empty) */
        bool required;
        size_t offset;             /* where the value lives in the daemon's struct */
        int64_t min, max;          /* SETTING_INT only; min == max == 0 means any */
        const char *help;
};

struct program_info {
        const char *name;          /* e.g. "tally-broker" */
        const char *summary;       /* one line */
        const char *usage;         /* the part after the program name, e.g. "[options] [ctl CMD]" */
        const char *details;       /* printed after the options; may be NULL */
};

#define SETTINGS_END { .name = NULL }

/* The settings most daemons share. */
#define SETTING_LOG_LEVEL(type, field) \
        { "log_level", SETTING_STRING, "info", false, offsetof(type, field), 0, 0, \
          "Least severe log level written: debug, info, warn or error" }
#define SETTING_STATE_DIR(type, field) \
        { "state_dir", SETTING_STRING, "./var", false, offsetof(type, field), 0, 0, \
          "Folder for this host's durable state" }
/* A daemon's Prometheus /metrics (common/metrics_http.c): its port (0: off) and address. */
#define SETTING_METRICS_PORT(type, field) \
        { "metrics_port", SETTING_INT, "0", false, offsetof(type, field), 0, 65535, \
          "Serve Prometheus /metrics on this port (0: off)" }
#define SETTING_METRICS_ADDRESS(type, field) \
        { "metrics_address", SETTING_STRING, "127.0.0.1", false, offsetof(type, field), 0, 0, \
          "IPv4 address /metrics listens on" }
#define SETTING_DATABASE_URL(type, field) \
        { "database_url", SETTING_STRING, NULL, true, offsetof(type, field), 0, 0, \
          "PostgreSQL connection string (libpq URI or key=value)" }
#define SETTING_KAFKA_BROKERS(type, field) \
        { "kafka_brokers", SETTING_STRING, NULL, true, offsetof(type, field), 0, 0, \
          "Kafka bootstrap servers, host:port[,host:port...]" }
/* Kafka TLS/SASL for every client of the daemon; field is a struct
 * kafka_client_settings (common/kafka.h) in the daemon's config struct. */
#define SETTING_KAFKA_CLIENT(type, field) \
        { "kafka_settings", SETTING_STRING, "", false, offsetof(type, field.settings), 0, 0, \
          "librdkafka settings for every Kafka client, name=value,... (TLS, SASL: docs/configuration.md)" }, \
        { "kafka_sasl_password", SETTING_STRING, "", false, offsetof(type, field.sasl_password), 0, 0, \
          "SASL password (sasl.password); best given as TALLY_KAFKA_SASL_PASSWORD" }

enum config_result {
        CONFIG_OK = 0,
        CONFIG_EXIT = 1, /* --help or --version was printed; exit 0 */
};

/* Fills cfg from the table. Returns CONFIG_OK, CONFIG_EXIT, or a negative errno
 * with a one-line message naming the offending setting in errbuf.
 * On success *ret_argi, if given, is the index of the first positional argument
 * (arguments after it, or after "--", are not parsed as flags). */
int config_load(const struct program_info *prog, const struct setting *table, void *cfg,
                int argc, char **argv, int *ret_argi, char *errbuf, size_t errlen);

/* Frees the strings config_load stored in cfg. Accepts a cfg never loaded if it is zeroed. */
void config_free(const struct setting *table, void *cfg);

/* Writes --help text for the table to stdout. */
void config_print_help(const struct program_info *prog, const struct setting *table);

/* Parsers the loader uses, exposed for tests and other inputs. Return 0 or -EINVAL. */
int config_parse_int(const char *s, int64_t *ret);
int config_parse_bool(const char *s, bool *ret);

/* Common start-up for a daemon's main(): loads the configuration, sets the log
 * component and level from cfg's log_level field (if the table has one).
 * Returns -1 to go on, or an exit status to return from main at once (0 after
 * --help or --version, 2 after printing a configuration error). */
int config_main(const struct program_info *prog, const struct setting *table, void *cfg,
                int argc, char **argv, int *ret_argi);
