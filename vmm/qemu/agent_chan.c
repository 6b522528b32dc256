/* agent_chan.c — the guest agent's channel (see agent_chan.h). */
#include "agent_chan.h"
#include "protocol.h"
#include "sockio.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* How long a ping may take to be written. */
#define PING_TIMEOUT_MS 5000
/* How long past the command's own timeout the host waits for the agent's answer. */
#define EXEC_SLACK_MS 10000

void qemu_exec_result_clear(struct qemu_exec_result *r)
{
        if (!r)
                return;
        free(r->out);
        free(r->err);
        memset(r, 0, sizeof(*r));
}

void agent_chan_init(struct agent_chan *a)
{
        *a = (struct agent_chan){ .fd = -1 };
}

void agent_chan_free(struct agent_chan *a)
{
        if (a->fd >= 0)
                close(a->fd);
        a->fd = -1;
}

void agent_chan_shutdown(struct agent_chan *a)
{
        if (a->fd >= 0)
                shutdown(a->fd, SHUT_RDWR);
}

int agent_chan_ping(struct agent_chan *a)
{
        unsigned char h[AGENT_HEADER_LEN] = { AGENT_MAGIC0, AGENT_MAGIC1, AGENT_PING, 0, 0, 0, 0 };
        return qio_write_all(a->fd, h, sizeof(h), time_mono_ms() + PING_TIMEOUT_MS);
}

/* Where read_frame reads: the channel's socket, until a deadline. */
struct frame_source {
        int fd;
        int64_t deadline;
};

static int read_exact(void *ctx, void *buf, size_t len)
{
        const struct frame_source *src = ctx;
        return qio_read_all(src->fd, buf, len, src->deadline);
}

/* Reads the next frame (protocol.h), skipping bytes before the magic.
 * *ret_payload is malloc'd (NUL-terminated past its length). */
static int read_frame(struct agent_chan *a, int *ret_type, unsigned char **ret_payload, uint32_t *ret_len,
                      int64_t deadline)
{
        struct frame_source src = { a->fd, deadline };
        int r = agent_read_frame(read_exact, &src, ret_type, ret_payload, ret_len);
        return r == -EMSGSIZE ? -EPROTO : r;
}

int agent_chan_wait_ready(struct agent_chan *a, int64_t timeout_ms, char *why, size_t whylen)
{
        if (a->ready)
                return 0;
        if (a->fd < 0 || a->broken) {
                qio_set_why(why, whylen, "the VM is not running");
                return -ESRCH;
        }
        int64_t deadline = time_mono_ms() + timeout_ms;
        for (;;) {
                int type;
                unsigned char *p;
                uint32_t len;
                int r = read_frame(a, &type, &p, &len, deadline);
                if (r < 0) {
                        if (r == -ETIMEDOUT)
                                qio_set_why(why, whylen, "the guest did not boot within %lld ms", (long long)timeout_ms);
                        else
                                qio_set_why(why, whylen, "the guest's agent channel failed while booting: %s",
                                            strerror(-r));
                        return r;
                }
                free(p);
                if (type == AGENT_READY) {
                        a->ready = true;
                        return 0;
                }
        }
}

/* Appends len bytes to a capped buffer. */
static int append(char **buf, size_t *blen, bool *truncated, size_t cap, const unsigned char *p, size_t len)
{
        size_t keep = len;
        if (keep > cap - *blen)
                keep = cap - *blen;
        if (keep < len)
                *truncated = true;
        if (keep == 0)
                return 0;
        char *n = realloc(*buf, *blen + keep + 1);
        if (!n)
                return -ENOMEM;
        memcpy(n + *blen, p, keep);
        *blen += keep;
        n[*blen] = 0;
        *buf = n;
        return 0;
}

/* The AGENT_EXEC frame for req: header, timeout, cap, argc, stdin length,
 * the arguments NUL-terminated, stdin. *ret (malloc'd) is *ret_len bytes. */
static int encode_exec(const struct qemu_exec_request *req, uint32_t timeout_ms, size_t cap, unsigned char **ret,
                       size_t *ret_len, char *why, size_t whylen)
{
        size_t len = 16, argc = 0;
        for (; req->argv[argc]; argc++)
                len += strlen(req->argv[argc]) + 1;
        len += req->stdin_len;
        if (len > AGENT_PAYLOAD_MAX) {
                qio_set_why(why, whylen, "the command and its stdin exceed %u bytes", AGENT_PAYLOAD_MAX);
                return -E2BIG;
        }
        unsigned char *msg = malloc(AGENT_HEADER_LEN + len);
        if (!msg)
                return -ENOMEM;
        unsigned char *p = msg;
        *p++ = AGENT_MAGIC0;
        *p++ = AGENT_MAGIC1;
        *p++ = AGENT_EXEC;
        agent_put_u32(p, (uint32_t)len), p += 4;
        agent_put_u32(p, timeout_ms), p += 4;
        agent_put_u32(p, (uint32_t)cap), p += 4;
        agent_put_u32(p, (uint32_t)argc), p += 4;
        agent_put_u32(p, (uint32_t)req->stdin_len), p += 4;
        for (size_t i = 0; i < argc; i++) {
                size_t l = strlen(req->argv[i]) + 1;
                memcpy(p, req->argv[i], l);
                p += l;
        }
        if (req->stdin_len)
                memcpy(p, req->stdin_data, req->stdin_len);
        *ret = msg;
        *ret_len = AGENT_HEADER_LEN + len;
        return 0;
}

int agent_chan_exec(struct agent_chan *a, const struct qemu_exec_request *req, const bool *paused,
                    struct qemu_exec_result *ret, char *why, size_t whylen)
{
        uint64_t timeout_ms = req->timeout_ns > 0 ? ((uint64_t)req->timeout_ns + 999999) / 1000000 : 0;
        if (timeout_ms > UINT32_MAX)
                timeout_ms = UINT32_MAX;
        size_t cap = req->output_cap > AGENT_PAYLOAD_MAX ? AGENT_PAYLOAD_MAX : req->output_cap;
        unsigned char *msg;
        size_t msg_len;
        int r = encode_exec(req, (uint32_t)timeout_ms, cap, &msg, &msg_len, why, whylen);
        if (r < 0)
                return r;

        /* The agent enforces the timeout; the host only guards against a guest that stopped answering. */
        int64_t deadline = timeout_ms ? time_mono_ms() + (int64_t)timeout_ms + EXEC_SLACK_MS : -1;
        r = qio_write_all(a->fd, msg, msg_len, deadline);
        free(msg);
        if (r < 0) {
                a->broken = true;
                qio_set_why(why, whylen, "could not send the command to the guest: %s", strerror(-r));
                return r;
        }

        struct qemu_exec_result res = { 0 };
        for (;;) {
                int type;
                unsigned char *f;
                uint32_t flen;
                r = read_frame(a, &type, &f, &flen, deadline);
                if (r == -ETIMEDOUT && __atomic_load_n(paused, __ATOMIC_ACQUIRE)) {
                        /* Paused meanwhile: the guest's clock stands still too. */
                        deadline = time_mono_ms() + EXEC_SLACK_MS;
                        continue;
                }
                if (r < 0) {
                        a->broken = true;
                        qio_set_why(why, whylen, "the guest agent did not answer: %s", strerror(-r));
                        goto fail;
                }
                if (type == AGENT_STDOUT)
                        r = append(&res.out, &res.out_len, &res.out_truncated, cap, f, flen);
                else if (type == AGENT_STDERR)
                        r = append(&res.err, &res.err_len, &res.err_truncated, cap, f, flen);
                else if (type == AGENT_DONE && flen >= 7) {
                        res.exit_code = (int)agent_get_u32(f);
                        res.timed_out = f[4];
                        res.out_truncated |= f[5];
                        res.err_truncated |= f[6];
                        free(f);
                        break;
                } else if (type == AGENT_ERROR) {
                        qio_set_why(why, whylen, "the guest agent could not run the command: %s", (char *)f);
                        free(f);
                        r = -EIO;
                        goto fail;
                }
                free(f);
                if (r < 0)
                        goto fail;
        }
        if (!res.out && !(res.out = calloc(1, 1)))
                goto nomem;
        if (!res.err && !(res.err = calloc(1, 1)))
                goto nomem;
        *ret = res;
        return 0;
nomem:
        r = -ENOMEM;
fail:
        qemu_exec_result_clear(&res);
        return r;
}
