/* spend_limits.c — see spend_limits.h. */
#include "spend_limits.h"
#include "db.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

void spend_limits_init(struct spend_limits *l, const char *url, const char *query)
{
        memset(l, 0, sizeof(*l));
        l->url = url;
        l->query = query;
        pthread_mutex_init(&l->lock, NULL);
}

void spend_limits_free(struct spend_limits *l)
{
        PQfinish(l->db);
        l->db = NULL;
        pthread_mutex_destroy(&l->lock);
}

bool spend_limits_enabled(const struct spend_limits *l)
{
        return l->url && *l->url;
}

int spend_limits_check_key(struct spend_limits *l, const char *account, const char *key, char *why, size_t whylen)
{
        if (!spend_limits_enabled(l))
                return 0;
        int r = 0;
        pthread_mutex_lock(&l->lock);
        for (int attempt = 0; attempt < 2; attempt++) {
                char err[512];
                int c;
                if (strcmp(l->query, SPEND_LIMITS_DEFAULT_QUERY) == 0) {
                        c = db_ensure_conn(&l->db, l->url, NULL, NULL, err, sizeof(err));
                } else if (!l->db || PQstatus(l->db) != CONNECTION_OK) {
                        PQfinish(l->db);
                        l->db = db_connect(l->url, err, sizeof(err));
                        c = l->db ? 0 : -EIO;
                } else {
                        c = 0;
                }
                if (c == -EPROTO) {
                        /* A schema this tally was not built for: its key_blocks may not mean what the
                         * query reads, so no create is let through on it. */
                        log_error("refusing the limits database", "error=\"%s\"", err);
                        r = -EAGAIN;
                        snprintf(why, whylen, "could not check the key's spend limit: %s", err);
                        goto out;
                }
                if (c < 0) {
                        log_warn("could not connect to the limits database", "error=\"%s\"", err);
                        continue;
                }
                const char *params[2] = { account, key };
                PGresult *res = PQexecParams(l->db, l->query, 2, NULL, params, NULL, NULL, 0);
                ExecStatusType st = PQresultStatus(res);
                if (st == PGRES_TUPLES_OK) {
                        r = PQntuples(res) > 0 ? -EACCES : 0;
                        PQclear(res);
                        goto out;
                }
                log_warn("could not check the key's spend limit", "error=\"%s\"", PQresultErrorMessage(res));
                PQclear(res);
                if (PQstatus(l->db) == CONNECTION_OK) {
                        r = -EAGAIN;
                        snprintf(why, whylen, "could not check the key's spend limit (the query failed)");
                        goto out;
                }
        }
        r = -EAGAIN;
        snprintf(why, whylen, "could not check the key's spend limit: the limits database is unreachable");
out:
        pthread_mutex_unlock(&l->lock);
        if (r == -EACCES)
                snprintf(why, whylen, "key %s has reached its daily spend limit: no sandbox starts or resumes for it "
                         "today (its account's day)", key);
        return r;
}
