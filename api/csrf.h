/* csrf.h — the check that a person's write came from tally's own page: a
 * session's cookie rides along with any request a browser makes, so a write
 * made with a session must also carry the session's X-CSRF-Token header, a
 * secret only the page that signed in was given (api/auth.c makes it and
 * stores its hash with the session). API keys are not sent by browsers on
 * their own and need no token. */
#pragma once

#include "server.h"

/* For a request of a person's session (r->caller.person set) with a write
 * method: 0 when its X-CSRF-Token header hashes to session_hash (64 hex, the
 * hash auth_resolve found), else api_fail's 403 csrf_required. 0 for reads
 * and for API keys. The comparison takes the same time wherever it differs. */
int csrf_check(struct api_req *r, const char session_hash[65], struct api_error *err);
