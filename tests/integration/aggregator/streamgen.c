/* streamgen.c — see streamgen.h. */
#include "streamgen.h"

#include "support.h"
#include "timeutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GiB (UINT64_C(1) << 30)

static unsigned rnd(unsigned *s)
{
        *s = *s * 1103515245u + 12345u;
        return (*s >> 8) & 0xffffff;
}

char *gen_u128s(u128 v, char *buf)
{
        char tmp[48];
        int n = 0;
        do {
                tmp[n++] = (char)('0' + (int)(v % 10));
                v /= 10;
        } while (v);
        for (int i = 0; i < n; i++)
                buf[i] = tmp[n - 1 - i];
        buf[n] = '\0';
        return buf;
}

void gen_stream_make(struct gen_stream *g, unsigned seed, size_t nsandboxes, size_t nsamples, int64_t start_ns)
{
        memset(g, 0, sizeof(*g));
        unsigned s = seed;
        g->nsandboxes = nsandboxes;
        g->sandboxes = calloc(nsandboxes, sizeof(*g->sandboxes));
        size_t total = 0;
        for (size_t i = 0; i < nsandboxes; i++) {
                struct gen_sandbox *sb = &g->sandboxes[i];
                snprintf(sb->id, sizeof(sb->id), "sb-%u-%zu", seed, i);
                snprintf(sb->account, sizeof(sb->account), "acct-%zu", i % 7);
                snprintf(sb->key, sizeof(sb->key), "key-%zu", i % 11);
                sb->nsamples = nsamples / 2 + rnd(&s) % nsamples;
                sb->samples = calloc(sb->nsamples, sizeof(*sb->samples));
                sb->pre = calloc(sb->nsamples, sizeof(*sb->pre));
                uint32_t vcpus = 1 + rnd(&s) % 8;
                uint64_t mem = (1 + rnd(&s) % 16) * GiB / 2;
                uint64_t disk = (uint64_t)(rnd(&s) % 1000) * 1000003;
                int64_t wall = start_ns + (int64_t)(rnd(&s) % 7200) * NS_PER_SEC + rnd(&s) % 1000;
                uint64_t epoch = 1 + rnd(&s) % 3, seq = rnd(&s) % 100, counter = rnd(&s) % 1000000;
                uint64_t epoch_used = counter; /* CPU used in this epoch so far: the counter */
                enum sandbox_state state = STATE_RUNNING;
                sb->truth_cpu_ns = counter; /* the first sample bills its counter */
                for (size_t k = 0; k < sb->nsamples; k++) {
                        bool restarted = false;
                        if (k > 0) {
                                /* time passes in the state of the previous sample */
                                int64_t dt = (int64_t)(1 + rnd(&s) % 300) * NS_PER_SEC + rnd(&s) % NS_PER_SEC;
                                uint64_t used = state == STATE_STOPPED ? 0
                                                : (uint64_t)((u128)(rnd(&s) % 1001) * (uint64_t)dt * vcpus / 1000);
                                if (state == STATE_RUNNING)
                                        sb->truth_mem_byte_ns += (u128)dt * mem;
                                else if (state == STATE_PAUSED)
                                        sb->truth_storage_byte_ns += (u128)dt * (mem + disk);
                                wall += dt;
                                seq += 1 + rnd(&s) % 3;
                                if (rnd(&s) % 100 < 3) {
                                        /* the cgroup was recreated: the counter restarts from zero,
                                         * holding only what was used since */
                                        epoch += 1 + rnd(&s) % 2;
                                        seq = rnd(&s) % 5;
                                        counter = used;
                                        restarted = true;
                                } else {
                                        counter += used;
                                }
                                epoch_used = used;
                                sb->truth_cpu_ns += epoch_used;
                                unsigned r = rnd(&s) % 100;
                                if (k + 1 == sb->nsamples)
                                        state = STATE_STOPPED;
                                else if (state != STATE_STOPPED)
                                        state = r < 75 ? STATE_RUNNING : STATE_PAUSED;
                        }
                        sb->samples[k] = aggtest_sample(sb->account, sb->key, sb->id, epoch, seq, wall, state,
                                                        counter, mem, disk, vcpus);
                        sb->samples[k].mem_bytes = mem / 3;
                        sb->samples[k].final = state == STATE_STOPPED;
                        if (k == 0) {
                                sb->pre[k] = aggtest_created_for(&sb->samples[k]);
                        } else if (restarted) {
                                sb->pre[k] = sb->samples[k];
                                sb->pre[k].type = EVENT_RESTARTED;
                                snprintf(sb->pre[k].reason, sizeof(sb->pre[k].reason), "counter_back");
                        }
                }
                total += sb->nsamples;
        }
        /* Interleave the sandboxes (each in its own order), resend older samples
         * now and then, and finally replay the first third of the stream. */
        size_t cap = total * 3 + 16;
        g->messages = calloc(cap, sizeof(*g->messages));
        size_t *next = calloc(nsandboxes, sizeof(size_t));
        size_t sent = 0;
        while (sent < total) {
                size_t i = rnd(&s) % nsandboxes;
                struct gen_sandbox *sb = &g->sandboxes[i];
                if (next[i] == sb->nsamples)
                        continue;
                if (sb->pre[next[i]].sandbox[0])
                        g->messages[g->nmessages++] = &sb->pre[next[i]];
                g->messages[g->nmessages++] = &sb->samples[next[i]++];
                sent++;
                if (rnd(&s) % 100 < 10)
                        g->messages[g->nmessages++] = &sb->samples[rnd(&s) % next[i]];
        }
        size_t replay = g->nmessages / 3;
        for (size_t k = 0; k < replay && g->nmessages < cap; k++)
                g->messages[g->nmessages++] = g->messages[k];
        free(next);
}

void gen_stream_free(struct gen_stream *g)
{
        for (size_t i = 0; i < g->nsandboxes; i++) {
                free(g->sandboxes[i].samples);
                free(g->sandboxes[i].pre);
        }
        free(g->sandboxes);
        free(g->messages);
}

void gen_stream_verify(struct aggtest *t, const struct gen_stream *g)
{
        PGresult *r = PQexec(t->db, "SELECT sandbox_id, sum(cpu_ns), sum(mem_byte_ns), sum(storage_byte_ns)"
                                    " FROM usage_hourly GROUP BY sandbox_id");
        CHECK(PQresultStatus(r) == PGRES_TUPLES_OK, "usage query: %s", PQresultErrorMessage(r));
        size_t matched = 0;
        for (size_t i = 0; i < g->nsandboxes; i++) {
                const struct gen_sandbox *sb = &g->sandboxes[i];
                char cpu[48], mem[48], sto[48];
                snprintf(cpu, sizeof(cpu), "%llu", (unsigned long long)sb->truth_cpu_ns);
                gen_u128s(sb->truth_mem_byte_ns, mem);
                gen_u128s(sb->truth_storage_byte_ns, sto);
                int row = -1;
                for (int k = 0; k < PQntuples(r); k++)
                        if (strcmp(PQgetvalue(r, k, 0), sb->id) == 0)
                                row = k;
                if (row < 0) {
                        CHECK(sb->truth_cpu_ns == 0 && sb->truth_mem_byte_ns == 0 && sb->truth_storage_byte_ns == 0,
                              "%s: nothing billed", sb->id);
                        continue;
                }
                matched++;
                CHECK(strcmp(PQgetvalue(r, row, 1), cpu) == 0, "%s: CPU billed %s ns, truth %s", sb->id,
                      PQgetvalue(r, row, 1), cpu);
                CHECK(strcmp(PQgetvalue(r, row, 2), mem) == 0, "%s: memory billed %s byte-ns, truth %s", sb->id,
                      PQgetvalue(r, row, 2), mem);
                CHECK(strcmp(PQgetvalue(r, row, 3), sto) == 0, "%s: storage billed %s byte-ns, truth %s", sb->id,
                      PQgetvalue(r, row, 3), sto);
        }
        CHECK((int)matched == PQntuples(r), "ledger has %d sandboxes, the stream %zu", PQntuples(r), matched);
        PQclear(r);
}
