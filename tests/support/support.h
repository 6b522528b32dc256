/* support.h — what integration tests share: the throwaway services scripts/test
 * started, fresh databases, and running tally's binaries as real processes.
 * A missing service is a failure, never a skip: a test that did not run did
 * not pass. */
#pragma once

#include <librdkafka/rdkafka.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

/* CHECK records a failed expectation with its reason and goes on, so one run
 * reports every broken invariant; main returns test_result(). */
extern int test_failures;
#define CHECK(cond, ...)                                                                  \
        do {                                                                              \
                if (!(cond)) {                                                            \
                        test_failures++;                                                  \
                        fprintf(stderr, "FAIL %s:%d: (%s) ", __FILE__, __LINE__, #cond); \
                        fprintf(stderr, __VA_ARGS__);                                     \
                        fputc('\n', stderr);                                              \
                }                                                                         \
        } while (0)
int test_result(void);

/* The value of an environment variable the test needs; aborts the test with a
 * message naming it (and scripts/test) when unset. */
const char *test_env(const char *name);

/* Creates an empty database on the test cluster and returns its URL (malloc'd). */
char *test_db_create(const char *prefix);
/* Drops it (forcing connections off) and frees url. */
void test_db_drop(char *url);
/* The one value a query of one row answers (malloc'd), on a connection of its
 * own to url; NULL for no row or a NULL value, and a failed query said on stderr. */
char *test_db_value(const char *url, const char *sql);

/* The URL as role (malloc'd): the same database, user role. The databases are
 * the cluster superuser's URLs (the test's own connections look into and seed
 * them); tally's programs log in as their own roles (sql/roles/roles.sql) with
 * the passwords of PGPASSFILE (scripts/lib.sh start_test_pg). test_run and
 * test_spawn do it for them: a --database-url or --limits-database-url with the
 * superuser's URL given to tally-migrate, -aggregator, -api, -admin (close-due:
 * tally_close_due), -vmm or -notifier names that program's role instead. */
char *test_role_url(const char *url, const char *role);

/* Runs argv to completion (envp NULL: this environment), capturing stdout and
 * stderr (malloc'd, NUL-terminated; pass NULL to discard). Returns the exit
 * status, or 128+signal. */
int test_run(char *const argv[], char **out, char **err);

/* Starts argv in the background with stdout and stderr to files (NULL: /dev/null). */
pid_t test_spawn(char *const argv[], const char *out_path, const char *err_path);

/* Waits until path exists and is non-empty, up to timeout_ms. Returns 0 or -ETIMEDOUT. */
int test_wait_file(const char *path, int timeout_ms);

/* Waits until the log at path holds a line with needle followed, on that
 * line, by " port=N" (a daemon started on port 0 logs where it listens, e.g.
 * tally-api's msg="listening"), up to timeout_ms. Returns N, or -ETIMEDOUT. */
int test_log_port(const char *path, const char *needle, int timeout_ms);

/* Reads a whole small file (malloc'd), trailing newline removed; NULL on error. */
char *test_read_file(const char *path);
/* scripts/ca CMD DIR [NAME] (TALLY_CA_SCRIPT: `init` a CA in DIR, `issue` a
 * certificate named NAME); a failure fails the test and exits. */
void test_ca(const char *cmd, const char *dir, const char *name);
/* Removes path and everything below it (best effort; links are not followed). */
void test_remove_tree(const char *path);

/* The process runs: it exists and is not a zombie (one that ended and waits
 * for its parent — PID 1, for a daemon a script started — to reap it, which
 * kill(pid, 0) still finds; scripts/lib.sh pid_alive is the same rule). */
bool test_pid_running(pid_t pid);

/* Whether buf holds one whole HTTP answer (after any 100 Continue): the
 * headers and the body their Content-Length or chunked framing promise
 * (head: an answer to HEAD, headers alone). For a client that must stop
 * reading once the answer is in, since a kept-alive connection would
 * otherwise idle until the server's timeout. */
bool test_http_answer_complete(const char *buf, size_t len, bool head);

/* Whether req starts with a plain, whole request head that announces no
 * body: "METHOD /path HTTP/1.x", then "Name: value" lines up to a blank line,
 * neither Content-Length nor Transfer-Encoding among them. libmicrohttpd
 * hands every such request to the handler, so no answer at all means the
 * handler refused to make one (it returned MHD_NO). Anything odder may be
 * dropped by libmicrohttpd itself, and a head with a body may end unanswered:
 * the input can stop short of the body it announced. */
bool test_http_answer_due(const char *req, size_t len);

/* One HTTP exchange on a connected socket fd, which it closes: sends all of
 * req (stopping early if the server closes: it may answer 400 or 413 before
 * reading everything), shuts the sending side (unless keep_open: a client
 * that waits for its answer with the connection open), and reads until the
 * server closes or one whole answer is in (test_http_answer_complete), keeping at
 * most cap bytes in out. Sends and reads time out after timeout_s; a read
 * interrupted by a signal (libFuzzer's SIGALRM) is retried. Returns the
 * bytes read. */
size_t test_http_exchange(int fd, const void *req, size_t len, char *out, size_t cap, int timeout_s, bool keep_open);

/* The host's cgroups as mounted (/proc/self/mounts), so that a test runs on
 * what the host has rather than on paths of one layout: a hybrid host (v1
 * controllers, a v2 tree without them at /sys/fs/cgroup/unified), a pure v2
 * host (cgroup2 at /sys/fs/cgroup with cpu and memory), or v1 only. */
struct test_cgroup_layout {
        bool v1;                  /* cpuacct and memory are mounted as v1 hierarchies */
        char v1_cpuacct[256];     /* their mount points ("" when not mounted) */
        char v1_memory[256];
        char v2[256];             /* the cgroup2 mount ("" when none) */
        bool v2_cpu, v2_memory;   /* the v2 root offers these controllers (a pure v2 host) */
};
/* Fills *ret; -ENOENT when the host has neither v1 cpuacct+memory nor cgroup2. */
int test_cgroup_layout(struct test_cgroup_layout *ret);

/* A fresh folder under the test run's work folder (malloc'd). */
char *test_tmpdir(const char *prefix);

/* A TCP port on 127.0.0.1 for a server the test starts later (a daemon's
 * --metrics-port, say): random, free now (bound and released), never one this
 * process handed out before, and below the kernel's ephemeral range
 * (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default), so that no
 * outgoing connection (to PostgreSQL, to Kafka) can take it between this pick
 * and the server's bind. Exits the test when no port is free. scripts/lib.sh's
 * free_port is the shell's, tests/support/testsupport.py's the Python tests'. */
int test_free_port(void);
/* The range test_free_port picks from: [*lo, *hi]. */
void test_port_range(int *lo, int *hi);

/* A test whose checks need one UTC day throughout (a daily spend limit, the
 * warning before it, whose horizon ends at midnight) calls this first: when
 * the current UTC day ends within run_s seconds, it says so and sleeps until
 * one second into the next. */
void test_wait_out_utc_day(int run_s);

/* The Kafka a test runs against. By default the development broker (a
 * tally-broker process of the test's own, TALLY_BROKER_BIN); with
 * TALLY_TEST_KAFKA=apache (`scripts/test --kafka apache`, meson test setup
 * "apache") a real Apache Kafka that scripts/kafka (TALLY_KAFKA_SCRIPT) formats
 * and starts in a folder of the test's own, topics usage and control created
 * with `partitions`. nodes: 1, or 3 for a KRaft quorum (Apache Kafka only), or
 * 0: as TALLY_TEST_KAFKA_NODES says (default 1).
 * Exits the test on failure. */
struct test_kafka {
        char bootstrap[512];
        char dir[512];
        pid_t pid; /* the development broker; 0 for Apache Kafka */
        int apache;
        int nodes;
};
int test_kafka_is_apache(void);
void test_kafka_start(struct test_kafka *k, const char *dir, int partitions, int nodes);
void test_kafka_stop(struct test_kafka *k);
/* Apache Kafka only: SIGKILL node (1..nodes), or start it again on its data. */
void test_kafka_kill_node(struct test_kafka *k, int node);
void test_kafka_restart_node(struct test_kafka *k, int node);
/* Apache Kafka only: the process id of node (1..nodes), 0 if it does not run. */
pid_t test_kafka_node_pid(struct test_kafka *k, int node);

/* Who a test's Kafka clients are on Apache Kafka, where every connection
 * authenticates (SASL/PLAIN) and ACLs allow each principal its own topics
 * (scripts/lib.sh, docs/kafka.md "Principals and ACLs"). The passwords are in
 * the test run's credentials file, TALLY_KAFKA_CREDENTIALS (scripts/test sets
 * it; test_kafka_start, when it is unset, points it at the first cluster's).
 * On the development broker, which authenticates no one, all of this is
 * nothing. */
/* USER's password (malloc'd), or NULL when the file has none. */
char *test_kafka_password(const char *user);
/* conf (or a new conf when NULL), set up to connect as user ("admin",
 * "aggregator", "host-test") on Apache Kafka; as it is on the development
 * broker. Exits the test when user has no password. */
rd_kafka_conf_t *test_kafka_conf_as(rd_kafka_conf_t *conf, const char *user);
/* The test's own clients: admin, the super user (a test plays hosts and
 * aggregators alike, and reads what they wrote). */
rd_kafka_conf_t *test_kafka_conf(rd_kafka_conf_t *conf);
/* The environment a spawned program gets (test_run, test_spawn): the test's
 * own, plus, on Apache Kafka, TALLY_KAFKA_SETTINGS and
 * TALLY_KAFKA_SASL_PASSWORD for the principal that program connects as:
 * tally-aggregator as aggregator, tally-vmm and tally-collector as host-test
 * (the tests' one host principal; its group ACL covers every tally-vmm-<id>).
 * A test that sets TALLY_KAFKA_SETTINGS itself keeps it. Returns NULL when
 * the program gets the test's environment unchanged, else a malloc'd array
 * (its first two strings malloc'd, the rest borrowed from environ). */
char **test_kafka_environ(const char *program);
/* Frees what test_kafka_environ returned (NULL is fine). */
void test_kafka_environ_free(char **env);

/* GET /metrics of a daemon on 127.0.0.1:port: the whole answer, headers and
 * body (malloc'd), or NULL when nothing answered. */
char *test_get_metrics(int port);
/* The value of the sample whose name and labels are exactly series (for
 * example `tally_vmm_sandboxes{state="running"}`) in page, as an integer in
 * base units: a value written as seconds with a fraction ("0.300125") is
 * returned in microseconds. -1 when the page has no such sample. */
int64_t test_metric(const char *page, const char *series, bool seconds);
