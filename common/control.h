/* control.h — the control topic's message: a command to the hosts' vmm daemons.
 *
 * The aggregator publishes one when a key reaches its daily spend limit; every
 * tally-vmm reads the whole topic (a consumer group of its own per host) and
 * carries out the command for the key's sandboxes it runs, within a second.
 * Messages are keyed by account id. Commands are idempotent: pausing a paused
 * sandbox or stopping a stopped one changes nothing. */
#pragma once

#include "event.h"

#include <stddef.h>
#include <stdint.h>

enum control_action { CONTROL_PAUSE, CONTROL_STOP, CONTROL_ACTION_COUNT };

struct control_command {
        enum control_action action;
        char account[EVENT_ID_MAX + 1];
        char key[EVENT_ID_MAX + 1];      /* every sandbox this key created... */
        char sandbox[EVENT_ID_MAX + 1];  /* ...or, if set, just this one */
        char reason[64];                 /* e.g. "daily_limit"; [a-z_]{0,63} */
        int64_t issued_ns;               /* wall clock when the command was decided */
};

const char *control_action_name(enum control_action a);

/* Encodes as one JSON object. Returns the length or -ENOBUFS / -EINVAL. */
int control_encode(const struct control_command *c, char *buf, size_t size);

/* Decodes and validates; -EINVAL with the reason in why. */
int control_decode(const void *buf, size_t len, struct control_command *ret, char *why, size_t whylen);
