/* process_files.c — the files the process backend keeps in a sandbox's
 * folder beside the daemon's: the main program's argv (for a fork after a
 * restart), the lease's end the init reads, and the path of the init's exec
 * socket (see process_sandbox.h). */
#include "jail.h"
#include "process_sandbox.h"
#include "registry.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define COMMAND_FILE "command"   /* the main program's argv, NUL-separated */

int process_write_command(const char *dir, char **command)
{
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/" COMMAND_FILE, dir);
        FILE *f = fopen(path, "we");
        if (!f)
                return -errno;
        for (char **c = command; c && *c; c++)
                fwrite(*c, 1, strlen(*c) + 1, f);
        return fclose(f) == 0 ? 0 : -errno;
}

int process_read_command(const char *dir, char ***ret)
{
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/" COMMAND_FILE, dir);
        FILE *f = fopen(path, "re");
        if (!f)
                return -errno;
        char *buf = NULL;
        size_t len = 0, cap = 0;
        char chunk[4096];
        size_t n;
        while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
                if (len + n + 1 > cap) {
                        cap = (len + n + 1) * 2;
                        char *b = realloc(buf, cap);
                        if (!b) {
                                free(buf);
                                fclose(f);
                                return -ENOMEM;
                        }
                        buf = b;
                }
                memcpy(buf + len, chunk, n);
                len += n;
        }
        fclose(f);
        if (len == 0) {
                free(buf);
                *ret = NULL;
                return 0;
        }
        size_t count = 0;
        for (size_t i = 0; i < len; i++)
                count += buf[i] == '\0';
        char **argv = calloc(count + 1, sizeof(*argv));
        if (!argv) {
                free(buf);
                return -ENOMEM;
        }
        size_t at = 0;
        for (size_t i = 0; i < count; i++) {
                argv[i] = buf + at;
                at += strlen(buf + at) + 1;
        }
        *ret = argv;
        return 0;
}

/* The lease file: a fixed-width decimal so that rewriting it in place (the
 * init keeps it open) never leaves a shorter number behind. */
int process_write_lease(const char *dir, int64_t deadline_wall_ns)
{
        char path[PATH_MAX + 16], text[32];
        snprintf(path, sizeof(path), "%s/" JAIL_LEASE_FILE, dir);
        int n = snprintf(text, sizeof(text), "%020lld\n", (long long)(deadline_wall_ns > 0 ? deadline_wall_ns : 0));
        int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        int r = pwrite(fd, text, (size_t)n, 0) == n ? 0 : -EIO;
        if (close(fd) < 0 && r == 0)
                r = -errno;
        return r;
}

/* The daemon's spec carries the deadline once it fills lease_deadline_wall_ns;
 * until then it is read from the record. */
int64_t process_start_deadline(const struct sandbox_spec *spec, const char *dir)
{
        if (spec->lease_deadline_wall_ns > 0)
                return spec->lease_deadline_wall_ns;
        char state[PATH_MAX];
        snprintf(state, sizeof(state), "%s", dir);
        for (int up = 0; up < 2; up++) {
                char *slash = strrchr(state, '/');
                if (!slash || slash == state)
                        return 0;
                *slash = '\0';
        }
        struct sandbox_record rec;
        if (registry_read(state, spec->id, &rec) < 0)
                return 0;
        int64_t deadline = rec.timeout_ns;
        sandbox_record_clear(&rec);
        return deadline;
}

bool process_init_socket_path(const char *dir, struct sockaddr_un *a)
{
        *a = (struct sockaddr_un){ .sun_family = AF_UNIX };
        return snprintf(a->sun_path, sizeof(a->sun_path), "%s/init.sock", dir) < (int)sizeof(a->sun_path);
}
