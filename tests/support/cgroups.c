/* cgroups.c — test_cgroup_layout: see support.h. */
#include "support.h"

#include <errno.h>
#include <mntent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether the comma-separated mount options hold opt as a whole word. */
static bool has_option(const char *opts, const char *opt)
{
        size_t n = strlen(opt);
        for (const char *p = opts; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
                if (strncmp(p, opt, n) == 0 && (p[n] == ',' || p[n] == '\0'))
                        return true;
        return false;
}

/* Whether the v2 folder's cgroup.controllers lists name. */
static bool v2_offers(const char *dir, const char *name)
{
        char path[300];
        snprintf(path, sizeof(path), "%s/cgroup.controllers", dir);
        char *s = test_read_file(path);
        bool found = false;
        size_t n = strlen(name);
        for (char *w = s ? strtok(s, " \n") : NULL; w && !found; w = strtok(NULL, " \n"))
                found = strlen(w) == n && strncmp(w, name, n) == 0;
        free(s);
        return found;
}

int test_cgroup_layout(struct test_cgroup_layout *ret)
{
        struct test_cgroup_layout l = { 0 };
        FILE *f = setmntent("/proc/self/mounts", "re");
        if (!f)
                return -errno;
        struct mntent *m;
        while ((m = getmntent(f))) {
                if (strcmp(m->mnt_type, "cgroup2") == 0 && !l.v2[0])
                        snprintf(l.v2, sizeof(l.v2), "%s", m->mnt_dir);
                else if (strcmp(m->mnt_type, "cgroup") == 0) {
                        if (has_option(m->mnt_opts, "cpuacct") && !l.v1_cpuacct[0])
                                snprintf(l.v1_cpuacct, sizeof(l.v1_cpuacct), "%s", m->mnt_dir);
                        if (has_option(m->mnt_opts, "memory") && !l.v1_memory[0])
                                snprintf(l.v1_memory, sizeof(l.v1_memory), "%s", m->mnt_dir);
                }
        }
        endmntent(f);
        if (l.v2[0]) {
                l.v2_cpu = v2_offers(l.v2, "cpu");
                l.v2_memory = v2_offers(l.v2, "memory");
        }
        l.v1 = l.v1_cpuacct[0] && l.v1_memory[0];
        *ret = l;
        return l.v1 || l.v2[0] ? 0 : -ENOENT;
}
