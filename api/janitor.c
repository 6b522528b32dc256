/* janitor.c — see janitor.h. */
#include "janitor.h"

#include "destinations.h"
#include "log.h"
#include "vmm_hosts.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define JANITOR_PERIOD_S 60
/* The host registry's states are read this often (host_states). */
#define HOST_STATES_PERIOD_S 2

struct janitor {
        const struct api_config *cfg;
        struct db_pool *pool;
        struct vmm_hosts *hosts;
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

/* The operator's state of each registered host (sql/021: draining, or down
 * by its heartbeat) onto tally-api's hosts: a draining host takes no create. */
static void host_states_round(struct janitor *j)
{
        PGconn *db = db_pool_get(j->pool);
        PGresult *res = db_query(db, "read the host registry", PGRES_TUPLES_OK,
                                 "SELECT host_id, effective_state, address FROM host_states ORDER BY host_id", 0,
                                 NULL);
        int n = res ? PQntuples(res) : 0;
        const char **ids = calloc((size_t)n + 1, sizeof(*ids)), **states = calloc((size_t)n + 1, sizeof(*states)),
                   **addresses = calloc((size_t)n + 1, sizeof(*addresses));
        for (int i = 0; ids && states && addresses && i < n; i++) {
                ids[i] = PQgetvalue(res, i, 0);
                states[i] = PQgetvalue(res, i, 1);
                addresses[i] = PQgetisnull(res, i, 2) ? NULL : PQgetvalue(res, i, 2);
        }
        if (res && ids && states && addresses) /* (a failed read leaves the states as they were) */
                vmm_hosts_set_states(j->hosts, n, ids, states, addresses);
        free(ids);
        free(states);
        free(addresses);
        PQclear(res);
        db_pool_put(j->pool, db);
}

static void *janitor_main(void *arg)
{
        struct janitor *j = arg;
        pthread_mutex_lock(&j->lock);
        for (int tick = 1; !j->stopping; tick++) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_sec += HOST_STATES_PERIOD_S;
                pthread_cond_timedwait(&j->wake, &j->lock, &until);
                if (j->stopping)
                        break;
                pthread_mutex_unlock(&j->lock);
                if (j->hosts)
                        host_states_round(j);
                if (tick % (JANITOR_PERIOD_S / HOST_STATES_PERIOD_S) == 0)
                        janitor_round(j);
                pthread_mutex_lock(&j->lock);
        }
        pthread_mutex_unlock(&j->lock);
        return NULL;
}

int janitor_start(const struct api_config *cfg, struct db_pool *pool, struct vmm_hosts *hosts, struct janitor **ret)
{
        struct janitor *j = calloc(1, sizeof(*j));
        if (!j)
                return -ENOMEM;
        j->cfg = cfg;
        j->pool = pool;
        j->hosts = hosts;
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
