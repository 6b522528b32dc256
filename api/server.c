/* server.c — tally-api's server as a whole: it makes its parts in order and
 * stops them in reverse. The parts live in their own files: the route table
 * (router.c), one request from head to answer (dispatch.c, csrf.c,
 * ratelimit.c), the HTTP side (http.c, access_log.c, metrics.c), the
 * housekeeping thread (janitor.c), the database pool (pool.c), the workers
 * (workers.c) and the hosts' tally-vmm daemons (vmm_hosts.c). */
#include "http.h"
#include "janitor.h"
#include "log.h"
#include "metrics.h"
#include "ratelimit.h"
#include "router.h"
#include "server.h"
#include "vmm_hosts.h"

#include "destinations.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int api_server_start(const struct api_config *cfg, struct api_server **ret, char *err, size_t errlen)
{
        struct api_server *s = calloc(1, sizeof(*s));
        int r;
        if (!s) {
                snprintf(err, errlen, "out of memory");
                return -ENOMEM;
        }
        s->cfg = cfg;
        if ((r = api_metrics_new(route_count(), &s->metrics)) < 0 ||
            (r = ratelimit_new(cfg->rate_per_s, cfg->rate_burst, &s->rate)) < 0) {
                snprintf(err, errlen, "could not make the request counters and budgets: %s", strerror(-r));
                goto fail;
        }
        struct vmm_hosts_tls tls = { cfg->vmm_tls_cert, cfg->vmm_tls_key, cfg->vmm_tls_ca };
        if ((r = vmm_hosts_new(cfg->vmm_sockets, &tls, &s->hosts, err, errlen)) < 0)
                goto fail;
        vmm_hosts_set_limit(s->hosts, (int)cfg->vmm_calls_per_host);
        vmm_hosts_discover(s->hosts, cfg->vmm_registry);
        if (vmm_hosts_count(s->hosts) == 0 && !cfg->vmm_registry) {
                r = -EINVAL;
                snprintf(err, errlen, "vmm_sockets names no tally-vmm and vmm_registry is off: no host to reach");
                goto fail;
        }
        if ((r = vmm_hosts_watch(s->hosts)) < 0) {
                snprintf(err, errlen, "could not start watching the tally-vmm hosts: %s", strerror(-r));
                goto fail;
        }
        if ((r = db_pool_new(cfg->database_url, (int)cfg->db_pool_size, cfg->statement_timeout_ms, &s->pool, err,
                             errlen)) < 0)
                goto fail;
        struct work_limits lim = { cfg->workers, cfg->workers_per_key, cfg->workers_per_account, cfg->queue_per_account,
                                   cfg->queue_max };
        if ((r = work_pool_new(&lim, &s->workers, err, errlen)) < 0)
                goto fail;
        if ((r = http_start(s, &s->http, err, errlen)) < 0)
                goto fail;
        {
                PGconn *db = db_pool_get(s->pool);
                alert_metrics_refresh(db);
                db_pool_put(s->pool, db);
        }
        if ((r = janitor_start(cfg, s->pool, s->hosts, &s->janitor)) < 0)
                log_warn("could not start the janitor: expired sessions stay until restart", "error=\"%s\"",
                         strerror(-r));
        *ret = s;
        return 0;
fail:
        api_server_stop(s);
        return r;
}

int api_server_port(struct api_server *s)
{
        return http_port(s->http);
}

void api_server_stop(struct api_server *s)
{
        if (!s)
                return;
        janitor_stop(s->janitor);
        /* Queued requests are answered 503; running ones get 5 s. libmicrohttpd
         * cannot stop with a connection suspended: if one still runs on a
         * tally-vmm, the daemon is left to the process's exit. */
        bool idle = work_pool_free(s->workers, 5000);
        if (idle)
                http_stop(s->http);
        else
                http_abandon(s->http);
        db_pool_free(s->pool);
        vmm_hosts_free(s->hosts);
        ratelimit_free(s->rate);
        api_metrics_free(s->metrics);
        free(s);
}
