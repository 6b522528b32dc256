/* send.c — see send.h. Webhooks are HTTPS with libcurl's certificate and
 * host checks on; plain http only to hosts the operator listed; no redirect
 * is followed (a receiver answering 3xx is a failed attempt, retried). */
#include "send.h"
#include "money.h"
#include "tally_build.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

int signature_make(const char *secret, int64_t t, const char *body, size_t len, char out[SIGNATURE_MAX])
{
        char ts[24];
        int n = snprintf(ts, sizeof(ts), "%" PRId64 ".", t);
        unsigned char *msg = malloc((size_t)n + len + 1);
        if (!msg)
                return -ENOMEM;
        memcpy(msg, ts, (size_t)n);
        memcpy(msg + n, body, len);
        unsigned char mac[EVP_MAX_MD_SIZE];
        unsigned int maclen = 0;
        bool ok = HMAC(EVP_sha256(), secret, (int)strlen(secret), msg, (size_t)n + len, mac, &maclen) != NULL;
        free(msg);
        if (!ok || maclen != 32)
                return -EIO;
        int o = snprintf(out, SIGNATURE_MAX, "t=%" PRId64 ",v1=", t);
        for (unsigned int i = 0; i < maclen; i++)
                o += snprintf(out + o, (size_t)(SIGNATURE_MAX - o), "%02x", mac[i]);
        return 0;
}

static bool host_listed(const char *list, const char *host)
{
        size_t hl = strlen(host);
        for (const char *p = list; p && *p;) {
                const char *e = strchr(p, ',');
                size_t n = e ? (size_t)(e - p) : strlen(p);
                while (n && *p == ' ')
                        p++, n--;
                while (n && p[n - 1] == ' ')
                        n--;
                if (n == hl && strncasecmp(p, host, n) == 0)
                        return true;
                p = e ? e + 1 : NULL;
        }
        return false;
}

bool webhook_url_allowed(const char *allow_http, const char *url, char *why, size_t whylen)
{
        CURLU *u = curl_url();
        char *scheme = NULL, *host = NULL;
        bool ok = false;
        if (!u || curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK ||
            curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
            curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
                snprintf(why, whylen, "not a URL");
        } else if (strcmp(scheme, "https") == 0) {
                ok = true;
        } else if (strcmp(scheme, "http") != 0) {
                snprintf(why, whylen, "the scheme must be https");
        } else if (!host_listed(allow_http, host)) {
                snprintf(why, whylen, "plain http is allowed only to the hosts in allow_http");
        } else {
                ok = true;
        }
        curl_free(scheme);
        curl_free(host);
        curl_url_cleanup(u);
        return ok;
}

_Static_assert(sizeof(((struct send_job *)0)->errbuf) >= CURL_ERROR_SIZE, "libcurl's error buffer");

static size_t discard(char *p, size_t size, size_t n, void *ctx)
{
        return size * n;
}

static void common_options(CURL *c, const struct send_config *cfg, char *errbuf)
{
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)cfg->timeout_ms);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)cfg->timeout_ms);
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
        if (cfg->ca_file && cfg->ca_file[0])
                curl_easy_setopt(c, CURLOPT_CAINFO, cfg->ca_file);
}

int send_job_webhook(struct send_job *j, const struct send_config *cfg, const char *url, const char *secret,
                     const char *event_id, const char *type, const char *body)
{
        memset(j, 0, sizeof(*j));
        j->kind = SEND_WEBHOOK;
        if (!webhook_url_allowed(cfg->allow_http, url, j->err, sizeof(j->err)))
                return j->result = -EPERM;
        char sig[SIGNATURE_MAX];
        size_t len = strlen(body);
        if (signature_make(secret, (int64_t)time(NULL), body, len, sig) < 0) {
                snprintf(j->err, sizeof(j->err), "could not sign");
                return j->result = -EIO;
        }
        CURL *c = curl_easy_init();
        if (!c) {
                snprintf(j->err, sizeof(j->err), "could not start libcurl");
                return j->result = -ENOMEM;
        }
        char h_sig[SIGNATURE_MAX + 32], h_id[128], h_type[96];
        snprintf(h_sig, sizeof(h_sig), "Tally-Signature: %s", sig);
        snprintf(h_id, sizeof(h_id), "Tally-Event-Id: %s", event_id);
        snprintf(h_type, sizeof(h_type), "Tally-Event-Type: %s", type);
        struct curl_slist *hs = NULL;
        hs = curl_slist_append(hs, "Content-Type: application/json");
        hs = curl_slist_append(hs, "Expect:");
        hs = curl_slist_append(hs, h_sig);
        hs = curl_slist_append(hs, h_id);
        hs = curl_slist_append(hs, h_type);
        common_options(c, cfg, j->errbuf);
        curl_easy_setopt(c, CURLOPT_URL, url);
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
        curl_easy_setopt(c, CURLOPT_USERAGENT, "tally-notifier/" TALLY_VERSION);
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, hs);
        /* body is the caller's and outlives the job (send.h). */
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)len);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
        j->curl = c;
        j->list = hs;
        return 0;
}

static size_t mail_read(char *buf, size_t size, size_t n, void *ctx)
{
        struct send_job *m = ctx;
        size_t k = size * n;
        if (k > m->len - m->off)
                k = m->len - m->off;
        memcpy(buf, m->mail + m->off, k);
        m->off += k;
        return k;
}

static const char *jstr(json_t *o, const char *k)
{
        const char *s = json_string_value(json_object_get(o, k));
        return s ? s : "";
}

static json_int_t jint(json_t *o, const char *k)
{
        return json_integer_value(json_object_get(o, k));
}

/* Nano-dollars as dollars with 9 decimals, exactly (common/money.c): "$17.083333333". */
static void dollars(char *out, size_t size, json_int_t nd)
{
        char amount[32];
        money_format(amount, sizeof(amount), (int64_t)nd, 9);
        bool neg = amount[0] == '-';
        snprintf(out, size, "%s$%s", neg ? "-" : "", amount + neg);
}

/* The message: headers and a plain-text body with the event's facts. Lines
 * end in CRLF; no line starts with a dot. malloc'd into *ret. */
static int mail_compose(const struct send_config *cfg, const char *to, const char *event_id, const char *body,
                        char **ret)
{
        json_t *ev = json_loads(body, 0, NULL);
        if (!ev)
                return -EINVAL;
        char spend[48], lim[48], date[64], what[256];
        dollars(spend, sizeof(spend), jint(ev, "spend_nanodollars"));
        dollars(lim, sizeof(lim), jint(ev, "limit_nanodollars"));
        const char *type = jstr(ev, "type");
        if (strcmp(type, "spend.threshold_reached") == 0)
                snprintf(what, sizeof(what), "API key %s reached %lld%% of its daily spend limit", jstr(ev, "key"),
                         (long long)jint(ev, "threshold_pct"));
        else if (strcmp(type, "spend.limit_projected") == 0)
                snprintf(what, sizeof(what), "API key %s is on course to reach its daily spend limit by %s",
                         jstr(ev, "key"), jstr(ev, "projected_at"));
        else
                snprintf(what, sizeof(what), "A test event for this alert destination");
        time_t now = time(NULL);
        struct tm tm;
        gmtime_r(&now, &tm);
        strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S +0000", &tm);
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (!f) {
                json_decref(ev);
                return -ENOMEM;
        }
        fprintf(f,
                "From: %s\r\nTo: <%s>\r\nSubject: tally: %s\r\nDate: %s\r\nMessage-ID: <%s@tally>\r\n"
                "X-Tally-Event-Id: %s\r\nMIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n",
                cfg->smtp_from, to, what, date, event_id, event_id);
        fprintf(f,
                "%s.\r\n\r\nAccount: %s\r\nAPI key: %s\r\nDay (UTC): %s\r\nSpend today: %s\r\nDaily limit: %s\r\n"
                "Time: %s\r\nEvent: %s (%s)\r\n\r\nDashboard: %s\r\n",
                what, jstr(ev, "account"), jstr(ev, "key"), jstr(ev, "day"), spend, lim, jstr(ev, "time"), event_id,
                type, cfg->dashboard_url);
        json_decref(ev);
        if (fclose(f) != 0) {
                free(text);
                return -ENOMEM;
        }
        *ret = text;
        return 0;
}

int send_job_email(struct send_job *j, const struct send_config *cfg, const char *to, const char *event_id,
                   const char *body)
{
        memset(j, 0, sizeof(*j));
        j->kind = SEND_EMAIL;
        if (!cfg->smtp_url || !cfg->smtp_url[0]) {
                snprintf(j->err, sizeof(j->err), "no smtp_url configured");
                return j->result = -ENOTCONN;
        }
        if (strpbrk(to, "\r\n<>")) {
                snprintf(j->err, sizeof(j->err), "not an email address");
                return j->result = -EINVAL;
        }
        if (mail_compose(cfg, to, event_id, body, &j->mail) < 0) {
                snprintf(j->err, sizeof(j->err), "could not compose the message");
                return j->result = -EINVAL;
        }
        j->len = strlen(j->mail);
        CURL *c = curl_easy_init();
        if (!c) {
                snprintf(j->err, sizeof(j->err), "could not start libcurl");
                return j->result = -ENOMEM;
        }
        char rcpt[320];
        snprintf(rcpt, sizeof(rcpt), "<%s>", to);
        j->list = curl_slist_append(NULL, rcpt);
        common_options(c, cfg, j->errbuf);
        curl_easy_setopt(c, CURLOPT_URL, cfg->smtp_url);
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "smtp,smtps");
        /* STARTTLS when the server offers it; smtps:// is TLS from the start. */
        curl_easy_setopt(c, CURLOPT_USE_SSL, (long)CURLUSESSL_TRY);
        if (cfg->smtp_username && cfg->smtp_username[0]) {
                curl_easy_setopt(c, CURLOPT_USERNAME, cfg->smtp_username);
                curl_easy_setopt(c, CURLOPT_PASSWORD, cfg->smtp_password ? cfg->smtp_password : "");
        }
        /* The envelope sender is the bare address of smtp_from ("Name <a@b>" or "a@b"). */
        char env_from[320];
        const char *lt = strchr(cfg->smtp_from, '<'), *gt = lt ? strchr(lt, '>') : NULL;
        if (lt && gt)
                snprintf(env_from, sizeof(env_from), "<%.*s>", (int)(gt - lt - 1), lt + 1);
        else
                snprintf(env_from, sizeof(env_from), "<%s>", cfg->smtp_from);
        curl_easy_setopt(c, CURLOPT_MAIL_FROM, env_from);
        curl_easy_setopt(c, CURLOPT_MAIL_RCPT, j->list);
        curl_easy_setopt(c, CURLOPT_READFUNCTION, mail_read);
        curl_easy_setopt(c, CURLOPT_READDATA, j);
        curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
        j->curl = c;
        return 0;
}

/* The outcome of a finished transfer into j->result and j->err. */
static void job_finish(struct send_job *j, CURLcode cr)
{
        if (cr != CURLE_OK) {
                snprintf(j->err, sizeof(j->err), "%s", j->errbuf[0] ? j->errbuf : curl_easy_strerror(cr));
                j->result = cr == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -EIO;
                return;
        }
        if (j->kind == SEND_WEBHOOK) {
                long status = 0;
                curl_easy_getinfo(j->curl, CURLINFO_RESPONSE_CODE, &status);
                if (status < 200 || status > 299) {
                        snprintf(j->err, sizeof(j->err), "HTTP %ld", status);
                        j->result = -EPROTO;
                        return;
                }
        }
        j->result = 0;
}

int send_jobs_run(struct send_job *jobs, size_t n)
{
        CURLM *m = curl_multi_init();
        if (!m)
                return -ENOMEM;
        int running = 0;
        for (size_t i = 0; i < n; i++)
                if (jobs[i].curl) {
                        curl_easy_setopt(jobs[i].curl, CURLOPT_PRIVATE, &jobs[i]);
                        if (curl_multi_add_handle(m, jobs[i].curl) != CURLM_OK) {
                                snprintf(jobs[i].err, sizeof(jobs[i].err), "could not start the transfer");
                                jobs[i].result = -ENOMEM;
                                curl_easy_cleanup(jobs[i].curl);
                                jobs[i].curl = NULL;
                        } else {
                                running++;
                        }
                }
        while (running > 0) {
                if (curl_multi_perform(m, &running) != CURLM_OK)
                        break;
                CURLMsg *msg;
                int left;
                while ((msg = curl_multi_info_read(m, &left)))
                        if (msg->msg == CURLMSG_DONE) {
                                struct send_job *j = NULL;
                                curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&j);
                                job_finish(j, msg->data.result);
                                j->done = true;
                        }
                if (running > 0 && curl_multi_poll(m, NULL, 0, 1000, NULL) != CURLM_OK)
                        break;
        }
        for (size_t i = 0; i < n; i++)
                if (jobs[i].curl) {
                        curl_multi_remove_handle(m, jobs[i].curl);
                        if (!jobs[i].done) {
                                snprintf(jobs[i].err, sizeof(jobs[i].err), "the transfer did not finish");
                                jobs[i].result = -EIO;
                        }
                }
        curl_multi_cleanup(m);
        return 0;
}

void send_job_free(struct send_job *j)
{
        if (!j)
                return;
        if (j->curl)
                curl_easy_cleanup(j->curl);
        curl_slist_free_all(j->list);
        free(j->mail);
        j->curl = NULL;
        j->list = NULL;
        j->mail = NULL;
}
