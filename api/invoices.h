/* invoices.h — tally-api's invoice routes (api/invoices.c): a person's view of
 * the account's monthly invoices, closed and previews, JSON or CSV. */
#pragma once

#include "server.h"

/* GET /v1/invoices */
int h_invoices_list(struct api_req *r, struct api_reply *out, struct api_error *err);
/* GET /v1/invoices/current */
int h_invoice_current(struct api_req *r, struct api_reply *out, struct api_error *err);
/* GET /v1/invoices/{YYYY-MM} */
int h_invoice_get(struct api_req *r, struct api_reply *out, struct api_error *err);
