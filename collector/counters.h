/* counters.h — where a tick's readings come from: each sandbox's cgroup
 * counter files (cgroup.h), kept open within a descriptor budget, and the BPF
 * cgroup walk (cgroup_scan.h) that reads every watched cgroup at once when it
 * loads. A sandbox the walk did not see this tick is read from its files.
 *
 * The counters module owns the walk and the descriptor budget; it opens and
 * closes a sandbox's files and scan refs (struct sandbox's files, scan_cpu,
 * scan_mem, peak fields), and reads nothing else of it. */
#pragma once

#include "cgroup.h"
#include "cgroup_scan.h"
#include "collector.h"
#include "table.h"

#include <stdbool.h>
#include <stddef.h>

struct counters {
        struct cgroup_scan *scan;     /* the BPF cgroup walk, or NULL: every sandbox is read from its files */
        bool scanned;                 /* this tick's walk succeeded */
        bool scan_error_logged;
        bool read_peak;               /* note each sandbox's peak file */
        size_t kept_fds, fd_budget;   /* counter descriptors open, and how many we may keep */
        bool transient_logged;
        struct collector_metrics *m;  /* borrowed */
};

/* Raises the descriptor limit and sizes the budget; loads the walk unless
 * reader is "files" (reader "scan": a walk that does not load is an error;
 * "auto": files then). Returns 0 or -errno with a reason in err. */
int counters_init(struct counters *cn, const char *reader, bool read_peak, struct collector_metrics *m, char *err,
                  size_t errlen);

/* Frees the walk. */
void counters_free(struct counters *cn);

/* Opens s's counter files (outside the hot path) and has the walk watch its
 * cgroups. Returns 0 or -errno (logged once until it opens). */
int counters_open(struct counters *cn, struct sandbox *s);

/* Closes s's counter files and gives their descriptors back to the budget. */
void counters_close(struct counters *cn, struct sandbox *s);

/* Walks every root once for this tick (peaks: read watermarks too); on
 * failure this tick reads files. */
void counters_scan_tick(struct counters *cn, bool peaks);

/* Asks the cache for what counters_read_scanned will read of s (a hint). */
void counters_prefetch(const struct counters *cn, const struct sandbox *s);

/* This tick's reading of s from the walk, if it saw s's cgroups (its peak
 * too when the walk read watermarks). False: read s's files. */
bool counters_read_scanned(struct counters *cn, struct sandbox *s, struct cgroup_reading *rd);
