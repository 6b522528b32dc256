/* builtin.h — the routes tally-api answers from what it has at hand: its
 * health, the read side's handlers (api.h: usage, spend, alerts) put behind
 * HTTP, and the OpenAPI document. */
#pragma once

#include "server.h"

/* GET /healthz: 200 when the database answers, else 503. */
int h_healthz(struct api_req *r, struct api_reply *out, struct api_error *err);
/* GET /v1/usage (JSON, or CSV when Accept asks for text/csv) */
int h_usage(struct api_req *r, struct api_reply *out, struct api_error *err);
/* GET /v1/spend */
int h_spend(struct api_req *r, struct api_reply *out, struct api_error *err);
/* GET /v1/alerts */
int h_alerts(struct api_req *r, struct api_reply *out, struct api_error *err);
/* GET /v1/openapi.json */
int h_openapi(struct api_req *r, struct api_reply *out, struct api_error *err);
