/* csrf.c — see csrf.h. */
#include "csrf.h"

#include <openssl/crypto.h>
#include <string.h>

int csrf_check(struct api_req *r, const char session_hash[65], struct api_error *err)
{
        if (!r->caller.person[0] || !req_is_write(r->method))
                return 0;
        const char *token = req_header(r, "X-CSRF-Token");
        char h[65];
        if (token)
                sha256_hex(token, strlen(token), h);
        if (!token || CRYPTO_memcmp(h, session_hash, 64) != 0)
                return api_fail(err, 403, "csrf_required", "X-CSRF-Token",
                                "a write with a session needs the session's X-CSRF-Token header");
        return 0;
}
