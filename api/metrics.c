/* metrics.c — see metrics.h. */
#include "metrics.h"

#include "destinations.h"
#include "router.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

static const int64_t bucket_us[] = { 1000, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 5000000 };
#define NBUCKETS (sizeof(bucket_us) / sizeof(bucket_us[0]))
#define STATUS_MAX 600

/* Each array has one row a route, plus the row of "no route". */
struct api_metrics {
        size_t nroutes;
        _Atomic uint64_t (*by_status)[STATUS_MAX];
        _Atomic uint64_t (*buckets)[NBUCKETS + 1];
        _Atomic uint64_t *sum_us;
};

int api_metrics_new(size_t nroutes, struct api_metrics **ret)
{
        struct api_metrics *m = calloc(1, sizeof(*m));
        if (!m)
                return -ENOMEM;
        m->nroutes = nroutes;
        m->by_status = calloc(nroutes + 1, sizeof(*m->by_status));
        m->buckets = calloc(nroutes + 1, sizeof(*m->buckets));
        m->sum_us = calloc(nroutes + 1, sizeof(*m->sum_us));
        if (!m->by_status || !m->buckets || !m->sum_us) {
                api_metrics_free(m);
                return -ENOMEM;
        }
        *ret = m;
        return 0;
}

void api_metrics_free(struct api_metrics *m)
{
        if (!m)
                return;
        free(m->by_status);
        free(m->buckets);
        free(m->sum_us);
        free(m);
}

void api_metrics_count(struct api_metrics *m, size_t ri, int status, int64_t us)
{
        if (ri > m->nroutes)
                ri = m->nroutes;
        if (status >= 100 && status < STATUS_MAX)
                atomic_fetch_add(&m->by_status[ri][status], 1);
        size_t b = 0;
        while (b < NBUCKETS && us > bucket_us[b])
                b++;
        atomic_fetch_add(&m->buckets[ri][b], 1);
        atomic_fetch_add(&m->sum_us[ri], (uint64_t)us);
}

int h_metrics(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        struct api_metrics *m = r->srv->metrics;
        size_t nroutes = m->nroutes;
        char *buf = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&buf, &len);
        if (!f)
                return api_fail(err, 500, "internal", NULL, "out of memory");
        fprintf(f, "# HELP tally_api_requests_total Requests answered, by route and status.\n"
                   "# TYPE tally_api_requests_total counter\n");
        for (size_t i = 0; i <= nroutes; i++)
                for (int s = 100; s < STATUS_MAX; s++) {
                        uint64_t n = atomic_load(&m->by_status[i][s]);
                        if (n)
                                fprintf(f, "tally_api_requests_total{method=\"%s\",route=\"%s\",status=\"%d\"} %llu\n",
                                        i < nroutes ? route_at(i)->method : "", i < nroutes ? route_at(i)->pattern : "none",
                                        s, (unsigned long long)n);
                }
        fprintf(f, "# HELP tally_api_request_duration_seconds Time from the request's first byte to its answer.\n"
                   "# TYPE tally_api_request_duration_seconds histogram\n");
        for (size_t i = 0; i <= nroutes; i++) {
                uint64_t cum = 0, total = 0;
                for (size_t b = 0; b <= NBUCKETS; b++)
                        total += atomic_load(&m->buckets[i][b]);
                if (!total)
                        continue;
                const char *method = i < nroutes ? route_at(i)->method : "";
                const char *pat = i < nroutes ? route_at(i)->pattern : "none";
                for (size_t b = 0; b < NBUCKETS; b++) {
                        cum += atomic_load(&m->buckets[i][b]);
                        fprintf(f, "tally_api_request_duration_seconds_bucket{method=\"%s\",route=\"%s\",le=\"%lld.%06lld\"} %llu\n",
                                method, pat, (long long)(bucket_us[b] / 1000000), (long long)(bucket_us[b] % 1000000),
                                (unsigned long long)cum);
                }
                uint64_t sum = atomic_load(&m->sum_us[i]);
                fprintf(f, "tally_api_request_duration_seconds_bucket{method=\"%s\",route=\"%s\",le=\"+Inf\"} %llu\n",
                        method, pat, (unsigned long long)total);
                fprintf(f, "tally_api_request_duration_seconds_sum{method=\"%s\",route=\"%s\"} %llu.%06llu\n", method,
                        pat, (unsigned long long)(sum / 1000000), (unsigned long long)(sum % 1000000));
                fprintf(f, "tally_api_request_duration_seconds_count{method=\"%s\",route=\"%s\"} %llu\n", method, pat,
                        (unsigned long long)total);
        }
        int size, in_use;
        uint64_t waits;
        db_pool_stats(r->srv->pool, &size, &in_use, &waits);
        /* this request holds no connection: /metrics never takes one */
        fprintf(f, "# HELP tally_api_db_pool_connections Connections in the database pool.\n"
                   "# TYPE tally_api_db_pool_connections gauge\ntally_api_db_pool_connections %d\n"
                   "# HELP tally_api_db_pool_in_use Connections held by requests now.\n"
                   "# TYPE tally_api_db_pool_in_use gauge\ntally_api_db_pool_in_use %d\n"
                   "# HELP tally_api_db_pool_waits_total Times a request waited for a free connection.\n"
                   "# TYPE tally_api_db_pool_waits_total counter\ntally_api_db_pool_waits_total %llu\n",
                size, in_use, (unsigned long long)waits);
        int running, queued;
        work_pool_stats(r->srv->workers, &running, &queued);
        fprintf(f, "# HELP tally_api_workers_running Requests running on a worker (waiting on a tally-vmm).\n"
                   "# TYPE tally_api_workers_running gauge\ntally_api_workers_running %d\n"
                   "# HELP tally_api_workers_queued Requests waiting for a worker.\n"
                   "# TYPE tally_api_workers_queued gauge\ntally_api_workers_queued %d\n",
                running, queued);
        alert_metrics_write(f);
        fclose(f);
        out->status = 200;
        out->body = buf;
        out->len = len;
        out->content_type = "text/plain; version=0.0.4";
        return 0;
}
