/* send.h — how one alert event leaves tally: a signed webhook POST or an
 * email, through libcurl. Nothing here touches the database; the caller
 * records the outcome. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct curl_slist;

#define SIGNATURE_MAX 128 /* "t=<unix>,v1=<64 hex>" */

/* The Tally-Signature header value for body sent at unix time t:
 * "t=<t>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>" (docs/alerts.md).
 * Returns 0 or -EIO. */
int signature_make(const char *secret, int64_t t, const char *body, size_t len, char out[SIGNATURE_MAX]);

struct send_config {
        const char *allow_http;   /* hosts a webhook may reach over plain http, comma separated */
        int64_t timeout_ms;
        const char *ca_file;      /* extra CA bundle ("" for the system's) */
        const char *smtp_url;     /* smtp://host:port (STARTTLS when offered) or smtps:// */
        const char *smtp_from;
        const char *smtp_username;
        const char *smtp_password;
        const char *dashboard_url;
};

/* One attempt to send one event: prepared (send_job_webhook/_email), run
 * with others at once (send_jobs_run: libcurl's multi interface, so one slow
 * receiver does not hold up the rest), then read (result: 0 on a 2xx or a
 * message the relay accepted, else a negative errno with why in err) and
 * freed. A job whose preparation failed has result and err set already and
 * is skipped by the run. */
enum send_kind { SEND_WEBHOOK, SEND_EMAIL };
struct send_job {
        enum send_kind kind;
        void *curl;               /* CURL * */
        struct curl_slist *list;  /* headers or recipients */
        char *mail;               /* the message (email) */
        size_t len, off;
        bool done;
        int result;
        char errbuf[256];         /* CURL_ERROR_SIZE */
        char err[512];
};

/* Signs and prepares a POST of body (not copied: it must outlive the job)
 * with the event id and signature headers. Returns 0 or j->result. */
int send_job_webhook(struct send_job *j, const struct send_config *c, const char *url, const char *secret,
                     const char *event_id, const char *type, const char *body);
/* Prepares mailing the event (its JSON, body) as plain text to `to`. */
int send_job_email(struct send_job *j, const struct send_config *c, const char *to, const char *event_id,
                   const char *body);
/* Runs the prepared jobs at once, each within the configured timeout. */
int send_jobs_run(struct send_job *jobs, size_t n);
void send_job_free(struct send_job *j);

/* Whether url may be used as a webhook: https, or http to a host in allow_http.
 * Fills why when not. */
bool webhook_url_allowed(const char *allow_http, const char *url, char *why, size_t whylen);
