/* Integration: the BPF cgroup walk (collector/cgroup_scan.h) against the
 * kernel's own files, on real cgroups — v1 cpuacct + memory and the unified v2
 * tree — holding real processes that burned CPU and now hold still. Every
 * counter the walk reports must equal what cgroup.c reads from the files
 * (cpuacct.usage, cpu.stat usage_usec × 1000, memory.usage_in_bytes,
 * memory.max_usage_in_bytes) to the unit; a removed cgroup must be absent. */
#include "cgroup.h"
#include "cgroup_scan.h"
#include "sandboxes.h"
#include "support.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

struct probe {
        struct test_sandbox sb;
        struct cgroup_files files;
        struct cgroup_scan_ref cpu, mem; /* mem.root -1: no memory counter file */
};

static struct cgroup_scan_ref watch(struct cgroup_scan *s, int version, const char *dir,
                                    enum cgroup_scan_counter what)
{
        struct cgroup_scan_ref ref;
        int r = cgroup_scan_watch(s, version, dir, what, &ref);
        CHECK(r == 0, "could not watch %s: %s", dir, strerror(-r));
        return ref;
}

static bool get(struct cgroup_scan *s, struct probe *p, struct cgroup_scan_reading *ret)
{
        return cgroup_scan_get(s, &p->cpu, p->mem.root >= 0 ? &p->mem : NULL, ret);
}

static void setup(struct probe *p, struct cgroup_scan *s, const char *state, const char *id, int version, int burn_ms)
{
        tsb_create(&p->sb, state, id, "acct_scan", version, burn_ms);
        /* the layout the host gave it (a pure v2 host has no v1) */
        int r = cgroup_files_open(p->sb.version, p->sb.cpu_dir, p->sb.mem_dir, true, true, &p->files);
        CHECK(r == 0, "could not open the files of %s: %s", p->sb.cpu_dir, strerror(-r));
        p->cpu = watch(s, p->sb.version, p->sb.cpu_dir, CGROUP_SCAN_CPU);
        p->mem = p->files.mem_path ? watch(s, p->sb.version, p->sb.mem_dir, CGROUP_SCAN_MEM) : CGROUP_SCAN_REF_NONE;
}

/* The files' reading, taken twice around nothing: the processes hold still, so both agree. */
static struct cgroup_reading files_now(const struct probe *p)
{
        struct cgroup_reading rd;
        int r = cgroup_files_read(&p->files, &rd);
        CHECK(r == 0, "could not read the files of %s: %s", p->sb.cpu_dir, strerror(-r));
        r = cgroup_files_read_peak(&p->files, &rd.mem_peak_bytes);
        CHECK(r == 0, "could not read the peak of %s: %s", p->sb.mem_dir, strerror(-r));
        return rd;
}

/* Scan and files agree for every probe: files, walk, files again, until the files hold still. */
static void compare(struct cgroup_scan *s, struct probe *probes, int n)
{
        for (int i = 0; i < n; i++) {
                struct probe *p = &probes[i];
                struct cgroup_reading before, after;
                struct cgroup_scan_reading sr;
                bool seen = false;
                for (int attempt = 0; attempt < 5; attempt++) {
                        before = files_now(p);
                        int r = cgroup_scan_run(s, true);
                        CHECK(r == 0, "the walk failed: %s", strerror(-r));
                        seen = get(s, p, &sr);
                        after = files_now(p);
                        if (memcmp(&before, &after, sizeof(before)) == 0)
                                break;
                }
                CHECK(memcmp(&before, &after, sizeof(before)) == 0, "the files of %s kept changing", p->sb.rec.id);
                CHECK(seen, "the walk did not see %s (v%d)", p->sb.cpu_dir, p->sb.version);
                CHECK(sr.cpu_ns == before.cpu_ns, "%s: walk cpu_ns %" PRIu64 ", file %" PRIu64, p->sb.rec.id,
                      sr.cpu_ns, before.cpu_ns);
                CHECK(sr.mem_bytes == before.mem_bytes, "%s: walk memory %" PRIu64 ", file %" PRIu64, p->sb.rec.id,
                      sr.mem_bytes, before.mem_bytes);
                CHECK(sr.has_peak == (p->mem.root >= 0), "%s: has_peak %d with memory root %d", p->sb.rec.id,
                      sr.has_peak, p->mem.root);
                if (sr.has_peak)
                        CHECK(sr.mem_peak_bytes == before.mem_peak_bytes,
                              "%s: walk peak %" PRIu64 ", file %" PRIu64, p->sb.rec.id, sr.mem_peak_bytes,
                              before.mem_peak_bytes);
                printf("%s v%d: cpu_ns %" PRIu64 " memory %" PRIu64 " peak %" PRIu64 " (walk = files)\n",
                       p->sb.rec.id, p->sb.version, sr.cpu_ns, sr.mem_bytes, sr.mem_peak_bytes);
        }
}

int main(void)
{
        char *dir = test_tmpdir("cgroup-scan");
        char state[600], id[64];
        snprintf(state, sizeof(state), "%s/state", dir);
        CHECK(mkdir(state, 0755) == 0, "could not create %s: %m", state);

        struct cgroup_scan *s = NULL;
        char err[256] = "";
        int r = cgroup_scan_new(&s, err, sizeof(err));
        CHECK(r == 0, "the cgroup walk did not load: %s", err);

        /* Burns of different lengths, so a mixed-up record would show. */
        struct probe probes[4];
        const int versions[4] = { 1, 1, 2, 2 }, burns[4] = { 250, 60, 200, 40 };
        for (int i = 0; i < 4; i++) {
                snprintf(id, sizeof(id), "scan%d_%d", (int)getpid(), i);
                setup(&probes[i], s, state, id, versions[i], burns[i]);
        }
        CHECK(probes[0].cpu.root == probes[1].cpu.root, "the same folder became two roots");
        /* v1: memory is a hierarchy of its own; v2: one folder (or no memory controller there) */
        if (probes[0].sb.version == 1)
                CHECK(probes[0].mem.root >= 0 && probes[0].mem.root != probes[0].cpu.root,
                      "v1 memory is not its own root (%d, %d)", probes[0].mem.root, probes[0].cpu.root);
        else
                CHECK(probes[0].mem.root < 0 || probes[0].mem.root == probes[0].cpu.root,
                      "v2 memory is another root than its CPU's folder (%d, %d)", probes[0].mem.root,
                      probes[0].cpu.root);
        for (int i = 0; i < 4; i++)
                CHECK(files_now(&probes[i]).cpu_ns >= (uint64_t)burns[i] * 1000000,
                      "%s counted less than its %d ms burn", probes[i].sb.rec.id, burns[i]);

        compare(s, probes, 4);
        /* The roots (the parent folders watched: three with v1, one on a v2-only
         * layout) and the four sandboxes, at least. */
        int roots = 0;
        for (int root = 0; root < 8; root++) {
                bool used = false;
                for (int i = 0; i < 4; i++)
                        used |= probes[i].cpu.root == root || probes[i].mem.root == root;
                roots += used;
        }
        CHECK(cgroup_scan_seen(s) >= (size_t)(4 + roots), "the walk saw %zu cgroups, %d roots", cgroup_scan_seen(s),
              roots);
        CHECK(cgroup_scan_dropped(s) == 0, "the walk dropped %zu cgroups", cgroup_scan_dropped(s));

        /* Without peaks, the walk says it has none. */
        struct cgroup_scan_reading sr;
        CHECK(cgroup_scan_run(s, false) == 0, "the walk failed");
        CHECK(get(s, &probes[0], &sr) && !sr.has_peak && sr.mem_peak_bytes == 0,
              "a walk without peaks reported one");

        /* A cgroup removed and made again at the same path between two walks (a sandbox whose
         * cgroup the vmm recreated) is another cgroup: the walk must not give its counters to
         * the reference of the one removed, which the walk before listed at the same place. */
        for (int i = 1; i < 4; i += 2) {
                struct probe gone = probes[i];
                cgroup_files_close(&probes[i].files);
                tsb_stop(&probes[i].sb, state);
                tsb_remove(&probes[i].sb, state);
                setup(&probes[i], s, state, gone.sb.rec.id, versions[i], burns[i] / 2);
                CHECK(probes[i].cpu.id != gone.cpu.id, "%s: made again under the same id", gone.sb.cpu_dir);
                CHECK(cgroup_scan_run(s, true) == 0, "the walk failed after a cgroup was made again");
                CHECK(!get(s, &gone, &sr), "the walk read the new %s under the removed one's identity",
                      gone.sb.cpu_dir);
        }
        compare(s, probes, 4);

        /* A removed cgroup is absent, so the collector reads its files and sees it gone. */
        for (int i = 1; i < 4; i += 2) {
                cgroup_files_close(&probes[i].files);
                tsb_stop(&probes[i].sb, state);
                tsb_remove(&probes[i].sb, state);
        }
        CHECK(cgroup_scan_run(s, true) == 0, "the walk failed after removals");
        for (int i = 1; i < 4; i += 2)
                CHECK(!get(s, &probes[i], &sr),
                      "the walk still reports the removed %s", probes[i].sb.cpu_dir);
        struct probe left[2] = { probes[0], probes[2] };
        compare(s, left, 2);

        for (int i = 0; i < 4; i += 2) {
                cgroup_files_close(&probes[i].files);
                tsb_stop(&probes[i].sb, state);
                tsb_remove(&probes[i].sb, state);
        }
        cgroup_scan_free(s);
        tsb_cgroup_parent_remove();
        free(dir);
        if (test_failures == 0)
                printf("ok: the cgroup walk equals the kernel's files\n");
        return test_result();
}
