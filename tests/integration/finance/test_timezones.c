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
 * The days, from the zones' rules (the US: second Sunday of March, first of
 * November; the EU: last Sunday of March and of October, at 01:00Z), worked by
 * hand. Each is the latest such day at least two days past (sample times are
 * checked against the aggregator's clock: at most 400 days back), D below:
 *   America/New_York, spring forward (02:00 EST -> 03:00 EDT):
 *     D runs 05:00Z D -> 04:00Z D+1: 23 hours.
 *     Sandbox 03:00Z D -> 06:00Z D+1 (27 h): D-1 2 h, D 23 h, D+1 2 h.
 *   America/New_York, fall back (02:00 EDT -> 01:00 EST):
 *     D runs 04:00Z D -> 05:00Z D+1: 25 hours.
 *     Sandbox 02:00Z D -> 07:00Z D+1 (29 h): D-1 2 h, D 25 h, D+1 2 h.
 *   Europe/Berlin, spring forward (02:00 CET -> 03:00 CEST):
 *     D runs 23:00Z D-1 -> 22:00Z D: 23 hours.
 *     Sandbox 21:00Z D-1 -> 00:00Z D+1 (27 h): D-1 2 h, D 23 h, D+1 2 h.
 *   Europe/Berlin, fall back (03:00 CEST -> 02:00 CET):
 *     D runs 22:00Z D-1 -> 23:00Z D: 25 hours.
 *     Sandbox 20:00Z D-1 -> 01:00Z D+1 (29 h): D-1 2 h, D 25 h, D+1 2 h.
 *   Asia/Kolkata (+05:30, no daylight saving): local midnight is 18:30Z, inside
 *     the UTC hour 18:00Z, which starts at 23:30 local and so belongs to the day
 *     before (docs/billing.md: an hour belongs to the day of its start). A day
 *     K runs 19:00Z K-1 -> 19:00Z K (00:30 -> 00:30 local), 24 hours.
 *     M is the month before last, K its 15th, L its last day:
 *     Sandbox 17:00Z K-1 -> 21:00Z K (28 h): K-1 2 h, K 24 h, K+1 2 h.
 *     Sandbox 17:00Z L -> 21:00Z L (4 h): M 2 h, the next month 2 h (its month's end).
 * In UTC days the same sandboxes give other days: New York's fall-back day
 * would be 22 hours (715,000,000: no block), Kolkata's K 21 hours (no block),
 * Berlin's spring-forward day 24 hours (a block). */
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
#include <time.h>

#define GiB   (UINT64_C(1) << 30)
#define HOUR  INT64_C(32500000)
#define LIMIT "763750000"
#define DAY_NS (INT64_C(86400) * NS_PER_SEC)
#define H_NS   (INT64_C(3600) * NS_PER_SEC)

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


/* ---- dates, in UTC: a day is its midnight's Unix ns ---- */

static int64_t date_ns(int y, int m, int d)
{
        return aggtest_utc(y, m, d, 0, 0, 0);
}

static const char *ymd(int64_t ns, char *buf)
{
        time_t s = (time_t)(ns / NS_PER_SEC);
        struct tm tm;
        gmtime_r(&s, &tm);
        strftime(buf, 11, "%Y-%m-%d", &tm);
        return buf;
}

static int wday(int64_t ns)
{
        time_t s = (time_t)(ns / NS_PER_SEC);
        struct tm tm;
        gmtime_r(&s, &tm);
        return tm.tm_wday;
}

static int64_t nth_sunday(int y, int m, int n)
{
        int64_t first = date_ns(y, m, 1);
        return first + ((7 - wday(first)) % 7 + 7 * (n - 1)) * DAY_NS;
}

static int64_t last_sunday(int y, int m)
{
        int64_t last = date_ns(m == 12 ? y + 1 : y, m == 12 ? 1 : m + 1, 1) - DAY_NS;
        return last - wday(last) * DAY_NS;
}

/* The latest day rule(year) at least two days before now. */
static int64_t latest(int64_t (*rule)(int y, int m, int n), int m, int n, int64_t now)
{
        time_t s = (time_t)(now / NS_PER_SEC);
        struct tm tm;
        gmtime_r(&s, &tm);
        int64_t d = rule(tm.tm_year + 1900, m, n);
        return d + 2 * DAY_NS <= now ? d : rule(tm.tm_year + 1899, m, n);
}

static int64_t last_sunday_rule(int y, int m, int n)
{
        (void)n;
        return last_sunday(y, m);
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

        /* The days (see the top) and the stream. mv (UTC for now) gets New York's fall-back sandbox. */
        int64_t now = time_wall_ns();
        int64_t nys = latest(nth_sunday, 3, 2, now), nyf = latest(nth_sunday, 11, 1, now);
        int64_t bes = latest(last_sunday_rule, 3, 0, now), bef = latest(last_sunday_rule, 10, 0, now);
        time_t nows = (time_t)(now / NS_PER_SEC);
        struct tm tm;
        gmtime_r(&nows, &tm);
        int my = tm.tm_mon >= 2 ? tm.tm_year + 1900 : tm.tm_year + 1899, mm = (tm.tm_mon + 10) % 12 + 1; /* M */
        int64_t kd = date_ns(my, mm, 15), ld = date_ns(mm == 12 ? my + 1 : my, mm % 12 + 1, 1) - DAY_NS;
        char NYS[3][11], NYF[3][11], BES[3][11], BEF[3][11], K[3][11], M[24], M1[11], NYFM[2][11], NYSM[11];
        for (int i = 0; i < 3; i++) {
                ymd(nys + (i - 1) * DAY_NS, NYS[i]);
                ymd(nyf + (i - 1) * DAY_NS, NYF[i]);
                ymd(bes + (i - 1) * DAY_NS, BES[i]);
                ymd(bef + (i - 1) * DAY_NS, BEF[i]);
                ymd(kd + (i - 1) * DAY_NS, K[i]);
        }
        snprintf(M, sizeof(M), "%04d-%02d-01", my, mm);
        ymd(ld + DAY_NS, M1);
        snprintf(NYSM, sizeof(NYSM), "%.8s01", NYS[1]);
        snprintf(NYFM[0], sizeof(NYFM[0]), "%.8s01", NYF[0]);
        snprintf(NYFM[1], sizeof(NYFM[1]), "%.8s01", NYF[1]);
        run_hours("ny", "kny", "ny-spring", nys + 3 * H_NS, 27);
        run_hours("ny", "kny", "ny-fall", nyf + 2 * H_NS, 29);
        run_hours("be", "kbe", "be-spring", bes - 3 * H_NS, 27);
        run_hours("be", "kbe", "be-fall", bef - 4 * H_NS, 29);
        run_hours("in", "kin", "in-day", kd - 7 * H_NS, 28);
        run_hours("in", "kin", "in-month", ld + 17 * H_NS, 4);
        run_hours("mv", "kmv", "mv-fall", nyf + 2 * H_NS, 29);
        aggtest_flush(&t);
        pid_t agg = aggtest_spawn(&t, NULL);
        CHECK(aggtest_wait_caught_up(&t, 120) == 0, "the aggregator did not consume the stream");

        /* spend_daily: the days the aggregator wrote, hours x 32,500,000 (each key's days in date order) */
        char want[1024], ld0[11], ld1[11];
        ymd(ld, ld0);
        ymd(ld + DAY_NS, ld1);
        const char *days = "SELECT string_agg(day || '=' || nanodollars, ' ' ORDER BY day) FROM spend_daily WHERE key_id = ";
        char sql[512];
        snprintf(want, sizeof(want), "%s=65000000 %s=747500000 %s=65000000", NYS[0], NYS[1], NYS[2]);
        snprintf(sql, sizeof(sql), "%s'kny' AND day < '%s'", days, NYF[0]);
        expect(want, "New York's spring-forward day (23 hours)", sql);
        snprintf(want, sizeof(want), "%s=65000000 %s=812500000 %s=65000000", NYF[0], NYF[1], NYF[2]);
        snprintf(sql, sizeof(sql), "%s'kny' AND day >= '%s'", days, NYF[0]);
        expect(want, "New York's fall-back day (25 hours)", sql);
        snprintf(want, sizeof(want), "%s=65000000 %s=747500000 %s=65000000", BES[0], BES[1], BES[2]);
        snprintf(sql, sizeof(sql), "%s'kbe' AND day < '%s'", days, BEF[0]);
        expect(want, "Berlin's spring-forward day (23 hours)", sql);
        snprintf(want, sizeof(want), "%s=65000000 %s=812500000 %s=65000000", BEF[0], BEF[1], BEF[2]);
        snprintf(sql, sizeof(sql), "%s'kbe' AND day >= '%s'", days, BEF[0]);
        expect(want, "Berlin's fall-back day (25 hours)", sql);
        snprintf(want, sizeof(want), "%s=65000000 %s=780000000 %s=65000000 %s=65000000 %s=65000000", K[0], K[1], K[2],
                 ld0, ld1);
        snprintf(sql, sizeof(sql), "%s'kin'", days);
        expect(want, "Kolkata's days (from 00:30 local)", sql);
        snprintf(want, sizeof(want), "%s=715000000 %s=227500000", NYF[1], NYF[2]);
        snprintf(sql, sizeof(sql), "%s'kmv'", days);
        expect(want, "mv's UTC days (22 and 7 hours)", sql);
        /* the per-key daily rollup agrees with spend_daily day by day */
        expect("0", "usage_key_daily's days are spend_daily's (an hour: 3,600 CPU-s and 32,500,000 nano-dollars)",
               "SELECT count(*) FROM usage_key_daily u FULL JOIN spend_daily s ON s.key_id = u.key_id AND s.day = u.day"
               " WHERE u.key_id IS NULL OR s.key_id IS NULL OR u.cpu_ns * 32500000 <> s.nanodollars::numeric * 3600000000000");

        /* limits: blocked on the days that reached 763,750,000; alerts per local day */
        snprintf(want, sizeof(want), "kbe:%s kin:%s kny:%s", BEF[1], K[1], NYF[1]);
        expect(want, "the blocks", "SELECT string_agg(key_id || ':' || day, ' ' ORDER BY key_id, day) FROM key_blocks");
        snprintf(want, sizeof(want),
                 "kbe:%s:50 kbe:%s:80 kbe:%s:50 kbe:%s:80 kbe:%s:100 kin:%s:50 kin:%s:80 kin:%s:100 kmv:%s:50 kmv:%s:80 "
                 "kny:%s:50 kny:%s:80 kny:%s:50 kny:%s:80 kny:%s:100",
                 BES[1], BES[1], BEF[1], BEF[1], BEF[1], K[1], K[1], K[1], NYF[1], NYF[1], NYS[1], NYS[1], NYF[1],
                 NYF[1], NYF[1]);
        expect(want, "the alerts, once per (key, local day, threshold)",
               "SELECT string_agg(key_id || ':' || day || ':' || threshold_pct, ' '"
               "                  ORDER BY key_id, day, threshold_pct) FROM alerts WHERE threshold_pct > 0");

        /* /v1/spend of a day, as Berlin's person, then New York's */
        char s0[32], s1[32];
        snprintf(s0, sizeof(s0), "%sT23:00:00Z", BES[0]);
        snprintf(s1, sizeof(s1), "%sT22:00:00Z", BES[1]);
        check_spend_day(BES[1], "Europe/Berlin", s0, s1, 23 * HOUR, false);
        snprintf(s0, sizeof(s0), "%sT22:00:00Z", BEF[0]);
        snprintf(s1, sizeof(s1), "%sT23:00:00Z", BEF[1]);
        check_spend_day(BEF[1], "Europe/Berlin", s0, s1, 25 * HOUR, true);
        sign_in("ny", pw);
        snprintf(s0, sizeof(s0), "%sT05:00:00Z", NYS[1]);
        snprintf(s1, sizeof(s1), "%sT04:00:00Z", NYS[2]);
        check_spend_day(NYS[1], "America/New_York", s0, s1, 23 * HOUR, false);
        snprintf(s0, sizeof(s0), "%sT04:00:00Z", NYF[1]);
        snprintf(s1, sizeof(s1), "%sT05:00:00Z", NYF[2]);
        check_spend_day(NYF[1], "America/New_York", s0, s1, 25 * HOUR, true);
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
        snprintf(s0, sizeof(s0), "%sT19:00:00Z", K[0]);
        snprintf(s1, sizeof(s1), "%sT19:00:00Z", K[1]);
        check_spend_day(K[1], "Asia/Kolkata", s0, s1, 24 * HOUR, true);

        /* invoices: calendar months of the zone. New York's fall-back sandbox starts at
         * 02:00Z on D, 22:00 local on D-1: when D is November 1st, its first 2 hours are
         * October's (2 vCPU-hours: 50,000,000; 2 GiB-hours: 15,000,000), its other 27
         * November's. Kolkata's month M holds K's sandbox (28 h) and 2 hours of L's (17:00Z
         * and 18:00Z, 22:30 and 23:30 local); the next month L's 19:00Z and 20:00Z (00:30 and
         * 01:30 local on its 1st). */
        bool oct = strcmp(NYFM[0], NYFM[1]) != 0;
        if (oct)
                snprintf(want, sizeof(want), "%s=877500000 %s=65000000 %s=877500000", NYSM, NYFM[0], NYFM[1]);
        else
                snprintf(want, sizeof(want), "%s=877500000 %s=942500000", NYSM, NYFM[1]);
        expect(want, "New York's invoice months",
               "SELECT string_agg(month || '=' || total_nanodollars, ' ' ORDER BY month) FROM finance.invoices"
               " WHERE account_id = 'ny'");
        snprintf(sql, sizeof(sql),
                 "SELECT amount_nanodollars FROM finance.invoice_lines WHERE account_id = 'ny' AND month = '%s'"
                 " AND kind = 'usage' AND meter = 'cpu'", NYFM[1]);
        expect(oct ? "675000000" : "725000000", "New York's fall-back month's CPU line", sql);
        snprintf(want, sizeof(want), "%s=975000000 %s=65000000", M, M1);
        expect(want, "Kolkata's invoice months",
               "SELECT string_agg(month || '=' || total_nanodollars, ' ' ORDER BY month) FROM finance.invoices"
               " WHERE account_id = 'in'");
        /* New York's fall-back month starts at 04:00Z on its 1st (EDT) and ends at 05:00Z on the next month's 1st (EST) */
        {
                int fy = atoi(NYF[1]), fm = atoi(NYF[1] + 5);
                snprintf(want, sizeof(want), "%.8s01 04:00:00 %04d-%02d-01 05:00:00", NYF[1], fm == 12 ? fy + 1 : fy,
                         fm % 12 + 1);
        }
        snprintf(sql, sizeof(sql),
                 "SELECT (period_start AT TIME ZONE 'UTC') || ' ' || (period_end AT TIME ZONE 'UTC')"
                 " FROM finance.invoices WHERE account_id = 'ny' AND month = '%s'", NYFM[1]);
        expect(want, "New York's November: its period (UTC)", sql);
        char Mm[24];
        snprintf(Mm, sizeof(Mm), "%.7s", M);
        CHECK(admin(&out, "close-month", Mm, NULL) == 0, "close-month %s: %s", Mm, out);
        free(out);
        /* M: CPU 30 x 25,000,000 = 750,000,000 (75 cents), memory 30 x 7,500,000 =
         * 225,000,000 (22.5 -> 23 cents, half away from zero): 975,000,000, 98 cents. */
        snprintf(sql, sizeof(sql),
                 "SELECT total_nanodollars || ' ' || total_cents FROM closed_invoices WHERE account_id = 'in'"
                 " AND month = '%s'", M);
        expect("975000000 98", "Kolkata's closed month", sql);

        /* A zone set after the usage: mv's days are rebuilt from its hours, as New York's. */
        CHECK(admin(&out, "account", "timezone", "mv", "America/New_York", NULL) == 0, "account timezone mv: %s", out);
        free(out);
        snprintf(want, sizeof(want), "%s=65000000 %s=812500000 %s=65000000", NYF[0], NYF[1], NYF[2]);
        snprintf(sql, sizeof(sql), "%s'kmv'", days);
        expect(want, "mv's days after the change", sql);
        snprintf(want, sizeof(want), "%s=7200000000000 %s=90000000000000 %s=7200000000000", NYF[0], NYF[1], NYF[2]);
        expect(want, "mv's usage days after the change",
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
