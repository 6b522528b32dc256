/* api_create.c — see api_create.h. */
#include "api_create.h"
#include "api_reply.h"
#include "log.h"
#include "spec.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

void create_calls_init(struct create_calls *cc)
{
        memset(cc, 0, sizeof(*cc));
        pthread_mutex_init(&cc->lock, NULL);
}

void create_calls_destroy(struct create_calls *cc)
{
        pthread_mutex_destroy(&cc->lock);
}

bool vmm_api_caller_gone(struct MHD_Connection *c)
{
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci)
                return false;
        /* (the request is read whole before it is answered: what could be
         * left to read is the hang-up, or over TLS its close alert) */
        struct pollfd p = { .fd = ci->connect_fd, .events = POLLRDHUP };
        return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/* The slot of request_id (lock held), NULL when none. */
static struct create_call *find_locked(struct create_calls *cc, const char *request_id)
{
        for (unsigned i = 0; i < CREATE_CALLS_KEPT; i++)
                if (strcmp(cc->ring[i].request_id, request_id) == 0)
                        return &cc->ring[i];
        return NULL;
}

/* A new slot for request_id (lock held): the oldest goes. */
static struct create_call *take_locked(struct create_calls *cc, const char *request_id)
{
        struct create_call *s = &cc->ring[cc->next];
        cc->next = (cc->next + 1) % CREATE_CALLS_KEPT;
        *s = (struct create_call){ .cancelled = false };
        snprintf(s->request_id, sizeof(s->request_id), "%s", request_id);
        return s;
}

/* body's "request_id", taken out of it: 0 and *out ("" when absent), or -EINVAL. */
static int take_request_id(json_t *body, char *out, char *why, size_t whylen)
{
        json_t *v = json_object_get(body, "request_id");
        *out = '\0';
        if (!v)
                return 0;
        if (!json_is_string(v) || !event_id_valid(json_string_value(v))) {
                snprintf(why, whylen, "request_id must be 1 to %d characters of A-Z a-z 0-9 _ . : -", REQUEST_ID_MAX);
                return -EINVAL;
        }
        snprintf(out, REQUEST_ID_MAX + 1, "%s", json_string_value(v));
        json_object_del(body, "request_id");
        return 0;
}

/* Stops sandbox id, made for a caller that is gone (or cancelled it). */
static void stop_unwanted(struct vmm *v, const char *id, const char *request_id, const char *why_stopped)
{
        char why[256] = "";
        int r = vmm_stop(v, id, "request", why, sizeof(why));
        log_warn("a create nobody waits for: its sandbox is stopped", "sandbox=%s request_id=%s because=\"%s\" r=%d",
                 id, *request_id ? request_id : "-", why_stopped, r);
}

enum MHD_Result vmm_api_create(struct MHD_Connection *c, struct vmm *v, struct create_calls *cc, json_t *body)
{
        char why[512] = "", rid[REQUEST_ID_MAX + 1];
        struct create_request req;
        int r;
        if (json_is_object(body) && (r = take_request_id(body, rid, why, sizeof(why))) < 0)
                return vmm_reply_result(c, r, why, NULL, 201);
        if (!json_is_object(body))
                *rid = '\0';
        if ((r = create_request_parse(body, vmm_get_limits(v), &req, why, sizeof(why))) < 0)
                return vmm_reply_result(c, r, why, NULL, 201);
        bool cancelled = false;
        if (*rid) {
                pthread_mutex_lock(&cc->lock);
                struct create_call *s = find_locked(cc, rid);
                if (s && (s->cancelled || *s->sandbox))
                        cancelled = true; /* cancelled, or this very create was made already */
                else if (!s)
                        take_locked(cc, rid);
                pthread_mutex_unlock(&cc->lock);
        }
        if (cancelled || vmm_api_caller_gone(c)) {
                create_request_clear(&req);
                log_info("a create nobody waits for is not made", "request_id=%s because=\"%s\"", *rid ? rid : "-",
                         cancelled ? "cancelled, or made already" : "its caller hung up");
                return vmm_reply_error(c, 409, cancelled ? "this create was cancelled, or made already"
                                                         : "the caller hung up: nothing was made");
        }
        json_t *out = NULL;
        r = vmm_create(v, &req, &out, why, sizeof(why));
        create_request_clear(&req);
        if (r < 0)
                return vmm_reply_result(c, r, why, out, 201);
        const char *id = json_string_value(json_object_get(out, "id"));
        cancelled = false;
        if (*rid && id) {
                pthread_mutex_lock(&cc->lock);
                struct create_call *s = find_locked(cc, rid);
                if (!s)
                        s = take_locked(cc, rid); /* pushed out by 4,096 others meanwhile */
                cancelled = s->cancelled;
                snprintf(s->sandbox, sizeof(s->sandbox), "%s", id);
                pthread_mutex_unlock(&cc->lock);
        }
        bool gone = !cancelled && vmm_api_caller_gone(c);
        if (id && (cancelled || gone)) {
                stop_unwanted(v, id, rid, cancelled ? "cancelled while it was made" : "its caller hung up");
                json_decref(out);
                return vmm_reply_error(c, 409, "the create was given up by its caller: its sandbox was stopped");
        }
        return vmm_reply_json(c, 201, out);
}

enum MHD_Result vmm_api_create_cancel(struct MHD_Connection *c, struct vmm *v, struct create_calls *cc,
                                      json_t *body)
{
        char why[256] = "", rid[REQUEST_ID_MAX + 1], made[EVENT_ID_MAX + 1] = "";
        int r;
        if (!json_is_object(body) || !json_object_get(body, "request_id")) {
                snprintf(why, sizeof(why), "request_id is required");
                return vmm_reply_result(c, -EINVAL, why, NULL, 200);
        }
        if ((r = take_request_id(body, rid, why, sizeof(why))) < 0)
                return vmm_reply_result(c, r, why, NULL, 200);
        pthread_mutex_lock(&cc->lock);
        struct create_call *s = find_locked(cc, rid);
        if (!s)
                s = take_locked(cc, rid); /* the create has not come (yet): refused when it does */
        if (!s->cancelled)
                snprintf(made, sizeof(made), "%s", s->sandbox);
        s->cancelled = true;
        pthread_mutex_unlock(&cc->lock);
        if (*made)
                stop_unwanted(v, made, rid, "cancelled by its caller");
        return vmm_reply_json(c, 200, json_pack("{s:s, s:o}", "request_id", rid, "stopped",
                                                *made ? json_string(made) : json_null()));
}
