/* Integration: a final sample that comes late.
 *
 * The collector is stopped (SIGTERM), a sandbox is stopped, and the collector
 * starts again 10 s later and takes the sandbox's final sample then (the vmm
 * keeps the record for final_wait_ms, 30 s). The sandbox held its memory
 * until its stop and not a nanosecond after (invariant 2: held time
 * from the lifecycle moments, never from the time a sample was taken), so:
 *   - held memory billed is at most start of create -> end of stop, and at
 *     least end of create -> start of stop (the test's own clock);
 *   - billed CPU equals the cgroup's counter the test read from the kernel
 *     once the sandbox's processes ended. */
#include "pipe.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>

#define TICK_MS 200
#define MEM_BYTES (UINT64_C(128) << 20)

int main(void)
{
        struct pipeline P;
        const char *vmm_extra[] = { "--final-wait-ms", "30000", NULL };
        pipe_start(&P, "pipe_late", TICK_MS, vmm_extra);
        struct sb s;
        if (pipe_create(&P, &s, "{\"account\": \"acct_pipe\", \"key\": \"key_free\", \"vcpus\": 1, \"memory_mib\": 128,"
                                " \"command\": [\"sleep\", \"600\"]}") < 0)
                return pipe_finish(&P);
        const char *work[] = { "sh", "-c", "i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done", NULL };
        CHECK(pipe_exec(&P, &s, work) == 0, "the work failed");
        test_sleep_ms(1000); /* a few samples */
        pipe_daemon_stop(P.collector);
        P.collector = 0;
        if (pipe_stop_with_truth(&P, &s) < 0)
                return pipe_finish(&P);
        test_sleep_ms(10000);
        int64_t restarted = time_boot_ns();
        pipe_collector_start(&P);
        pipe_wait_removed(&P, s.id, 15000);
        pipe_wait_caught_up(&P, 15000);

        struct billed b = pipe_billed(&P, s.id, MEM_BYTES, MEM_BYTES);
        int64_t lo = s.stop.start - s.create.end, hi = s.stop.end - s.create.start;
        CHECK(b.found && (uint64_t)b.cpu_ns == s.truth_cpu_ns,
              "billed CPU %" PRId64 " ns, the cgroup's final counter read by the test %" PRIu64 " ns", b.cpu_ns,
              s.truth_cpu_ns);
        CHECK(b.mem_rem == 0, "memory billed %" PRId64 " byte-ns over whole ns of 128 MiB", b.mem_rem);
        CHECK(b.mem_ns <= hi, "memory billed for %" PRId64 " ns, %" PRId64 " ns after the stop (the sandbox lived %"
              PRId64 "..%" PRId64 " ns; the collector came back %" PRId64 " ms after the stop)",
              b.mem_ns, b.mem_ns - hi, lo, hi, (restarted - s.stop.end) / NS_PER_MS);
        CHECK(b.mem_ns >= lo, "memory billed for %" PRId64 " ns, %" PRId64 " ns short of the sandbox's life (%"
              PRId64 "..%" PRId64 " ns)", b.mem_ns, lo - b.mem_ns, lo, hi);
        CHECK(b.storage_ns == 0 && b.storage_rem == 0, "storage billed for a sandbox never paused: %" PRId64 " ns",
              b.storage_ns);
        fprintf(stderr, "late final: cpu billed %" PRId64 " of %" PRIu64 " ns; memory held %" PRId64
                " ns of a %" PRId64 "..%" PRId64 " ns life\n", b.cpu_ns, s.truth_cpu_ns, b.mem_ns, lo, hi);
        return pipe_finish(&P);
}
