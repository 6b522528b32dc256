/* builder.c — see builder.h. */
#include "builder.h"
#include "jail.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int report_fd = -1;

static char config[CONFIG_MAX];
struct jail_config cfg;

_Noreturn void fail(const char *fmt, ...)
{
        int e = errno;
        char buf[512];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        if (n < 0)
                n = 0;
        if ((size_t)n >= sizeof(buf))
                n = sizeof(buf) - 1;
        if (e)
                n += snprintf(buf + n, sizeof(buf) - (size_t)n, ": %s", strerror(e));
        if ((size_t)n >= sizeof(buf) - 1)
                n = sizeof(buf) - 2;
        if (report_fd == 2)
                buf[n++] = '\n';
        ssize_t w = write(report_fd, buf, (size_t)n);
        (void)w;
        _exit(1);
}

void read_config(void)
{
        size_t len = 0;
        ssize_t n;
        if (lseek(JAIL_FD_CONFIG, 0, SEEK_SET) < 0)
                fail("could not read the configuration");
        while ((n = read(JAIL_FD_CONFIG, config + len, sizeof(config) - 1 - len)) > 0)
                len += (size_t)n;
        if (n < 0)
                fail("could not read the configuration");
        close(JAIL_FD_CONFIG);
        config[len] = '\0';
        bool args = false;
        size_t argc = 0;
        for (size_t at = 0; at < len; at += strlen(config + at) + 1) {
                char *s = config + at;
                if (args) {
                        if (argc < ARGS_MAX)
                                cfg.argv[argc++] = s;
                        continue;
                }
                if (strcmp(s, "--") == 0) {
                        args = true;
                        continue;
                }
                char *eq = strchr(s, '=');
                if (!eq)
                        continue;
                *eq = '\0';
                const char *v = eq + 1;
                if (strcmp(s, "id") == 0)
                        cfg.id = v;
                else if (strcmp(s, "dir") == 0)
                        cfg.dir = v;
                else if (strcmp(s, "disk_bytes") == 0)
                        cfg.disk_bytes = v;
                else if (strcmp(s, "network") == 0)
                        cfg.network = v;
                else if (strcmp(s, "copy_from") == 0)
                        cfg.copy_from = v;
                else if (strcmp(s, "copy_from_id") == 0)
                        cfg.copy_from_id = v;
                else if (strcmp(s, "pid") == 0)
                        cfg.pid = v;
                else if (strcmp(s, "cgroup") == 0 && cfg.ncgroups < CGROUPS_MAX)
                        cfg.cgroups[cfg.ncgroups++] = v;
        }
        cfg.argv[argc] = NULL;
}

void write_file(const char *path, const char *text, mode_t mode)
{
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
        if (fd < 0)
                fail("could not create %s", path);
        size_t len = strlen(text);
        if (write(fd, text, len) != (ssize_t)len)
                fail("could not write %s", path);
        close(fd);
}

void make_dir(const char *path, mode_t mode)
{
        if (mkdir(path, mode) < 0 && errno != EEXIST)
                fail("could not create %s", path);
}

void path(char *buf, size_t size, const char *a, const char *b)
{
        if (snprintf(buf, size, "%s/%s", a, b) >= (int)size) {
                errno = ENAMETOOLONG;
                fail("path too long");
        }
}
