/* api_exec.c — POST /v1/sandboxes/ID/exec of tally-vmm's local API: the
 * command runs (vmm_exec), then its answer is made while it is sent. See
 * api_exec.h. */
#include "api_exec.h"
#include "api.h"
#include "api_reply.h"
#include "log.h"
#include "utf8.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXEC_TIMEOUT_MAX_MS (24LL * 3600 * 1000)
#define STREAM_BLOCK      (16 * 1024)   /* bytes of an exec answer made at a time */

enum part_kind { PART_TEXT, PART_JSON, PART_BASE64 };

struct part {
        enum part_kind kind;
        const unsigned char *data;       /* PART_TEXT: into stream->text; else the command's output */
        size_t len;
};

/* One exec answer being sent: the command's output (held once, as the
 * backend read it) and where the writer is. */
struct exec_stream {
        struct exec_budget *budget;
        long long reserved;              /* bytes counted in budget->held */
        struct exec_result res;
        char text[4][256];               /* the JSON around the two outputs */
        struct part parts[6];            /* head, 2 x (lead, output), tail */
        int nparts, at_part;
        size_t at;                       /* bytes of the current part done */
};

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Writes what fits of part p from offset *at into out (room bytes); returns bytes written. */
static size_t write_part(const struct part *p, size_t *at, char *out, size_t room)
{
        size_t w = 0;
        if (p->kind == PART_TEXT) {
                size_t n = p->len - *at < room ? p->len - *at : room;
                memcpy(out, p->data + *at, n);
                *at += n;
                return n;
        }
        if (p->kind == PART_BASE64) {
                while (*at < p->len && room - w >= 4) {
                        const unsigned char *s = p->data + *at;
                        size_t n = p->len - *at < 3 ? p->len - *at : 3;
                        uint32_t v = (uint32_t)s[0] << 16 | (n > 1 ? (uint32_t)s[1] << 8 : 0) | (n > 2 ? s[2] : 0);
                        out[w++] = b64[v >> 18 & 63];
                        out[w++] = b64[v >> 12 & 63];
                        out[w++] = n > 1 ? b64[v >> 6 & 63] : '=';
                        out[w++] = n > 2 ? b64[v & 63] : '=';
                        *at += n;
                }
                return w;
        }
        while (*at < p->len && room - w >= 6) {
                unsigned char c = p->data[(*at)++];
                switch (c) {
                case '"': out[w++] = '\\'; out[w++] = '"'; break;
                case '\\': out[w++] = '\\'; out[w++] = '\\'; break;
                case '\n': out[w++] = '\\'; out[w++] = 'n'; break;
                case '\r': out[w++] = '\\'; out[w++] = 'r'; break;
                case '\t': out[w++] = '\\'; out[w++] = 't'; break;
                default:
                        if (c < 0x20 || c == 0x7f) {
                                static const char hex[] = "0123456789abcdef";
                                memcpy(out + w, "\\u00", 4);
                                out[w + 4] = hex[c >> 4];
                                out[w + 5] = hex[c & 15];
                                w += 6;
                        } else {
                                out[w++] = (char)c;
                        }
                }
        }
        return w;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
        struct exec_stream *st = cls;
        size_t w = 0;
        (void)pos;
        while (st->at_part < st->nparts && w < max) {
                const struct part *p = &st->parts[st->at_part];
                size_t n = write_part(p, &st->at, buf + w, max - w);
                w += n;
                if (st->at == p->len) {
                        st->at_part++;
                        st->at = 0;
                } else if (n == 0) {
                        break; /* too little room left for one escaped byte: the next call */
                }
        }
        if (w == 0 && st->at_part == st->nparts)
                return MHD_CONTENT_READER_END_OF_STREAM;
        return (ssize_t)w;
}

static void stream_free(void *cls)
{
        struct exec_stream *st = cls;
        atomic_fetch_sub(&st->budget->held, st->reserved);
        exec_result_clear(&st->res);
        free(st);
}

/* Adds the parts for one output: "name":"escaped" when it is UTF-8, else
 * "name":null,"name_base64":"...". lead goes before it (a comma, or the head). */
static void add_output(struct exec_stream *st, int text, const char *lead, const char *name, const char *buf,
                       size_t len)
{
        bool utf8 = utf8_valid(buf, len);
        int n = snprintf(st->text[text], sizeof(st->text[text]), utf8 ? "%s\"%s\":\"" : "%s\"%s\":null,\"%s_base64\":\"",
                         lead, name, name);
        st->parts[st->nparts++] = (struct part){ PART_TEXT, (const unsigned char *)st->text[text], (size_t)n };
        st->parts[st->nparts++] = (struct part){ utf8 ? PART_JSON : PART_BASE64, (const unsigned char *)buf, len };
}

enum MHD_Result vmm_api_exec(struct MHD_Connection *c, struct vmm *v, struct exec_budget *budget, const char *id,
                             json_t *body)
{
        char why[512] = "";
        const struct vmm_settings *s = vmm_get_settings(v);
        char **argv = NULL;
        int64_t timeout_ms, cap;
        long long reserved = 0;
        int r;
        if (!json_is_object(body)) {
                r = -EINVAL;
                snprintf(why, sizeof(why), "the request body must be a JSON object");
                goto out;
        }
        json_t *in = json_object_get(body, "stdin");
        if ((r = command_parse(json_object_get(body, "command"), "command", &argv, why, sizeof(why))) < 0 ||
            (r = vmm_body_opt_int(body, "timeout_ms", 1, EXEC_TIMEOUT_MAX_MS, s->exec_timeout_default_ms, &timeout_ms,
                             why, sizeof(why))) < 0 ||
            (r = vmm_body_opt_int(body, "output_cap", 0, VMM_EXEC_OUTPUT_CAP_MAX,
                             s->exec_output_cap_default < VMM_EXEC_OUTPUT_CAP_MAX ? s->exec_output_cap_default
                                                                                  : VMM_EXEC_OUTPUT_CAP_MAX,
                             &cap, why, sizeof(why))) < 0)
                goto out;
        if (in && !json_is_string(in)) {
                r = -EINVAL;
                snprintf(why, sizeof(why), "stdin must be a string");
                goto out;
        }
        /* Both outputs at their cap, counted before the command runs. */
        reserved = 2 * (long long)cap;
        if (atomic_fetch_add(&budget->held, reserved) + reserved > budget->max) {
                r = -EAGAIN;
                snprintf(why, sizeof(why), "tally-vmm already holds %lld bytes of commands' output (at most %lld): "
                         "try again, or ask for a smaller output_cap", (long long)atomic_load(&budget->held) - reserved,
                         (long long)budget->max);
                goto out;
        }
        /* The connection stays open while the command runs (plus the kill's grace). */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)(timeout_ms / 1000 + 60));
        struct exec_request req = { argv, in ? json_string_value(in) : NULL, in ? json_string_length(in) : 0,
                                    timeout_ms * 1000000, (size_t)cap, NULL };
        struct exec_result res = { 0 };
        if ((r = vmm_exec(v, id, &req, &res, why, sizeof(why))) < 0)
                goto out;
        command_free(argv);
        struct exec_stream *st = calloc(1, sizeof(*st));
        if (!st) {
                exec_result_clear(&res);
                atomic_fetch_sub(&budget->held, reserved);
                return MHD_NO;
        }
        st->budget = budget;
        st->reserved = reserved;
        st->res = res;
        int n = snprintf(st->text[0], sizeof(st->text[0]),
                         "{\"exit_code\":%d,\"timed_out\":%s,\"stdout_truncated\":%s,\"stderr_truncated\":%s",
                         res.exit_code, res.timed_out ? "true" : "false", res.out_truncated ? "true" : "false",
                         res.err_truncated ? "true" : "false");
        st->parts[st->nparts++] = (struct part){ PART_TEXT, (const unsigned char *)st->text[0], (size_t)n };
        add_output(st, 1, ",", "stdout", st->res.out ? st->res.out : "", st->res.out_len);
        add_output(st, 2, "\",", "stderr", st->res.err ? st->res.err : "", st->res.err_len);
        st->parts[st->nparts++] = (struct part){ PART_TEXT, (const unsigned char *)"\"}", 2 };
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK, stream_read,
                                                                      st, stream_free);
        if (!resp) {
                stream_free(st);
                return MHD_NO;
        }
        MHD_add_response_header(resp, "Content-Type", "application/json");
        MHD_add_response_header(resp, "Connection", "close");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return ret;
out:
        if (reserved)
                atomic_fetch_sub(&budget->held, reserved);
        command_free(argv);
        return vmm_reply_result(c, r, why, NULL, 200);
}
