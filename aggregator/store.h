/* store.h — writing a batch to the ledger: the SQL a commit runs, the
 * staging of usage and fold state (COPY into the session's staging tables),
 * and the commit itself, one transaction run as a table of steps.
 *
 * One transaction holds everything a batch produced: usage upserts, spend
 * per key and day (rated), fold state fenced per sandbox by version, the
 * sandboxes rows, lifecycle events, dead letters, held readings, the
 * partitions' next offsets fenced by generation, alerts and blocks, and last
 * the per-host sample times (the one row aggregators share, held until
 * COMMIT). Every statement is one the tally_aggregator role is granted
 * (sql/013_roles.sql, 014_provenance.sql). Nothing here publishes or changes
 * memory: the caller does that once store_commit returned 0. */
#pragma once

#include "batch.h"
#include "enforce.h"
#include "ledger.h"
#include "metrics.h"
#include "partitions.h"
#include "text.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a committed transaction produced, for the caller to act on. */
struct commit_report {
        size_t rows;            /* usage rows (sandbox, hour) written */
        int partitions;         /* partitions whose offsets it moves (set by the caller, for the log) */
        long fired, blocked;    /* alerts recorded; keys newly blocked */
        long waived;            /* sandboxes whose paused storage a new block waives */
        struct command *cmds;   /* enforcement to publish after COMMIT; the caller frees it */
        int ncmds;
        int64_t t0;             /* monotonic ns: start */
        int64_t at[10];         /* monotonic ns: end of each step (store.c) */
        struct text usage_copy; /* from store_prepare to store_finish: stage_usage's COPY rows */
        struct text fold_copy;  /* and stage_fold's */
};

/* A batch's commit in two halves. store_prepare writes out the rows that
 * read the batch's sandboxes, which the cache owns and the loop goes on
 * folding (the caller's thread; no database). store_finish then commits the
 * batch in one transaction — the staging COPYs, the batch's own arrays and
 * ps — so it may run on another thread while the caller folds the next batch
 * (given a copy of the partitions' positions and the ledger to itself).
 * store_finish returns 0; -ESTALE when a partition is no longer ours
 * (generation moved on); -EBUSY when another aggregator moved a sandbox's
 * fold state or a held reading on meanwhile; -EIO when the ledger refused
 * (last_error says why); -ENOMEM, -ENOBUFS. On failure the transaction is
 * rolled back and nothing of the batch was written; *ret is filled either
 * way (free ret->cmds). A report's buffers are kept for the next batch:
 * store_report_free frees them. */
int store_prepare(struct batch *b, struct commit_report *ret);
int store_finish(struct ledger *l, struct batch *b, const struct partitions *ps, struct agg_metrics *metrics,
                 struct commit_report *ret);
void store_report_free(struct commit_report *rep);

/* Runs every statement of a commit once on l's empty staging tables, in a
 * transaction rolled back: a session's first commit parses the catalogs of
 * the tables and their triggers and compiles the triggers' PL/pgSQL, which
 * the aggregator pays at start instead of in its first batch's latency.
 * 0, or -EIO (logged; the first commit then pays it). */
int store_warm(struct ledger *l);

/* Logs what a committed batch did and how long each part of it took. */
void store_log_committed(const struct commit_report *rep, const struct batch *b);

/* Inserts one dead letter (the session's prepared statement). 0 or -EIO. */
int store_dead(struct ledger *l, const struct dead_letter *d);
