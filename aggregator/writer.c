/* writer.c — see writer.h. */
#include "writer.h"

#include "lifecycle.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void *writer_main(void *arg)
{
        struct writer *w = arg;
        pthread_mutex_lock(&w->mu);
        while (!w->quit) {
                if (w->state != WRITER_RUNNING) {
                        pthread_cond_wait(&w->cv, &w->mu);
                        continue;
                }
                pthread_mutex_unlock(&w->mu);
                int r = w->announce ? lifecycle_announce(w->ledger, &w->rows)
                                    : store_finish(w->ledger, w->batch, &w->positions, w->metrics, &w->rep);
                pthread_mutex_lock(&w->mu);
                w->result = r;
                w->state = WRITER_DONE;
                pthread_cond_broadcast(&w->cv);
        }
        pthread_mutex_unlock(&w->mu);
        return NULL;
}

int writer_start(struct writer *w)
{
        pthread_mutex_init(&w->mu, NULL);
        pthread_cond_init(&w->cv, NULL);
        int e = pthread_create(&w->thread, NULL, writer_main, w);
        w->started = e == 0;
        return -e;
}

void writer_stop(struct writer *w)
{
        if (!w->started)
                return;
        pthread_mutex_lock(&w->mu);
        w->quit = true;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w->positions.parts);
        free(w->rows.buf);
        store_report_free(&w->rep);
        w->started = false;
}

void writer_submit(struct writer *w)
{
        pthread_mutex_lock(&w->mu);
        w->state = WRITER_RUNNING;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
}

bool writer_finished(struct writer *w)
{
        pthread_mutex_lock(&w->mu);
        bool done = w->state == WRITER_DONE;
        pthread_mutex_unlock(&w->mu);
        return done;
}

int writer_wait(struct writer *w)
{
        pthread_mutex_lock(&w->mu);
        while (w->state == WRITER_RUNNING)
                pthread_cond_wait(&w->cv, &w->mu);
        int r = w->result;
        w->state = WRITER_IDLE;
        pthread_mutex_unlock(&w->mu);
        return r;
}

int writer_positions(struct writer *w, const struct partitions *src)
{
        struct partitions *dst = &w->positions;
        if (dst->nparts < src->nparts) {
                struct partition *p = realloc(dst->parts, (size_t)src->nparts * sizeof(*p));
                if (!p)
                        return -ENOMEM;
                dst->parts = p;
        }
        dst->group = src->group;
        dst->nparts = src->nparts;
        if (src->nparts)
                memcpy(dst->parts, src->parts, (size_t)src->nparts * sizeof(*dst->parts));
        return 0;
}
