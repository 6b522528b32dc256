/* pool.c — a small fixed pool of PostgreSQL connections for the request
 * threads. A thread waits for a free connection rather than opening one:
 * the database sees at most db_pool_size connections from one tally-api. */
#include "db.h"
#include "log.h"
#include "server.h"

#include <errno.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct db_pool {
        pthread_mutex_t lock;
        pthread_cond_t freed;
        char *url;
        int size;
        int nfree;
        PGconn **conns; /* the free ones: conns[0..nfree) */
        uint64_t waits;
        int64_t statement_timeout_ms;
};

/* Bounds every statement of a connection (a new one, or one reset after a
 * lost link: a reset starts a new session without it). */
static void set_timeout(struct db_pool *p, PGconn *c)
{
        char sql[64];
        snprintf(sql, sizeof(sql), "SET statement_timeout = %lld", (long long)p->statement_timeout_ms);
        PGresult *res = PQexec(c, sql);
        if (PQresultStatus(res) != PGRES_COMMAND_OK)
                log_warn("could not bound statements", "error=\"%s\"", PQerrorMessage(c));
        PQclear(res);
}

int db_pool_new(const char *url, int size, int64_t statement_timeout_ms, struct db_pool **ret, char *err,
                size_t errlen)
{
        struct db_pool *p = calloc(1, sizeof(*p));
        if (!p || !(p->conns = calloc((size_t)size, sizeof(PGconn *))) || !(p->url = strdup(url))) {
                snprintf(err, errlen, "out of memory");
                if (p)
                        free(p->conns);
                free(p);
                return -ENOMEM;
        }
        pthread_mutex_init(&p->lock, NULL);
        pthread_cond_init(&p->freed, NULL);
        p->size = size;
        p->statement_timeout_ms = statement_timeout_ms;
        for (int i = 0; i < size; i++) {
                PGconn *c = db_connect(url, err, errlen);
                if (!c) {
                        db_pool_free(p);
                        return -ECONNREFUSED;
                }
                /* A database of another schema than this tally-api was built for: refused at start. */
                int r = i == 0 ? db_check_schema(c, err, errlen) : 0;
                if (r < 0) {
                        PQfinish(c);
                        db_pool_free(p);
                        return r;
                }
                set_timeout(p, c);
                p->conns[p->nfree++] = c;
        }
        *ret = p;
        return 0;
}

PGconn *db_pool_get(struct db_pool *p)
{
        pthread_mutex_lock(&p->lock);
        if (p->nfree == 0)
                p->waits++;
        while (p->nfree == 0)
                pthread_cond_wait(&p->freed, &p->lock);
        PGconn *c = p->conns[--p->nfree];
        pthread_mutex_unlock(&p->lock);
        if (PQstatus(c) != CONNECTION_OK)
                db_pool_reset(p, c);
        return c;
}

bool db_pool_reset(struct db_pool *p, PGconn *c)
{
        PQreset(c);
        if (PQstatus(c) != CONNECTION_OK) {
                log_warn("could not reconnect to the database", "error=\"%s\"", PQerrorMessage(c));
                return false;
        }
        set_timeout(p, c);
        return true;
}

void db_pool_put(struct db_pool *p, PGconn *c)
{
        if (!c)
                return;
        if (PQtransactionStatus(c) != PQTRANS_IDLE)
                PQclear(PQexec(c, "ROLLBACK"));
        pthread_mutex_lock(&p->lock);
        p->conns[p->nfree++] = c;
        pthread_cond_signal(&p->freed);
        pthread_mutex_unlock(&p->lock);
}

void db_pool_stats(struct db_pool *p, int *ret_size, int *ret_in_use, uint64_t *ret_waits)
{
        pthread_mutex_lock(&p->lock);
        *ret_size = p->size;
        *ret_in_use = p->size - p->nfree;
        *ret_waits = p->waits;
        pthread_mutex_unlock(&p->lock);
}

void db_pool_free(struct db_pool *p)
{
        if (!p)
                return;
        for (int i = 0; i < p->nfree; i++)
                PQfinish(p->conns[i]);
        pthread_mutex_destroy(&p->lock);
        pthread_cond_destroy(&p->freed);
        free(p->conns);
        free(p->url);
        free(p);
}
