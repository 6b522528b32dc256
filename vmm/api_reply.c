/* api_reply.c — see api_reply.h. */
#include "api_reply.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum MHD_Result vmm_reply_json(struct MHD_Connection *c, unsigned int status, json_t *j)
{
        char *text = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        if (!text)
                return MHD_NO;
        size_t len = strlen(text);
        text[len] = '\0';
        struct MHD_Response *resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(resp, "Content-Type", "application/json");
        /* One request per connection: a connection's longer timeout while it is
         * answered (api.c's handle) never carries over to idle time. */
        MHD_add_response_header(resp, "Connection", "close");
        enum MHD_Result r = MHD_queue_response(c, status, resp);
        MHD_destroy_response(resp);
        return r;
}

enum MHD_Result vmm_reply_error(struct MHD_Connection *c, unsigned int status, const char *why)
{
        json_t *text = json_string(why);
        if (!text) {
                char ascii[512];
                size_t i = 0;
                for (; why[i] && i < sizeof(ascii) - 1; i++)
                        ascii[i] = (unsigned char)why[i] < 0x80 ? why[i] : '?';
                ascii[i] = '\0';
                text = json_string(ascii);
        }
        return vmm_reply_json(c, status, json_pack("{s:o}", "error", text));
}

unsigned int vmm_reply_status_for(int r)
{
        switch (-r) {
        case EINVAL: return 400;
        case EACCES: return 403;
        case ENOENT: return 404;
        case EBUSY: return 409;
        case EOPNOTSUPP: return 422;
        case EAGAIN: return 503;
        case ENOSPC: return 507; /* this host's capacity: the sentence names what is short */
        case ECANCELED: return 503;
        default: return 500;
        }
}

enum MHD_Result vmm_reply_result(struct MHD_Connection *c, int r, const char *why, json_t *ok, unsigned int okstatus)
{
        if (r < 0) {
                json_decref(ok);
                return vmm_reply_error(c, vmm_reply_status_for(r), *why ? why : strerror(-r));
        }
        return vmm_reply_json(c, okstatus, ok ? ok : json_object());
}

int vmm_body_opt_int(json_t *body, const char *name, int64_t min, int64_t max, int64_t def, int64_t *out,
                       char *why, size_t whylen)
{
        json_t *v = json_object_get(body, name);
        if (!v) {
                *out = def;
                return 0;
        }
        if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
                snprintf(why, whylen, "%s must be an integer from %lld to %lld", name, (long long)min, (long long)max);
                return -EINVAL;
        }
        *out = json_integer_value(v);
        return 0;
}
