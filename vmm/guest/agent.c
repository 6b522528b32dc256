/* agent.c — tally's guest agent: PID 1 of a qemu sandbox (started by the
 * initramfs's /init), it runs the commands the host sends over a serial port
 * and returns their exit code, stdout and stderr (framing: protocol.h).
 *
 * Linked statically: the initramfs holds nothing but busybox and this. It
 * must never exit (PID 1 exiting panics the guest, which ends the VM), so
 * every error is reported to the host and the loop goes on. */
#include "protocol.h"
#include "timeutil.h"

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
#include <time.h>
#include <unistd.h>

static int chan = -1;

static int write_all(int fd, const void *buf, size_t len)
{
        const char *p = buf;
        while (len > 0) {
                ssize_t n = write(fd, p, len);
                if (n < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                p += n;
                len -= (size_t)n;
        }
        return 0;
}

static int read_all(int fd, void *buf, size_t len)
{
        char *p = buf;
        while (len > 0) {
                ssize_t n = read(fd, p, len);
                if (n == 0)
                        return -EPIPE;
                if (n < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                p += n;
                len -= (size_t)n;
        }
        return 0;
}

static void send_frame(int type, const void *payload, size_t len)
{
        unsigned char h[AGENT_HEADER_LEN] = { AGENT_MAGIC0, AGENT_MAGIC1, (unsigned char)type };
        agent_put_u32(h + 3, (uint32_t)len);
        write_all(chan, h, sizeof(h));
        if (len > 0)
                write_all(chan, payload, len);
}

static void send_error(const char *what)
{
        send_frame(AGENT_ERROR, what, strlen(what));
}

static int read_chan(void *ctx, void *buf, size_t len)
{
        return read_all(chan, buf, len);
}

/* Reads the next frame (protocol.h); the payload is malloc'd in *ret_payload. */
static int read_frame(int *ret_type, unsigned char **ret_payload, uint32_t *ret_len)
{
        return agent_read_frame(read_chan, NULL, ret_type, ret_payload, ret_len);
}

struct stream {
        int fd;
        int type;
        uint32_t sent;
        bool truncated;
};

/* Reads what fd has; forwards up to cap bytes in all, drops the rest.
 * Returns false at end of file. */
static bool pump(struct stream *s, uint32_t cap)
{
        char buf[AGENT_CHUNK_MAX];
        ssize_t n = read(s->fd, buf, sizeof(buf));
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
                return true;
        if (n <= 0)
                return false;
        size_t keep = (size_t)n;
        if (keep > cap - s->sent)
                keep = cap - s->sent;
        if (keep < (size_t)n)
                s->truncated = true;
        if (keep > 0)
                send_frame(s->type, buf, keep);
        s->sent += (uint32_t)keep;
        return true;
}

static void run_command(const unsigned char *p, uint32_t len)
{
        if (len < 16) {
                send_error("exec request too short");
                return;
        }
        uint32_t timeout_ms = agent_get_u32(p), cap = agent_get_u32(p + 4);
        uint32_t argc = agent_get_u32(p + 8), in_len = agent_get_u32(p + 12);
        if (argc == 0 || argc > 4096 || in_len > len - 16) {
                send_error("exec request malformed");
                return;
        }
        char **argv = calloc(argc + 1, sizeof(char *));
        if (!argv) {
                send_error("out of memory");
                return;
        }
        const char *s = (const char *)p + 16, *end = (const char *)p + len - in_len;
        for (uint32_t i = 0; i < argc; i++) {
                const char *nul = memchr(s, 0, (size_t)(end - s));
                if (!nul) {
                        free(argv);
                        send_error("exec request malformed: argument not terminated");
                        return;
                }
                argv[i] = (char *)s;
                s = nul + 1;
        }
        const char *in = end;

        int pin[2], pout[2], perr[2];
        if (pipe2(pin, O_CLOEXEC) < 0) {
                free(argv);
                send_error("could not create pipes");
                return;
        }
        if (pipe2(pout, O_CLOEXEC) < 0) {
                close(pin[0]), close(pin[1]);
                free(argv);
                send_error("could not create pipes");
                return;
        }
        if (pipe2(perr, O_CLOEXEC) < 0) {
                close(pin[0]), close(pin[1]), close(pout[0]), close(pout[1]);
                free(argv);
                send_error("could not create pipes");
                return;
        }
        pid_t pid = fork();
        if (pid == 0) {
                setsid();
                dup2(pin[0], 0);
                dup2(pout[1], 1);
                dup2(perr[1], 2);
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                signal(SIGPIPE, SIG_DFL); /* ignored dispositions survive exec; commands expect the default */
                execvp(argv[0], argv);
                dprintf(2, "tally-agent: could not run %s: %s\n", argv[0], strerror(errno));
                _exit(127);
        }
        close(pin[0]), close(pout[1]), close(perr[1]);
        free(argv);
        if (pid < 0) {
                close(pin[1]), close(pout[0]), close(perr[0]);
                send_error("could not fork");
                return;
        }

        fcntl(pin[1], F_SETFL, O_NONBLOCK);
        struct stream out = { pout[0], AGENT_STDOUT, 0, false }, err = { perr[0], AGENT_STDERR, 0, false };
        int in_fd = pin[1];
        uint32_t in_done = 0;
        if (in_len == 0) {
                close(in_fd);
                in_fd = -1;
        }
        int64_t deadline = timeout_ms ? time_mono_ms() + timeout_ms : 0, drain_until = 0;
        bool timed_out = false, exited = false;
        int status = 0;
        while (out.fd >= 0 || err.fd >= 0) {
                struct pollfd fds[3] = { { out.fd, POLLIN, 0 }, { err.fd, POLLIN, 0 }, { in_fd, POLLOUT, 0 } };
                int wait = 100;
                if (exited)
                        wait = 0; /* the command is gone: take what its pipes hold, then finish */
                int n = poll(fds, 3, wait);
                if (n < 0 && errno != EINTR)
                        break;
                bool got = false;
                if (out.fd >= 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
                        got = true;
                        if (!pump(&out, cap)) {
                                close(out.fd);
                                out.fd = -1;
                        }
                }
                if (err.fd >= 0 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
                        got = true;
                        if (!pump(&err, cap)) {
                                close(err.fd);
                                err.fd = -1;
                        }
                }
                if (in_fd >= 0 && (fds[2].revents & (POLLOUT | POLLERR | POLLHUP))) {
                        ssize_t w = write(in_fd, in + in_done, in_len - in_done);
                        if (w > 0)
                                in_done += (uint32_t)w;
                        if ((w < 0 && errno != EAGAIN && errno != EINTR) || in_done == in_len) {
                                close(in_fd);
                                in_fd = -1;
                        }
                }
                if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
                        exited = true;
                        drain_until = time_mono_ms() + 200;
                }
                /* After the command ended, its pipes are read until they are
                 * empty — or, if something it left behind keeps writing, for
                 * a moment. */
                if (exited && (!got || time_mono_ms() >= drain_until))
                        break;
                if (!exited && deadline && time_mono_ms() >= deadline) {
                        timed_out = true;
                        kill(-pid, SIGKILL);
                        kill(pid, SIGKILL);
                        waitpid(pid, &status, 0);
                        exited = true;
                        drain_until = time_mono_ms() + 200;
                }
        }
        if (!exited)
                waitpid(pid, &status, 0);
        /* Output left in the pipes after the command ended is counted as dropped. */
        if (out.fd >= 0)
                close(out.fd);
        if (err.fd >= 0)
                close(err.fd);
        if (in_fd >= 0)
                close(in_fd);

        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        unsigned char done[7];
        agent_put_u32(done, (uint32_t)code);
        done[4] = timed_out;
        done[5] = out.truncated;
        done[6] = err.truncated;
        send_frame(AGENT_DONE, done, sizeof(done));
}

int main(int argc, char **argv)
{
        const char *path = argc > 1 ? argv[1] : "/dev/ttyS1";
        if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
                printf("Usage: tally-agent [SERIAL-DEVICE]\n"
                       "Runs the commands tally's host sends over SERIAL-DEVICE (default /dev/ttyS1).\n");
                return 0;
        }
        signal(SIGPIPE, SIG_IGN);
        for (;;) {
                chan = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
                if (chan >= 0)
                        break;
                fprintf(stderr, "tally-agent: could not open %s: %s\n", path, strerror(errno));
                sleep(1);
        }
        struct termios t;
        if (tcgetattr(chan, &t) == 0) {
                cfmakeraw(&t);
                t.c_cflag |= CLOCAL | CREAD;
                t.c_cflag &= ~(tcflag_t)CRTSCTS;
                t.c_cc[VMIN] = 1;
                t.c_cc[VTIME] = 0;
                cfsetspeed(&t, B115200);
                tcsetattr(chan, TCSANOW, &t);
        }
        send_frame(AGENT_READY, AGENT_VERSION, strlen(AGENT_VERSION));
        for (;;) {
                int type;
                unsigned char *payload;
                uint32_t len;
                int r = read_frame(&type, &payload, &len);
                if (r < 0) {
                        if (r == -EMSGSIZE)
                                send_error("frame too large");
                        else
                                usleep(10000);
                        continue;
                }
                if (type == AGENT_EXEC)
                        run_command(payload, len);
                else if (type == AGENT_PING)
                        send_frame(AGENT_READY, AGENT_VERSION, strlen(AGENT_VERSION));
                else
                        send_error("unknown frame type");
                free(payload);
                while (waitpid(-1, NULL, WNOHANG) > 0)
                        ; /* PID 1 reaps whatever the commands left behind */
        }
}
