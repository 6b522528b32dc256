/* access_log.c — see access_log.h. */
#include "access_log.h"

#include "log.h"

void access_log_request(const struct api_req *r, const char *route, int status, int64_t us)
{
        log_info("request", "method=%s route=%s path=%s status=%d duration_us=%lld key=%s person=%s ip=%s", r->method,
                 route, r->path, status, (long long)us, r->caller.key[0] ? r->caller.key : "-",
                 r->caller.person[0] ? r->caller.person : "-", r->ip);
}
