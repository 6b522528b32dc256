/* static.h — the dashboard's files, served by tally-api (api/static.c). */
#pragma once

#include "server.h"

/* GET /: web/index.html */
int h_static_index(struct api_req *r, struct api_reply *out, struct api_error *err);
/* GET /static/{name}: one file of web/ or of its chart library */
int h_static_file(struct api_req *r, struct api_reply *out, struct api_error *err);
