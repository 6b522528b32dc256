/* spool.c — see spool.h. */
#include "spool.h"
#include "event.h"
#include "log.h"
#include "state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int entry_path(const struct spool *s, const char *sandbox, char *buf, size_t size)
{
        int n = snprintf(buf, size, "%s/%s.json", s->dir, sandbox);
        return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

static struct spool_entry *entry_new(const char *sandbox, const char *account, const char *payload, size_t len)
{
        struct spool_entry *e = calloc(1, sizeof(*e));
        if (!e)
                return NULL;
        e->payload = malloc(len + 1);
        if (!e->payload) {
                free(e);
                return NULL;
        }
        memcpy(e->payload, payload, len);
        e->payload[len] = '\0';
        e->len = len;
        snprintf(e->sandbox, sizeof(e->sandbox), "%s", sandbox);
        snprintf(e->account, sizeof(e->account), "%s", account);
        return e;
}

static void link_entry(struct spool *s, struct spool_entry *e)
{
        e->next = s->head;
        s->head = e;
        s->count++;
        s->bytes += e->len;
}

static void load_one(struct spool *s, const char *name)
{
        char path[8192], buf[8192];
        snprintf(path, sizeof(path), "%s/%s", s->dir, name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        struct usage_event ev = { 0 };
        char why[256] = "unreadable";
        if (n <= 0 || event_decode(buf, (size_t)n, &ev, why, sizeof(why)) < 0 || ev.type != EVENT_SAMPLE) {
                char bad[8200];
                snprintf(bad, sizeof(bad), "%s.bad", path);
                rename(path, bad);
                log_error("moved aside a spool entry that is not a sample", "path=%s reason=\"%s\"", bad, why);
                event_clear(&ev);
                return;
        }
        struct spool_entry *e = entry_new(ev.sandbox, ev.account, buf, (size_t)n);
        event_clear(&ev);
        if (e)
                link_entry(s, e);
}

int spool_open(struct spool *s, const char *state_dir)
{
        memset(s, 0, sizeof(*s));
        int n = snprintf(s->dir, sizeof(s->dir), "%s/" COLLECTOR_DIR "/spool", state_dir);
        if (n < 0 || (size_t)n >= sizeof(s->dir))
                return -ENAMETOOLONG;
        DIR *d = opendir(s->dir);
        if (!d)
                return -errno;
        struct dirent *de;
        while ((de = readdir(d))) {
                size_t len = strlen(de->d_name);
                if (len > 5 && strcmp(de->d_name + len - 5, ".json") == 0)
                        load_one(s, de->d_name);
        }
        closedir(d);
        return 0;
}

struct spool_entry *spool_find(struct spool *s, const char *sandbox)
{
        for (struct spool_entry *e = s->head; e; e = e->next)
                if (strcmp(e->sandbox, sandbox) == 0)
                        return e;
        return NULL;
}

struct spool_entry *spool_add(struct spool *s, const char *sandbox, const char *account, const char *payload,
                              size_t len)
{
        char path[8192];
        if (spool_find(s, sandbox)) {
                errno = EEXIST;
                return NULL;
        }
        int r = entry_path(s, sandbox, path, sizeof(path));
        if (r == 0)
                r = state_write_atomic(path, payload, len);
        if (r < 0) {
                errno = -r;
                return NULL;
        }
        struct spool_entry *e = entry_new(sandbox, account, payload, len);
        if (!e) {
                /* The file stays: the next start sends it. */
                errno = ENOMEM;
                return NULL;
        }
        link_entry(s, e);
        return e;
}

static void unlink_entry(struct spool *s, struct spool_entry *e)
{
        for (struct spool_entry **p = &s->head; *p; p = &(*p)->next)
                if (*p == e) {
                        *p = e->next;
                        s->count--;
                        s->bytes -= e->len;
                        return;
                }
}

int spool_done(struct spool *s, struct spool_entry *e)
{
        char path[8192];
        int r = entry_path(s, e->sandbox, path, sizeof(path));
        if (r == 0 && unlink(path) < 0 && errno != ENOENT)
                r = -errno;
        unlink_entry(s, e);
        free(e->payload);
        free(e);
        return r;
}

void spool_close(struct spool *s)
{
        if (!s)
                return;
        while (s->head) {
                struct spool_entry *e = s->head;
                s->head = e->next;
                free(e->payload);
                free(e);
        }
        s->count = s->bytes = 0;
}
