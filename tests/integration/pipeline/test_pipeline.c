/* Integration: the whole pipeline, every part a real process.
 *
 * tally-vmm runs process sandboxes in real cgroups, tally-collector samples
 * them, a private tally-broker carries the usage and control topics, and
 * tally-aggregator rates the usage into a real PostgreSQL ledger. Checked,
 * against truth the test reads itself:
 *   - conservation (invariant 1): a sandbox's billed CPU equals, to the
 *     unit, its cgroup's CPU counter as the test reads it from the kernel once
 *     the sandbox's processes have ended (not the vmm's own final_cpu_ns);
 *   - coverage (invariant 2): its held memory is billed for its life as the
 *     test measured it around its own create and stop calls: no less than from
 *     the end of create to the start of stop, no more than from the start of
 *     create to the end of stop (the calls' round trips, a few ms; not a tick);
 *   - spend limits (invariant 5): for a key with a daily limit and a sandbox
 *     burning CPU, the test works out the key's spend by hand from its own
 *     readings of the cgroup's counter and the default plan's prices, and the
 *     sandbox must be frozen within 2 s of that spend reaching the limit (so
 *     it overshoots by no more than 2 s of its CPU); its 50/80/100% alerts
 *     fire once each, no CPU accrues after, and a new sandbox is refused;
 *   - a pause limit caps spend (docs/billing.md, "What a pause limit caps"):
 *     the key's two sandboxes, paused by its block, hold their storage, and
 *     the key's spend stays, to the nano-dollar, the CPU and memory the ledger
 *     billed them (worked by hand from the default plan); their storage is
 *     kept as waived. */
#include "pipe.h"
#include "support.h"
#include "timeutil.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TICK_MS 200
#define MEM_BYTES (UINT64_C(128) << 20)

static struct pipeline P;

static void conservation(void)
{
        struct sb s;
        if (pipe_create(&P, &s, "{\"account\": \"acct_pipe\", \"key\": \"key_free\", \"vcpus\": 1, \"memory_mib\": 128,"
                                " \"command\": [\"sleep\", \"600\"]}") < 0)
                return;
        /* The work: a shell loop, about a CPU-second. */
        const char *work[] = { "sh", "-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; echo done", NULL };
        CHECK(pipe_exec(&P, &s, work) == 0, "the work failed");
        int64_t seen = pipe_cgroup_cpu_ns(s.cpu_dir);
        CHECK(seen > 100000000, "the work used only %" PRId64 " ns of CPU", seen);
        test_sleep_ms(1000); /* a few more samples of an idle sandbox */
        if (pipe_stop_with_truth(&P, &s) < 0)
                return;
        CHECK(s.truth_cpu_ns >= (uint64_t)seen, "final counter %" PRIu64 " below an earlier reading %" PRId64,
              s.truth_cpu_ns, seen);
        pipe_wait_removed(&P, s.id, 10000);
        pipe_wait_caught_up(&P, 15000);

        struct billed b = pipe_billed(&P, s.id, MEM_BYTES, MEM_BYTES);
        CHECK(b.found && (uint64_t)b.cpu_ns == s.truth_cpu_ns,
              "billed CPU %" PRId64 " ns, the cgroup's counter read by the test %" PRIu64 " ns (off by %" PRId64 ")",
              b.cpu_ns, s.truth_cpu_ns, b.cpu_ns - (int64_t)s.truth_cpu_ns);
        int64_t lo = s.stop.start - s.create.end, hi = s.stop.end - s.create.start;
        CHECK(b.mem_rem == 0, "memory billed %" PRId64 " byte-ns over whole ns of 128 MiB", b.mem_rem);
        CHECK(b.mem_ns >= lo && b.mem_ns <= hi,
              "memory billed for %" PRId64 " ns; the sandbox lived %" PRId64 "..%" PRId64
              " ns (create and stop calls took %" PRId64 " and %" PRId64 " ns): off by %" PRId64 " ns",
              b.mem_ns, lo, hi, s.create.end - s.create.start, s.stop.end - s.stop.start,
              b.mem_ns < lo ? b.mem_ns - lo : b.mem_ns - hi);
        CHECK(b.storage_ns == 0 && b.storage_rem == 0, "storage billed for a sandbox never paused: %" PRId64 " ns",
              b.storage_ns);
        fprintf(stderr, "conservation: cpu billed %" PRId64 " ns, kernel %" PRIu64 " ns; memory held %" PRId64
                " ns, life %" PRId64 "..%" PRId64 " ns\n", b.cpu_ns, s.truth_cpu_ns, b.mem_ns, lo, hi);
}

/* The key's spend by hand, in nano-dollars x 3.6e12 (exact integers), from the
 * default plan: CPU $0.025 per vCPU-hour = 25,000,000 nd per 3.6e12 CPU-ns;
 * memory $0.0075 per GiB-hour, so a 128 MiB sandbox 937,500 nd per 3.6e12 ns. */
static int64_t spend_x(int64_t cpu_ns, int64_t held_ns)
{
        return cpu_ns * 25000000 + held_ns * 937500;
}

static bool frozen(const char *cpu_dir, const char *cgroup_parent, const char *id)
{
        char path[800], buf[64] = "";
        /* v1: the freezer hierarchy; v2: the one folder's cgroup.events. */
        snprintf(path, sizeof(path), "/sys/fs/cgroup/freezer/%s/%s/freezer.state", cgroup_parent, id);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
                ssize_t n = read(fd, buf, sizeof(buf) - 1);
                close(fd);
                return n > 0 && strncmp(buf, "FROZEN", 6) == 0;
        }
        snprintf(path, sizeof(path), "%s/cgroup.events", cpu_dir);
        char *ev = test_read_file(path);
        bool f = ev && strstr(ev, "frozen 1");
        free(ev);
        return f;
}

/* A number the ledger holds for the key (one value of sql), or -1. */
static int64_t key_value(const char *sql)
{
        char *v = pipe_query(&P, sql);
        int64_t n = v ? strtoll(v, NULL, 10) : -1;
        free(v);
        return n;
}

static void spend_limit(void)
{
        /* 20,000 nano-dollars: about 2.9 CPU-seconds. */
        const int64_t limit = 20000;
        pipe_exec_sql(&P, "INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars, limit_policy)"
                          " VALUES ('key_lim', 'acct_pipe', sha256('key_lim'), 20000, 'pause')");
        /* Two sandboxes of the key the block will pause with their storage: an idle one, then one burning CPU. */
        struct sb idle, s;
        if (pipe_create(&P, &idle, "{\"account\": \"acct_pipe\", \"key\": \"key_lim\", \"vcpus\": 1,"
                                   " \"memory_mib\": 128, \"command\": [\"sleep\", \"600\"]}") < 0)
                return;
        if (pipe_create(&P, &s, "{\"account\": \"acct_pipe\", \"key\": \"key_lim\", \"vcpus\": 1, \"memory_mib\": 128,"
                                " \"command\": [\"sh\", \"-c\", \"while :; do :; done\"]}") < 0)
                return;
        /* The test's own readings: the counters every few ms, until frozen. The
         * lives are counted from the end of each create call (the least they held). */
        int64_t crossed = 0, crossed_cpu = 0, froze = 0, froze_cpu = 0, deadline = time_boot_ns() + 30 * NS_PER_SEC;
        while (!froze && time_boot_ns() < deadline) {
                int64_t now = time_boot_ns(), cpu = pipe_cgroup_cpu_ns(s.cpu_dir);
                int64_t idle_cpu = pipe_cgroup_cpu_ns(idle.cpu_dir);
                if (!crossed && cpu >= 0 && idle_cpu >= 0 &&
                    spend_x(cpu + idle_cpu, (now - s.create.end) + (now - idle.create.end)) >= limit * 3600000000000)
                        crossed = now, crossed_cpu = cpu;
                if (frozen(s.cpu_dir, P.cgroup_parent, s.id))
                        froze = time_boot_ns(), froze_cpu = pipe_cgroup_cpu_ns(s.cpu_dir);
                else
                        test_sleep_ms(5);
        }
        CHECK(crossed, "the key's spend did not reach its limit within 30 s (cpu %" PRId64 " ns)",
              pipe_cgroup_cpu_ns(s.cpu_dir));
        CHECK(froze, "the sandbox was not frozen within 30 s");
        if (crossed && froze) {
                CHECK(froze - crossed <= 2 * NS_PER_SEC,
                      "frozen %" PRId64 " ms after the key's spend reached its limit (the rule: within 2000 ms)",
                      (froze - crossed) / NS_PER_MS);
                CHECK(froze_cpu - crossed_cpu <= 2 * NS_PER_SEC,
                      "%" PRId64 " ns of CPU burned past the limit (the rule: at most 2 s of 1 vCPU)",
                      froze_cpu - crossed_cpu);
                fprintf(stderr, "spend limit: frozen %" PRId64 " ms after the limit, %" PRId64
                        " ms of CPU past it\n", (froze - crossed) / NS_PER_MS, (froze_cpu - crossed_cpu) / NS_PER_MS);
        }
        int64_t a = pipe_cgroup_cpu_ns(s.cpu_dir);
        test_sleep_ms(1000);
        int64_t b = pipe_cgroup_cpu_ns(s.cpu_dir);
        CHECK(froze && a == b, "a paused sandbox accrued %" PRId64 " ns of CPU", b - a);
        bool idle_frozen = false;
        for (int i = 0; i < 100 && !(idle_frozen = frozen(idle.cpu_dir, P.cgroup_parent, idle.id)); i++)
                test_sleep_ms(20);
        int64_t idle_froze = time_boot_ns();
        CHECK(idle_frozen, "the key's idle sandbox was not paused with the other");

        /* The alerts of the sample that crossed are committed with it. */
        pipe_wait_caught_up(&P, 15000);
        char *alerts = pipe_query(&P, "SELECT string_agg(threshold_pct::text, ',' ORDER BY threshold_pct) FROM alerts"
                                      " WHERE key_id = 'key_lim'");
        CHECK(alerts && strcmp(alerts, "50,80,100") == 0, "alerts %s, wanted 50,80,100 once each",
              alerts ? alerts : "none");
        free(alerts);

        /* What a pause limit caps (docs/billing.md): both sandboxes were running at the block, so their
         * paused storage is waived for the rest of the day. The key's spend, once the pause is billed, stays
         * where it is while the two hold 128 MiB and their disks paused (two such sandboxes' storage is
         * about 8.3 nd a second: 2 x 134,217,728 B x 80,000,000 nd / (1e9 B x 2,592,000 s); the old rule
         * added it, 50 nd in the 6 s below). */
        const char *spend_sql = "SELECT nanodollars FROM spend_daily WHERE key_id = 'key_lim'"
                                " AND day = (now() AT TIME ZONE 'UTC')::date";
        test_sleep_ms(1000);
        pipe_wait_caught_up(&P, 15000);
        int64_t after_pause = key_value(spend_sql);
        test_sleep_ms(6000);
        pipe_wait_caught_up(&P, 15000);
        int64_t later = key_value(spend_sql);
        CHECK(later == after_pause, "the key's spend went from %" PRId64 " nd after the pause to %" PRId64
              " nd 6 s later, its sandboxes paused by its limit", after_pause, later);
        /* To the nano-dollar: the spend is the CPU and memory the ledger billed the two sandboxes, by hand
         * from the default plan (spend_x), rounded once, half away from zero; none of their storage. */
        int64_t cpu = key_value("SELECT sum(cpu_ns) FROM usage_hourly WHERE key_id = 'key_lim'");
        int64_t held_ns = key_value("SELECT div(sum(mem_byte_ns), 134217728) FROM usage_hourly WHERE key_id = 'key_lim'");
        int64_t held_rem = key_value("SELECT mod(sum(mem_byte_ns), 134217728) FROM usage_hourly WHERE key_id = 'key_lim'");
        int64_t stored = key_value("SELECT sum(storage_byte_ns) FROM usage_hourly WHERE key_id = 'key_lim'");
        int64_t waived_ns = key_value("SELECT div(sum(storage_waived_byte_ns), 134217728) FROM usage_hourly"
                                      " WHERE key_id = 'key_lim'");
        /* The CPU is the kernel's: both cgroups' counters, frozen since the pause, read by the test. The
         * memory is held from the creates to the pauses: at least from the end of each create call to the
         * crossing, at most from its start to when the test saw it frozen. */
        int64_t kernel = pipe_cgroup_cpu_ns(s.cpu_dir) + pipe_cgroup_cpu_ns(idle.cpu_dir);
        CHECK(cpu == kernel, "the key's billed CPU %" PRId64 " ns, its frozen cgroups' counters %" PRId64 " ns", cpu,
              kernel);
        int64_t held_lo = (crossed - s.create.end) + (crossed - idle.create.end);
        int64_t held_hi = (froze - s.create.start) + (idle_froze - idle.create.start);
        CHECK(held_ns >= held_lo && held_ns <= held_hi, "memory held %" PRId64 " ns, the test saw %" PRId64 "..%" PRId64,
              held_ns, held_lo, held_hi);
        __int128 x = (__int128)kernel * 25000000 + (__int128)held_ns * 937500, den = 3600000000000;
        int64_t want = (int64_t)((2 * x + den) / (2 * den));
        CHECK(held_rem == 0 && later == want,
              "the key's spend is %" PRId64 " nd; its sandboxes' CPU (%" PRId64 " ns) and memory (%" PRId64
              " ns of 128 MiB) cost %" PRId64 " nd", later, kernel, held_ns, want);
        CHECK(stored == 0, "%" PRId64 " byte-ns of storage charged to sandboxes paused by the key's limit", stored);
        /* Their storage is kept, waived: two sandboxes, each at least 128 MiB, paused for the 8 s waited. */
        CHECK(waived_ns >= 2 * 7 * NS_PER_SEC, "waived storage: %" PRId64 " ns of 128 MiB (want the pauses': 2 x 7 s"
              " or more)", waived_ns);
        CHECK(key_value("SELECT count(*) FROM limit_waivers WHERE key_id = 'key_lim'") == 2,
              "limit_waivers does not name the key's two sandboxes");
        /* Finance sees what was waived: per sandbox, its waived byte-ns at $0.08 per GB-month, by hand:
         * byte-ns x 80,000,000 / (1e9 x 2,592,000e9), rounded once, half away from zero. */
        char *rows = pipe_query(&P, "SET ROLE finance; SELECT string_agg(storage_waived_byte_ns || ' ' ||"
                                    " waived_nanodollars, ' ') FROM finance.limit_waivers WHERE key_id = 'key_lim'");
        long long bns[2] = { -1, -1 }, nd[2] = { -1, -1 };
        CHECK(rows && sscanf(rows, "%lld %lld %lld %lld", &bns[0], &nd[0], &bns[1], &nd[1]) == 4,
              "finance.limit_waivers: %s", rows ? rows : "no rows");
        for (int i = 0; i < 2; i++) {
                __int128 q = (__int128)bns[i] * 80000000, d = (__int128)1000000000 * 2592000000000000;
                long long w = (long long)((2 * q + d) / (2 * d));
                CHECK(bns[i] > 0 && nd[i] == w, "finance.limit_waivers: %lld byte-ns waived as %lld nd, want %lld",
                      bns[i], nd[i], w);
        }
        free(rows);
        fprintf(stderr, "spend limit: spend %" PRId64 " nd against %" PRId64 " (cpu %" PRId64 " ns, memory %" PRId64
                " ns), %" PRId64 " ns of 128 MiB storage waived\n", later, limit, cpu, held_ns, waived_ns);

        struct call c;
        json_decref(pipe_api(&P, "POST", "/v1/sandboxes", "{\"account\": \"acct_pipe\", \"key\": \"key_lim\"}", &c));
        CHECK(c.status == 403, "a new sandbox for a key over its daily limit: HTTP %ld, want 403", c.status);
        pipe_action(&P, &s, "stop", NULL);
        pipe_action(&P, &idle, "stop", NULL);
}

int main(void)
{
        pipe_start(&P, "pipeline", TICK_MS, NULL);
        conservation();
        spend_limit();
        test_sleep_ms(1000); /* the vmm removes each sandbox's cgroup once its final counter is safe */
        return pipe_finish(&P);
}
