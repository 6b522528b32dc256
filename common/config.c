/* config.c — see config.h. Nothing here may exit the process: errors go back
 * to the caller with a message, so tests can check every refusal. */
#include "config.h"
#include "log.h"
#include "tally_build.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set_error(char *errbuf, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_error(char *errbuf, size_t errlen, const char *fmt, ...)
{
        va_list ap;
        va_start(ap, fmt);
        if (errbuf && errlen)
                vsnprintf(errbuf, errlen, fmt, ap);
        va_end(ap);
}

int config_parse_int(const char *s, int64_t *ret)
{
        if (!s || !*s)
                return -EINVAL;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (errno || *end != '\0' || isspace((unsigned char)*s))
                return -EINVAL;
        *ret = v;
        return 0;
}

int config_parse_bool(const char *s, bool *ret)
{
        static const char *const yes[] = { "1", "true", "yes", "on" };
        static const char *const no[] = { "0", "false", "no", "off" };
        for (size_t i = 0; i < 4; i++) {
                if (strcasecmp(s, yes[i]) == 0) {
                        *ret = true;
                        return 0;
                }
                if (strcasecmp(s, no[i]) == 0) {
                        *ret = false;
                        return 0;
                }
        }
        return -EINVAL;
}

/* Compares a key as typed (dashes or underscores) with a table name. */
static bool key_matches(const char *name, const char *key, size_t keylen)
{
        size_t i = 0;
        for (; i < keylen && name[i]; i++) {
                char k = key[i] == '-' ? '_' : key[i];
                if (k != name[i])
                        return false;
        }
        return i == keylen && name[i] == '\0';
}

static const struct setting *find(const struct setting *table, const char *key, size_t keylen)
{
        for (const struct setting *s = table; s->name; s++)
                if (key_matches(s->name, key, keylen))
                        return s;
        return NULL;
}

static int assign(const struct setting *s, void *cfg, const char *value, const char *source,
                  char *errbuf, size_t errlen)
{
        char *field = (char *)cfg + s->offset;
        switch (s->type) {
        case SETTING_STRING: {
                char *copy = strdup(value);
                if (!copy)
                        return -ENOMEM;
                free(*(char **)field);
                *(char **)field = copy;
                return 0;
        }
        case SETTING_INT: {
                int64_t v;
                if (config_parse_int(value, &v) < 0) {
                        set_error(errbuf, errlen, "invalid value for %s from %s: \"%s\" is not an integer",
                             s->name, source, value);
                        return -EINVAL;
                }
                if ((s->min != 0 || s->max != 0) && (v < s->min || v > s->max)) {
                        set_error(errbuf, errlen,
                             "invalid value for %s from %s: %lld is outside %lld..%lld", s->name,
                             source, (long long)v, (long long)s->min, (long long)s->max);
                        return -ERANGE;
                }
                *(int64_t *)field = v;
                return 0;
        }
        case SETTING_BOOL: {
                bool b;
                if (config_parse_bool(value, &b) < 0) {
                        set_error(errbuf, errlen,
                             "invalid value for %s from %s: \"%s\" is not a boolean (true or false)",
                             s->name, source, value);
                        return -EINVAL;
                }
                *(bool *)field = b;
                return 0;
        }
        }
        return -EINVAL;
}

struct file_ctx {
        const char *program;
        const char *path;
        const struct setting *table;
        void *cfg;
        char *errbuf;
        size_t errlen;
        int error;
        bool *seen; /* which settings got a value, for the required check */
};

/* inih reports the line of the first handler refusal as ini_parse's result;
 * the message gets the line appended there. */
static int on_ini(void *user, const char *section, const char *name, const char *value)
{
        struct file_ctx *ctx = user;
        if (ctx->error)
                return 0;
        /* Sections named for other programs belong to them. */
        if (section[0] && strcmp(section, ctx->program) != 0)
                return 1;
        const struct setting *s = find(ctx->table, name, strlen(name));
        if (!s) {
                set_error(ctx->errbuf, ctx->errlen, "unknown setting \"%s\" in %s", name, ctx->path);
                ctx->error = -EINVAL;
                return 0;
        }
        int r = assign(s, ctx->cfg, value, ctx->path, ctx->errbuf, ctx->errlen);
        if (r < 0) {
                ctx->error = r;
                return 0;
        }
        ctx->seen[s - ctx->table] = true;
        return 1;
}

static void env_name(char *out, size_t size, const char *name)
{
        size_t n = (size_t)snprintf(out, size, "TALLY_");
        for (; *name && n + 1 < size; name++)
                out[n++] = (char)toupper((unsigned char)*name);
        out[n] = '\0';
}

void config_print_help(const struct program_info *prog, const struct setting *table)
{
        printf("Usage: %s %s\n%s\n\nOptions (each also a config-file key and a TALLY_ variable):\n",
               prog->name, prog->usage ? prog->usage : "[options]", prog->summary);
        printf("  --config=FILE           read settings from an INI file (also TALLY_CONFIG)\n");
        for (const struct setting *s = table; s->name; s++) {
                char flag[64], env[64];
                snprintf(flag, sizeof(flag), "--%s=%s", s->name,
                         s->type == SETTING_INT ? "N" : s->type == SETTING_BOOL ? "BOOL" : "STR");
                for (char *p = flag + 2; *p && *p != '='; p++)
                        if (*p == '_')
                                *p = '-';
                env_name(env, sizeof(env), s->name);
                printf("  %-23s %s\n", flag, s->help);
                printf("  %-23s [%s; %s%s%s]\n", "", env, s->required ? "required" : "default ",
                       s->required ? "" : (s->default_value && *s->default_value ? s->default_value : "none"),
                       "");
        }
        printf("  --help                  print this help and exit\n");
        printf("  --version               print the version and exit\n");
        if (prog->details)
                printf("\n%s\n", prog->details);
}

int config_load(const struct program_info *prog, const struct setting *table, void *cfg,
                int argc, char **argv, int *ret_argi, char *errbuf, size_t errlen)
{
        size_t count = 0;
        while (table[count].name)
                count++;
        bool *seen = calloc(count + 1, sizeof(bool));
        if (!seen)
                return -ENOMEM;
        int r;

        /* Pass 1: help, version and the config file path, before anything can fail. */
        const char *config_path = getenv("TALLY_CONFIG");
        int first_positional = argc;
        for (int i = 1; i < argc; i++) {
                const char *a = argv[i];
                if (strcmp(a, "--") == 0 || a[0] != '-' || a[1] == '\0') {
                        first_positional = strcmp(a, "--") == 0 ? i + 1 : i;
                        break;
                }
                if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
                        config_print_help(prog, table);
                        r = CONFIG_EXIT;
                        goto fail;
                }
                if (strcmp(a, "--version") == 0) {
                        printf("%s %s\n", prog->name, TALLY_VERSION);
                        r = CONFIG_EXIT;
                        goto fail;
                }
                if (strncmp(a, "--config=", 9) == 0)
                        config_path = a + 9;
                else if (strcmp(a, "--config") == 0 && i + 1 < argc)
                        config_path = argv[++i];
                else if (!strchr(a, '=') && i + 1 < argc && a[1] == '-') {
                        const struct setting *s = find(table, a + 2, strlen(a + 2));
                        if (s && s->type != SETTING_BOOL)
                                i++; /* skip the value of "--name value" */
                }
        }

        /* Defaults. */
        for (const struct setting *s = table; s->name; s++)
                if (s->default_value && (r = assign(s, cfg, s->default_value, "default", errbuf, errlen)) < 0)
                        goto fail;

        if (config_path && *config_path) {
                struct file_ctx ctx = { prog->name, config_path, table, cfg, errbuf, errlen, 0, seen };
                int lr = ini_parse(config_path, on_ini, &ctx);
                if (ctx.error) {
                        size_t used = strlen(errbuf);
                        if (lr > 0 && used < errlen)
                                snprintf(errbuf + used, errlen - used, " line %d", lr);
                        r = ctx.error;
                        goto fail;
                }
                if (lr == -1) {
                        set_error(errbuf, errlen, "could not open config file %s: %s", config_path, strerror(errno));
                        r = -ENOENT;
                        goto fail;
                }
                if (lr != 0) {
                        set_error(errbuf, errlen, "could not parse config file %s: syntax error at line %d",
                             config_path, lr);
                        r = -EINVAL;
                        goto fail;
                }
        }

        for (const struct setting *s = table; s->name; s++) {
                char env[96];
                env_name(env, sizeof(env), s->name);
                const char *v = getenv(env);
                if (!v)
                        continue;
                if ((r = assign(s, cfg, v, env, errbuf, errlen)) < 0)
                        goto fail;
                seen[s - table] = true;
        }

        for (int i = 1; i < first_positional; i++) {
                const char *a = argv[i];
                if (strncmp(a, "--config", 8) == 0 && (a[8] == '\0' || a[8] == '=')) {
                        if (a[8] == '\0')
                                i++;
                        continue;
                }
                if (a[0] != '-' || a[1] != '-') {
                        set_error(errbuf, errlen, "unknown option \"%s\" (try --help)", a);
                        r = -EINVAL;
                        goto fail;
                }
                const char *key = a + 2;
                const char *eq = strchr(key, '=');
                size_t keylen = eq ? (size_t)(eq - key) : strlen(key);
                const struct setting *s = find(table, key, keylen);
                if (!s) {
                        set_error(errbuf, errlen, "unknown option \"--%.*s\" (try --help)", (int)keylen, key);
                        r = -EINVAL;
                        goto fail;
                }
                const char *value;
                if (eq)
                        value = eq + 1;
                else if (s->type == SETTING_BOOL)
                        value = "true";
                else if (i + 1 < first_positional) {
                        value = argv[++i];
                } else {
                        set_error(errbuf, errlen, "option --%s needs a value", s->name);
                        r = -EINVAL;
                        goto fail;
                }
                char source[96];
                snprintf(source, sizeof(source), "--%.*s", (int)keylen, key);
                if ((r = assign(s, cfg, value, source, errbuf, errlen)) < 0)
                        goto fail;
                seen[s - table] = true;
        }

        for (const struct setting *s = table; s->name; s++) {
                if (!s->required || s->default_value || seen[s - table])
                        continue;
                char env[96], flag[96];
                env_name(env, sizeof(env), s->name);
                snprintf(flag, sizeof(flag), "%s", s->name);
                for (char *p = flag; *p; p++)
                        if (*p == '_')
                                *p = '-';
                set_error(errbuf, errlen, "missing required setting %s: set it in the config file, as %s, or with --%s",
                          s->name, env, flag);
                r = -EINVAL;
                goto fail;
        }
        if (ret_argi)
                *ret_argi = first_positional;
        r = CONFIG_OK;
fail:
        free(seen);
        return r;
}

void config_free(const struct setting *table, void *cfg)
{
        if (!cfg)
                return;
        for (const struct setting *s = table; s->name; s++)
                if (s->type == SETTING_STRING) {
                        char **field = (char **)((char *)cfg + s->offset);
                        free(*field);
                        *field = NULL;
                }
}

int config_main(const struct program_info *prog, const struct setting *table, void *cfg,
                int argc, char **argv, int *ret_argi)
{
        char err[512] = "";
        log_set_component(prog->name);
        int r = config_load(prog, table, cfg, argc, argv, ret_argi, err, sizeof(err));
        if (r == CONFIG_EXIT) {
                config_free(table, cfg);
                return 0;
        }
        if (r < 0) {
                /* Once, as a sentence: nothing else has been logged yet, and a person reads it. */
                fprintf(stderr, "%s: %s\n", prog->name, err);
                config_free(table, cfg);
                return 2;
        }
        const struct setting *lvl = find(table, "log_level", 9);
        if (lvl) {
                const char *name = *(char **)((char *)cfg + lvl->offset);
                enum log_level level;
                if (!name || log_level_parse(name, &level) < 0) {
                        fprintf(stderr, "%s: invalid value for log_level: \"%s\" (debug, info, warn or error)\n",
                                prog->name, name ? name : "");
                        config_free(table, cfg);
                        return 2;
                }
                log_set_level(level);
        }
        return -1; /* go on */
}
