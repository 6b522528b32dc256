/* agent_chan.h — the host's end of the guest agent's channel: the VM's
 * second serial port, framed as vmm/guest/protocol.h says (magic, type,
 * length, payload). The agent says it is ready once the guest booted, then
 * runs one command at a time: the host sends AGENT_EXEC, the agent answers
 * with stdout and stderr frames and one AGENT_DONE (or AGENT_ERROR).
 *
 * struct agent_chan owns the socket from agent_chan_init to agent_chan_free.
 * A channel that lost sync (a write or read failed mid-command, or the agent
 * stopped answering) is marked broken and refuses every later command: a
 * frame boundary can no longer be trusted. Errors are negative errno; where
 * a why buffer is given the failure is explained there. */
#pragma once

#include "qemu.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct agent_chan {
        int fd;                      /* -1 until connected; owned */
        bool ready;                  /* the agent said it is ready */
        bool broken;                 /* lost sync: no more commands */
};

/* An unconnected channel; agent_chan_free undoes it. */
void agent_chan_init(struct agent_chan *a);
void agent_chan_free(struct agent_chan *a);

/* Asks the agent to say it is ready again (after a takeover, or in a copy
 * whose agent sits between commands): the next agent_chan_wait_ready takes
 * the answer. */
int agent_chan_ping(struct agent_chan *a);

/* Waits until the agent has said it is ready, at most timeout_ms. */
int agent_chan_wait_ready(struct agent_chan *a, int64_t timeout_ms, char *why, size_t whylen);

/* Runs req in the guest once the agent is ready (the caller waited). Fills
 * *ret (the caller frees it with qemu_exec_result_clear) and returns 0 when
 * the command ran, whatever its exit status. paused (atomic, read while
 * waiting) says the VM is paused: the guest's clock stands still, so the
 * wait for its answer starts again rather than end. */
int agent_chan_exec(struct agent_chan *a, const struct qemu_exec_request *req, const bool *paused,
                    struct qemu_exec_result *ret, char *why, size_t whylen);

/* Shuts the socket down (an exec in another thread sees the end of the
 * stream; agent_chan_free closes it). */
void agent_chan_shutdown(struct agent_chan *a);
