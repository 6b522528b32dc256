/* Integration: a host's collector upgraded from v1 messages to usage batches
 * (format v2, docs/events.md "Usage batches") while its sandboxes run, then
 * killed with SIGKILL in the middle of its batches and started again.
 *
 * Every part a real process: tally-vmm with two process sandboxes in real
 * cgroups, tally-collector, the development broker, tally-aggregator,
 * PostgreSQL. Checked against truth the test reads itself from the kernel:
 *   - while the v2 collector runs, what is billed of a sandbox reaches the
 *     cgroup's counter read after its work (its batched samples are billed
 *     as they come, not only its final counter at the stop);
 *   - at the end, each sandbox's billed CPU equals its cgroup's final counter
 *     to the nanosecond (invariant 1), whatever the format switch and the
 *     kill did, and nothing is a dead letter. */
#include "pipe.h"
#include "support.h"
#include "timeutil.h"

#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define TICK_MS 200
#define MEM_BYTES (UINT64_C(128) << 20)

static const char *const work[] = { "sh", "-c", "i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done", NULL };

int main(void)
{
        struct pipeline P;
        pipe_start(&P, "pipe_usage_v2", TICK_MS, NULL);
        struct sb a, b;
        const char *body = "{\"account\": \"acct_pipe\", \"key\": \"key_free\", \"vcpus\": 1, \"memory_mib\": 128,"
                           " \"command\": [\"sleep\", \"600\"]}";
        if (pipe_create(&P, &a, body) < 0 || pipe_create(&P, &b, body) < 0 || pipe_hold(&a) < 0 || pipe_hold(&b) < 0)
                return pipe_finish(&P);
        CHECK(pipe_exec(&P, &a, work) == 0, "the work failed");
        test_sleep_ms(1000); /* v1 samples */

        /* The upgrade: the same host's collector, now sending batches. */
        pipe_daemon_stop(P.collector);
        P.collector_format = "v2";
        pipe_collector_start(&P);
        /* (its first ticks go as v1 until librdkafka has told it the partition count) */
        test_sleep_ms(1000);
        CHECK(pipe_exec(&P, &a, work) == 0 && pipe_exec(&P, &b, work) == 0, "the work failed");
        int64_t after_a = pipe_cgroup_cpu_ns(a.cpu_dir), after_b = pipe_cgroup_cpu_ns(b.cpu_dir);
        test_sleep_ms(6 * TICK_MS);
        pipe_wait_caught_up(&P, 15000);
        struct billed ma = pipe_billed(&P, a.id, MEM_BYTES, MEM_BYTES), mb = pipe_billed(&P, b.id, MEM_BYTES, MEM_BYTES);
        CHECK(ma.cpu_ns >= after_a && mb.cpu_ns >= after_b,
              "while the v2 collector runs, billed CPU %" PRId64 " and %" PRId64 " ns, below the counters %" PRId64
              " and %" PRId64 " ns read after the work: its batches were not billed",
              ma.cpu_ns, mb.cpu_ns, after_a, after_b);

        /* Killed at an instant of the test's choosing, not the collector's: a tick's batches
         * may be built, queued in the producer or on the way. */
        CHECK(pipe_exec(&P, &a, work) == 0, "the work failed");
        test_sleep_ms(TICK_MS / 2 + 37);
        kill(P.collector, SIGKILL);
        waitpid(P.collector, NULL, 0);
        pipe_collector_start(&P);
        CHECK(pipe_exec(&P, &b, work) == 0, "the work failed");
        test_sleep_ms(3 * TICK_MS);
        if (pipe_stop_with_truth(&P, &a) < 0 || pipe_stop_with_truth(&P, &b) < 0)
                return pipe_finish(&P);
        pipe_wait_removed(&P, a.id, 15000);
        pipe_wait_removed(&P, b.id, 15000);
        pipe_wait_caught_up(&P, 15000);

        struct billed ba = pipe_billed(&P, a.id, MEM_BYTES, MEM_BYTES), bb = pipe_billed(&P, b.id, MEM_BYTES, MEM_BYTES);
        CHECK(ba.found && (uint64_t)ba.cpu_ns == a.truth_cpu_ns,
              "sandbox a: billed CPU %" PRId64 " ns, the cgroup's final counter %" PRIu64 " ns", ba.cpu_ns,
              a.truth_cpu_ns);
        CHECK(bb.found && (uint64_t)bb.cpu_ns == b.truth_cpu_ns,
              "sandbox b: billed CPU %" PRId64 " ns, the cgroup's final counter %" PRIu64 " ns", bb.cpu_ns,
              b.truth_cpu_ns);
        char *dead = pipe_query(&P, "SELECT count(*)::text FROM dead_letters");
        CHECK(dead && strcmp(dead, "0") == 0, "dead letters: %s", dead ? dead : "?");
        free(dead);
        fprintf(stderr, "usage v2: cpu billed %" PRId64 "/%" PRIu64 " and %" PRId64 "/%" PRIu64 " ns\n", ba.cpu_ns,
                a.truth_cpu_ns, bb.cpu_ns, b.truth_cpu_ns);
        return pipe_finish(&P);
}
