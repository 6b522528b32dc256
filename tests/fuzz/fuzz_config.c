/* fuzz_config.c — the configuration loader (common/config.c) on hostile
 * input from all three of its sources at once: the config file, the
 * environment and the command line.
 *
 * The input is three parts split by NUL bytes: the config file's text; the
 * environment, one NAME=VALUE a line (set as TALLY_<NAME>); the arguments,
 * one a line. Loaded against a table with every kind of setting. Checked:
 * a load that succeeds leaves every required setting set and every bounded
 * integer within its bounds; one that fails says why; nothing leaks. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "fuzz_config: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

struct cfg {
        char *database_url;
        char *log_level;
        char *name;
        int64_t port;
        int64_t any;
        int64_t negative;
        bool flag;
        bool other_flag;
};

static const struct setting table[] = {
        { "database_url", SETTING_STRING, NULL, true, offsetof(struct cfg, database_url), 0, 0, "required" },
        { "log_level", SETTING_STRING, "info", false, offsetof(struct cfg, log_level), 0, 0, "with a default" },
        { "name", SETTING_STRING, NULL, false, offsetof(struct cfg, name), 0, 0, "optional" },
        { "port", SETTING_INT, "8080", false, offsetof(struct cfg, port), 1, 65535, "bounded" },
        { "any", SETTING_INT, NULL, false, offsetof(struct cfg, any), 0, 0, "any integer" },
        { "negative", SETTING_INT, "-5", false, offsetof(struct cfg, negative), INT64_MIN, -1, "negative" },
        { "flag", SETTING_BOOL, "false", false, offsetof(struct cfg, flag), 0, 0, "a flag" },
        { "other_flag", SETTING_BOOL, NULL, false, offsetof(struct cfg, other_flag), 0, 0, "another" },
        SETTINGS_END,
};

static const struct program_info prog = { "tally-fuzz", "fuzzing the loader", "[options]", NULL };
static char file_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
        (void)argc, (void)argv;
        snprintf(file_path, sizeof(file_path), "/tmp/tally-fuzz-config.%d.ini", (int)getpid());
        /* --help and --version print; nobody reads it. */
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
                dup2(null, STDOUT_FILENO);
                close(null);
        }
        unsetenv("TALLY_CONFIG");
        return 0;
}

/* The next part of [*p, end) up to a NUL, as a fresh string. */
static char *part(const uint8_t **p, const uint8_t *end)
{
        const uint8_t *q = *p;
        while (q < end && *q)
                q++;
        char *s = malloc((size_t)(q - *p) + 1);
        if (!s)
                abort();
        memcpy(s, *p, (size_t)(q - *p));
        s[q - *p] = '\0';
        *p = q < end ? q + 1 : q;
        return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        static bool ready;
        if (!ready) {
                LLVMFuzzerInitialize(NULL, NULL);
                ready = true;
        }
        const uint8_t *p = data, *end = data + size;
        char *file = part(&p, end), *env = part(&p, end), *args = part(&p, end);

        FILE *f = fopen(file_path, "w");
        if (!f)
                abort();
        fputs(file, f);
        fclose(f);

        /* The environment: TALLY_<NAME> for each NAME=VALUE line. */
        char *names[32];
        int nnames = 0;
        for (char *line = strtok(env, "\n"); line && nnames < 32; line = strtok(NULL, "\n")) {
                char *eq = strchr(line, '=');
                if (!eq || eq == line)
                        continue;
                *eq = '\0';
                char name[80];
                size_t n = (size_t)snprintf(name, sizeof(name), "TALLY_");
                for (char *c = line; *c && n + 1 < sizeof(name); c++)
                        name[n++] = (char)toupper((unsigned char)*c);
                name[n] = '\0';
                if (strcmp(name, "TALLY_CONFIG") == 0) /* a path: would read any file */
                        continue;
                if (setenv(name, eq + 1, 1) == 0 && !(names[nnames++] = strdup(name)))
                        abort();
        }

        /* The arguments: --config FILE first when the file has text. */
        char *argv[66];
        int argc = 0;
        argv[argc++] = "tally-fuzz";
        char config_arg[96];
        if (*file) {
                snprintf(config_arg, sizeof(config_arg), "--config=%s", file_path);
                argv[argc++] = config_arg;
        }
        for (char *line = args; line && argc < 65;) {
                char *nl = strchr(line, '\n');
                if (nl)
                        *nl = '\0';
                /* Another --config would read any file the fuzzer names (/dev/zero never ends). */
                if (strncmp(line, "--config", 8) != 0 && strncmp(line, "-config", 7) != 0)
                        argv[argc++] = line;
                line = nl ? nl + 1 : NULL;
        }
        argv[argc] = NULL;

        struct cfg c;
        memset(&c, 0, sizeof(c));
        char err[512] = "";
        int argi = -1;
        int r = config_load(&prog, table, &c, argc, argv, &argi, err, sizeof(err));
        if (r == CONFIG_OK) {
                if (!c.database_url)
                        FAIL("loaded without the required database_url");
                if (!c.log_level)
                        FAIL("log_level lost its default");
                if (c.port < 1 || c.port > 65535)
                        FAIL("port %lld outside 1..65535", (long long)c.port);
                if (c.negative > -1)
                        FAIL("negative is %lld", (long long)c.negative);
                if (argi < 1 || argi > argc)
                        FAIL("first positional argument %d of %d", argi, argc);
        } else if (r < 0) {
                if (!err[0] || !memchr(err, '\0', sizeof(err)))
                        FAIL("refused (%d) without a message", r);
        } else if (r != CONFIG_EXIT) {
                FAIL("config_load returned %d", r);
        }
        config_free(table, &c);

        for (int i = 0; i < nnames; i++) {
                unsetenv(names[i]);
                free(names[i]);
        }
        free(file);
        free(env);
        free(args);
        return 0;
}
