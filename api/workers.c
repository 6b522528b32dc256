/* workers.c — the threads that run the requests which wait on something
 * slow (a tally-vmm: an exec may run for hours; an Idempotency-Key retry
 * waiting for the first request), so that libmicrohttpd's threads only ever
 * parse, authenticate and answer, and /healthz and every read stay fast
 * whatever one tenant runs.
 *
 * Every bound is per tenant: a key runs at most per_key jobs at once and an
 * account at most per_account (below the number of workers, so one account
 * never holds them all); what waits is one FIFO, from which a free worker
 * takes the first job whose key and account are under their caps, so a
 * tenant at its caps never holds up anyone else's job. An account may have
 * queue_per_account jobs waiting and all accounts queue_max together; past
 * either, a submit is refused (the server answers 429). It must never run a
 * job twice or drop one: each is run exactly once, or cancelled at stop. */
#include "log.h"
#include "server.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What runs now or waits, per key or per account. */
struct tenant {
        char id[2 * EVENT_ID_MAX + 16];
        int running, queued;
};

struct work_pool {
        struct work_limits lim;
        pthread_mutex_t lock;
        pthread_cond_t wake, idle;
        struct work_job *head, *tail; /* waiting, oldest first */
        int queued, running;
        bool stopping;
        /* Tenants with a job running or waiting; small (at most workers + queue_max of them), scanned linearly. */
        struct tenant *tenants;
        size_t ntenants, cap;
        pthread_t *threads;
        int nthreads;
};

static struct tenant *tenant_get(struct work_pool *p, const char *id, bool create)
{
        for (size_t i = 0; i < p->ntenants; i++)
                if (strcmp(p->tenants[i].id, id) == 0)
                        return &p->tenants[i];
        if (!create)
                return NULL;
        if (p->ntenants == p->cap) {
                size_t cap = p->cap ? 2 * p->cap : 64;
                struct tenant *t = realloc(p->tenants, cap * sizeof(*t));
                if (!t)
                        return NULL;
                p->tenants = t;
                p->cap = cap;
        }
        struct tenant *t = &p->tenants[p->ntenants++];
        memset(t, 0, sizeof(*t));
        snprintf(t->id, sizeof(t->id), "%s", id);
        return t;
}

/* Forgets a tenant with nothing running or waiting (keeps the table small). */
static void tenant_tidy(struct work_pool *p, struct tenant *t)
{
        if (t->running || t->queued)
                return;
        *t = p->tenants[--p->ntenants];
}

static void job_ids(const struct work_job *j, char acct[2 * EVENT_ID_MAX + 16], char who[2 * EVENT_ID_MAX + 16])
{
        snprintf(acct, 2 * EVENT_ID_MAX + 16, "a:%s", j->account);
        snprintf(who, 2 * EVENT_ID_MAX + 16, "w:%s:%s", j->account, j->who);
}

/* The first waiting job whose key and account are under their caps, taken
 * off the queue and counted as running; NULL when none may run. */
static struct work_job *take(struct work_pool *p)
{
        struct work_job *prev = NULL;
        for (struct work_job *j = p->head; j; prev = j, j = j->next) {
                char a[2 * EVENT_ID_MAX + 16], w[2 * EVENT_ID_MAX + 16];
                job_ids(j, a, w);
                struct tenant *ta = tenant_get(p, a, false), *tw = tenant_get(p, w, false);
                if (!ta || !tw || ta->running >= p->lim.per_account || tw->running >= p->lim.per_key)
                        continue;
                if (prev)
                        prev->next = j->next;
                else
                        p->head = j->next;
                if (p->tail == j)
                        p->tail = prev;
                j->next = NULL;
                ta->queued--;
                tw->queued--;
                ta->running++;
                tw->running++;
                p->queued--;
                p->running++;
                return j;
        }
        return NULL;
}

static void *worker(void *arg)
{
        struct work_pool *p = arg;
        pthread_mutex_lock(&p->lock);
        for (;;) {
                struct work_job *j = NULL;
                while (!p->stopping && !(j = take(p)))
                        pthread_cond_wait(&p->wake, &p->lock);
                if (!j)
                        break;
                /* j is the submitter's: it may be freed as soon as run returns */
                char a[2 * EVENT_ID_MAX + 16], w[2 * EVENT_ID_MAX + 16];
                job_ids(j, a, w);
                pthread_mutex_unlock(&p->lock);
                j->run(j, false);
                j = NULL;
                pthread_mutex_lock(&p->lock);
                struct tenant *ta = tenant_get(p, a, false);
                if (ta) {
                        ta->running--;
                        tenant_tidy(p, ta);
                }
                struct tenant *tw = tenant_get(p, w, false);
                if (tw) {
                        tw->running--;
                        tenant_tidy(p, tw);
                }
                p->running--;
                /* a job of this tenant may be next: every worker looks again */
                pthread_cond_broadcast(&p->wake);
                pthread_cond_broadcast(&p->idle);
        }
        pthread_mutex_unlock(&p->lock);
        return NULL;
}

int work_pool_new(const struct work_limits *lim, struct work_pool **ret, char *err, size_t errlen)
{
        if (lim->per_account >= lim->workers || lim->per_key > lim->per_account) {
                snprintf(err, errlen,
                         "workers_per_account (%lld) must be below workers (%lld), and workers_per_key (%lld) at most "
                         "workers_per_account: one tenant must never hold every worker",
                         (long long)lim->per_account, (long long)lim->workers, (long long)lim->per_key);
                return -EINVAL;
        }
        struct work_pool *p = calloc(1, sizeof(*p));
        if (!p || !(p->threads = calloc((size_t)lim->workers, sizeof(pthread_t)))) {
                free(p);
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        p->lim = *lim;
        pthread_mutex_init(&p->lock, NULL);
        pthread_cond_init(&p->wake, NULL);
        pthread_cond_init(&p->idle, NULL);
        for (int i = 0; i < (int)lim->workers; i++) {
                if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
                        snprintf(err, errlen, "could not start a worker thread");
                        work_pool_free(p, 0);
                        return -EAGAIN;
                }
                p->nthreads++;
        }
        *ret = p;
        return 0;
}

int work_pool_submit(struct work_pool *p, struct work_job *j)
{
        char a[2 * EVENT_ID_MAX + 16], w[2 * EVENT_ID_MAX + 16];
        job_ids(j, a, w);
        int rc = 0;
        pthread_mutex_lock(&p->lock);
        /* both made first: making one may move the other (the table grows) */
        bool made = tenant_get(p, a, true) && tenant_get(p, w, true);
        struct tenant *ta = made ? tenant_get(p, a, false) : NULL, *tw = made ? tenant_get(p, w, false) : NULL;
        if (p->stopping || !ta || !tw) {
                rc = -ENOMEM;
        } else if (p->queued >= p->lim.queue_max || ta->queued >= p->lim.queue_per_account) {
                rc = -EBUSY;
        } else {
                j->next = NULL;
                if (p->tail)
                        p->tail->next = j;
                else
                        p->head = j;
                p->tail = j;
                ta->queued++;
                tw->queued++;
                p->queued++;
                pthread_cond_broadcast(&p->wake);
        }
        if (rc < 0) {
                /* tidying one may move the other: each is looked up afresh */
                if ((tw = tenant_get(p, w, false)))
                        tenant_tidy(p, tw);
                if ((ta = tenant_get(p, a, false)))
                        tenant_tidy(p, ta);
        }
        pthread_mutex_unlock(&p->lock);
        return rc;
}

void work_pool_stats(struct work_pool *p, int *ret_running, int *ret_queued)
{
        pthread_mutex_lock(&p->lock);
        *ret_running = p->running;
        *ret_queued = p->queued;
        pthread_mutex_unlock(&p->lock);
}

bool work_pool_free(struct work_pool *p, int64_t wait_ms)
{
        if (!p)
                return true;
        pthread_mutex_lock(&p->lock);
        p->stopping = true;
        /* what waits is cancelled (its caller answers 503), never run */
        struct work_job *j = p->head;
        p->head = p->tail = NULL;
        p->queued = 0;
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
        while (j) {
                struct work_job *next = j->next;
                j->run(j, true);
                j = next;
        }
        /* what runs gets wait_ms to end; a worker still in a long call is left to the process's exit */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += wait_ms / 1000;
        until.tv_nsec += (wait_ms % 1000) * 1000000;
        if (until.tv_nsec >= 1000000000) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000;
        }
        pthread_mutex_lock(&p->lock);
        while (p->running > 0 && pthread_cond_timedwait(&p->idle, &p->lock, &until) == 0)
                ;
        bool done = p->running == 0;
        pthread_mutex_unlock(&p->lock);
        if (!done) {
                log_warn("stopping with requests still running on a tally-vmm", "running=%d", p->running);
                return false;
        }
        for (int i = 0; i < p->nthreads; i++)
                pthread_join(p->threads[i], NULL);
        pthread_mutex_destroy(&p->lock);
        pthread_cond_destroy(&p->wake);
        pthread_cond_destroy(&p->idle);
        free(p->tenants);
        free(p->threads);
        free(p);
        return true;
}
