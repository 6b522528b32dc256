/* watch.h — learning which registry records changed: inotify on
 * <state_dir>/sandboxes, each named record read as it is now (registry.h), or
 * every record when the inotify queue overflowed.
 *
 * Reading is kept apart from acting (records.h) so the tick can read under
 * the registry's moment lock and act after releasing it. The watch owns the
 * inotify descriptor and the records it read until watch_clear. */
#pragma once

#include "event.h"
#include "registry.h"

#include <stdbool.h>
#include <stddef.h>

/* A registry record inotify said changed: its content at the read, or gone. */
struct changed_record {
        bool gone;
        char id[EVENT_ID_MAX + 1];
        struct sandbox_record rec;
};

struct watch {
        int fd;                       /* inotify, -1: not open */
        const char *state_dir;        /* borrowed */
        const char *registry_dir;     /* borrowed: <state_dir>/sandboxes */
        /* Records read while the moment lock was held, applied once it is released (reading is
         * quick; applying may open files, walk a disk folder or fsync a final sample). */
        struct changed_record *changed;
        size_t nchanged, changed_cap;
        struct sandbox_record *listed; /* a full re-read (the inotify queue overflowed) ... */
        int nlisted;
        bool full_read;               /* ... when set */
};

/* Watches registry_dir (under state_dir; both borrowed). Returns 0 or -errno. */
int watch_open(struct watch *w, const char *state_dir, const char *registry_dir);

/* Frees what was read and closes the descriptor. */
void watch_close(struct watch *w);

/* Reads the records inotify says changed since the last call (or every
 * record, into listed with full_read set, if its queue overflowed), without
 * acting on them: quick enough to run under the moment lock. */
void watch_collect(struct watch *w);

/* Frees what watch_collect read. */
void watch_clear(struct watch *w);
