/* fold.c — see fold.h. Never bills negative, never bills twice. */
#include "fold.h"

#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include <stdbool.h>

void fold_split(int64_t from, int64_t to, uint64_t cpu, enum sandbox_state state, uint64_t mem_size_bytes,
                uint64_t disk_bytes, fold_emit_fn emit, void *ctx)
{
        if (to <= from) {
                /* No time passed: any CPU lands in the hour of the reading. */
                if (cpu) {
                        struct fold_usage u = { .hour_ns = time_hour_start(to), .cpu_ns = cpu };
                        emit(ctx, &u);
                }
                return;
        }
        u128 span = (u128)(to - from);
        uint64_t cpu_given = 0;
        for (int64_t start = from; start < to;) {
                int64_t hour = time_hour_start(start);
                int64_t end = hour + NS_PER_HOUR < to ? hour + NS_PER_HOUR : to;
                /* CPU up to `end` by its share of the time, floored; the last
                 * piece takes what is left, so the pieces sum to cpu exactly. */
                uint64_t upto = end == to ? cpu : (uint64_t)((u128)cpu * (u128)(end - from) / span);
                u128 held = (u128)(end - start);
                struct fold_usage u = { .hour_ns = hour, .cpu_ns = upto - cpu_given };
                if (state == STATE_RUNNING)
                        u.mem_byte_ns = held * mem_size_bytes;
                else if (state == STATE_PAUSED)
                        u.storage_byte_ns = held * ((u128)mem_size_bytes + disk_bytes);
                cpu_given = upto;
                if (u.cpu_ns || u.mem_byte_ns || u.storage_byte_ns)
                        emit(ctx, &u);
                start = end;
        }
}

static void remember(struct fold_state *st, const struct usage_event *ev)
{
        st->known = true;
        st->epoch = ev->epoch;
        st->seq = ev->seq;
        st->wall_ns = ev->wall_ns > st->wall_ns ? ev->wall_ns : st->wall_ns;
        st->state = ev->state;
        st->mem_size_bytes = ev->mem_size_bytes;
        st->disk_bytes = ev->disk_bytes;
}

static void peak(const struct usage_event *ev, fold_emit_fn emit, void *ctx)
{
        uint64_t p = ev->mem_peak_bytes > ev->mem_bytes ? ev->mem_peak_bytes : ev->mem_bytes;
        if (p) {
                struct fold_usage u = { .hour_ns = time_hour_start(ev->wall_ns), .mem_peak_bytes = p };
                emit(ctx, &u);
        }
}

/* Could `vcpus` have used `cpu` in `elapsed` (plus the slack)? */
static bool possible(uint64_t cpu, uint32_t vcpus, int64_t elapsed)
{
        u128 most = (u128)(vcpus ? vcpus : 1) * (u128)((elapsed > 0 ? elapsed : 0) + FOLD_CPU_SLACK_NS);
        return (u128)cpu <= most;
}

enum fold_result fold_apply(struct fold_state *st, const struct usage_event *ev, fold_emit_fn emit, void *ctx)
{
        if (!st->known && (u128)ev->cpu_ns > (u128)(ev->vcpus ? ev->vcpus : 1) * FOLD_FIRST_CPU_MAX_NS)
                return FOLD_IMPOSSIBLE;
        if (!st->known) {
                /* The counter starts at zero with the cgroup: all of it is new.
                 * No interval precedes the first sample, so no held time. */
                fold_split(ev->wall_ns, ev->wall_ns, ev->cpu_ns, ev->state, 0, 0, emit, ctx);
                peak(ev, emit, ctx);
                st->wall_ns = ev->wall_ns;
                st->cpu_ns = ev->cpu_ns;
                remember(st, ev);
                return FOLD_BILLED;
        }
        if (ev->epoch < st->epoch)
                return FOLD_OLD_EPOCH;
        if (ev->epoch == st->epoch && ev->seq <= st->seq)
                return FOLD_DUPLICATE;

        if (ev->epoch > st->epoch ? !possible(ev->cpu_ns, ev->vcpus, ev->wall_ns - st->wall_ns)
                                  : ev->cpu_ns > st->cpu_ns &&
                                            !possible(ev->cpu_ns - st->cpu_ns, ev->vcpus, ev->wall_ns - st->wall_ns))
                return FOLD_IMPOSSIBLE;
        enum fold_result r = FOLD_BILLED;
        uint64_t cpu;
        if (ev->epoch > st->epoch) {
                cpu = ev->cpu_ns; /* the counter restarted from zero */
                st->cpu_ns = ev->cpu_ns;
        } else if (ev->cpu_ns >= st->cpu_ns) {
                cpu = ev->cpu_ns - st->cpu_ns;
                st->cpu_ns = ev->cpu_ns;
        } else {
                cpu = 0; /* keep the higher counter: billing from the lower would bill twice */
                r = FOLD_COUNTER_BACK;
        }
        /* The interval since the last sample is billed in the state it began in. */
        fold_split(st->wall_ns, ev->wall_ns, cpu, st->state, st->mem_size_bytes, st->disk_bytes, emit, ctx);
        peak(ev, emit, ctx);
        remember(st, ev);
        return r;
}

int fold_state_format(const struct fold_state *st, char *buf, size_t size)
{
        int n = snprintf(buf, size,
                         "v1 known=%d epoch=%" PRIu64 " seq=%" PRIu64 " cpu_ns=%" PRIu64 " wall_ns=%" PRId64
                         " state=%d mem_size_bytes=%" PRIu64 " disk_bytes=%" PRIu64,
                         st->known ? 1 : 0, st->epoch, st->seq, st->cpu_ns, st->wall_ns, (int)st->state,
                         st->mem_size_bytes, st->disk_bytes);
        if (n < 0 || (size_t)n >= size)
                return -ENOBUFS;
        return n;
}

int fold_state_parse(const char *text, struct fold_state *ret)
{
        struct fold_state st = { 0 };
        int known = 0, state = 0, end = 0;
        if (sscanf(text,
                   "v1 known=%d epoch=%" SCNu64 " seq=%" SCNu64 " cpu_ns=%" SCNu64 " wall_ns=%" SCNd64
                   " state=%d mem_size_bytes=%" SCNu64 " disk_bytes=%" SCNu64 "%n",
                   &known, &st.epoch, &st.seq, &st.cpu_ns, &st.wall_ns, &state, &st.mem_size_bytes, &st.disk_bytes,
                   &end) != 8 || text[end] != '\0' || state < 0 || state >= STATE_COUNT)
                return -EINVAL;
        st.known = known != 0;
        st.state = (enum sandbox_state)state;
        *ret = st;
        return 0;
}
