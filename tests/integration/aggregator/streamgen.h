/* streamgen.h — random usage streams with their ground truth.
 *
 * Each sandbox's life is drawn at random: samples at random intervals, states
 * that change at samples, counters that grow and sometimes restart in a new
 * epoch. The ground truth (CPU used, byte-ns held running, byte-ns kept paused)
 * is summed here while drawing, from the life itself, independently of the
 * aggregator. The stream sent adds what Kafka and producers do: sandboxes
 * interleaved, older samples resent later, and a replay of a prefix. Each
 * sandbox's `created` event comes before its first sample, and a `restarted`
 * event before the first sample of each new epoch, as the hosts send them. */
#pragma once

#include "aggtest.h"
#include "fold.h"

struct gen_sandbox {
        char id[32], account[32], key[32];
        uint64_t truth_cpu_ns;
        u128 truth_mem_byte_ns, truth_storage_byte_ns;
        size_t nsamples;
        struct usage_event *samples; /* in order */
        /* Sent just before samples[k] when pre[k].sandbox is set: the vmm's
         * `created` before the first, a `restarted` announcing each new epoch. */
        struct usage_event *pre;
};

struct gen_stream {
        size_t nsandboxes;
        struct gen_sandbox *sandboxes;
        size_t nmessages;
        const struct usage_event **messages; /* what is sent, in order (points into samples) */
};

/* Draws nsandboxes lives of about nsamples each, starting around start_ns. */
void gen_stream_make(struct gen_stream *g, unsigned seed, size_t nsandboxes, size_t nsamples, int64_t start_ns);
void gen_stream_free(struct gen_stream *g);
/* v in decimal into buf (at least 40 bytes), as the ledger's numeric columns print it; returns buf. */
char *gen_u128s(u128 v, char *buf);

/* Compares the ledger's totals per sandbox with the ground truth; CHECKs. */
void gen_stream_verify(struct aggtest *t, const struct gen_stream *g);
