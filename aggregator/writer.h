/* writer.h — the thread that runs each commit's transaction (store_finish:
 * every statement, the staging COPYs first), on a ledger connection
 * of its own, while the loop (loop.c) goes on folding the next batch. One
 * commit at a time: the loop takes a commit's result (settle) before it
 * starts the next, and before anything that would read what that commit
 * writes. Only the loop's thread calls these. */
#pragma once

#include "batch.h"
#include "ledger.h"
#include "metrics.h"
#include "partitions.h"
#include "store.h"
#include "text.h"

#include <pthread.h>
#include <stdbool.h>

enum writer_state { WRITER_IDLE, WRITER_RUNNING, WRITER_DONE };

struct writer {
        pthread_t thread;
        bool started;
        pthread_mutex_t mu;
        pthread_cond_t cv;
        enum writer_state state;
        bool quit;
        struct ledger *ledger;
        struct batch *batch;
        struct partitions positions;    /* the partitions as the batch left them (parts copied) */
        struct agg_metrics *metrics;
        struct commit_report rep;
        /* Instead of a commit: rows of `created` events to commit ahead of
         * their batch (lifecycle_announce). */
        bool announce;
        struct text rows;
        int result;
};

/* Starts the thread (idle). 0 or -errno. */
int writer_start(struct writer *w);

/* Ends the thread (after the commit it runs, if any) and frees the copy of the positions. */
void writer_stop(struct writer *w);

/* Copies the partitions' positions as the batch left them, for its offsets
 * statement: the loop moves them on while the writer commits. 0 or -ENOMEM. */
int writer_positions(struct writer *w, const struct partitions *src);

/* Runs store_finish(w->ledger, w->batch, &w->positions, w->metrics, &w->rep)
 * on the thread, or with announce set lifecycle_announce(w->ledger,
 * &w->rows); the writer must be idle. */
void writer_submit(struct writer *w);

/* Has the commit submitted finished (writer_wait will not wait)? */
bool writer_finished(struct writer *w);

/* Waits for the commit submitted; its result. The writer is idle after. */
int writer_wait(struct writer *w);
