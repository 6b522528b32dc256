/* auth.c — who is asking: API keys (SHA-256 of a 192-bit secret), people
 * (yescrypt passwords from libcrypt), sessions (cookie token and CSRF token,
 * both stored hashed, with an expiry), sign-in attempts (counted in
 * PostgreSQL, charged before the hash). The request rate limit is
 * ratelimit.c's. Secrets come from OpenSSL's RAND_bytes only; none is stored
 * or logged in clear. */
#include "log.h"
#include "server.h"
#include "timeutil.h"

#include <arpa/inet.h>
#include <crypt.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SESSION_COOKIE "tally_session"

int secret_hex(char *out, size_t n)
{
        unsigned char buf[64];
        if (n > sizeof(buf) || RAND_bytes(buf, (int)n) != 1)
                return -EIO;
        for (size_t i = 0; i < n; i++)
                snprintf(out + 2 * i, 3, "%02x", buf[i]);
        OPENSSL_cleanse(buf, sizeof(buf));
        return 0;
}

void sha256_hex(const char *s, size_t len, char out[65])
{
        unsigned char md[32];
        unsigned int mdlen = 0;
        static const char hex[] = "0123456789abcdef";
        EVP_Digest(s, len, md, &mdlen, EVP_sha256(), NULL);
        for (int i = 0; i < 32; i++) {
                out[2 * i] = hex[md[i] >> 4];
                out[2 * i + 1] = hex[md[i] & 15];
        }
        out[64] = '\0';
}

int api_key_generate(char *out, size_t size)
{
        char hex[49];
        if (size < 52 || secret_hex(hex, 24) < 0)
                return -EIO;
        snprintf(out, size, "tk_%s", hex);
        OPENSSL_cleanse(hex, sizeof(hex));
        return 0;
}

int password_hash(const char *password, char **ret)
{
        char *setting = crypt_gensalt_ra("$y$", 0, NULL, 0);
        if (!setting)
                return -errno ? -errno : -EIO;
        void *data = NULL;
        int size = 0;
        char *h = crypt_ra(password, setting, &data, &size);
        free(setting);
        if (!h || h[0] == '*') {
                free(data);
                return -EIO;
        }
        *ret = strdup(h);
        free(data);
        return *ret ? 0 : -ENOMEM;
}

/* A hash to check against when the email is unknown, so a wrong email takes
 * as long as a wrong password. */
static char *dummy_hash;
static pthread_once_t dummy_once = PTHREAD_ONCE_INIT;
static void make_dummy(void)
{
        if (password_hash("not a password", &dummy_hash) < 0)
                dummy_hash = NULL;
}

bool password_verify(const char *password, const char *stored)
{
        if (!stored || !*stored) {
                pthread_once(&dummy_once, make_dummy);
                stored = dummy_hash ? dummy_hash : "$y$j9T$x$x";
        }
        void *data = NULL;
        int size = 0;
        const char *h = crypt_ra(password, stored, &data, &size);
        bool ok = h && h[0] != '*' && strlen(h) == strlen(stored) && CRYPTO_memcmp(h, stored, strlen(h)) == 0 &&
                  stored != dummy_hash;
        free(data);
        return ok;
}

/* ---- finding the caller ---- */

/* Verified API keys, remembered for AUTH_CACHE_TTL_US so that a burst of
 * requests with one key costs one lookup, not one each: a fixed table of
 * AUTH_CACHE_SLOTS entries (4-way, the oldest replaced), keyed by the key's
 * SHA-256 — the secret itself is never kept. A key unknown to the database is
 * never remembered (a flood of made-up keys cannot fill the table). A revoked
 * key is remembered as revoked; revoking a key through this process forgets it
 * at once (auth_cache_forget_key), and any other tally-api stops accepting it
 * within AUTH_CACHE_TTL_US. */
#define AUTH_CACHE_SLOTS 1024
#define AUTH_CACHE_WAYS 4
#define AUTH_CACHE_TTL_US INT64_C(1000000)

struct auth_entry {
        char hash[65];
        char key[EVENT_ID_MAX + 1];
        char account[EVENT_ID_MAX + 1];
        bool revoked;
        int64_t until_us; /* 0: empty */
};

static struct auth_entry auth_cache[AUTH_CACHE_SLOTS];
static pthread_mutex_t auth_cache_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t auth_set_of(const char *hash)
{
        /* the hash is uniform: its first 8 hex digits pick the set */
        uint32_t v = 0;
        for (int i = 0; i < 8; i++)
                v = v << 4 | (uint32_t)(hash[i] <= '9' ? hash[i] - '0' : hash[i] - 'a' + 10);
        return (size_t)(v % (AUTH_CACHE_SLOTS / AUTH_CACHE_WAYS)) * AUTH_CACHE_WAYS;
}

/* Copies the live entry of hash into *ret; false when there is none. */
static bool auth_cache_get(const char *hash, int64_t now, struct auth_entry *ret)
{
        size_t set = auth_set_of(hash);
        bool hit = false;
        pthread_mutex_lock(&auth_cache_lock);
        for (size_t i = set; i < set + AUTH_CACHE_WAYS && !hit; i++) {
                if (auth_cache[i].until_us > now && strcmp(auth_cache[i].hash, hash) == 0) {
                        *ret = auth_cache[i];
                        hit = true;
                }
        }
        pthread_mutex_unlock(&auth_cache_lock);
        return hit;
}

static void auth_cache_put(const char *hash, const char *key, const char *account, bool revoked, int64_t now)
{
        size_t set = auth_set_of(hash), victim = set;
        pthread_mutex_lock(&auth_cache_lock);
        for (size_t i = set; i < set + AUTH_CACHE_WAYS; i++) {
                if (strcmp(auth_cache[i].hash, hash) == 0 || auth_cache[i].until_us <= now) {
                        victim = i;
                        break;
                }
                if (auth_cache[i].until_us < auth_cache[victim].until_us)
                        victim = i;
        }
        struct auth_entry *e = &auth_cache[victim];
        snprintf(e->hash, sizeof(e->hash), "%s", hash);
        snprintf(e->key, sizeof(e->key), "%s", key);
        snprintf(e->account, sizeof(e->account), "%s", account);
        e->revoked = revoked;
        e->until_us = now + AUTH_CACHE_TTL_US;
        pthread_mutex_unlock(&auth_cache_lock);
}

void auth_cache_forget_key(const char *key)
{
        pthread_mutex_lock(&auth_cache_lock);
        for (size_t i = 0; i < AUTH_CACHE_SLOTS; i++) {
                if (auth_cache[i].until_us && strcmp(auth_cache[i].key, key) == 0)
                        auth_cache[i].until_us = 0;
        }
        pthread_mutex_unlock(&auth_cache_lock);
}

int auth_resolve(struct api_req *r, char ret_csrf_hash[65], struct api_error *err)
{
        const char *authz = req_header(r, "Authorization");
        char h[65];
        if (authz) {
                if (strncmp(authz, "Bearer ", 7) != 0)
                        return api_fail(err, 401, "unauthenticated", "Authorization",
                                        "Authorization must be \"Bearer <API key>\"");
                const char *key = authz + 7;
                sha256_hex(key, strlen(key), h);
                int64_t now = time_mono_ns() / NS_PER_US;
                struct auth_entry e;
                if (!auth_cache_get(h, now, &e)) {
                        const char *params[] = { h };
                        PGresult *res = PQexecParams(req_db(r),
                                                     "SELECT id, account_id, revoked_at IS NOT NULL FROM api_keys "
                                                     "WHERE key_hash = decode($1, 'hex')",
                                                     1, NULL, params, NULL, NULL, 0);
                        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                                log_error("could not look up an API key", "error=\"%s\"",
                                          PQerrorMessage(req_db(r)));
                                PQclear(res);
                                return api_fail(err, 503, "database_unavailable", NULL, "could not check the API key");
                        }
                        if (PQntuples(res) != 1) {
                                PQclear(res);
                                return api_fail(err, 401, "unauthenticated", "Authorization", "unknown API key");
                        }
                        snprintf(e.key, sizeof(e.key), "%s", PQgetvalue(res, 0, 0));
                        snprintf(e.account, sizeof(e.account), "%s", PQgetvalue(res, 0, 1));
                        e.revoked = strcmp(PQgetvalue(res, 0, 2), "t") == 0;
                        PQclear(res);
                        auth_cache_put(h, e.key, e.account, e.revoked, now);
                }
                if (e.revoked)
                        return api_fail(err, 401, "key_revoked", "Authorization", "this API key was revoked");
                snprintf(r->caller.key, sizeof(r->caller.key), "%s", e.key);
                snprintf(r->caller.account, sizeof(r->caller.account), "%s", e.account);
                return 0;
        }
        const char *token = req_cookie(r, SESSION_COOKIE);
        if (!token)
                return api_fail(err, 401, "unauthenticated", NULL,
                                "send Authorization: Bearer <API key>, or sign in with POST /v1/sessions");
        sha256_hex(token, strlen(token), h);
        const char *params[] = { h };
        PGresult *res = PQexecParams(req_db(r),
                                     "SELECT person_id, account_id, encode(csrf_hash, 'hex') FROM sessions "
                                     "WHERE token_hash = decode($1, 'hex') AND expires_at > now()",
                                     1, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                log_error("could not look up a session", "error=\"%s\"", PQerrorMessage(req_db(r)));
                PQclear(res);
                return api_fail(err, 503, "database_unavailable", NULL, "could not check the session");
        }
        int rc = 0;
        if (PQntuples(res) != 1) {
                rc = api_fail(err, 401, "session_expired", NULL, "the session ended or expired: sign in again");
        } else {
                snprintf(r->caller.person, sizeof(r->caller.person), "%s", PQgetvalue(res, 0, 0));
                snprintf(r->caller.account, sizeof(r->caller.account), "%s", PQgetvalue(res, 0, 1));
                snprintf(ret_csrf_hash, 65, "%s", PQgetvalue(res, 0, 2));
        }
        PQclear(res);
        return rc;
}

/* ---- sign-in attempts: counted in PostgreSQL (sql/012), never evicted ---- */

/* The rows an attempt is counted against: the email, lowercased, and the
 * client's address — an IPv4 address, or an IPv6 client's /64 (one host
 * may hold all of its /64). */
static void signin_subjects(const char *email, const char *ip, char ret_email[300], char ret_addr[128])
{
        snprintf(ret_email, 300, "email:%s", email);
        for (char *p = ret_email; *p; p++)
                if (*p >= 'A' && *p <= 'Z')
                        *p = (char)(*p - 'A' + 'a');
        struct in6_addr a6;
        if (strchr(ip, ':') && inet_pton(AF_INET6, ip, &a6) == 1) {
                memset(a6.s6_addr + 8, 0, 8);
                char text[INET6_ADDRSTRLEN];
                inet_ntop(AF_INET6, &a6, text, sizeof(text));
                snprintf(ret_addr, 128, "addr:%s/64", text);
                return;
        }
        snprintf(ret_addr, 128, "addr:%s", ip);
}

/* Charges one attempt to the email and to the address, in one statement,
 * before the password is checked: the rows' locks order concurrent
 * attempts, so at most signin_max_failures of a window ever reach the hash.
 * Returns 0 (check the password), 1 (over the limit: *ret_retry_s), or -EIO. */
static int signin_charge(PGconn *db, const struct api_config *cfg, const char *email, const char *ip,
                         int64_t *ret_retry_s)
{
        char e[300], a[128], window[24];
        signin_subjects(email, ip, e, a);
        snprintf(window, sizeof(window), "%lld", (long long)cfg->signin_window_s);
        const char *p[] = { e, a, window };
        /* the email's row first, then the address's: every attempt locks in that order */
        PGresult *res = db_query(db, "charge a sign-in attempt", PGRES_TUPLES_OK,
                                 "INSERT INTO signin_attempts AS s (subject, attempts, window_start) "
                                 "VALUES ($1, 1, now()), ($2, 1, now()) "
                                 "ON CONFLICT (subject) DO UPDATE SET "
                                 "  attempts = CASE WHEN s.window_start <= now() - $3::bigint * interval '1 second' "
                                 "                  THEN 1 ELSE s.attempts + 1 END, "
                                 "  window_start = CASE WHEN s.window_start <= now() - $3::bigint * interval '1 second' "
                                 "                      THEN now() ELSE s.window_start END "
                                 "RETURNING attempts, ceil(extract(epoch FROM window_start + $3::bigint * interval "
                                 "'1 second' - now()))::bigint",
                                 3, p);
        if (!res)
                return -EIO;
        int rc = 0;
        int64_t retry = 1;
        for (int i = 0; i < PQntuples(res); i++) {
                if (strtoll(PQgetvalue(res, i, 0), NULL, 10) > cfg->signin_max_failures) {
                        rc = 1;
                        int64_t left = strtoll(PQgetvalue(res, i, 1), NULL, 10);
                        if (left > retry)
                                retry = left;
                }
        }
        PQclear(res);
        *ret_retry_s = retry;
        return rc;
}

/* A right password: the email's count starts again, and the address gets
 * this attempt back. */
static void signin_settle(PGconn *db, const char *email, const char *ip)
{
        char e[300], a[128];
        signin_subjects(email, ip, e, a);
        const char *p[] = { e, a };
        PQclear(db_query(db, "settle a sign-in", PGRES_COMMAND_OK,
                         "UPDATE signin_attempts SET attempts = CASE WHEN subject = $1 THEN 0 "
                         "                                           ELSE greatest(attempts - 1, 0) END "
                         "WHERE subject IN ($1, $2)",
                         2, p));
}

/* ---- sessions: sign in, who am I, sign out ---- */

static void set_cookie(struct api_req *r, struct api_reply *out, const char *token, int64_t max_age)
{
        snprintf(out->headers[0], sizeof(out->headers[0]),
                 "Set-Cookie: " SESSION_COOKIE "=%s; Path=/; Max-Age=%lld; HttpOnly; SameSite=Strict%s", token,
                 (long long)max_age, req_config(r)->cookie_secure ? "; Secure" : "");
}

int h_session_create(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        static const char *const allowed[] = { "email", "password", NULL };
        int rc;
        if (!r->json)
                return api_fail(err, 400, "missing_field", "email", "email and password are required");
        if ((rc = body_check_fields(r->json, allowed, err)) < 0)
                return rc;
        const char *email = json_string_value(json_object_get(r->json, "email"));
        const char *password = json_string_value(json_object_get(r->json, "password"));
        if (!email || !*email || strlen(email) > 254)
                return api_fail(err, 400, "invalid_field", "email", "email must be a string of 1 to 254 bytes");
        if (!password || strlen(password) > 1024)
                return api_fail(err, 400, "invalid_field", "password", "password must be a string of at most 1024 bytes");
        const struct api_config *cfg = req_config(r);
        int64_t retry;
        int limited = signin_charge(req_db(r), cfg, email, r->ip, &retry);
        if (limited < 0)
                return api_fail(err, 503, "database_unavailable", NULL, "could not sign in");
        if (limited) {
                snprintf(out->headers[1], sizeof(out->headers[1]), "Retry-After: %lld", (long long)retry);
                return api_fail(err, 429, "too_many_sign_ins", NULL,
                                "too many failed sign-ins for this email or address; retry in %lld s",
                                (long long)retry);
        }
        const char *p1[] = { email };
        PGresult *res = PQexecParams(req_db(r), "SELECT id, account_id, password_hash FROM people WHERE email = $1", 1,
                                     NULL, p1, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                log_error("could not look up a person", "error=\"%s\"", PQerrorMessage(req_db(r)));
                PQclear(res);
                return api_fail(err, 503, "database_unavailable", NULL, "could not sign in");
        }
        bool found = PQntuples(res) == 1;
        const char *stored = found && !PQgetisnull(res, 0, 2) ? PQgetvalue(res, 0, 2) : NULL;
        /* the slow hash runs without holding a database connection */
        char *stored_copy = stored ? strdup(stored) : NULL;
        char person[EVENT_ID_MAX + 1] = "", account[EVENT_ID_MAX + 1] = "";
        if (found) {
                snprintf(person, sizeof(person), "%s", PQgetvalue(res, 0, 0));
                snprintf(account, sizeof(account), "%s", PQgetvalue(res, 0, 1));
        }
        PQclear(res);
        req_db_release(r);
        bool ok = password_verify(password, stored_copy);
        free(stored_copy);
        if (!found || !ok) {
                log_info("sign-in refused", "ip=%s", r->ip);
                return api_fail(err, 401, "bad_credentials", NULL, "wrong email or password");
        }
        signin_settle(req_db(r), email, r->ip);
        char token[65], csrf[65], th[65], ch[65], ttl[32];
        if (secret_hex(token, 32) < 0 || secret_hex(csrf, 32) < 0)
                return api_fail(err, 500, "internal", NULL, "could not make a session token");
        sha256_hex(token, 64, th);
        sha256_hex(csrf, 64, ch);
        snprintf(ttl, sizeof(ttl), "%lld", (long long)cfg->session_ttl_s);
        const char *p2[] = { th, ch, person, account, ttl };
        res = PQexecParams(req_db(r),
                           "INSERT INTO sessions (token_hash, csrf_hash, person_id, account_id, expires_at) "
                           "VALUES (decode($1, 'hex'), decode($2, 'hex'), $3, $4, now() + $5::bigint * interval '1 second') "
                           "RETURNING to_char(expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')",
                           5, NULL, p2, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                log_error("could not store a session", "error=\"%s\"", PQerrorMessage(req_db(r)));
                PQclear(res);
                return api_fail(err, 503, "database_unavailable", NULL, "could not sign in");
        }
        json_t *body = json_pack("{s:s, s:s, s:s, s:s}", "person", person, "account", account, "csrf_token", csrf,
                                 "expires_at", PQgetvalue(res, 0, 0));
        PQclear(res);
        set_cookie(r, out, token, cfg->session_ttl_s);
        OPENSSL_cleanse(token, sizeof(token));
        log_info("signed in", "person=%s account=%s", person, account);
        return reply_json(out, 201, body);
}

int h_session_get(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        const char *p[] = { r->caller.person };
        PGresult *res = PQexecParams(req_db(r), "SELECT email FROM people WHERE id = $1", 1, NULL, p, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
                PQclear(res);
                return api_fail(err, 503, "database_unavailable", NULL, "could not read the session");
        }
        json_t *body = json_pack("{s:s, s:s, s:s}", "person", r->caller.person, "account", r->caller.account, "email",
                                 PQgetvalue(res, 0, 0));
        PQclear(res);
        return reply_json(out, 200, body);
}

int h_session_delete(struct api_req *r, struct api_reply *out, struct api_error *err)
{
        const char *token = req_cookie(r, SESSION_COOKIE);
        char h[65];
        sha256_hex(token ? token : "", token ? strlen(token) : 0, h);
        const char *p[] = { h };
        PGresult *res = PQexecParams(req_db(r), "DELETE FROM sessions WHERE token_hash = decode($1, 'hex')", 1, NULL,
                                     p, NULL, NULL, 0);
        bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
        PQclear(res);
        if (!ok)
                return api_fail(err, 503, "database_unavailable", NULL, "could not sign out");
        set_cookie(r, out, "", 0);
        return reply_json(out, 200, json_pack("{s:b}", "signed_out", 1));
}
