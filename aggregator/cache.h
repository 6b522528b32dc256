/* cache.h — the sandboxes the aggregator holds in memory, and the fold
 * state store they are read from.
 *
 * In-memory state is always "the ledger plus the batch": a sandbox not in
 * memory is read from the ledger by id (fold_state joined with its sandboxes
 * row) the first time one of its messages comes, whatever partition brings
 * it; prefetch reads those of a whole poll in one query first. Memory stays
 * bounded: sandboxes_sweep evicts those not used for a while (their state
 * stays in the ledger). The cache owns every struct sandbox; a batch points
 * at them, so nothing is dropped or evicted while a batch holds any. */
#pragma once

#include "event.h"
#include "fold.h"
#include "ledger.h"
#include "metrics.h"

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sandbox {
        char id[EVENT_ID_MAX + 1];
        char account[EVENT_ID_MAX + 1];
        char key[EVENT_ID_MAX + 1];
        char host[EVENT_ID_MAX + 1];
        int32_t partition;
        /* Its size, from its `created` event (or the ledger's row of it): a
         * reading that does not carry one (the vmm's `stopped` event need
         * not) is billed at this size. 0: not known. */
        uint32_t vcpus;
        uint64_t mem_size_bytes;
        struct fold_state fold;
        bool dirty;             /* listed in the batch's dirty list */
        bool sampled;           /* a collector's sample of it was billed in the open batch */
        /* What the sandboxes table holds for it (state + 1; 0: unknown), and
         * its host there: the row is only written when they change. */
        int db_state;
        char db_host[EVENT_ID_MAX + 1];
        /* The ledger has no sandboxes row for it: none when it was looked up,
         * and no commit of this aggregator has written one since. */
        bool no_row;
        int64_t version;        /* fold_state.version it was read or last written at; 0: no row */
        /* Network bytes (recorded, not priced): the highest cumulative counters
         * its samples carried, and whether the sandboxes row is behind them. */
        uint64_t net_rx, net_tx;
        bool net_unsaved;
        int64_t used_ns;        /* monotonic time of its last commit, for eviction */
        size_t piece;           /* its newest piece in the open batch, + 1; 0: none (batch.h) */
        struct sandbox *next;   /* hash chain */
};

/* A set of sandbox ids: added to, then sorted once, and searched (the
 * sorted part). */
struct id_set {
        char (*ids)[EVENT_ID_MAX + 1];
        size_t n, cap, sorted;
};

struct sandbox_cache {
        struct ledger *ledger;          /* borrowed: where fold state is read from */
        struct agg_metrics *metrics;    /* borrowed; may be NULL */
        struct sandbox **buckets;
        size_t nbuckets, nsandboxes;
        /* Sandboxes a prefetch looked up and the ledger has no row for:
         * new, so sandbox_add need not ask again. */
        struct id_set absent;
        /* Sandboxes a prefetch looked up that have no held readings in the
         * ledger: their `created` event need not ask for them
         * (sandbox_unheld). Forgotten with absent, and at every commit (a
         * commit may store held readings). */
        struct id_set unheld;
};

/* The sandbox of id in memory, or NULL. */
struct sandbox *sandbox_find(struct sandbox_cache *c, const char *id);

/* A sandbox not in memory: its fold state is read from the ledger by id
 * (whatever partition it arrives on), unless a prefetch already found it has
 * none. NULL when the ledger cannot be read: the caller drops the batch and
 * reads it again, never billing from an empty state a row exists for. */
struct sandbox *sandbox_add(struct sandbox_cache *c, const char *id);

/* Before messages are folded: the fold state of every sandbox among them not
 * in memory, read in one query (but for those an earlier prefetch found
 * absent and unheld, not forgotten since: messages looked at again while
 * they wait for their commit group, loop.c). A failure is not fatal here:
 * sandbox_add reads each one again. */
void prefetch(struct sandbox_cache *c, rd_kafka_message_t **msgs, size_t n);

/* Did the last prefetch (since the last commit) find that the ledger holds
 * no readings held for id (held.h)? false: not known, ask. */
bool sandbox_unheld(const struct sandbox_cache *c, const char *id);

/* Forgets which sandboxes have no held readings: called at every commit. */
void sandboxes_forget_unheld(struct sandbox_cache *c);

/* Reads the state of a sandbox no one has once, as a prefetch would: a
 * session's first read of the fold state parses the catalogs of the tables
 * it joins, which the aggregator pays at start instead of in its first
 * poll's latency. */
void sandboxes_warm(struct sandbox_cache *c);

/* Forgets which sandboxes prefetches found the ledger has no row for, and
 * which have no held readings (once the messages looked up are taken:
 * another aggregator may write them later). */
void sandboxes_forget_absent(struct sandbox_cache *c);

/* Drops the state of every sandbox of partitions p < ndrop for which drop[p]
 * is set (drop NULL: all). Also forgets which sandboxes the ledger had no
 * row for. Never while a batch holds sandboxes. */
void sandboxes_drop(struct sandbox_cache *c, const bool *drop, int32_t ndrop);

/* Evicts sandboxes unused for keep_idle_ms, and stopped ones unused for
 * keep_stopped_ms, but none the open batch points at, and then forgets which
 * were absent (an evicted one may have been). Never while a commit is under
 * way. Returns how many it evicted. */
size_t sandboxes_sweep(struct sandbox_cache *c, int64_t keep_idle_ms, int64_t keep_stopped_ms);

/* Frees every sandbox and the table (the cache may be used again). */
void sandbox_cache_free(struct sandbox_cache *c);
