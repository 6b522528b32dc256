/* test_agent.c — the guest agent as a real process on the host, talking over
 * a pseudo-terminal as it talks over the VM's serial port: the protocol's
 * edges a booted VM makes slow to reach (garbage before a frame, malformed and
 * unknown frames, ping, binary output with NULs) checked against the framing
 * protocol.h defines, without QEMU. */
#include "protocol.h"
#include "support.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

static int master = -1;

static void send_raw(const void *p, size_t len)
{
        const char *c = p;
        while (len > 0) {
                ssize_t n = write(master, c, len);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0) {
                        fprintf(stderr, "FAIL: could not write to the agent: %s\n", strerror(errno));
                        exit(1);
                }
                c += n;
                len -= (size_t)n;
        }
}

static void send_frame(int type, const void *payload, uint32_t len)
{
        unsigned char h[AGENT_HEADER_LEN] = { AGENT_MAGIC0, AGENT_MAGIC1, (unsigned char)type };
        agent_put_u32(h + 3, len);
        send_raw(h, sizeof(h));
        if (len)
                send_raw(payload, len);
}

/* Reads exactly len bytes within 10 s, or fails the test. */
static void recv_exact(void *buf, size_t len)
{
        char *p = buf;
        while (len > 0) {
                struct pollfd pf = { master, POLLIN, 0 };
                if (poll(&pf, 1, 10000) <= 0) {
                        fprintf(stderr, "FAIL: the agent did not answer within 10 s\n");
                        exit(1);
                }
                ssize_t n = read(master, p, len);
                if (n < 0 && (errno == EINTR || errno == EAGAIN))
                        continue;
                if (n <= 0) {
                        fprintf(stderr, "FAIL: the agent's terminal closed: %s\n", strerror(errno));
                        exit(1);
                }
                p += n;
                len -= (size_t)n;
        }
}

/* The next frame; its payload is malloc'd and NUL-terminated. */
static int recv_frame(unsigned char **payload, uint32_t *len)
{
        unsigned char h[AGENT_HEADER_LEN];
        recv_exact(h, sizeof(h));
        CHECK(h[0] == AGENT_MAGIC0 && h[1] == AGENT_MAGIC1, "a frame without the magic: %02x %02x", h[0], h[1]);
        *len = agent_get_u32(h + 3);
        *payload = malloc(*len + 1);
        recv_exact(*payload, *len);
        (*payload)[*len] = 0;
        return h[2];
}

/* Builds an EXEC payload (malloc'd) for argv with stdin. */
static unsigned char *exec_payload(uint32_t timeout_ms, uint32_t cap, const char *const *argv, const char *in,
                                   uint32_t *ret_len)
{
        uint32_t argc = 0, len = 16, in_len = in ? (uint32_t)strlen(in) : 0;
        for (; argv[argc]; argc++)
                len += (uint32_t)strlen(argv[argc]) + 1;
        len += in_len;
        unsigned char *p = malloc(len), *q = p + 16;
        agent_put_u32(p, timeout_ms);
        agent_put_u32(p + 4, cap);
        agent_put_u32(p + 8, argc);
        agent_put_u32(p + 12, in_len);
        for (uint32_t i = 0; i < argc; i++) {
                size_t l = strlen(argv[i]) + 1;
                memcpy(q, argv[i], l);
                q += l;
        }
        if (in_len)
                memcpy(q, in, in_len);
        *ret_len = len;
        return p;
}

struct outcome {
        int code;
        bool timed_out, out_trunc, err_trunc, error;
        char out[8192], err[8192];
        size_t out_len, err_len;
        char error_text[256];
};

static void collect(struct outcome *o)
{
        memset(o, 0, sizeof(*o));
        for (;;) {
                unsigned char *p;
                uint32_t len;
                int type = recv_frame(&p, &len);
                if (type == AGENT_STDOUT && o->out_len + len < sizeof(o->out)) {
                        memcpy(o->out + o->out_len, p, len);
                        o->out_len += len;
                } else if (type == AGENT_STDERR && o->err_len + len < sizeof(o->err)) {
                        memcpy(o->err + o->err_len, p, len);
                        o->err_len += len;
                } else if (type == AGENT_DONE) {
                        CHECK(len == 7, "DONE payload of %u bytes", len);
                        o->code = (int)agent_get_u32(p);
                        o->timed_out = p[4], o->out_trunc = p[5], o->err_trunc = p[6];
                        free(p);
                        return;
                } else if (type == AGENT_ERROR) {
                        o->error = true;
                        snprintf(o->error_text, sizeof(o->error_text), "%s", (char *)p);
                        free(p);
                        return;
                } else {
                        CHECK(false, "unexpected frame type %c during a command", type);
                }
                free(p);
        }
}

static void run(const char *const *argv, const char *in, uint32_t timeout_ms, uint32_t cap, struct outcome *o)
{
        uint32_t len;
        unsigned char *p = exec_payload(timeout_ms, cap, argv, in, &len);
        send_frame(AGENT_EXEC, p, len);
        free(p);
        collect(o);
}

int main(void)
{
        const char *agent = test_env("TALLY_GUEST_AGENT_BIN");
        master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0) {
                fprintf(stderr, "FAIL: no pseudo-terminal: %s\n", strerror(errno));
                return 1;
        }
        struct termios t;
        tcgetattr(master, &t);
        cfmakeraw(&t);
        tcsetattr(master, TCSANOW, &t);
        char *slave = ptsname(master);
        char *const argv[] = { (char *)agent, slave, NULL };
        pid_t pid = test_spawn(argv, NULL, NULL);
        CHECK(pid > 0, "could not start %s", agent);

        unsigned char *p;
        uint32_t len;
        int type = recv_frame(&p, &len);
        CHECK(type == AGENT_READY && strcmp((char *)p, AGENT_VERSION) == 0, "first frame %c '%s'", type, (char *)p);
        free(p);

        /* Garbage before a frame is skipped, including a lone first magic byte. */
        send_raw("xxTzT", 5);
        send_frame(AGENT_PING, NULL, 0);
        type = recv_frame(&p, &len);
        CHECK(type == AGENT_READY, "ping after garbage answered with %c", type);
        free(p);

        struct outcome o;
        const char *echo[] = { "sh", "-c", "printf 'a\\000b'; echo err >&2; exit 7", NULL };
        run(echo, NULL, 10000, 4096, &o);
        CHECK(!o.error && o.code == 7, "exit code %d (error: %s)", o.code, o.error_text);
        CHECK(o.out_len == 3 && memcmp(o.out, "a\0b", 3) == 0, "binary stdout came back as %zu bytes", o.out_len);
        CHECK(o.err_len == 4 && memcmp(o.err, "err\n", 4) == 0, "stderr '%.*s'", (int)o.err_len, o.err);

        const char *cat[] = { "cat", NULL };
        run(cat, "stdin text", 10000, 4, &o);
        CHECK(o.code == 0 && o.out_len == 4 && memcmp(o.out, "stdi", 4) == 0 && o.out_trunc,
              "cap 4 of stdin echo: %zu bytes, truncated %d", o.out_len, o.out_trunc);

        const char *sleeper[] = { "sleep", "30", NULL };
        run(sleeper, NULL, 300, 4096, &o);
        CHECK(o.timed_out && o.code == 128 + SIGKILL, "timeout: timed_out %d code %d", o.timed_out, o.code);

        const char *missing[] = { "/no/such/program", NULL };
        run(missing, NULL, 10000, 4096, &o);
        CHECK(o.code == 127 && strstr(o.err, "could not run"), "missing program: code %d, stderr '%s'", o.code, o.err);

        /* Malformed requests get an ERROR frame and the agent carries on. */
        unsigned char shortp[4] = { 0 };
        send_frame(AGENT_EXEC, shortp, sizeof(shortp));
        collect(&o);
        CHECK(o.error, "a too-short request was not refused");
        uint32_t blen;
        unsigned char *bad = exec_payload(0, 10, echo, NULL, &blen);
        bad[blen - 1] = 'x'; /* the last argument loses its NUL */
        send_frame(AGENT_EXEC, bad, blen);
        free(bad);
        collect(&o);
        CHECK(o.error && strstr(o.error_text, "not terminated"), "unterminated argument: '%s'", o.error_text);
        send_frame('?', "zz", 2);
        collect(&o);
        CHECK(o.error && strstr(o.error_text, "unknown"), "unknown frame type: '%s'", o.error_text);

        const char *ok[] = { "echo", "still here", NULL };
        run(ok, NULL, 10000, 4096, &o);
        CHECK(o.code == 0 && strcmp(o.out, "still here\n") == 0, "after the bad frames: '%s'", o.out);

        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(master);
        return test_result();
}
