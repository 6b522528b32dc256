/* fold.c — see fold.h. Never bills negative, never bills twice. */
#include "fold.h"

#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

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

void fold_place(int64_t end, uint64_t cpu, uint64_t running, uint64_t paused, uint64_t mem_size_bytes,
                uint64_t disk_bytes, fold_emit_fn emit, void *ctx)
{
        u128 span = (u128)running + paused;
        if (span == 0) {
                if (cpu) {
                        struct fold_usage u = { .hour_ns = time_hour_start(end), .cpu_ns = cpu };
                        emit(ctx, &u);
                }
                return;
        }
        /* The callers bound span (plausibility checks) far below end - 2020. */
        int64_t start = end - (int64_t)span;
        uint64_t cpu_given = 0, run_given = 0, paused_given = 0;
        for (int64_t from = start; from < end;) {
                int64_t hour = time_hour_start(from);
                int64_t to = hour + NS_PER_HOUR < end ? hour + NS_PER_HOUR : end;
                u128 done = (u128)(to - start);
                /* Each quantity up to `to` by its share of the span, floored;
                 * the last piece takes what is left. */
                uint64_t cpu_upto = to == end ? cpu : (uint64_t)((u128)cpu * done / span);
                uint64_t run_upto = to == end ? running : (uint64_t)((u128)running * done / span);
                uint64_t paused_upto = to == end ? paused : (uint64_t)((u128)paused * done / span);
                struct fold_usage u = { .hour_ns = hour, .cpu_ns = cpu_upto - cpu_given };
                u.mem_byte_ns = (u128)(run_upto - run_given) * mem_size_bytes;
                u.storage_byte_ns = (u128)(paused_upto - paused_given) * ((u128)mem_size_bytes + disk_bytes);
                cpu_given = cpu_upto;
                run_given = run_upto;
                paused_given = paused_upto;
                if (u.cpu_ns || u.mem_byte_ns || u.storage_byte_ns)
                        emit(ctx, &u);
                from = to;
        }
}

static void peak(const struct usage_event *ev, int64_t at, fold_emit_fn emit, void *ctx)
{
        uint64_t p = ev->mem_peak_bytes > ev->mem_bytes ? ev->mem_peak_bytes : ev->mem_bytes;
        if (p) {
                struct fold_usage u = { .hour_ns = time_hour_start(at), .mem_peak_bytes = p };
                emit(ctx, &u);
        }
}

/* Could `vcpus` have used `cpu` in `elapsed` (plus the slack)? */
static bool possible(uint64_t cpu, uint32_t vcpus, int64_t elapsed)
{
        u128 most = (u128)(vcpus ? vcpus : 1) * (u128)((elapsed > 0 ? elapsed : 0) + FOLD_CPU_SLACK_NS);
        return (u128)cpu <= most;
}

/* Could `held` ns of held time have passed in `elapsed` (plus the slack)? */
static bool held_possible(u128 held, int64_t elapsed)
{
        return held <= (u128)((elapsed > 0 ? elapsed : 0) + FOLD_CPU_SLACK_NS);
}

static uint64_t max_u64(uint64_t a, uint64_t b)
{
        return a > b ? a : b;
}

/* The provenance fields of from, onto st. */
static void provenance_copy(struct fold_state *st, const struct fold_state *from)
{
        st->created = from->created;
        st->created_ns = from->created_ns;
        st->created_vcpus = from->created_vcpus;
        st->epoch_max = from->epoch_max;
        memcpy(st->host, from->host, sizeof(st->host));
}

int fold_announce(struct fold_state *st, const struct usage_event *ev)
{
        if (ev->type == EVENT_CREATED) {
                if (st->created)
                        return 0;
                st->created = true;
                st->created_ns = ev->wall_ns;
                st->created_vcpus = ev->vcpus;
                st->epoch_max = max_u64(st->epoch_max, ev->epoch ? ev->epoch : 1);
                snprintf(st->host, sizeof(st->host), "%s", ev->host);
                return 0;
        }
        if (ev->type != EVENT_RESTARTED)
                return 0;
        if (!st->created)
                return -ENOENT;
        if (st->host[0] && strcmp(st->host, ev->host) != 0)
                return -EPERM;
        uint64_t base = max_u64(st->epoch, st->epoch_max);
        if (ev->epoch > base && ev->epoch - base > FOLD_JUMP_MAX)
                return -ERANGE;
        st->epoch_max = max_u64(st->epoch_max, ev->epoch);
        return 0;
}

enum fold_result fold_apply_at(struct fold_state *st, const struct usage_event *ev, const struct fold_clock *clock,
                               unsigned *notes, fold_emit_fn emit, void *ctx)
{
        unsigned nt = 0;
        if (notes)
                *notes = 0;
        bool stop = ev->type == EVENT_STOPPED;
        if (ev->type != EVENT_SAMPLE && !stop)
                return FOLD_DUPLICATE;

        /* The `stopped` event has no seq; a missing epoch (0) is the state's. */
        uint64_t epoch = stop && ev->epoch == 0 && st->known ? st->epoch : ev->epoch;
        uint64_t mem = ev->mem_size_bytes, disk = ev->disk_bytes;
        if (stop && st->known) {
                mem = mem ? mem : st->mem_size_bytes;
                disk = disk ? disk : st->disk_bytes;
        }

        /* The wall time, checked against the aggregator's clock: one out of
         * bounds places the usage at the aggregator's clock and moves no
         * interval (the next good reading bills it). */
        bool clock_bad = false;
        if (clock && clock->max_ahead_ns > 0 && ev->wall_ns > clock->now_ns &&
            ev->wall_ns - clock->now_ns > clock->max_ahead_ns) {
                nt |= FOLD_NOTE_CLOCK_AHEAD;
                clock_bad = true;
        } else if (clock && clock->max_behind_ns > 0 && ev->wall_ns < clock->now_ns &&
                   clock->now_ns - ev->wall_ns > clock->max_behind_ns) {
                nt |= FOLD_NOTE_CLOCK_BEHIND;
                clock_bad = true;
        }
        int64_t at = clock_bad ? clock->now_ns : ev->wall_ns; /* where the usage is placed */
        if (notes)
                *notes = nt;

        /* Provenance: nothing is billed before the sandbox's `created` event,
         * nor under an epoch its host has not announced (the caller holds
         * such a reading until the announcement comes, or dead-letters it). */
        if (!st->created)
                return FOLD_UNANNOUNCED;
        uint32_t vcpus = st->created_vcpus ? st->created_vcpus : ev->vcpus;
        uint64_t announced = st->epoch_max > st->epoch ? st->epoch_max : st->epoch;

        if (!st->known) {
                if (epoch > (announced ? announced : 1))
                        return FOLD_UNANNOUNCED;
                /* The counters start at zero with the sandbox: all of them is
                 * new (its whole life, for the held counters) — at most what
                 * it could have used since its created moment. */
                int64_t life = FOLD_FIRST_CPU_MAX_NS;
                if (st->created_ns > 0)
                        life = (at > st->created_ns ? at - st->created_ns : 0) + FOLD_FIRST_SLACK_NS;
                if ((u128)ev->cpu_ns > (u128)(vcpus ? vcpus : 1) * (u128)life ||
                    (ev->held_known && (u128)ev->running_ns + ev->paused_ns > (u128)life))
                        return FOLD_IMPOSSIBLE;
                uint64_t run = ev->held_known ? ev->running_ns : 0, paused = ev->held_known ? ev->paused_ns : 0;
                fold_place(at, ev->cpu_ns, run, paused, mem, disk, emit, ctx);
                if (!stop)
                        peak(ev, at, emit, ctx);
                struct fold_state prov = *st;
                *st = (struct fold_state){ .known = true, .epoch = epoch, .seq = stop ? 0 : ev->seq,
                                           .cpu_ns = ev->cpu_ns,
                                           /* one not trusted for time leaves the
                                            * wall time at the created moment */
                                           .wall_ns = clock_bad && st->created_ns > 0 ? st->created_ns : at,
                                           .state = stop ? STATE_STOPPED : ev->state, .mem_size_bytes = mem,
                                           .disk_bytes = disk, .held = ev->held_known, .running_ns = run,
                                           .paused_ns = paused,
                                           .closed = stop || ev->state == STATE_STOPPED };
                provenance_copy(st, &prov);
                return FOLD_BILLED;
        }
        if (epoch < st->epoch)
                return FOLD_OLD_EPOCH;
        if (epoch - st->epoch > FOLD_JUMP_MAX)
                return FOLD_EPOCH_JUMP;
        if (epoch > announced)
                return FOLD_UNANNOUNCED;
        bool new_epoch = epoch > st->epoch;
        /* The vmm's `stopped` reads the counter after the sandbox's processes
         * are gone: below what a sample of the running sandbox already showed
         * in the same epoch, or dated long before it (whatever its epoch), it
         * is not the vmm's. */
        if (stop && !st->closed &&
            ((!new_epoch && ev->cpu_ns < st->cpu_ns) ||
             (!clock_bad && ev->wall_ns < st->wall_ns - FOLD_CPU_SLACK_NS)))
                return FOLD_STOP_BEHIND;
        if (!stop) {
                if (!new_epoch && ev->seq <= st->seq)
                        return FOLD_DUPLICATE;
                /* (A state made by a `stopped` event alone has billed no seq yet.) */
                if (ev->seq >> 32 > st->seq >> 32 && (ev->seq >> 32) - (st->seq >> 32) > FOLD_JUMP_MAX &&
                    !(st->closed && st->seq == 0))
                        return FOLD_SEQ_JUMP;
        }

        /* CPU. Once the sandbox is known stopped (the `stopped` event, or a
         * sample in state stopped; also for a state read back without the
         * closed flag) counters only move up: a smaller one is a reading
         * from before the stop, not a restart. */
        bool closed = st->closed || stop || st->state == STATE_STOPPED || ev->state == STATE_STOPPED;
        enum fold_result r = FOLD_BILLED;
        uint64_t cpu, cpu_to;
        /* A higher epoch after the stop is no restart either: the `stopped`
         * event carries its final counter's epoch, so only one that did not
         * say it (billed in epoch 0) can be followed by a higher one, the
         * collector's final sample of the same counter. */
        if ((new_epoch && !st->closed && st->state != STATE_STOPPED) || (!new_epoch && ev->cpu_ns < st->cpu_ns && !closed)) {
                cpu = cpu_to = ev->cpu_ns; /* the counter restarted from zero */
                if (!new_epoch)
                        r = FOLD_COUNTER_RESET;
        } else if (ev->cpu_ns >= st->cpu_ns) {
                cpu = ev->cpu_ns - st->cpu_ns;
                cpu_to = ev->cpu_ns;
        } else {
                cpu = 0;
                cpu_to = st->cpu_ns;
        }
        int64_t elapsed = clock_bad ? 0 : ev->wall_ns - st->wall_ns;
        if (!possible(cpu, vcpus, elapsed))
                return FOLD_IMPOSSIBLE;

        /* Held time: by the counters when both this reading and the state
         * have them; otherwise by the interval since the last reading. */
        if (ev->held_known && st->held) {
                uint64_t run = ev->running_ns > st->running_ns ? ev->running_ns - st->running_ns : 0;
                uint64_t paused = ev->paused_ns > st->paused_ns ? ev->paused_ns - st->paused_ns : 0;
                if (!held_possible((u128)run + paused, elapsed))
                        return FOLD_IMPOSSIBLE;
                if (!closed && (ev->running_ns < st->running_ns || ev->paused_ns < st->paused_ns))
                        nt |= FOLD_NOTE_HELD_BACK;
                fold_place(at, cpu, run, paused, mem, disk, emit, ctx);
                st->running_ns = max_u64(st->running_ns, ev->running_ns);
                st->paused_ns = max_u64(st->paused_ns, ev->paused_ns);
        } else {
                /* The interval since the last reading, in the state it began
                 * in (nothing after the stop); a reading with held counters
                 * after one without starts counting from its own. */
                if (clock_bad)
                        fold_split(at, at, cpu, st->state, 0, 0, emit, ctx);
                else
                        fold_split(st->wall_ns, ev->wall_ns, cpu, st->closed ? STATE_STOPPED : st->state,
                                   st->mem_size_bytes, st->disk_bytes, emit, ctx);
                st->held = ev->held_known;
                if (ev->held_known) {
                        st->running_ns = ev->running_ns;
                        st->paused_ns = ev->paused_ns;
                }
        }
        if (!stop)
                peak(ev, at, emit, ctx);
        if (notes)
                *notes = nt;

        st->epoch = epoch;
        if (!stop)
                st->seq = ev->seq;
        st->cpu_ns = cpu_to;
        if (!clock_bad && ev->wall_ns > st->wall_ns)
                st->wall_ns = ev->wall_ns;
        st->state = closed ? STATE_STOPPED : ev->state;
        st->mem_size_bytes = mem;
        st->disk_bytes = disk;
        st->closed = closed;
        return r;
}

enum fold_result fold_apply(struct fold_state *st, const struct usage_event *ev, fold_emit_fn emit, void *ctx)
{
        return fold_apply_at(st, ev, NULL, NULL, emit, ctx);
}

int fold_state_format(const struct fold_state *st, char *buf, size_t size)
{
        int n = snprintf(buf, size,
                         "v3 known=%d epoch=%" PRIu64 " seq=%" PRIu64 " cpu_ns=%" PRIu64 " wall_ns=%" PRId64
                         " state=%d mem_size_bytes=%" PRIu64 " disk_bytes=%" PRIu64 " held=%d running_ns=%" PRIu64
                         " paused_ns=%" PRIu64 " closed=%d created=%d created_ns=%" PRId64 " created_vcpus=%" PRIu32
                         " epoch_max=%" PRIu64 " host=%s",
                         st->known ? 1 : 0, st->epoch, st->seq, st->cpu_ns, st->wall_ns, (int)st->state,
                         st->mem_size_bytes, st->disk_bytes, st->held ? 1 : 0, st->running_ns, st->paused_ns,
                         st->closed ? 1 : 0, st->created ? 1 : 0, st->created_ns, st->created_vcpus, st->epoch_max,
                         st->host);
        if (n < 0 || (size_t)n >= size)
                return -ENOBUFS;
        return n;
}

int fold_state_parse(const char *text, struct fold_state *ret)
{
        struct fold_state st = { 0 };
        int known = 0, state = 0, held = 0, closed = 0, created = 0, end = 0;
        if (strncmp(text, "v1 ", 3) == 0) {
                if (sscanf(text,
                           "v1 known=%d epoch=%" SCNu64 " seq=%" SCNu64 " cpu_ns=%" SCNu64 " wall_ns=%" SCNd64
                           " state=%d mem_size_bytes=%" SCNu64 " disk_bytes=%" SCNu64 "%n",
                           &known, &st.epoch, &st.seq, &st.cpu_ns, &st.wall_ns, &state, &st.mem_size_bytes,
                           &st.disk_bytes, &end) != 8)
                        return -EINVAL;
                created = 1; /* before provenance: created on any host, its epoch announced */
                st.epoch_max = st.epoch;
        } else if (strncmp(text, "v2 ", 3) == 0) {
                if (sscanf(text,
                           "v2 known=%d epoch=%" SCNu64 " seq=%" SCNu64 " cpu_ns=%" SCNu64 " wall_ns=%" SCNd64
                           " state=%d mem_size_bytes=%" SCNu64 " disk_bytes=%" SCNu64 " held=%d running_ns=%" SCNu64
                           " paused_ns=%" SCNu64 " closed=%d%n",
                           &known, &st.epoch, &st.seq, &st.cpu_ns, &st.wall_ns, &state, &st.mem_size_bytes,
                           &st.disk_bytes, &held, &st.running_ns, &st.paused_ns, &closed, &end) != 12)
                        return -EINVAL;
                created = 1;
                st.epoch_max = st.epoch;
        } else {
                if (sscanf(text,
                           "v3 known=%d epoch=%" SCNu64 " seq=%" SCNu64 " cpu_ns=%" SCNu64 " wall_ns=%" SCNd64
                           " state=%d mem_size_bytes=%" SCNu64 " disk_bytes=%" SCNu64 " held=%d running_ns=%" SCNu64
                           " paused_ns=%" SCNu64 " closed=%d created=%d created_ns=%" SCNd64 " created_vcpus=%" SCNu32
                           " epoch_max=%" SCNu64 " host=%n",
                           &known, &st.epoch, &st.seq, &st.cpu_ns, &st.wall_ns, &state, &st.mem_size_bytes,
                           &st.disk_bytes, &held, &st.running_ns, &st.paused_ns, &closed, &created,
                           &st.created_ns, &st.created_vcpus, &st.epoch_max, &end) != 16 || end == 0)
                        return -EINVAL;
                /* The host is the rest: an id, or nothing. */
                size_t n = strlen(text + end);
                if (n >= sizeof(st.host) || (n && !event_id_valid(text + end)))
                        return -EINVAL;
                memcpy(st.host, text + end, n + 1);
                end += (int)n;
        }
        if (text[end] != '\0' || state < 0 || state >= STATE_COUNT || known < 0 || known > 1 || held < 0 ||
            held > 1 || closed < 0 || closed > 1 || created < 0 || created > 1)
                return -EINVAL;
        st.known = known != 0;
        st.state = (enum sandbox_state)state;
        st.held = held != 0;
        st.closed = closed != 0;
        st.created = created != 0;
        *ret = st;
        return 0;
}
