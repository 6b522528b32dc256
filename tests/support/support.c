/* support.c — see support.h. */
#include "support.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

int test_failures;

/* SCRAM (every connection to the test cluster) draws its nonce from OpenSSL, which by
 * default tears itself down at exit before the atexit handlers a test registered
 * before its first connection (dropping its database) run: those would crash. Set
 * up before main, without that teardown. */
__attribute__((constructor)) static void openssl_for_the_whole_run(void)
{
        OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}

int test_result(void)
{
        if (test_failures)
                fprintf(stderr, "%d check(s) failed\n", test_failures);
        return test_failures ? 1 : 0;
}

const char *test_env(const char *name)
{
        const char *v = getenv(name);
        if (!v || !*v) {
                fprintf(stderr, "FAIL: %s is not set; run the integration suite through ./scripts/test, "
                                "which starts PostgreSQL and the development broker\n", name);
                exit(1);
        }
        return v;
}

static PGconn *admin(void)
{
        PGconn *c = PQconnectdb(test_env("TALLY_TEST_PG_URL"));
        if (PQstatus(c) != CONNECTION_OK) {
                fprintf(stderr, "FAIL: could not connect to the test cluster: %s\n", PQerrorMessage(c));
                exit(1);
        }
        return c;
}

static void admin_exec(const char *sql)
{
        PGconn *c = admin();
        PGresult *r = PQexec(c, sql);
        if (PQresultStatus(r) != PGRES_COMMAND_OK) {
                fprintf(stderr, "FAIL: %s: %s\n", sql, PQerrorMessage(c));
                exit(1);
        }
        PQclear(r);
        PQfinish(c);
}

char *test_db_create(const char *prefix)
{
        static unsigned counter;
        char name[64], sql[128];
        snprintf(name, sizeof(name), "t_%s_%d_%u", prefix, (int)getpid(), counter++);
        /* Owned by tally_owner, as in production: tally-migrate (as that role) creates every object. */
        snprintf(sql, sizeof(sql), "CREATE DATABASE %s OWNER tally_owner", name);
        admin_exec(sql);
        const char *base = test_env("TALLY_TEST_PG_URL");
        const char *slash = strrchr(base, '/');
        char *url;
        if (asprintf(&url, "%.*s/%s", (int)(slash - base), base, name) < 0)
                abort();
        return url;
}

void test_db_drop(char *url)
{
        if (!url)
                return;
        char sql[128];
        snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s WITH (FORCE)", strrchr(url, '/') + 1);
        admin_exec(sql);
        free(url);
}

/* The PostgreSQL role each of tally's programs logs in as (sql/roles/roles.sql,
 * docs/security.md); tally-admin's close-due is the timer's own role. */
static const char *program_role(char *const argv[])
{
        static const struct {
                const char *program, *role;
        } roles[] = {
                { "tally-migrate", "tally_owner" }, { "tally-aggregator", "tally_aggregator" },
                { "tally-api", "tally_api" },       { "tally-admin", "tally_admin" },
                { "tally-vmm", "tally_vmm" },       { "tally-notifier", "tally_notifier" },
        };
        const char *slash = strrchr(argv[0], '/');
        const char *name = slash ? slash + 1 : argv[0];
        for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++)
                if (strcmp(name, roles[i].program) == 0) {
                        if (strcmp(name, "tally-admin") == 0)
                                for (int a = 1; argv[a]; a++)
                                        if (strcmp(argv[a], "close-due") == 0)
                                                return "tally_close_due";
                        return roles[i].role;
                }
        return NULL;
}

/* The user of a postgresql://USER@... URL: [*ret_start, *ret_end). Returns false if it has none. */
static bool url_user(const char *url, const char **ret_start, const char **ret_end)
{
        const char *p = strstr(url, "://");
        if (!p)
                return false;
        p += 3;
        const char *at = strchr(p, '@'), *slash = strchr(p, '/');
        if (!at || (slash && slash < at))
                return false;
        const char *colon = memchr(p, ':', (size_t)(at - p)); /* user:password@ */
        *ret_start = p;
        *ret_end = colon ? colon : at;
        return true;
}

char *test_role_url(const char *url, const char *role)
{
        const char *start, *end;
        char *out;
        if (!url_user(url, &start, &end)) {
                fprintf(stderr, "FAIL: %s names no user\n", url);
                exit(1);
        }
        const char *at = strchr(start, '@');
        if (asprintf(&out, "%.*s%s%s", (int)(start - url), url, role, at) < 0)
                abort();
        return out;
}

/* argv as the program runs it: a --database-url or --limits-database-url naming the
 * test cluster's superuser (a URL of test_db_create) names the program's own role
 * instead. Returns NULL when nothing changes; else a malloc'd copy whose rewritten
 * URLs are malloc'd too (role_argv_free). */
static char **role_argv(char *const argv[])
{
        const char *role = program_role(argv);
        const char *admin = getenv("TALLY_TEST_PG_URL"), *as, *ae;
        if (!role || !admin || !url_user(admin, &as, &ae))
                return NULL;
        int n = 0;
        while (argv[n])
                n++;
        char **copy = calloc((size_t)n + 1, sizeof(char *));
        bool changed = false;
        for (int i = 0; i < n; i++) {
                copy[i] = argv[i];
                const char *v = NULL;
                const char *flags[] = { "--database-url", "--limits-database-url" };
                for (size_t f = 0; f < 2 && !v; f++) {
                        size_t fl = strlen(flags[f]);
                        if (strncmp(argv[i], flags[f], fl) == 0 && argv[i][fl] == '=')
                                v = argv[i] + fl + 1;
                        else if (strcmp(argv[i], flags[f]) == 0 && i + 1 < n) {
                                copy[i + 1] = argv[i + 1];
                                v = argv[++i];
                        }
                }
                const char *us, *ue;
                if (!v || !url_user(v, &us, &ue) || ue - us != ae - as || strncmp(us, as, (size_t)(ae - as)) != 0)
                        continue;
                char *url = test_role_url(v, role);
                if (v == argv[i]) { /* --flag URL */
                        copy[i] = url;
                } else {
                        char *flag;
                        if (asprintf(&flag, "%.*s=%s", (int)(v - argv[i] - 1), argv[i], url) < 0)
                                abort();
                        free(url);
                        copy[i] = flag;
                }
                changed = true;
        }
        if (!changed) {
                free(copy);
                return NULL;
        }
        return copy;
}

static void role_argv_free(char **copy, char *const argv[])
{
        if (!copy)
                return;
        for (int i = 0; copy[i]; i++)
                if (copy[i] != argv[i])
                        free(copy[i]);
        free(copy);
}

static char *drain(int fd)
{
        char *buf = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&buf, &len);
        char chunk[4096];
        ssize_t n;
        while ((n = read(fd, chunk, sizeof(chunk))) > 0)
                fwrite(chunk, 1, (size_t)n, mem);
        fclose(mem);
        return buf;
}

int test_run(char *const argv[], char **out, char **err)
{
        int po[2], pe[2];
        if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0)
                abort();
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, po[1], 1);
        posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
        pid_t pid;
        char **as_role = role_argv(argv);
        char **env = test_kafka_environ(argv[0]);
        if (posix_spawn(&pid, argv[0], &fa, NULL, as_role ? as_role : argv, env ? env : environ) != 0) {
                fprintf(stderr, "FAIL: could not run %s: %s\n", argv[0], strerror(errno));
                exit(1);
        }
        test_kafka_environ_free(env);
        role_argv_free(as_role, argv);
        posix_spawn_file_actions_destroy(&fa);
        close(po[1]);
        close(pe[1]);
        /* stderr is drained on a second pass; outputs here are small. */
        char *o = drain(po[0]);
        char *e = drain(pe[0]);
        close(po[0]);
        close(pe[0]);
        int st;
        waitpid(pid, &st, 0);
        if (out)
                *out = o;
        else
                free(o);
        if (err)
                *err = e;
        else
                free(e);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

pid_t test_spawn(char *const argv[], const char *out_path, const char *err_path)
{
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 1, out_path ? out_path : "/dev/null",
                                         O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_addopen(&fa, 2, err_path ? err_path : "/dev/null",
                                         O_WRONLY | O_CREAT | O_TRUNC, 0644);
        pid_t pid;
        char **as_role = role_argv(argv);
        char **env = test_kafka_environ(argv[0]);
        int r = posix_spawn(&pid, argv[0], &fa, NULL, as_role ? as_role : argv, env ? env : environ);
        test_kafka_environ_free(env);
        role_argv_free(as_role, argv);
        posix_spawn_file_actions_destroy(&fa);
        if (r != 0) {
                fprintf(stderr, "FAIL: could not start %s: %s\n", argv[0], strerror(r));
                exit(1);
        }
        return pid;
}

int test_wait_file(const char *path, int timeout_ms)
{
        for (int waited = 0; waited < timeout_ms; waited += 20) {
                struct stat st;
                if (stat(path, &st) == 0 && st.st_size > 0)
                        return 0;
                struct timespec ts = { 0, 20 * 1000000 };
                nanosleep(&ts, NULL);
        }
        return -ETIMEDOUT;
}

int test_log_port(const char *path, const char *needle, int timeout_ms)
{
        for (int waited = 0; waited < timeout_ms; waited += 20) {
                char *log = test_read_file(path);
                int port = 0;
                for (char *q = log; q && (q = strstr(q, needle)) && !port; q += strlen(needle)) {
                        size_t line = strcspn(q, "\n");
                        char *p = strstr(q, " port=");
                        if (p && p < q + line)
                                port = atoi(p + 6);
                }
                free(log);
                if (port > 0)
                        return port;
                struct timespec ts = { 0, 20 * 1000000 };
                nanosleep(&ts, NULL);
        }
        return -ETIMEDOUT;
}

char *test_read_file(const char *path)
{
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return NULL;
        char *s = drain(fd);
        close(fd);
        size_t n = strlen(s);
        while (n && s[n - 1] == '\n')
                s[--n] = '\0';
        return s;
}

char *test_tmpdir(const char *prefix)
{
        const char *base = getenv("TALLY_TEST_WORK");
        char *path;
        if (asprintf(&path, "%s/%s.XXXXXX", base && *base ? base : "/tmp", prefix) < 0 || !mkdtemp(path))
                abort();
        return path;
}

void test_wait_out_utc_day(int run_s)
{
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        long long left_s = 86400 - (long long)(now.tv_sec % 86400);
        if (left_s > run_s)
                return;
        fprintf(stderr, "the UTC day ends in %lld s, within this test's %d s: waiting for the next\n", left_s, run_s);
        struct timespec d = { (time_t)left_s, 0 };
        d.tv_sec -= now.tv_nsec > 0 ? 1 : 0;
        d.tv_nsec = now.tv_nsec > 0 ? 1000000000L - now.tv_nsec : 0;
        d.tv_sec += 1;
        while (nanosleep(&d, &d) < 0 && errno == EINTR)
                ;
}

bool test_http_answer_complete(const char *buf, size_t len, bool head)
{
        const char *p = buf, *end = buf + len;
        for (;;) {
                const char *hdr_end = memmem(p, (size_t)(end - p), "\r\n\r\n", 4);
                if (!hdr_end)
                        return false;
                const char *body = hdr_end + 4;
                if (end - p >= 12 && memcmp(p + 9, "100", 3) == 0) {
                        p = body;
                        continue;
                }
                if (head)
                        return true;
                long long clen = -1;
                bool chunked = false;
                for (const char *l = memchr(p, '\n', (size_t)(hdr_end - p)); l && l < hdr_end;
                     l = memchr(l + 1, '\n', (size_t)(hdr_end - l - 1))) {
                        if (strncasecmp(l + 1, "Content-Length:", 15) == 0)
                                clen = strtoll(l + 16, NULL, 10);
                        else if (strncasecmp(l + 1, "Transfer-Encoding: chunked", 26) == 0)
                                chunked = true;
                }
                if (chunked)
                        return memmem(body, (size_t)(end - body), "0\r\n\r\n", 5) != NULL;
                if (clen >= 0)
                        return end - body >= clen;
                return false; /* until the server closes */
        }
}

bool test_pid_running(pid_t pid)
{
        if (pid <= 0 || kill(pid, 0) != 0)
                return false;
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
        char *s = test_read_file(path);
        const char *state = s ? strstr(s, "\nState:") : NULL;
        if (state)
                for (state += 7; *state == ' ' || *state == '\t'; state++)
                        ;
        bool running = s && !(state && *state == 'Z');
        free(s);
        return running;
}

bool test_http_answer_due(const char *req, size_t len)
{
        const char *end = memmem(req, len, "\r\n\r\n", 4);
        if (!end || memchr(req, '\0', (size_t)(end - req)))
                return false;
        const char *eol = memchr(req, '\r', (size_t)(end - req) + 1), *p = req;
        while (p < eol && *p >= 'A' && *p <= 'Z')
                p++;
        if (p == req || p >= eol || *p++ != ' ' || *p != '/')
                return false;
        while (p < eol && *p > ' ' && *p < 0x7f)
                p++;
        if (eol[1] != '\n' || eol - p != 9 || (memcmp(p, " HTTP/1.1", 9) != 0 && memcmp(p, " HTTP/1.0", 9) != 0))
                return false;
        for (const char *l = eol + 2; l < end + 2; l = memchr(l, '\n', (size_t)(end + 2 - l)) + 1) {
                const char *le = memchr(l, '\r', (size_t)(end + 2 - l));
                const char *colon = memchr(l, ':', (size_t)(le - l));
                if (!colon || colon == l || le[1] != '\n')
                        return false;
                for (const char *c = l; c < le; c++)
                        if ((unsigned char)*c < ' ' || (unsigned char)*c >= 0x7f)
                                return false;
                for (const char *c = l; c < colon; c++)
                        if (*c == ' ' || *c == '\t')
                                return false;
                if (strncasecmp(l, "Content-Length:", 15) == 0 || strncasecmp(l, "Transfer-Encoding:", 18) == 0)
                        return false;
        }
        return true;
}

size_t test_http_exchange(int fd, const void *req, size_t len, char *out, size_t cap, int timeout_s, bool keep_open)
{
        struct timeval tv = { .tv_sec = timeout_s };
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        bool head = len >= 5 && memcmp(req, "HEAD ", 5) == 0;
        const char *p = req;
        while (len > 0) {
                ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break; /* the server may answer (400, 413) and close before it read all */
                p += n;
                len -= (size_t)n;
        }
        if (!keep_open)
                shutdown(fd, SHUT_WR);
        size_t got = 0;
        while (got < cap) {
                ssize_t n = recv(fd, out + got, cap - got, 0);
                /* libFuzzer's timer (SIGALRM, for -timeout) interrupts a recv with
                 * SO_RCVTIMEO even under SA_RESTART: that is not the answer's end. */
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                got += (size_t)n;
                if (test_http_answer_complete(out, got, head))
                        break;
        }
        close(fd);
        return got;
}

char *test_get_metrics(int port)
{
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
                if (fd >= 0)
                        close(fd);
                return NULL;
        }
        const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        size_t cap = 65536, len = 0;
        char *buf = malloc(cap);
        ssize_t n = write(fd, req, sizeof(req) - 1);
        while (buf && n >= 0 && len < cap - 1 && (n = read(fd, buf + len, cap - len - 1)) > 0)
                len += (size_t)n;
        close(fd);
        if (buf)
                buf[len] = '\0';
        return buf;
}

int64_t test_metric(const char *page, const char *series, bool seconds)
{
        size_t sl = strlen(series);
        for (const char *at = page ? strstr(page, series) : NULL; at; at = strstr(at + 1, series)) {
                if ((at != page && at[-1] != '\n') || at[sl] != ' ')
                        continue;
                const char *p = at + sl + 1;
                int64_t whole = 0, frac = 0;
                int digits = 0;
                for (; *p >= '0' && *p <= '9'; p++)
                        whole = whole * 10 + (*p - '0');
                if (!seconds)
                        return whole;
                if (*p == '.')
                        for (p++; *p >= '0' && *p <= '9'; p++)
                                if (digits < 6) {
                                        frac = frac * 10 + (*p - '0');
                                        digits++;
                                }
                for (; digits < 6; digits++)
                        frac *= 10;
                return whole * 1000000 + frac;
        }
        return -1;
}

char *test_db_value(const char *url, const char *sql)
{
        PGconn *c = PQconnectdb(url);
        PGresult *r = PQexec(c, sql);
        char *v = NULL;
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
                v = strdup(PQgetvalue(r, 0, 0));
        else if (PQresultStatus(r) != PGRES_TUPLES_OK)
                fprintf(stderr, "query failed: %s: %s", sql, PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
        return v;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
        (void)st;
        (void)flag;
        (void)ftw;
        remove(path);
        return 0;
}

void test_remove_tree(const char *path)
{
        nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void test_ca(const char *cmd, const char *dir, const char *name)
{
        char *argv[] = { (char *)test_env("TALLY_CA_SCRIPT"), (char *)cmd, (char *)dir, (char *)name, NULL };
        char *err = NULL;
        int rc = test_run(argv, NULL, &err);
        if (rc != 0) {
                fprintf(stderr, "FAIL: scripts/ca %s %s %s: %s\n", cmd, dir, name ? name : "", err ? err : "");
                test_failures++;
                exit(test_result());
        }
        free(err);
}
