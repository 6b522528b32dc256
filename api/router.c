/* router.c — see router.h. The table names each handler; the handlers live
 * with what they own (keys.c, sandboxes.c, ...). */
#include "router.h"

#include "builtin.h"
#include "destinations.h"
#include "invoices.h"
#include "metrics.h"
#include "static.h"

#include <string.h>

static const struct route routes[] = {
        { "GET", "/", h_static_index, NEED_NONE, false },
        { "GET", "/static/{id}", h_static_file, NEED_NONE, false },
        { "GET", "/healthz", h_healthz, NEED_NONE, false },
        { "GET", "/metrics", h_metrics, NEED_NONE, false },
        { "GET", "/v1/openapi.json", h_openapi, NEED_NONE, false },
        { "POST", "/v1/sessions", h_session_create, NEED_NONE, true }, /* the password hash is slow */
        { "GET", "/v1/sessions/current", h_session_get, NEED_PERSON, false },
        { "DELETE", "/v1/sessions/current", h_session_delete, NEED_PERSON, false },
        { "GET", "/v1/keys", h_keys_list, NEED_PERSON, false },
        { "POST", "/v1/keys", h_keys_create, NEED_PERSON, false },
        { "GET", "/v1/keys/{id}", h_key_get, NEED_PERSON, false },
        { "DELETE", "/v1/keys/{id}", h_key_revoke, NEED_PERSON, false },
        { "PUT", "/v1/keys/{id}/limit", h_key_limit_put, NEED_PERSON, false },
        { "DELETE", "/v1/keys/{id}/limit", h_key_limit_delete, NEED_PERSON, false },
        { "GET", "/v1/keys/{id}/caps", h_key_caps_get, NEED_PERSON, false },
        { "PUT", "/v1/keys/{id}/caps", h_key_caps_put, NEED_PERSON, false },
        { "PUT", "/v1/keys/{id}/internet", h_key_internet_put, NEED_PERSON, false },
        { "GET", "/v1/sandboxes", h_sandboxes_list, NEED_ANY, true },
        { "POST", "/v1/sandboxes", h_sandboxes_create, NEED_KEY, true },
        { "GET", "/v1/sandboxes/{id}", h_sandbox_get, NEED_ANY, true },
        { "DELETE", "/v1/sandboxes/{id}", h_sandbox_delete, NEED_ANY, true },
        { "POST", "/v1/sandboxes/{id}/exec", h_sandbox_exec, NEED_ANY, true },
        { "POST", "/v1/sandboxes/{id}/pause", h_sandbox_pause, NEED_ANY, true },
        { "POST", "/v1/sandboxes/{id}/resume", h_sandbox_resume, NEED_ANY, true },
        { "POST", "/v1/sandboxes/{id}/fork", h_sandbox_fork, NEED_ANY, true },
        { "POST", "/v1/sandboxes/{id}/timeout", h_sandbox_timeout, NEED_ANY, true },
        { "GET", "/v1/usage", h_usage, NEED_ANY, false },
        { "GET", "/v1/spend", h_spend, NEED_ANY, false },
        { "GET", "/v1/alerts", h_alerts, NEED_ANY, false },
        { "GET", "/v1/invoices", h_invoices_list, NEED_PERSON, false },
        { "GET", "/v1/invoices/current", h_invoice_current, NEED_PERSON, false },
        { "GET", "/v1/invoices/{id}", h_invoice_get, NEED_PERSON, false },
        { "GET", "/v1/account/settings", h_account_settings_get, NEED_ANY, false },
        { "PUT", "/v1/account/settings", h_account_settings_put, NEED_PERSON, false },
        { "GET", "/v1/alert-destinations", h_destinations_list, NEED_PERSON, false },
        { "POST", "/v1/alert-destinations", h_destinations_create, NEED_PERSON, false },
        { "DELETE", "/v1/alert-destinations/{id}", h_destination_disable, NEED_PERSON, false },
        { "POST", "/v1/alert-destinations/{id}/test", h_destination_test, NEED_PERSON, false },
        { "GET", "/v1/alert-deliveries", h_deliveries_list, NEED_PERSON, false },
        { "POST", "/v1/alert-deliveries/{id}/resend", h_delivery_resend, NEED_PERSON, false },
};
#define NROUTES (sizeof(routes) / sizeof(routes[0]))

size_t route_count(void)
{
        return NROUTES;
}

const struct route *route_at(size_t i)
{
        return &routes[i];
}

/* Matches path against pattern, copying the {id} segment into id. */
static bool match(const char *pattern, const char *path, char id[EVENT_ID_MAX + 1], bool *ret_id_ok)
{
        while (*pattern && *path) {
                if (strncmp(pattern, "{id}", 4) == 0) {
                        size_t n = strcspn(path, "/");
                        if (n == 0)
                                return false;
                        *ret_id_ok = n <= EVENT_ID_MAX;
                        size_t c = n <= EVENT_ID_MAX ? n : EVENT_ID_MAX;
                        memcpy(id, path, c);
                        id[c] = '\0';
                        if (!*ret_id_ok || !id_valid(id))
                                *ret_id_ok = false;
                        pattern += 4;
                        path += n;
                        continue;
                }
                if (*pattern != *path)
                        return false;
                pattern++;
                path++;
        }
        return !*pattern && !*path;
}

size_t route_find(const char *method, const char *path, char id[EVENT_ID_MAX + 1], bool *ret_id_ok,
                  bool *ret_path_known)
{
        *ret_path_known = false;
        *ret_id_ok = true;
        for (size_t i = 0; i < NROUTES; i++) {
                char seg[EVENT_ID_MAX + 1] = "";
                bool ok = true;
                if (!match(routes[i].pattern, path, seg, &ok))
                        continue;
                *ret_path_known = true;
                if (strcmp(routes[i].method, method) == 0) {
                        *ret_id_ok = ok;
                        memcpy(id, seg, EVENT_ID_MAX + 1);
                        return i;
                }
        }
        return NROUTES;
}

const char *api_route(size_t i, const char **ret_method)
{
        if (i >= NROUTES)
                return NULL;
        *ret_method = routes[i].method;
        return routes[i].pattern;
}
