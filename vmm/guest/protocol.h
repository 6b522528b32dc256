/* protocol.h — the frames the host (vmm/qemu/agent_chan.c) and the guest agent
 * (vmm/guest/agent.c) exchange over the VM's second serial port.
 *
 * Every frame is
 *   'T' 'L' type:u8 length:u32-big-endian payload[length]
 * The two magic bytes let a reader skip anything that is not a frame (a
 * reader resynchronises on them). Host to guest:
 *   AGENT_EXEC   u32 timeout_ms (0: none), u32 output_cap, u32 argc,
 *                u32 stdin_len, argc NUL-terminated strings, stdin bytes
 *   AGENT_PING   empty; the agent answers AGENT_READY (a host that reattached
 *                after a restart learns the agent is there and idle)
 * Guest to host:
 *   AGENT_READY  text: the agent's name and protocol version; sent at start
 *                and in answer to AGENT_PING
 *   AGENT_STDOUT / AGENT_STDERR  a chunk of the command's output (at most
 *                output_cap bytes of each stream are sent in all)
 *   AGENT_DONE   i32 exit code (128 + signal if one ended it), u8 timed_out,
 *                u8 stdout truncated, u8 stderr truncated
 *   AGENT_ERROR  text: the request could not be carried out at all
 * One command runs at a time; its frames end with AGENT_DONE or AGENT_ERROR.
 * Shared by a static guest binary and the host library: no dependencies. */
#pragma once

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define AGENT_MAGIC0 'T'
#define AGENT_MAGIC1 'L'
#define AGENT_HEADER_LEN 7
#define AGENT_PAYLOAD_MAX (16u << 20)
#define AGENT_CHUNK_MAX 4096

enum agent_frame_type {
        AGENT_EXEC = 'x',
        AGENT_PING = 'p',
        AGENT_READY = 'r',
        AGENT_STDOUT = 'o',
        AGENT_STDERR = 'e',
        AGENT_DONE = 'd',
        AGENT_ERROR = 'f',
};

#define AGENT_VERSION "tally-agent 1"

static inline void agent_put_u32(unsigned char *p, uint32_t v)
{
        p[0] = (unsigned char)(v >> 24);
        p[1] = (unsigned char)(v >> 16);
        p[2] = (unsigned char)(v >> 8);
        p[3] = (unsigned char)v;
}

static inline uint32_t agent_get_u32(const unsigned char *p)
{
        return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* Reads one frame through read_exact (which reads exactly len bytes from ctx
 * into buf and returns 0, or a negative errno that is passed on), skipping
 * bytes before the magic. *ret_payload is malloc'd (the caller frees it) and
 * NUL-terminated past its *ret_len bytes. -EMSGSIZE: a length over
 * AGENT_PAYLOAD_MAX (the stream is then out of step). */
static inline int agent_read_frame(int (*read_exact)(void *ctx, void *buf, size_t len), void *ctx, int *ret_type,
                                   unsigned char **ret_payload, uint32_t *ret_len)
{
        unsigned char c, h[5];
        int r, state = 0;
        while (state < 2) {
                r = read_exact(ctx, &c, 1);
                if (r < 0)
                        return r;
                if (state == 0)
                        state = c == AGENT_MAGIC0;
                else
                        state = c == AGENT_MAGIC1 ? 2 : c == AGENT_MAGIC0;
        }
        r = read_exact(ctx, h, sizeof(h));
        if (r < 0)
                return r;
        uint32_t len = agent_get_u32(h + 1);
        if (len > AGENT_PAYLOAD_MAX)
                return -EMSGSIZE;
        unsigned char *p = malloc(len + 1);
        if (!p)
                return -ENOMEM;
        r = read_exact(ctx, p, len);
        if (r < 0) {
                free(p);
                return r;
        }
        p[len] = 0;
        *ret_type = h[0];
        *ret_payload = p;
        *ret_len = len;
        return 0;
}
