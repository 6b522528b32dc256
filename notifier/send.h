/* send.h — how one alert event leaves tally: a signed webhook POST or an
 * email, through libcurl. Nothing here touches the database; the caller
 * records the outcome. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

/* POSTs body to url with the event id and signature headers. Returns 0 on a
 * 2xx; otherwise a negative errno with why (HTTP status, curl's error) in err. */
int send_webhook(const struct send_config *c, const char *url, const char *secret, const char *event_id,
                 const char *type, const char *body, char *err, size_t errlen);

/* Mails the event (its JSON, body) as plain text to `to`. Returns 0 or a
 * negative errno with why in err. */
int send_email(const struct send_config *c, const char *to, const char *event_id, const char *body, char *err,
               size_t errlen);

/* Whether url may be used as a webhook: https, or http to a host in allow_http.
 * Fills why when not. */
bool webhook_url_allowed(const char *allow_http, const char *url, char *why, size_t whylen);
