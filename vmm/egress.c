/* egress.c — see egress.h: the proxy's listener, its connections (one
 * thread each: the request, the policy check, the relay) and the counters.
 * egress_http.c reads the requests and writes the proxy's own answers;
 * egress_dest.c resolves and checks where a connection may go.
 *
 * Threads: one accept thread per sandbox with internet, and one thread per
 * relayed connection (at most connections_max per sandbox: a per-tenant
 * bound on the daemon's threads and descriptors). Blocking I/O with poll and
 * timeouts; no lock is held across a read, a write, a connect or a lookup.
 * Nothing here forks. The only thread that ever enters a sandbox's network
 * namespace is the short-lived one that makes the listener; it never
 * returns to the daemon's code (it ends), so no other socket of the daemon
 * can be made in the wrong namespace. */
#include "egress.h"
#include "egress_dest.h"
#include "egress_http.h"
#include "jail.h"
#include "log.h"
#include "registry.h"
#include "timeutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RELAY_CHUNK    16384
#define ADDRS_MAX      16       /* answers tried for one name */
#define THREAD_STACK   (256 * 1024)
#define COUNT_WRITE_MS 200      /* the counters file is rewritten at most this often while bytes flow */
#define CLOSE_WAIT_MS  2000     /* how long egress_close waits for its connection threads */

struct conn {
        struct egress *e;
        int fd;                  /* the sandbox's side */
        _Atomic int up;          /* the outside's (-1 until connected); egress_close shuts it down */
        int slot;
};

struct egress {
        struct egress_settings s;
        struct net_policy policy;
        char id[64];
        int listen_fd;
        int wake[2];             /* egress_close writes a byte: the accept thread ends */
        int counts_fd;
        pthread_t accept_thread;
        pthread_mutex_t lock;
        pthread_cond_t idle;     /* signalled when a connection ends */
        int active;
        int refs;                /* the owner's (until egress_close) and one per connection thread */
        atomic_bool stopping;    /* egress_close began: relays end */
        struct conn **conns;     /* connections_max slots */
        _Atomic uint64_t rx, tx;
        uint64_t written_rx, written_tx;
};

/* ---- the listener, made inside the sandbox's network namespace ---- */

struct listen_job {
        int ns_fd;
        int fd;                  /* out */
        int err;                 /* out: 0 or errno */
        const char *step;        /* out: what failed */
};

static void *listen_in_ns(void *arg)
{
        struct listen_job *j = arg;
        /* Per thread for network namespaces: this thread alone moves, and it ends here. */
        if (setns(j->ns_fd, CLONE_NEWNET) < 0) {
                j->err = errno;
                j->step = "enter the sandbox's network namespace";
                return NULL;
        }
        /* Loopback up, so 127.0.0.1 exists even before the sandbox's init brought it up. */
        jail_loopback_up();
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(JAIL_EGRESS_PORT) };
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        int one = 1;
        if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
            bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 64) < 0) {
                j->err = errno;
                j->step = "listen on the sandbox's loopback";
                if (fd >= 0)
                        close(fd);
                return NULL;
        }
        j->fd = fd;
        return NULL;
}

static int make_listener(pid_t pid, int *ret_fd, char *why, size_t whylen)
{
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
        struct listen_job j = { .ns_fd = open(path, O_RDONLY | O_CLOEXEC), .fd = -1 };
        if (j.ns_fd < 0) {
                int e = errno;
                snprintf(why, whylen, "could not open the sandbox's network namespace: %s", strerror(e));
                return -e;
        }
        pthread_t t;
        int r = pthread_create(&t, NULL, listen_in_ns, &j);
        if (r == 0)
                pthread_join(t, NULL);
        close(j.ns_fd);
        if (r != 0) {
                snprintf(why, whylen, "could not start the egress proxy: %s", strerror(r));
                return -r;
        }
        if (j.fd < 0) {
                snprintf(why, whylen, "could not %s for the egress proxy: %s", j.step, strerror(j.err));
                return -j.err;
        }
        *ret_fd = j.fd;
        return 0;
}

/* ---- one connection ---- */

static void count(struct egress *e, bool to_sandbox, size_t n)
{
        atomic_fetch_add(to_sandbox ? &e->rx : &e->tx, (uint64_t)n);
}

/* Copies bytes both ways until one side ends or nothing moves for the idle timeout. */
static void relay(struct conn *c)
{
        struct egress *e = c->e;
        char buf[RELAY_CHUNK];
        bool open_in = true, open_out = true;
        int64_t last = time_mono_ms();
        while ((open_in || open_out) && !atomic_load(&e->stopping)) {
                struct pollfd p[2] = { { open_in ? c->fd : -1, POLLIN, 0 }, { open_out ? c->up : -1, POLLIN, 0 } };
                int pr = poll(p, 2, 1000);
                if (pr == 0 && time_mono_ms() - last >= e->s.idle_timeout_ms)
                        return;
                if (pr == 0)
                        continue;
                last = time_mono_ms();
                if (pr < 0) {
                        if (errno == EINTR)
                                continue;
                        return;
                }
                for (int k = 0; k < 2; k++) {
                        if (!p[k].revents)
                                continue;
                        int from = k == 0 ? c->fd : c->up, to = k == 0 ? c->up : c->fd;
                        ssize_t n = recv(from, buf, sizeof(buf), MSG_DONTWAIT);
                        if (n < 0 && (errno == EAGAIN || errno == EINTR))
                                continue;
                        if (n <= 0) {
                                shutdown(to, SHUT_WR);
                                if (k == 0)
                                        open_in = false;
                                else
                                        open_out = false;
                                if (n < 0)
                                        return;
                                continue;
                        }
                        if (egress_write_all(to, buf, (size_t)n, (int)e->s.idle_timeout_ms) < 0)
                                return;
                        count(e, k == 1, (size_t)n);
                }
        }
}

/* The request r of connection c, allowed or refused: checks its name against
 * the allow-list, connects to an address of it a sandbox may reach, passes
 * the request on, and relays. */
static void forward(struct conn *c, const struct egress_request *r)
{
        struct egress *e = c->e;
        if (!net_policy_allows(&e->policy, r->host)) {
                log_info("egress refused", "sandbox=%s host=\"%.64s\" port=%d reason=not_allowed", e->id, r->host,
                         r->port);
                egress_reply(c->fd, 403, "Forbidden", "tally egress: this name is not on the sandbox's allow-list");
                return;
        }
        struct sockaddr_storage addrs[ADDRS_MAX];
        int n = egress_resolve(e->s.hosts_file, r->host, addrs, ADDRS_MAX);
        if (n == 0) {
                egress_reply(c->fd, 502, "Bad Gateway", "tally egress: the name does not resolve");
                return;
        }
        c->up = egress_connect_checked(addrs, n, r->port, e->s.connect_timeout_ms);
        if (c->up == -EACCES) {
                c->up = -1;
                log_info("egress refused", "sandbox=%s host=\"%.64s\" port=%d reason=address_not_public", e->id,
                         r->host, r->port);
                egress_reply(c->fd, 403, "Forbidden",
                             "tally egress: the name resolves only to addresses a sandbox may not reach (loopback, "
                             "private, link-local, this host's own)");
                return;
        }
        if (c->up < 0) {
                c->up = -1;
                egress_reply(c->fd, 502, "Bad Gateway", "tally egress: could not connect");
                return;
        }
        const char *rest = r->head + r->head_len;
        size_t rest_len = r->len - r->head_len;
        size_t headers_len = (size_t)(rest - r->eol);
        if (r->tunnel) {
                static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
                if (egress_write_all(c->fd, ok, sizeof(ok) - 1, 5000) < 0)
                        return;
        } else {
                /* origin-form line, then the headers and what came of the body, as they were */
                char first[EGRESS_HEAD_MAX + 64];
                int fl = snprintf(first, sizeof(first), "%s %s %s", r->method, r->path, r->version);
                if (fl < 0 || (size_t)fl >= sizeof(first) || egress_write_all(c->up, first, (size_t)fl, 5000) < 0 ||
                    egress_write_all(c->up, r->eol, headers_len, 5000) < 0)
                        return;
                count(e, false, (size_t)fl + headers_len);
        }
        if (rest_len > 0) {
                if (egress_write_all(c->up, rest, rest_len, 5000) < 0)
                        return;
                count(e, false, rest_len);
        }
        relay(c);
}

static void serve(struct conn *c)
{
        struct egress_request req;
        const char *detail = NULL;
        if (egress_request_read(c->fd, &req, &detail) < 0)
                egress_reply(c->fd, 400, "Bad Request", detail);
        else
                forward(c, &req);
}

static void egress_free(struct egress *e)
{
        free(e->conns);
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->idle);
        free(e);
}

static void *conn_main(void *arg)
{
        struct conn *c = arg;
        struct egress *e = c->e;
        serve(c);
        pthread_mutex_lock(&e->lock);
        e->conns[c->slot] = NULL;
        e->active--;
        close(c->fd);
        if (c->up >= 0)
                close(c->up);
        bool last = --e->refs == 0;
        pthread_cond_broadcast(&e->idle);
        pthread_mutex_unlock(&e->lock);
        free(c);
        if (last)
                egress_free(e); /* egress_close gave up waiting for this one (a slow name lookup) */
        return NULL;
}

/* ---- the counters file ---- */

static void write_counts(struct egress *e, bool force)
{
        uint64_t rx = atomic_load(&e->rx), tx = atomic_load(&e->tx);
        if (e->counts_fd < 0 || (!force && rx == e->written_rx && tx == e->written_tx))
                return;
        int r = sandbox_net_write(e->counts_fd, rx, tx);
        if (r < 0) {
                log_warn("could not write a sandbox's network counters", "sandbox=%s error=\"%s\"", e->id,
                         strerror(-r));
                return;
        }
        e->written_rx = rx;
        e->written_tx = tx;
}

void egress_counts(struct egress *e, uint64_t *ret_rx, uint64_t *ret_tx)
{
        *ret_rx = e ? atomic_load(&e->rx) : 0;
        *ret_tx = e ? atomic_load(&e->tx) : 0;
}

/* ---- accepting ---- */

static void *accept_main(void *arg)
{
        struct egress *e = arg;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, THREAD_STACK);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int64_t last_write = 0;
        for (;;) {
                struct pollfd p[2] = { { e->listen_fd, POLLIN, 0 }, { e->wake[0], POLLIN, 0 } };
                int pr = poll(p, 2, COUNT_WRITE_MS);
                if (p[1].revents)
                        break;
                int64_t now = time_mono_ms();
                if (now - last_write >= COUNT_WRITE_MS) {
                        write_counts(e, false);
                        last_write = now;
                }
                if (pr <= 0 || !p[0].revents)
                        continue;
                int fd = accept4(e->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0)
                        continue;
                pthread_mutex_lock(&e->lock);
                int slot = -1;
                for (int i = 0; i < (int)e->s.connections_max && slot < 0; i++)
                        if (!e->conns[i])
                                slot = i;
                struct conn *c = slot >= 0 ? calloc(1, sizeof(*c)) : NULL;
                if (c) {
                        *c = (struct conn){ e, fd, -1, slot };
                        e->conns[slot] = c;
                        e->active++;
                        e->refs++;
                }
                pthread_mutex_unlock(&e->lock);
                if (!c) {
                        egress_reply(fd, 503, "Service Unavailable", "tally egress: too many connections at once");
                        close(fd);
                        continue;
                }
                pthread_t t;
                if (pthread_create(&t, &attr, conn_main, c) != 0) {
                        pthread_mutex_lock(&e->lock);
                        e->conns[slot] = NULL;
                        e->active--;
                        e->refs--;
                        pthread_mutex_unlock(&e->lock);
                        close(fd);
                        free(c);
                }
        }
        pthread_attr_destroy(&attr);
        return NULL;
}

int egress_open(const struct egress_settings *s, const char *id, pid_t pid, const char *dir,
                const struct net_policy *p, struct egress **ret, char *why, size_t whylen)
{
        struct egress *e = calloc(1, sizeof(*e));
        if (!e)
                return -ENOMEM;
        e->s = *s;
        e->policy = *p;
        snprintf(e->id, sizeof(e->id), "%s", id);
        e->listen_fd = e->counts_fd = e->wake[0] = e->wake[1] = -1;
        pthread_mutex_init(&e->lock, NULL);
        pthread_cond_init(&e->idle, NULL);
        e->refs = 1;
        int r;
        if (!(e->conns = calloc((size_t)s->connections_max, sizeof(*e->conns)))) {
                r = -ENOMEM;
                goto fail;
        }
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/" SANDBOX_NET_FILE, dir);
        if ((e->counts_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0) {
                r = -errno;
                snprintf(why, whylen, "could not open the sandbox's network counters: %s", strerror(-r));
                goto fail;
        }
        uint64_t rx = 0, tx = 0;
        if (sandbox_net_read(e->counts_fd, &rx, &tx) == 0) {
                atomic_store(&e->rx, rx); /* a restarted tally-vmm counts on */
                atomic_store(&e->tx, tx);
        }
        write_counts(e, true);
        if ((r = make_listener(pid, &e->listen_fd, why, whylen)) < 0)
                goto fail;
        if (pipe2(e->wake, O_CLOEXEC) < 0) {
                r = -errno;
                goto fail;
        }
        if ((r = -pthread_create(&e->accept_thread, NULL, accept_main, e)) < 0) {
                snprintf(why, whylen, "could not start the egress proxy: %s", strerror(-r));
                goto fail;
        }
        *ret = e;
        return 0;
fail:
        if (e->listen_fd >= 0)
                close(e->listen_fd);
        if (e->counts_fd >= 0)
                close(e->counts_fd);
        for (int i = 0; i < 2; i++)
                if (e->wake[i] >= 0)
                        close(e->wake[i]);
        egress_free(e);
        return r;
}

void egress_close(struct egress *e)
{
        if (!e)
                return;
        atomic_store(&e->stopping, true);
        ssize_t w = write(e->wake[1], "x", 1);
        (void)w;
        pthread_join(e->accept_thread, NULL);
        close(e->listen_fd);
        close(e->wake[0]);
        close(e->wake[1]);
        pthread_mutex_lock(&e->lock);
        for (int i = 0; i < (int)e->s.connections_max; i++)
                if (e->conns[i]) {
                        shutdown(e->conns[i]->fd, SHUT_RDWR);
                        int up = e->conns[i]->up;
                        if (up >= 0)
                                shutdown(up, SHUT_RDWR);
                }
        /* Shut down, every connection thread ends at once, but one in a name lookup or a
         * connect ends only when that returns: it is not waited for past CLOSE_WAIT_MS
         * (the last thread frees the proxy's memory). */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += CLOSE_WAIT_MS / 1000;
        while (e->active > 0 && pthread_cond_timedwait(&e->idle, &e->lock, &until) == 0)
                ;
        pthread_mutex_unlock(&e->lock);
        write_counts(e, true);
        close(e->counts_fd);
        e->counts_fd = -1;
        pthread_mutex_lock(&e->lock);
        bool last = --e->refs == 0;
        pthread_mutex_unlock(&e->lock);
        if (last)
                egress_free(e);
}

