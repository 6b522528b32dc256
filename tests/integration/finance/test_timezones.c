/* Integration: an account's days and months in its own time zone, through the
 * real pipeline: samples on the development broker, a real tally-aggregator
 * (spend per day, alerts, blocks), a real tally-api (/v1/spend of a day, the
 * account's settings), the real tally-admin (account timezone, close-month)
 * and PostgreSQL's invoices.
 *
 * Every sandbox here is 1 vCPU busy with 1 GiB held, sampled on the hour: an
 * hour of it costs $0.025 + $0.0075 = 32,500,000 nano-dollars (docs/billing.md's
 * default rates), so a day's spend is its hours x 32,500,000. Each key has a
 * daily limit of 763,750,000 (23.5 hours): a 23-hour day stays under it
 * (747,500,000, 97.9 %: alerts at 50 and 80 %), a 24- or 25-hour day reaches it
 * (780,000,000; 812,500,000: alerts at 50, 80 and 100 % and a block).
 *
 * The days, from the zones' rules (tzdata), worked by hand:
 *   America/New_York, spring forward 2026-03-08 (02:00 EST -> 03:00 EDT):
 *     2026-03-08 runs 05:00Z Mar 8 -> 04:00Z Mar 9: 23 hours.
 *     Sandbox 03:00Z Mar 8 -> 06:00Z Mar 9 (27 h): 03-07 2 h, 03-08 23 h, 03-09 2 h.
 *   America/New_York, fall back 2026-11-01 (02:00 EDT -> 01:00 EST):
 *     2026-11-01 runs 04:00Z Nov 1 -> 05:00Z Nov 2: 25 hours.
 *     Sandbox 02:00Z Nov 1 -> 07:00Z Nov 2 (29 h): 10-31 2 h, 11-01 25 h, 11-02 2 h.
 *   Europe/Berlin, spring forward 2026-03-29 (02:00 CET -> 03:00 CEST):
 *     2026-03-29 runs 23:00Z Mar 28 -> 22:00Z Mar 29: 23 hours.
 *     Sandbox 21:00Z Mar 28 -> 00:00Z Mar 30 (27 h): 03-28 2 h, 03-29 23 h, 03-30 2 h.
 *   Europe/Berlin, fall back 2026-10-25 (03:00 CEST -> 02:00 CET):
 *     2026-10-25 runs 22:00Z Oct 24 -> 23:00Z Oct 25: 25 hours.
 *     Sandbox 20:00Z Oct 24 -> 01:00Z Oct 26 (29 h): 10-24 2 h, 10-25 25 h, 10-26 2 h.
 *   Asia/Kolkata (+05:30, no daylight saving): local midnight is 18:30Z, inside
 *     the UTC hour 18:00Z, which starts at 23:30 local and so belongs to the day
 *     before (docs/billing.md: an hour belongs to the day of its start). A day
 *     D runs 19:00Z D-1 -> 19:00Z D (00:30 -> 00:30 local), 24 hours.
 *     Sandbox 17:00Z Jun 10 -> 21:00Z Jun 11 (28 h): 06-10 2 h, 06-11 24 h, 06-12 2 h.
 *     Sandbox 17:00Z Jun 30 -> 21:00Z Jun 30 (4 h): June 2 h, July 2 h (its month's end).
 * In UTC days the same sandboxes give other days: New York's 2026-11-01 would
 * be 22 hours (715,000,000: no block), Kolkata's 2026-06-11 21 hours (no
 * block), Berlin's 2026-03-29 24 hours (a block). */
#include "aggtest.h"
#include "support.h"
#include "timeutil.h"

#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>

#define GiB   (UINT64_C(1) << 30)
#define HOUR  INT64_C(32500000)
#define LIMIT "763750000"

static struct aggtest t;

static char *q_text(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *q_text(const char *fmt, ...)
{
        char sql[4096];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(sql, sizeof(sql), fmt, ap);
        va_end(ap);
        char *v = aggtest_query(&t, sql);
        return v ? v : strdup("");
}

static void expect(const char *want, const char *what, const char *sql)
{
        char *v = q_text("%s", sql);
        CHECK(strcmp(v, want) == 0, "%s: got '%s', want '%s'", what, v, want);
        free(v);
}

/* 1 vCPU busy, 1 GiB, sampled on every hour from `from` for `hours`; the last sample stops it. */
static void run_hours(const char *account, const char *key, const char *id, int64_t from, int hours)
{
        for (int h = 0; h <= hours; h++) {
                struct usage_event ev = aggtest_sample(account, key, id, 1, (uint64_t)h + 1,
                                                       from + (int64_t)h * 3600 * NS_PER_SEC,
                                                       h == hours ? STATE_STOPPED : STATE_RUNNING,
                                                       (uint64_t)h * 3600 * NS_PER_SEC, GiB, 0, 1);
                ev.final = h == hours;
                aggtest_produce(&t, &ev);
        }
}

static const char *admin_bin(void)
{
        static char path[1024];
        const char *all = test_env("TALLY_BINARIES");
        const char *p = strstr(all, "/tally-admin");
        CHECK(p != NULL, "tally-admin is not among TALLY_BINARIES");
        const char *b = p;
        while (b > all && b[-1] != ':')
                b--;
        snprintf(path, sizeof(path), "%.*s", (int)(p - b) + (int)strlen("/tally-admin"), b);
        return path;
}

/* tally-admin ARGS... (NULL-terminated); its exit status, *out malloc'd. */
static int admin(char **out, ...)
{
        char *argv[16] = { (char *)admin_bin(), "--database-url", t.db_url };
        int n = 3;
        va_list ap;
        va_start(ap, out);
        for (char *a; n < 15 && (a = va_arg(ap, char *));)
                argv[n++] = a;
        va_end(ap);
        argv[n] = NULL;
        char *o = NULL, *e = NULL;
        int st = test_run(argv, &o, &e);
        if (st != 0 && e)
                fprintf(stderr, "tally-admin %s %s: %s", argv[3], n > 4 ? argv[4] : "", e);
        free(e);
        *out = o ? o : strdup("");
        return st;
}

/* ---- a real tally-api, a person of the account signed in ---- */

static int api_port;
static char cookie[256], csrf[128];

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
        char **b = ud;
        size_t add = size * n, old = *b ? strlen(*b) : 0;
        char *nb = realloc(*b, old + add + 1);
        memcpy(nb + old, p, add);
        nb[old + add] = '\0';
        *b = nb;
        return add;
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
        (void)ud;
        size_t len = size * n;
        if (len > 12 && strncasecmp(p, "Set-Cookie: ", 12) == 0)
                sscanf(p + 12, "tally_session=%255[^;\r\n]", cookie);
        return len;
}

static long http(const char *method, const char *path, const char *body, const char *bearer, json_t **ret)
{
        CURL *c = curl_easy_init();
        char url[512], h[512];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", api_port, path);
        struct curl_slist *hs = curl_slist_append(NULL, "Content-Type: application/json");
        if (bearer)
                snprintf(h, sizeof(h), "Authorization: Bearer %s", bearer);
        else
                snprintf(h, sizeof(h), "Cookie: tally_session=%s", cookie);
        hs = curl_slist_append(hs, h);
        if (!bearer && csrf[0]) { /* a session's write carries its CSRF token (docs/security.md) */
                snprintf(h, sizeof(h), "X-CSRF-Token: %s", csrf);
                hs = curl_slist_append(hs, h);
        }
        char *b = NULL;
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        if (body)
                curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        long status = 0;
        if (curl_easy_perform(c) == CURLE_OK)
                curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(hs);
        curl_easy_cleanup(c);
        *ret = b ? json_loads(b, 0, NULL) : NULL;
        if (!*ret)
                fprintf(stderr, "%s %s: %ld, not JSON: %.300s\n", method, path, status, b ? b : "");
        free(b);
        return status;
}

static const char *jstr(json_t *o, const char *k)
{
        json_t *v = json_object_get(o, k);
        return json_is_string(v) ? json_string_value(v) : "";
}

static void sign_in(const char *account, const char *pwfile)
{
        char email[128], body[256], *out;
        snprintf(email, sizeof(email), "tz-%s@example.com", account);
        CHECK(admin(&out, "person", "create", "--account", account, "--email", email, "--password-file", pwfile, NULL) ==
                      0,
              "person create %s", account);
        free(out);
        cookie[0] = '\0';
        snprintf(body, sizeof(body), "{\"email\":\"%s\",\"password\":\"correct horse battery\"}", email);
        json_t *j = NULL;
        csrf[0] = '\0';
        long st = http("POST", "/v1/sessions", body, NULL, &j);
        CHECK(st == 201 && cookie[0], "sign-in to %s: %ld", account, st);
        snprintf(csrf, sizeof(csrf), "%s", jstr(j, "csrf_token"));
        json_decref(j);
}

/* /v1/spend?day=DAY as the person signed in: checks the day's figures and its zone. */
static void check_spend_day(const char *day, const char *zone, const char *start, const char *end, int64_t spend,
                            bool blocked)
{
        char path[128];
        snprintf(path, sizeof(path), "/v1/spend?day=%s", day);
        json_t *j = NULL;
        long st = http("GET", path, NULL, NULL, &j);
        CHECK(st == 200, "GET %s: %ld", path, st);
        CHECK(!strcmp(jstr(j, "day"), day) && !strcmp(jstr(j, "time_zone"), zone) &&
                      !strcmp(jstr(j, "day_start"), start) && !strcmp(jstr(j, "day_end"), end) &&
                      json_is_false(json_object_get(j, "today")),
              "GET %s: day %s in %s from %s to %s, got %s %s %s %s", path, day, zone, start, end, jstr(j, "day"),
              jstr(j, "time_zone"), jstr(j, "day_start"), jstr(j, "day_end"));
        json_t *k = json_array_get(json_object_get(j, "data"), 0);
        CHECK(k && json_integer_value(json_object_get(k, "spend_nanodollars")) == spend &&
                      json_is_true(json_object_get(k, "blocked")) == blocked &&
                      json_integer_value(json_object_get(k, "burn_rate_nanodollars_per_hour")) == 0,
              "GET %s: spend %lld (want %lld), blocked %d (want %d)", path,
              k ? (long long)json_integer_value(json_object_get(k, "spend_nanodollars")) : -1LL, (long long)spend,
              k ? json_is_true(json_object_get(k, "blocked")) : -1, blocked);
        json_decref(j);
}

int main(void)
{
        aggtest_start(&t, "timezones", 2);
        aggtest_exec(&t, "INSERT INTO accounts (id, name, free_sandbox_hours) VALUES ('ny', 'n', 0), ('be', 'b', 0),"
                         " ('in', 'i', 0), ('mv', 'm', 0);"
                         "INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars, limit_policy) VALUES"
                         " ('kny', 'ny', sha256('kny'), " LIMIT ", 'pause'),"
                         " ('kbe', 'be', sha256('kbe'), " LIMIT ", 'pause'),"
                         " ('kin', 'in', sha256('kin'), " LIMIT ", 'stop'),"
                         " ('kmv', 'mv', sha256('kmv'), " LIMIT ", 'pause')");

        /* The zones: by tally-admin, and by a person through the API. */
        char *out = NULL;
        CHECK(admin(&out, "account", "timezone", "ny", "America/New_York", NULL) == 0 &&
                      strstr(out, "time_zone=America/New_York previous_time_zone=UTC"),
              "tally-admin account timezone ny America/New_York: %s", out);
        free(out);
        CHECK(admin(&out, "account", "timezone", "in", "Asia/Kolkata", "--json", NULL) == 0 &&
                      strstr(out, "\"time_zone\": \"Asia/Kolkata\"") && strstr(out, "\"utc_offset\": \"+05:30\"") &&
                      strstr(out, "\"day_hours\": 24"),
              "tally-admin account timezone in Asia/Kolkata --json: %s", out);
        free(out);
        CHECK(admin(&out, "account", "timezone", "in", "Mars/Olympus_Mons", NULL) != 0, "an unknown zone is refused");
        free(out);
        CHECK(admin(&out, "account", "timezone", "in", NULL) == 0 && strstr(out, "time_zone=Asia/Kolkata "),
              "tally-admin account timezone in: %s", out);
        free(out);
        CHECK(admin(&out, "account", "timezone", "--help", NULL) == 0 && strstr(out, "account timezone ACCOUNT [ZONE]"),
              "tally-admin account timezone --help: %s", out);
        free(out);

        char pw[1024], log[1024];
        snprintf(pw, sizeof(pw), "%s/pw", t.dir);
        FILE *f = fopen(pw, "w");
        fputs("correct horse battery\n", f);
        fclose(f);
        snprintf(log, sizeof(log), "%s/api.log", t.dir);
        char *argv[] = { (char *)test_env("TALLY_API_BIN"), "--database-url", t.db_url, "--port", "0",
                         "--cookie-secure=false", "--threads", "4", NULL };
        pid_t api = test_spawn(argv, NULL, log);
        for (int i = 0; i < 400 && !api_port; i++) {
                char *l = test_read_file(log);
                char *p = l ? strstr(l, "msg=\"listening\"") : NULL;
                char *q = p ? strstr(p, " port=") : NULL;
                if (q)
                        api_port = atoi(q + 6);
                free(l);
                if (!api_port)
                        time_sleep_ns(50 * NS_PER_MS);
        }
        CHECK(api_port > 0, "tally-api did not start");
        if (!api_port) {
                kill(api, SIGKILL);
                aggtest_stop(&t);
                return test_result();
        }
        sign_in("be", pw);
        json_t *j = NULL;
        CHECK(http("PUT", "/v1/account/settings", "{\"time_zone\":\"Europe/Berlin\"}", NULL, &j) == 200 &&
                      !strcmp(jstr(j, "time_zone"), "Europe/Berlin"),
              "PUT /v1/account/settings Europe/Berlin");
        json_decref(j);
        CHECK(http("PUT", "/v1/account/settings", "{\"time_zone\":\"Europe/Atlantis\"}", NULL, &j) == 400,
              "PUT /v1/account/settings: an unknown zone is 400");
        json_decref(j);
        CHECK(http("PUT", "/v1/account/settings", "{\"time_zone\":\"UTC\"}", "nobody-key", &j) == 401,
              "PUT /v1/account/settings without a session is refused");
        json_decref(j);
        expect("1", "the person's change is audited",
               "SELECT count(*) FROM audit_log WHERE account_id = 'be' AND action = 'account.time_zone'"
               " AND actor LIKE 'person:%' AND new_value ->> 'time_zone' = 'Europe/Berlin'");

        /* The stream. mv (UTC for now) gets New York's fall-back sandbox. */
        run_hours("ny", "kny", "ny-spring", aggtest_utc(2026, 3, 8, 3, 0, 0), 27);
        run_hours("ny", "kny", "ny-fall", aggtest_utc(2026, 11, 1, 2, 0, 0), 29);
        run_hours("be", "kbe", "be-spring", aggtest_utc(2026, 3, 28, 21, 0, 0), 27);
        run_hours("be", "kbe", "be-fall", aggtest_utc(2026, 10, 24, 20, 0, 0), 29);
        run_hours("in", "kin", "in-day", aggtest_utc(2026, 6, 10, 17, 0, 0), 28);
        run_hours("in", "kin", "in-month", aggtest_utc(2026, 6, 30, 17, 0, 0), 4);
        run_hours("mv", "kmv", "mv-fall", aggtest_utc(2026, 11, 1, 2, 0, 0), 29);
        aggtest_flush(&t);
        pid_t agg = aggtest_spawn(&t, NULL);
        CHECK(aggtest_wait_caught_up(&t, 120) == 0, "the aggregator did not consume the stream");

        /* spend_daily: the days the aggregator wrote, hours x 32,500,000 */
        expect("2026-03-07=65000000 2026-03-08=747500000 2026-03-09=65000000 2026-10-31=65000000 "
               "2026-11-01=812500000 2026-11-02=65000000",
               "New York's days (23 and 25 hours)",
               "SELECT string_agg(day || '=' || nanodollars, ' ' ORDER BY day) FROM spend_daily WHERE key_id = 'kny'");
        expect("2026-03-28=65000000 2026-03-29=747500000 2026-03-30=65000000 2026-10-24=65000000 "
               "2026-10-25=812500000 2026-10-26=65000000",
               "Berlin's days (23 and 25 hours)",
               "SELECT string_agg(day || '=' || nanodollars, ' ' ORDER BY day) FROM spend_daily WHERE key_id = 'kbe'");
        expect("2026-06-10=65000000 2026-06-11=780000000 2026-06-12=65000000 2026-06-30=65000000 2026-07-01=65000000",
               "Kolkata's days (from 00:30 local)",
               "SELECT string_agg(day || '=' || nanodollars, ' ' ORDER BY day) FROM spend_daily WHERE key_id = 'kin'");
        expect("2026-11-01=715000000 2026-11-02=227500000", "mv's UTC days",
               "SELECT string_agg(day || '=' || nanodollars, ' ' ORDER BY day) FROM spend_daily WHERE key_id = 'kmv'");
        /* the per-key daily rollup agrees with spend_daily day by day */
        expect("0", "usage_key_daily's days are spend_daily's (an hour: 3,600 CPU-s and 32,500,000 nano-dollars)",
               "SELECT count(*) FROM usage_key_daily u FULL JOIN spend_daily s ON s.key_id = u.key_id AND s.day = u.day"
               " WHERE u.key_id IS NULL OR s.key_id IS NULL OR u.cpu_ns * 32500000 <> s.nanodollars * 3600000000000");

        /* limits: blocked on the days that reached 763,750,000; alerts per local day */
        expect("kbe:2026-10-25 kin:2026-06-11 kny:2026-11-01", "the blocks",
               "SELECT string_agg(key_id || ':' || day, ' ' ORDER BY key_id, day) FROM key_blocks");
        expect("kbe:2026-03-29:50 kbe:2026-03-29:80 kbe:2026-10-25:50 kbe:2026-10-25:80 kbe:2026-10-25:100 "
               "kin:2026-06-11:50 kin:2026-06-11:80 kin:2026-06-11:100 "
               "kmv:2026-11-01:50 kmv:2026-11-01:80 "
               "kny:2026-03-08:50 kny:2026-03-08:80 kny:2026-11-01:50 kny:2026-11-01:80 kny:2026-11-01:100",
               "the alerts, once per (key, local day, threshold)",
               "SELECT string_agg(key_id || ':' || day || ':' || threshold_pct, ' '"
               "                  ORDER BY key_id, day, threshold_pct) FROM alerts WHERE threshold_pct > 0");

        /* /v1/spend of a day, as Berlin's person, then New York's */
        check_spend_day("2026-03-29", "Europe/Berlin", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23 * HOUR, false);
        check_spend_day("2026-10-25", "Europe/Berlin", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25 * HOUR, true);
        sign_in("ny", pw);
        check_spend_day("2026-03-08", "America/New_York", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 23 * HOUR,
                        false);
        check_spend_day("2026-11-01", "America/New_York", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", 25 * HOUR,
                        true);
        /* today: New York's date now (PostgreSQL's own conversion) */
        CHECK(http("GET", "/v1/spend", NULL, NULL, &j) == 200 && !strcmp(jstr(j, "time_zone"), "America/New_York") &&
                      json_is_true(json_object_get(j, "today")),
              "GET /v1/spend: today in New York");
        char *today = q_text("SELECT (now() AT TIME ZONE 'America/New_York')::date");
        CHECK(!strcmp(jstr(j, "day"), today), "GET /v1/spend: day %s, want %s", jstr(j, "day"), today);
        free(today);
        json_decref(j);
        CHECK(http("GET", "/v1/spend?day=2026-02-30", NULL, NULL, &j) == 400, "GET /v1/spend?day=2026-02-30 is 400");
        json_decref(j);
        CHECK(http("GET", "/v1/account/settings", NULL, NULL, &j) == 200 &&
                      !strcmp(jstr(j, "time_zone"), "America/New_York") &&
                      (!strcmp(jstr(j, "utc_offset"), "-05:00") || !strcmp(jstr(j, "utc_offset"), "-04:00")),
              "GET /v1/account/settings: New York");
        json_decref(j);
        sign_in("in", pw);
        check_spend_day("2026-06-11", "Asia/Kolkata", "2026-06-10T19:00:00Z", "2026-06-11T19:00:00Z", 24 * HOUR, true);

        /* invoices: calendar months of the zone. New York's October holds Nov 1's 02:00Z
         * and 03:00Z (Oct 31, 22:00 and 23:00 local): 2 vCPU-hours (50,000,000) and 2 GiB-hours
         * (15,000,000); its November the other 27 hours. Kolkata's July holds 19:00Z and 20:00Z
         * of June 30 (00:30 and 01:30 on July 1 local); its June the other 30 hours. */
        expect("2026-03-01=877500000 2026-10-01=65000000 2026-11-01=877500000", "New York's invoice months",
               "SELECT string_agg(month || '=' || total_nanodollars, ' ' ORDER BY month) FROM finance.invoices"
               " WHERE account_id = 'ny'");
        expect("50000000", "New York's October CPU line",
               "SELECT amount_nanodollars FROM finance.invoice_lines WHERE account_id = 'ny' AND month = '2026-10-01'"
               " AND kind = 'usage' AND meter = 'cpu'");
        expect("2026-06-01=975000000 2026-07-01=65000000", "Kolkata's invoice months",
               "SELECT string_agg(month || '=' || total_nanodollars, ' ' ORDER BY month) FROM finance.invoices"
               " WHERE account_id = 'in'");
        expect("2026-11-01 04:00:00 2026-12-01 05:00:00", "New York's November: its period (UTC)",
               "SELECT (period_start AT TIME ZONE 'UTC') || ' ' || (period_end AT TIME ZONE 'UTC')"
               " FROM finance.invoices WHERE account_id = 'ny' AND month = '2026-11-01'");
        CHECK(admin(&out, "close-month", "2026-06", NULL) == 0, "close-month 2026-06: %s", out);
        free(out);
        /* June 2026: CPU 30 x 25,000,000 = 750,000,000 (75 cents), memory 30 x 7,500,000 =
         * 225,000,000 (22.5 -> 23 cents, half away from zero): 975,000,000, 98 cents. */
        expect("975000000 98", "Kolkata's closed June",
               "SELECT total_nanodollars || ' ' || total_cents FROM closed_invoices WHERE account_id = 'in'"
               " AND month = '2026-06-01'");

        /* A zone set after the usage: mv's days are rebuilt from its hours, as New York's. */
        CHECK(admin(&out, "account", "timezone", "mv", "America/New_York", NULL) == 0, "account timezone mv: %s", out);
        free(out);
        expect("2026-10-31=65000000 2026-11-01=812500000 2026-11-02=65000000", "mv's days after the change",
               "SELECT string_agg(day || '=' || nanodollars, ' ' ORDER BY day) FROM spend_daily WHERE key_id = 'kmv'");
        expect("2026-10-31=7200000000000 2026-11-01=90000000000000 2026-11-02=7200000000000",
               "mv's usage days after the change",
               "SELECT string_agg(day || '=' || cpu_ns, ' ' ORDER BY day) FROM usage_key_daily WHERE key_id = 'kmv'");
        expect("admin UTC America/New_York", "the operator's change is audited",
               "SELECT actor || ' ' || (old_value ->> 'time_zone') || ' ' || (new_value ->> 'time_zone') FROM audit_log"
               " WHERE account_id = 'mv' AND action = 'account.time_zone'");

        CHECK(aggtest_terminate(agg) == 0, "the aggregator did not stop cleanly");
        kill(api, SIGTERM);
        waitpid(api, NULL, 0);
        aggtest_stop(&t);
        return test_result();
}
