/* watch.c — see watch.h. */
#include "watch.h"
#include "log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

int watch_open(struct watch *w, const char *state_dir, const char *registry_dir)
{
        w->state_dir = state_dir;
        w->registry_dir = registry_dir;
        w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
        if (w->fd < 0 ||
            inotify_add_watch(w->fd, registry_dir, IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE) < 0)
                return -errno;
        return 0;
}

void watch_close(struct watch *w)
{
        watch_clear(w);
        free(w->changed);
        w->changed = NULL;
        w->changed_cap = 0;
        if (w->fd >= 0)
                close(w->fd);
        w->fd = -1;
}

/* Reads one record inotify named into w->changed (nothing for other files). */
static void read_changed(struct watch *w, const char *name, bool *ret_full)
{
        size_t len = strlen(name);
        if (len <= 5 || strcmp(name + len - 5, ".json") != 0 || len - 5 > EVENT_ID_MAX)
                return;
        if (w->nchanged == w->changed_cap) {
                size_t cap = w->changed_cap ? w->changed_cap * 2 : 64;
                struct changed_record *l = realloc(w->changed, cap * sizeof(*l));
                if (!l) {
                        *ret_full = true; /* read every record instead */
                        return;
                }
                w->changed = l;
                w->changed_cap = cap;
        }
        struct changed_record *ch = &w->changed[w->nchanged];
        memcpy(ch->id, name, len - 5);
        ch->id[len - 5] = '\0';
        int r = registry_read(w->state_dir, ch->id, &ch->rec);
        if (r < 0 && r != -ENOENT) {
                log_warn("skipping an invalid registry record", "sandbox=%s", ch->id);
                return;
        }
        ch->gone = r == -ENOENT;
        w->nchanged++;
}

void watch_clear(struct watch *w)
{
        for (size_t i = 0; i < w->nchanged; i++)
                if (!w->changed[i].gone)
                        sandbox_record_clear(&w->changed[i].rec);
        w->nchanged = 0;
        registry_list_free(w->listed, w->nlisted);
        w->listed = NULL;
        w->nlisted = 0;
        w->full_read = false;
}

/* Reads the records inotify says changed since the last call (or every record
 * if its queue overflowed), without acting on them: quick enough to run under
 * the moment lock. records_apply (records.h) acts on them. */
void watch_collect(struct watch *w)
{
        char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
        bool full = false;
        for (;;) {
                ssize_t n = read(w->fd, buf, sizeof(buf));
                if (n <= 0)
                        break;
                for (char *p = buf; p < buf + n;) {
                        const struct inotify_event *ev = (const struct inotify_event *)p;
                        if (ev->mask & IN_Q_OVERFLOW)
                                full = true;
                        else if (ev->len > 0 && !full)
                                read_changed(w, ev->name, &full);
                        p += sizeof(*ev) + ev->len;
                }
        }
        if (!full)
                return;
        /* Every record as it is now: newer than anything the queue held. */
        watch_clear(w);
        int n = registry_list(w->state_dir, &w->listed);
        if (n < 0) {
                log_error("could not read the registry", "path=%s error=\"%s\"", w->registry_dir, strerror(-n));
                w->listed = NULL;
                return; /* the periodic rescan catches up */
        }
        w->nlisted = n;
        w->full_read = true;
}
