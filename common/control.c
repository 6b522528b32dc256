/* control.c — see control.h. */
#include "control.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const char *const action_names[CONTROL_ACTION_COUNT] = { "pause", "stop" };

const char *control_action_name(enum control_action a)
{
        return (unsigned)a < CONTROL_ACTION_COUNT ? action_names[a] : "?";
}

static bool reason_valid(const char *s)
{
        size_t n = 0;
        for (; s[n]; n++)
                if (!((s[n] >= 'a' && s[n] <= 'z') || s[n] == '_'))
                        return false;
        return n < 64;
}

int control_encode(const struct control_command *c, char *buf, size_t size)
{
        if ((unsigned)c->action >= CONTROL_ACTION_COUNT || !event_id_valid(c->account) ||
            (c->key[0] && !event_id_valid(c->key)) || (c->sandbox[0] && !event_id_valid(c->sandbox)) ||
            (!c->key[0] && !c->sandbox[0]) || !reason_valid(c->reason))
                return -EINVAL;
        int n = snprintf(buf, size,
                         "{\"v\":1,\"action\":\"%s\",\"account\":\"%s\",\"key\":\"%s\",\"sandbox\":\"%s\","
                         "\"reason\":\"%s\",\"issued_ns\":%" PRId64 "}",
                         action_names[c->action], c->account, c->key, c->sandbox, c->reason, c->issued_ns);
        return n < 0 || (size_t)n >= size ? -ENOBUFS : n;
}

static int refuse(char *why, size_t whylen, const char *msg)
{
        if (why && whylen)
                snprintf(why, whylen, "%s", msg);
        return -EINVAL;
}

static int str(json_t *o, const char *name, char *out, size_t size)
{
        json_t *v = json_object_get(o, name);
        if (!v)
                return 0;
        if (!json_is_string(v) || json_string_length(v) >= size)
                return -EINVAL;
        memcpy(out, json_string_value(v), json_string_length(v) + 1);
        return 0;
}

int control_decode(const void *buf, size_t len, struct control_command *ret, char *why, size_t whylen)
{
        json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, NULL);
        if (!o || !json_is_object(o)) {
                json_decref(o);
                return refuse(why, whylen, "invalid JSON object");
        }
        struct control_command c = { 0 };
        char action[16] = "";
        json_t *v = json_object_get(o, "v"), *issued = json_object_get(o, "issued_ns");
        int r = 0;
        if (!json_is_integer(v) || json_integer_value(v) != 1)
                r = refuse(why, whylen, "unknown version");
        else if (str(o, "action", action, sizeof(action)) || str(o, "account", c.account, sizeof(c.account)) ||
                 str(o, "key", c.key, sizeof(c.key)) || str(o, "sandbox", c.sandbox, sizeof(c.sandbox)) ||
                 str(o, "reason", c.reason, sizeof(c.reason)))
                r = refuse(why, whylen, "a field is not a string or too long");
        else if (strcmp(action, "pause") != 0 && strcmp(action, "stop") != 0)
                r = refuse(why, whylen, "unknown action");
        else if (!event_id_valid(c.account) || (c.key[0] && !event_id_valid(c.key)) ||
                 (c.sandbox[0] && !event_id_valid(c.sandbox)) || (!c.key[0] && !c.sandbox[0]))
                r = refuse(why, whylen, "account and a key or sandbox id are required");
        else if (!reason_valid(c.reason))
                r = refuse(why, whylen, "invalid reason");
        else if (issued && !json_is_integer(issued))
                r = refuse(why, whylen, "issued_ns is not an integer");
        c.issued_ns = issued && r == 0 ? (int64_t)json_integer_value(issued) : 0;
        json_decref(o);
        if (r < 0)
                return r;
        c.action = action[0] == 'p' ? CONTROL_PAUSE : CONTROL_STOP;
        *ret = c;
        return 0;
}
