/* builtin.c — see builtin.h. The read handlers never see HTTP (api.h); these
 * hand them the request's connection, caller and parameters, and turn what
 * they made into the reply. */
#include "builtin.h"
#include "vmm_hosts.h"

#include <stdlib.h>
#include <string.h>

int h_healthz(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        PGresult *res = PQexec(req_db(r), "SELECT 1");
        bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;
        PQclear(res);
        if (!ok)
                return api_fail(err, 503, "database_unavailable", NULL, "the database does not answer");
        /* The hosts as the watch last saw them (vmm_hosts.h): no host is asked here. */
        bool all_up;
        json_t *hosts = vmm_hosts_health(req_vmm_hosts(r), &all_up);
        return reply_json(out, 200, json_pack("{s:s, s:s, s:o}", "status", all_up ? "ok" : "degraded", "database", "ok",
                                              "hosts", hosts));
}

int h_usage(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        const char *accept = req_header(r, "Accept");
        bool csv = accept && strstr(accept, "text/csv");
        struct api_body b = { 0 };
        int rc = api_usage(req_db(r), &r->caller, req_param, r, csv, &b, err);
        return rc < 0 ? rc : reply_body(out, &b, "tally-usage.csv");
}

int h_spend(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        struct api_body b = { 0 };
        int rc = api_spend(req_db(r), &r->caller, req_param, r, &b, err);
        return rc < 0 ? rc : reply_body(out, &b, NULL);
}

int h_alerts(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        struct api_body b = { 0 };
        int rc = api_alerts(req_db(r), &r->caller, req_param, r, &b, err);
        return rc < 0 ? rc : reply_body(out, &b, NULL);
}

int h_openapi(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        (void)r;
        const char *doc = api_openapi_json();
        out->status = 200;
        out->body = strdup(doc);
        out->len = out->body ? strlen(out->body) : 0;
        out->content_type = "application/json";
        return out->body ? 0 : api_fail(err, 500, "internal", NULL, "out of memory");
}
