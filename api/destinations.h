/* destinations.h — where a person's account sends its spend alerts
 * (api/destinations.c, docs/alerts.md), and the alert outbox's gauges in
 * tally-api's /metrics. */
#pragma once

#include "server.h"

#include <libpq-fe.h>
#include <stdio.h>

/* GET /v1/alert-destinations */
int h_destinations_list(struct api_req *r, struct api_reply *out, struct api_error *err);
/* POST /v1/alert-destinations */
int h_destinations_create(struct api_req *r, struct api_reply *out, struct api_error *err);
/* DELETE /v1/alert-destinations/{id} */
int h_destination_disable(struct api_req *r, struct api_reply *out, struct api_error *err);
/* POST /v1/alert-destinations/{id}/test */
int h_destination_test(struct api_req *r, struct api_reply *out, struct api_error *err);
/* GET /v1/alert-deliveries[?destination=&limit=&cursor=] */
int h_deliveries_list(struct api_req *r, struct api_reply *out, struct api_error *err);
/* POST /v1/alert-deliveries/{id}/resend */
int h_delivery_resend(struct api_req *r, struct api_reply *out, struct api_error *err);

/* The outbox gauges: read from the database (at start, then by the janitor
 * once a minute) and written into /metrics' text. refresh returns 0 or a
 * negative errno (logged). */
int alert_metrics_refresh(PGconn *db);
void alert_metrics_write(FILE *f);
