/* janitor.c — see janitor.h. */
#include "janitor.h"

#include "destinations.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define JANITOR_PERIOD_S 60

struct janitor {
        const struct api_config *cfg;
        struct db_pool *pool;
        pthread_t thread;
        bool stopping;
        pthread_mutex_t lock;
        pthread_cond_t wake;
};

static void janitor_round(struct janitor *j)
{
        PGconn *db = db_pool_get(j->pool);
        PQclear(db_query(db, "remove expired sessions", PGRES_COMMAND_OK,
                         "DELETE FROM sessions WHERE expires_at < now()", 0, NULL));
        PQclear(db_query(db, "remove old idempotency keys", PGRES_COMMAND_OK,
                         "DELETE FROM idempotency_keys WHERE created_at < now() - interval '24 hours'", 0, NULL));
        char window[24];
        snprintf(window, sizeof(window), "%lld", (long long)j->cfg->signin_window_s);
        const char *wp[] = { window };
        PQclear(db_query(db, "remove ended sign-in windows", PGRES_COMMAND_OK,
                         "DELETE FROM signin_attempts "
                         "WHERE window_start < now() - $1::bigint * interval '1 second'",
                         1, wp));
        alert_metrics_refresh(db);
        db_pool_put(j->pool, db);
}

static void *janitor_main(void *arg)
{
        struct janitor *j = arg;
        pthread_mutex_lock(&j->lock);
        while (!j->stopping) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_sec += JANITOR_PERIOD_S;
                pthread_cond_timedwait(&j->wake, &j->lock, &until);
                if (j->stopping)
                        break;
                pthread_mutex_unlock(&j->lock);
                janitor_round(j);
                pthread_mutex_lock(&j->lock);
        }
        pthread_mutex_unlock(&j->lock);
        return NULL;
}

int janitor_start(const struct api_config *cfg, struct db_pool *pool, struct janitor **ret)
{
        struct janitor *j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->cfg = cfg;
        j->pool = pool;
        pthread_mutex_init(&j->lock, NULL);
        pthread_cond_init(&j->wake, NULL);
        int r = pthread_create(&j->thread, NULL, janitor_main, j);
        if (r != 0) {
                pthread_mutex_destroy(&j->lock);
                pthread_cond_destroy(&j->wake);
                free(j);
                return -r;
        }
        *ret = j;
        return 0;
}

void janitor_stop(struct janitor *j)
{
        if (!j)
                return;
        pthread_mutex_lock(&j->lock);
        j->stopping = true;
        pthread_cond_signal(&j->wake);
        pthread_mutex_unlock(&j->lock);
        pthread_join(j->thread, NULL);
        pthread_mutex_destroy(&j->lock);
        pthread_cond_destroy(&j->wake);
        free(j);
}
