/* access_log.h — tally-api's access log: one key=value line a request
 * answered, at level info, through common/log.h. It names the caller by its
 * key or person id and never holds a secret (no header, cookie, body or query
 * value is logged: the path is logged without its query). */
#pragma once

#include "server.h"

#include <stdint.h>

/* Logs r answered with status after us microseconds; route is the pattern
 * of the route it matched, "none" if none. */
void access_log_request(const struct api_req *r, const char *route, int status, int64_t us);
