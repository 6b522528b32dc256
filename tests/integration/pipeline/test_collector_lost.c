/* Integration: the collector killed for good while a sandbox runs.
 *
 * A sandbox is sampled for a second, then tally-collector is killed with
 * SIGKILL and never restarted; the sandbox burns about a CPU-second and is
 * stopped. Nothing samples it after the kill, so only the vmm's `stopped`
 * event (docs/events.md: the final CPU counter and the final held totals) can
 * close its bill. Checked against truth the test reads itself:
 *   - billed CPU equals the cgroup's CPU counter read from the kernel once the
 *     sandbox's processes ended (invariant 1);
 *   - held memory equals the sandbox's life as the test measured it around
 *     its create and stop calls: at least end of create -> start of stop, at
 *     most start of create -> end of stop (invariant 2).
 * The vmm waits 3 s for a final sample that never comes (final_wait_ms). */
#include "pipe.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <signal.h>
#include <sys/wait.h>

#define TICK_MS 200
#define MEM_BYTES (UINT64_C(128) << 20)

int main(void)
{
        struct pipeline P;
        const char *vmm_extra[] = { "--final-wait-ms", "3000", NULL };
        pipe_start(&P, "pipe_lost", TICK_MS, vmm_extra);
        struct sb s;
        if (pipe_create(&P, &s, "{\"account\": \"acct_pipe\", \"key\": \"key_free\", \"vcpus\": 1, \"memory_mib\": 128,"
                                " \"command\": [\"sleep\", \"600\"]}") < 0)
                return pipe_finish(&P);
        test_sleep_ms(1000); /* a few samples */
        kill(P.collector, SIGKILL);
        waitpid(P.collector, NULL, 0);
        P.collector = 0;
        int64_t before = pipe_cgroup_cpu_ns(s.cpu_dir);

        /* The work nobody samples: a shell loop, about a CPU-second. */
        const char *work[] = { "sh", "-c", "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done", NULL };
        CHECK(pipe_exec(&P, &s, work) == 0, "the work failed");
        test_sleep_ms(500);
        if (pipe_stop_with_truth(&P, &s) < 0)
                return pipe_finish(&P);
        CHECK(s.truth_cpu_ns > (uint64_t)before + 100000000,
              "the work after the kill used only %" PRId64 " ns of CPU", (int64_t)s.truth_cpu_ns - before);
        pipe_wait_removed(&P, s.id, 10000);
        pipe_wait_caught_up(&P, 15000);

        struct billed b = pipe_billed(&P, s.id, MEM_BYTES, MEM_BYTES);
        int64_t lo = s.stop.start - s.create.end, hi = s.stop.end - s.create.start;
        CHECK(b.found && (uint64_t)b.cpu_ns == s.truth_cpu_ns,
              "billed CPU %" PRId64 " ns, the cgroup's final counter read by the test %" PRIu64
              " ns: %" PRId64 " ns unbilled (%" PRId64 " ns were burned after the collector was killed)",
              b.cpu_ns, s.truth_cpu_ns, (int64_t)s.truth_cpu_ns - b.cpu_ns, (int64_t)s.truth_cpu_ns - before);
        CHECK(b.mem_rem == 0, "memory billed %" PRId64 " byte-ns over whole ns of 128 MiB", b.mem_rem);
        CHECK(b.mem_ns >= lo && b.mem_ns <= hi,
              "memory billed for %" PRId64 " ns; the sandbox lived %" PRId64 "..%" PRId64 " ns: off by %" PRId64 " ns",
              b.mem_ns, lo, hi, b.mem_ns < lo ? b.mem_ns - lo : b.mem_ns - hi);
        fprintf(stderr, "collector lost: cpu billed %" PRId64 " of %" PRIu64 " ns; memory held %" PRId64
                " ns of a %" PRId64 "..%" PRId64 " ns life\n", b.cpu_ns, s.truth_cpu_ns, b.mem_ns, lo, hi);
        return pipe_finish(&P);
}
