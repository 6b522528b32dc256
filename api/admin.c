/* tally-admin — what an operator does by hand: accounts, people, keys, plans,
 * and closing a month's invoices (by hand, or `close-due` from a timer).
 * The same code as tally-api (keys.c, auth.c). A password is read from a
 * file or the terminal, never from the command line (argv is visible to
 * every user of the host); a key's secret is printed once and never again. */
#include "admin.h"
#include "config.h"
#include "db.h"
#include "log.h"
#include "server.h"

#include <errno.h>
#include <stddef.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

struct admin_config {
        char *database_url;
        char *log_level;
        int64_t close_grace_hours;
};

static const struct setting settings[] = {
        SETTING_DATABASE_URL(struct admin_config, database_url),
        SETTING_LOG_LEVEL(struct admin_config, log_level),
        { "close_grace_hours", SETTING_INT, "72", false, offsetof(struct admin_config, close_grace_hours), 0, 8760,
          "close-due closes a month this many hours after it ended (late samples still land in it until then)" },
        SETTINGS_END,
};

static const struct program_info program = {
        .name = "tally-admin",
        .summary = "Create accounts, people and API keys, and assign price plans.",
        .usage = "[options] COMMAND [ARGS...]",
        .details = "Commands:\n"
                   "  account create ID [--name NAME] [--plan PLAN]\n"
                   "  account timezone ACCOUNT [ZONE] [--json]\n"
                   "         (the account's IANA time zone, UTC by default: its daily limits, spend days, alerts and\n"
                   "          invoice months follow it; with ZONE sets it, audited as admin, and rebuilds its days)\n"
                   "  person create --account ID --email EMAIL [--password-file FILE]\n"
                   "  person password --email EMAIL [--password-file FILE]\n"
                   "         (without --password-file the password is read from the terminal, or one line of stdin)\n"
                   "  key create --account ID [--name NAME] [--daily-limit-nanodollars N] [--policy pause|stop|alert_only]\n"
                   "         (prints the key's id and its secret, once)\n"
                   "  key list [--account ID] [--json]     every key, its daily limit and policy, and today's state\n"
                   "  key limit KEY --daily-limit-nanodollars N|none [--policy pause|stop|alert_only] [--json]\n"
                   "         (audited as admin, as a person's change is; lifts today's block when the key may\n"
                   "          spend again; prints the key and its spend today)\n"
                   "  plan assign --account ID --plan PLAN\n"
                   "  status [URL...]     the pipeline's health (groups, hosts, dead letters); probes each URL\n"
                   "  host list [--json]  every host: its state (ready, draining, or down: no heartbeat for\n"
                   "         host_heartbeat_bound(), 15 s), heartbeat age, address, promised/may promise, live\n"
                   "         sandboxes, last sample and metering gap\n"
                   "  host drain HOST_ID [--json]    tally-api places no new sandbox there (its own keep running);\n"
                   "         audited as admin\n"
                   "  host resume HOST_ID [--json]   ready again; audited as admin\n"
                   "  host forget HOST_ID            removes its row (a retired host; a host still running\n"
                   "         registers again, ready); audited as admin\n"
                   "  spend [--account ID] [--day YYYY-MM-DD] [--json]\n"
                   "         (spend per key on a day of its account (its time zone) against the limit it had that day)\n"
                   "  usage [--account ID] [--from DAY] [--to DAY] [--by key|meter|day|sandbox|label:NAME] [--json]\n"
                   "         (usage and cost over whole days of each account, in its time zone; sandbox|label:NAME:\n"
                   "          per sandbox or per value of the sandboxes' label NAME)\n"
                   "  invoice [--month YYYY-MM] [--account ID] [--json]\n"
                   "         (the month's invoices, this month's by default, with their lines, lines per key, free\n"
                   "          credit and total: a closed month's as closed, an open month's as a preview; this\n"
                   "          month's with its end-of-month estimate)\n"
                   "  close-month YYYY-MM\n"
                   "         (freezes that month's invoices, and every earlier month's not closed yet; a month\n"
                   "          that has not ended is refused; closing a closed month does nothing)\n"
                   "  close-due\n"
                   "         (closes every month that ended close_grace_hours ago or more; for a timer)\n"
                   "COMMAND --help prints that command's lines.",
};

struct args {
        const char *account, *name, *plan, *email, *password_file, *limit, *policy;
        bool json;
};

static int parse(int argc, char **argv, struct args *a)
{
        static const struct option opts[] = {
                { "account", required_argument, 0, 'a' },
                { "name", required_argument, 0, 'n' },
                { "plan", required_argument, 0, 'p' },
                { "email", required_argument, 0, 'e' },
                { "password-file", required_argument, 0, 'f' },
                { "daily-limit-nanodollars", required_argument, 0, 'l' },
                { "policy", required_argument, 0, 'P' },
                { "json", no_argument, 0, 'j' },
                { 0, 0, 0, 0 },
        };
        optind = 1;
        int c;
        while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                switch (c) {
                case 'a': a->account = optarg; break;
                case 'n': a->name = optarg; break;
                case 'p': a->plan = optarg; break;
                case 'e': a->email = optarg; break;
                case 'f': a->password_file = optarg; break;
                case 'l': a->limit = optarg; break;
                case 'P': a->policy = optarg; break;
                case 'j': a->json = true; break;
                default: return -EINVAL;
                }
        }
        return optind;
}

/* Reads the password: the file's first line, or the terminal with echo off,
 * or (no terminal) one line of stdin. Returns malloc'd text or NULL. */
static char *read_password(const char *file)
{
        FILE *f = file ? fopen(file, "r") : NULL;
        bool tty = !file && isatty(STDIN_FILENO);
        if (file && !f) {
                fprintf(stderr, "tally-admin: could not open %s: %m\n", file);
                return NULL;
        }
        struct termios old, quiet;
        if (tty) {
                fprintf(stderr, "Password: ");
                tcgetattr(STDIN_FILENO, &old);
                quiet = old;
                quiet.c_lflag &= ~(tcflag_t)ECHO;
                tcsetattr(STDIN_FILENO, TCSAFLUSH, &quiet);
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t n = getline(&line, &cap, f ? f : stdin);
        if (tty) {
                tcsetattr(STDIN_FILENO, TCSAFLUSH, &old);
                fputc('\n', stderr);
        }
        if (f)
                fclose(f);
        if (n <= 0) {
                free(line);
                return NULL;
        }
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
                line[--n] = '\0';
        return line;
}

static int run_sql(PGconn *db, const char *what, const char *sql, int n, const char *const *params)
{
        PGresult *res = PQexecParams(db, sql, n, NULL, params, NULL, NULL, 0);
        ExecStatusType st = PQresultStatus(res);
        int rows = st == PGRES_TUPLES_OK ? PQntuples(res) : atoi(PQcmdTuples(res));
        if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
                fprintf(stderr, "tally-admin: could not %s: %s", what, PQerrorMessage(db));
                PQclear(res);
                return -EIO;
        }
        PQclear(res);
        return rows;
}

static int set_password(PGconn *db, const char *email, const char *file)
{
        char *pw = read_password(file);
        if (!pw || strlen(pw) < 8) {
                fprintf(stderr, "tally-admin: a password of at least 8 characters is needed\n");
                free(pw);
                return -EINVAL;
        }
        char *hash = NULL;
        int r = password_hash(pw, &hash);
        explicit_bzero(pw, strlen(pw));
        free(pw);
        if (r < 0) {
                fprintf(stderr, "tally-admin: could not hash the password\n");
                return r;
        }
        const char *p[] = { email, hash };
        r = run_sql(db, "set the password", "UPDATE people SET password_hash = $2 WHERE email = $1", 2, p);
        free(hash);
        if (r == 0) {
                fprintf(stderr, "tally-admin: no person with email %s\n", email);
                return -ENOENT;
        }
        return r < 0 ? r : 0;
}

/* Prints what close_month()/close_due() returned: one line per month. */
static int close_print(PGresult *res)
{
        for (int i = 0; i < PQntuples(res); i++)
                printf("month=%s status=\"%s\" invoices=%s total_cents=%s\n", PQgetvalue(res, i, 0),
                       PQgetvalue(res, i, 1), PQgetvalue(res, i, 2), PQgetvalue(res, i, 3));
        return 0;
}

/* close-month YYYY-MM: the database refuses a month that has not ended
 * (SQLSTATE 55000), and a closed month is a no-op ("already closed"). */
static int close_month(PGconn *db, const char *month)
{
        int y, m;
        char tail;
        if (!month || strlen(month) != 7 || sscanf(month, "%4d-%2d%c", &y, &m, &tail) != 2 || m < 1 || m > 12 ||
            y < 2000 || month[4] != '-') {
                fprintf(stderr, "tally-admin: close-month needs a month as YYYY-MM\n");
                return -EINVAL;
        }
        char day[32];
        snprintf(day, sizeof(day), "%04d-%02d-01", y, m);
        const char *p[] = { day };
        PGresult *res = PQexecParams(db, "SELECT to_char(month, 'YYYY-MM'), status, invoices, total_cents"
                                         "  FROM close_month($1::date, 'tally-admin')",
                                     1, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
                bool not_ended = state && strcmp(state, "55000") == 0;
                fprintf(stderr, "tally-admin: could not close %s: %s", month,
                        PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) ?: PQerrorMessage(db));
                fputc('\n', stderr);
                PQclear(res);
                return not_ended ? -EAGAIN : -EIO;
        }
        close_print(res);
        PQclear(res);
        return 0;
}

static int close_due(PGconn *db, int64_t grace_hours)
{
        char grace[32];
        snprintf(grace, sizeof(grace), "%lld hours", (long long)grace_hours);
        const char *p[] = { grace };
        PGresult *res = PQexecParams(db, "SELECT to_char(month, 'YYYY-MM'), status, invoices, total_cents"
                                         "  FROM close_due($1::interval, 'tally-admin close-due')",
                                     1, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                fprintf(stderr, "tally-admin: could not close the months due: %s", PQerrorMessage(db));
                PQclear(res);
                return -EIO;
        }
        if (PQntuples(res) == 0)
                printf("status=\"nothing due\" grace_hours=%lld\n", (long long)grace_hours);
        close_print(res);
        PQclear(res);
        return 0;
}

/* tally-admin key limit KEY --daily-limit-nanodollars N|none [--policy P]:
 * the same change as PUT /v1/keys/{id}/limit, by the same code, audited as admin. */
static int key_limit(PGconn *db, const char *key, const struct args *a)
{
        if (!key || !a->limit) {
                fprintf(stderr, "tally-admin: key limit needs a KEY and --daily-limit-nanodollars N (or none)\n");
                return -EINVAL;
        }
        json_t *lim = NULL;
        if (strcmp(a->limit, "none") == 0) {
                lim = json_null();
        } else {
                char *end;
                errno = 0;
                long long v = strtoll(a->limit, &end, 10);
                if (!*a->limit || *end || errno) {
                        fprintf(stderr, "tally-admin: --daily-limit-nanodollars must be a whole number or none\n");
                        return -EINVAL;
                }
                lim = json_integer(v);
        }
        json_t *pol = a->policy ? json_string(a->policy) : NULL;
        char l[24], p[16];
        struct api_error err = { 0 };
        int r = key_limit_parse(lim, pol, true, l, p, &err);
        json_decref(lim);
        json_decref(pol);
        if (r < 0) {
                fprintf(stderr, "tally-admin: %s\n", err.message);
                return -EINVAL;
        }
        const char *kp[] = { key };
        PGresult *res = PQexecParams(db, "SELECT account_id FROM api_keys WHERE id = $1", 1, NULL, kp, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                fprintf(stderr, "tally-admin: could not read the key: %s", PQerrorMessage(db));
                PQclear(res);
                return -EIO;
        }
        if (PQntuples(res) != 1) {
                PQclear(res);
                fprintf(stderr, "tally-admin: no key %s\n", key);
                return -ENOENT;
        }
        char account[EVENT_ID_MAX + 1];
        snprintf(account, sizeof(account), "%s", PQgetvalue(res, 0, 0));
        PQclear(res);
        json_t *k = NULL;
        if ((r = key_limit_set(db, account, key, "admin", l, p, &k, &err)) < 0) {
                fprintf(stderr, "tally-admin: could not set the limit: %s\n", err.message);
                return r;
        }
        if (a->json) {
                json_dumpf(k, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
                fputc('\n', stdout);
        } else {
                json_t *v = json_object_get(k, "daily_limit_nanodollars");
                printf("key=%s account=%s daily_limit_nanodollars=%s policy=%s spend_today_nanodollars=%lld "
                       "block_lifted=%s blocked_today=%s\n",
                       key, account, json_is_integer(v) ? a->limit : "none",
                       json_string_value(json_object_get(k, "limit_policy")),
                       (long long)json_integer_value(json_object_get(k, "spend_today_nanodollars")),
                       json_is_true(json_object_get(k, "block_lifted")) ? "true" : "false",
                       json_is_true(json_object_get(k, "blocked_today")) ? "true" : "false");
        }
        json_decref(k);
        return 0;
}

/* COMMAND ... --help: the lines of the help that describe COMMAND (its own
 * line and the indented ones under it). True when it printed them. */
static bool command_help(int argc, char **argv)
{
        bool asked = false;
        for (int i = 1; i < argc; i++)
                asked |= strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0;
        if (!asked || argc < 1 || argv[0][0] == '-')
                return false;
        size_t n = strlen(argv[0]);
        bool in = false, any = false;
        for (const char *line = program.details; *line;) {
                const char *end = strchr(line, '\n');
                size_t len = end ? (size_t)(end - line) : strlen(line);
                if (len > 2 && line[0] == ' ' && line[1] == ' ' && line[2] != ' ')
                        in = strncmp(line + 2, argv[0], n) == 0 && (line[2 + n] == ' ' || line[2 + n] == '\n' ||
                                                                  line[2 + n] == '\0');
                else if (len <= 2 || line[0] != ' ')
                        in = false;
                if (in) {
                        printf("%s%.*s\n", any ? "" : "Usage: tally-admin [options] ", (int)len - (any ? 0 : 2),
                               line + (any ? 0 : 2));
                        any = true;
                }
                line += len + (end ? 1 : 0);
        }
        return any;
}

static int command(PGconn *db, const struct admin_config *cfg, int argc, char **argv)
{
        int viewed = admin_view(db, argc, argv);
        if (viewed != -ENOSYS)
                return viewed;
        if (argc >= 1 && strcmp(argv[0], "close-month") == 0)
                return argc == 2 ? close_month(db, argv[1]) : -EINVAL;
        if (argc >= 1 && strcmp(argv[0], "close-due") == 0)
                return argc == 1 ? close_due(db, cfg->close_grace_hours) : -EINVAL;
        if (argc >= 1 && strcmp(argv[0], "host") == 0)
                return admin_host(db, argc - 1, argv + 1);
        if (argc >= 2 && strcmp(argv[0], "account") == 0 && strcmp(argv[1], "timezone") == 0)
                return admin_account_timezone(db, argc - 2, argv + 2);
        if (argc < 2)
                return -EINVAL;
        const char *what = argv[0], *verb = argv[1];
        struct args a = { 0 };
        int first = parse(argc - 1, argv + 1, &a);
        if (first < 0)
                return -EINVAL;
        const char *pos = first < argc - 1 ? argv[1 + first] : NULL;
        if (strcmp(what, "account") == 0 && strcmp(verb, "create") == 0) {
                if (!pos || !id_valid(pos)) {
                        fprintf(stderr, "tally-admin: account create needs an ID of 1 to 64 of A-Z a-z 0-9 _ . : -\n");
                        return -EINVAL;
                }
                const char *p[] = { pos, a.name ? a.name : pos, a.plan ? a.plan : "default" };
                int r = run_sql(db, "create the account",
                                "INSERT INTO accounts (id, name, plan_id) VALUES ($1, $2, $3)", 3, p);
                if (r < 0)
                        return r;
                printf("%s\n", pos);
                return 0;
        }
        if (strcmp(what, "person") == 0 && strcmp(verb, "create") == 0) {
                if (!a.account || !a.email) {
                        fprintf(stderr, "tally-admin: person create needs --account and --email\n");
                        return -EINVAL;
                }
                char hex[17], id[24];
                if (secret_hex(hex, 8) < 0)
                        return -EIO;
                snprintf(id, sizeof(id), "per_%s", hex);
                const char *p[] = { id, a.account, a.email };
                int r = run_sql(db, "create the person", "INSERT INTO people (id, account_id, email) VALUES ($1, $2, $3)",
                                3, p);
                if (r < 0)
                        return r;
                if ((r = set_password(db, a.email, a.password_file)) < 0) {
                        const char *d[] = { id };
                        run_sql(db, "undo the person", "DELETE FROM people WHERE id = $1", 1, d);
                        return r;
                }
                printf("%s\n", id);
                return 0;
        }
        if (strcmp(what, "person") == 0 && strcmp(verb, "password") == 0) {
                if (!a.email) {
                        fprintf(stderr, "tally-admin: person password needs --email\n");
                        return -EINVAL;
                }
                return set_password(db, a.email, a.password_file);
        }
        if (strcmp(what, "key") == 0 && strcmp(verb, "create") == 0) {
                if (!a.account) {
                        fprintf(stderr, "tally-admin: key create needs --account\n");
                        return -EINVAL;
                }
                json_t *limit = NULL;
                if (a.limit) {
                        char *end;
                        long long v = strtoll(a.limit, &end, 10);
                        if (*end || v < 0) {
                                fprintf(stderr, "tally-admin: --daily-limit-nanodollars must be a whole number\n");
                                return -EINVAL;
                        }
                        limit = json_integer(v);
                }
                json_t *k = NULL;
                struct api_error err = { 0 };
                int r = key_create(db, a.account, "admin", a.name, limit, a.policy, &k, &err);
                json_decref(limit);
                if (r < 0) {
                        fprintf(stderr, "tally-admin: could not create the key: %s\n", err.message);
                        return r;
                }
                printf("id=%s\nkey=%s\n", json_string_value(json_object_get(k, "id")),
                       json_string_value(json_object_get(k, "key")));
                json_decref(k);
                return 0;
        }
        if (strcmp(what, "key") == 0 && strcmp(verb, "limit") == 0)
                return key_limit(db, pos, &a);
        if (strcmp(what, "plan") == 0 && strcmp(verb, "assign") == 0) {
                if (!a.account || !a.plan) {
                        fprintf(stderr, "tally-admin: plan assign needs --account and --plan\n");
                        return -EINVAL;
                }
                const char *p[] = { a.account, a.plan };
                int r = run_sql(db, "assign the plan",
                                "WITH old AS (SELECT plan_id FROM accounts WHERE id = $1), "
                                "upd AS (UPDATE accounts SET plan_id = $2 WHERE id = $1 RETURNING 1) "
                                "INSERT INTO audit_log (account_id, actor, action, object_id, old_value, new_value) "
                                "SELECT $1, 'admin', 'account.plan', $1, to_jsonb(old.plan_id), to_jsonb($2::text) "
                                "FROM old, upd",
                                2, p);
                if (r == 0) {
                        fprintf(stderr, "tally-admin: no account %s\n", a.account);
                        return -ENOENT;
                }
                return r < 0 ? r : 0;
        }
        return -EINVAL;
}

int main(int argc, char **argv)
{
        struct admin_config cfg = { 0 };
        /* COMMAND --help needs no database: the command is the first word that is not
         * a setting (every setting of tally-admin takes a value: --name VALUE or --name=VALUE). */
        for (int i = 1; i < argc; i++) {
                if (strcmp(argv[i], "--") == 0)
                        break;
                if (argv[i][0] != '-') {
                        if (command_help(argc - i, argv + i))
                                return 0;
                        break;
                }
                if (argv[i][1] == '-' && !strchr(argv[i], '=') && strcmp(argv[i], "--help") != 0)
                        i++;
        }
        int argi = argc;
        int r = config_main(&program, settings, &cfg, argc, argv, &argi);
        if (r >= 0)
                return r;
        if (argi >= argc) {
                config_print_help(&program, settings);
                config_free(settings, &cfg);
                return 2;
        }

        char err[512];
        PGconn *db = db_connect(cfg.database_url, err, sizeof(err));
        if (!db || db_check_schema(db, err, sizeof(err)) < 0) {
                fprintf(stderr, "tally-admin: %s\n", err);
                PQfinish(db);
                config_free(settings, &cfg);
                return 1;
        }
        r = command(db, &cfg, argc - argi, argv + argi);
        if (r == -EINVAL)
                fprintf(stderr, "tally-admin: unknown or incomplete command (see --help)\n");
        PQfinish(db);
        config_free(settings, &cfg);
        return r < 0 ? 1 : 0;
}
