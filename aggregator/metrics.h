/* metrics.h — tally-aggregator's counters and their /metrics page (Prometheus
 * text format), served by libmicrohttpd's own thread.
 *
 * The aggregator's loop is the only writer; the HTTP thread only reads, so
 * every figure is a relaxed atomic. To add a counter (the fold's counter
 * resets and clock refusals, say): a field here and one line in the table of
 * metrics.c. Integers only: durations are counted in microseconds. */
#pragma once

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "metrics_text.h"

/* Causes a message goes to dead_letters for. */
enum agg_dead_cause {
        AGG_DEAD_DECODE,   /* refused by the decoder or the fold (bad or impossible input) */
        AGG_DEAD_DATABASE, /* isolated by splitting a batch the database kept refusing */
        AGG_DEAD_CAUSES,
};

struct agg_metrics {
        _Atomic uint64_t batches_committed, messages_committed, batches_failed, batches_fenced;
        _Atomic uint64_t dead_letters[AGG_DEAD_CAUSES];
        _Atomic uint64_t batch_splits;          /* times a failing batch was halved */
        _Atomic uint64_t offset_gaps, offsets_lost;
        _Atomic uint64_t rating_gaps;           /* (account, meter, hour) with usage and no rate (rating_gaps) */
        _Atomic uint64_t sandboxes_fenced;      /* commits refused: a sandbox's fold state moved on elsewhere */
        _Atomic uint64_t sandboxes_loaded, sandboxes_evicted;
        _Atomic uint64_t state_reads;           /* queries reading fold states (a poll's sandboxes, or one) */
        _Atomic uint64_t sandboxes_in_memory;   /* gauge */
        _Atomic uint64_t metering_gap_hosts;    /* gauge: hosts in the metering_gaps view at the last check */
        _Atomic uint64_t metering_gaps_seen;    /* times a host was seen in a gap at a check */
        /* The fold's (docs/events.md, "How the aggregator reads samples"). */
        _Atomic uint64_t clock_ahead, clock_behind; /* readings placed at our clock: dated too far ahead / behind */
        _Atomic uint64_t counter_resets;        /* CPU counters that went back within an epoch (billed as restarts) */
        _Atomic uint64_t held_back;             /* held-time counters that went back (nothing billed for them) */
        _Atomic uint64_t stops_folded;          /* vmm `stopped` events folded */
        /* Provenance (docs/billing.md, "Provenance"). */
        _Atomic uint64_t readings_held;         /* readings held: no `created` yet, or an epoch not announced */
        _Atomic uint64_t readings_released;     /* held readings taken once their provenance came */
        _Atomic uint64_t readings_expired;      /* held readings dead-lettered after provenance_grace_ms */
        struct metrics_histogram commit;        /* one batch's transaction, BEGIN to COMMIT */
        struct metrics_histogram lag;           /* a message's Kafka timestamp to its commit (ms-granular) */
};

/* Writes the page into buf; returns its length or -ENOBUFS. */
int agg_metrics_text(const struct agg_metrics *m, char *buf, size_t size);

/* The same, as the page of a metrics_http server (arg: the struct agg_metrics). */
int agg_metrics_page(const void *m, char *buf, size_t size);

/* Logs (debug) the commit lag histogram hist of `buckets` 1 ms buckets: lines of
 * "ms:samples" pairs for the buckets not empty, for a benchmark to merge the
 * histograms of several aggregators. */
void agg_log_lag_histogram(const uint64_t *hist, int buckets);
