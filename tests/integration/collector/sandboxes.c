/* sandboxes.c — see sandboxes.h. */
#include "sandboxes.h"
#include "kafka.h"
#include "support.h"
#include "timeutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The host's cgroup mounts, read once (test_cgroup_layout): v1's cpuacct and
 * memory hierarchies where they are mounted, and the cgroup2 tree
 * (/sys/fs/cgroup/unified on a hybrid host, /sys/fs/cgroup on a pure v2 one). */
static struct test_cgroup_layout layout;
static bool layout_read;

static const struct test_cgroup_layout *host_layout(void)
{
        if (!layout_read) {
                if (test_cgroup_layout(&layout) < 0) {
                        fprintf(stderr, "FAIL: this host mounts no cgroups the collector reads\n");
                        exit(1);
                }
                /* TALLY_TEST_CGROUP_LAYOUT=v2: every sandbox in the cgroup2 tree, as on a
                 * pure v2 host (a hybrid host's tree has no cpu or memory controller:
                 * the CPU counter is there, memory is not). */
                const char *force = getenv("TALLY_TEST_CGROUP_LAYOUT");
                if (force && strcmp(force, "v2") == 0) {
                        if (!layout.v2[0]) {
                                fprintf(stderr, "FAIL: TALLY_TEST_CGROUP_LAYOUT=v2 on a host without cgroup2\n");
                                exit(1);
                        }
                        layout.v1 = false;
                        layout.v1_cpuacct[0] = layout.v1_memory[0] = '\0';
                }
                layout_read = true;
        }
        return &layout;
}

void msleep(int ms)
{
        struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
}

static void die(const char *what, const char *path)
{
        fprintf(stderr, "FAIL: %s %s: %s (the collector's tests need root and cgroups)\n", what, path,
                strerror(errno));
        exit(1);
}

static void parent_path(char *buf, size_t size, const char *root)
{
        snprintf(buf, size, "%s/tally-collector-test-%d", root, (int)getpid());
}

static void ensure_dir(const char *path)
{
        if (mkdir(path, 0755) < 0 && errno != EEXIST)
                die("could not create cgroup", path);
}

static void write_str(const char *path, const char *text)
{
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, text, strlen(text)) < 0)
                die("could not write", path);
        close(fd);
}

int tsb_version(int want)
{
        const struct test_cgroup_layout *l = host_layout();
        if (want == 1 && !l->v1)
                return 2;
        if (want == 2 && !l->v2[0])
                return 1;
        return want;
}

void tsb_cgroup_parent_remove(void)
{
        const struct test_cgroup_layout *l = host_layout();
        const char *roots[] = { l->v1_cpuacct, l->v1_memory, l->v2 };
        for (size_t i = 0; i < 3; i++) {
                char p[512];
                if (!roots[i][0])
                        continue;
                parent_path(p, sizeof(p), roots[i]);
                rmdir(p);
        }
}

static void cgroup_dir(char *buf, size_t size, const char *root, const char *id)
{
        char parent[400], ctl[450];
        parent_path(parent, sizeof(parent), root);
        ensure_dir(parent);
        if (root == host_layout()->v2 && (layout.v2_cpu || layout.v2_memory)) {
                /* A v2 tree with controllers (a pure v2 host): the sandboxes get
                 * memory (memory.current, memory.peak) as the vmm's do. */
                const char *dirs[] = { root, parent };
                for (size_t i = 0; i < 2; i++) {
                        snprintf(ctl, sizeof(ctl), "%s/cgroup.subtree_control", dirs[i]);
                        if (layout.v2_cpu)
                                write_file(ctl, "+cpu");
                        if (layout.v2_memory)
                                write_file(ctl, "+memory");
                }
        }
        snprintf(buf, size, "%.256s/%.64s", parent, id);
}

/* Burns ms of this process's CPU time from now on. */
static void burn(int ms)
{
        struct timespec ts;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        int64_t until = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (int64_t)ms * 1000000;
        volatile uint64_t x = 0;
        for (;;) {
                for (int i = 0; i < 100000; i++)
                        x += (uint64_t)i;
                clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
                if ((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec >= until)
                        return;
        }
}

void tsb_create(struct test_sandbox *sb, const char *state_dir, const char *id, const char *account, int version,
                int burn_ms)
{
        memset(sb, 0, sizeof(*sb));
        const struct test_cgroup_layout *l = host_layout();
        version = tsb_version(version);
        sb->version = version;
        if (version == 1) {
                cgroup_dir(sb->cpu_dir, sizeof(sb->cpu_dir), l->v1_cpuacct, id);
                cgroup_dir(sb->mem_dir, sizeof(sb->mem_dir), l->v1_memory, id);
                ensure_dir(sb->cpu_dir);
                ensure_dir(sb->mem_dir);
        } else {
                cgroup_dir(sb->cpu_dir, sizeof(sb->cpu_dir), l->v2, id);
                ensure_dir(sb->cpu_dir);
                snprintf(sb->mem_dir, sizeof(sb->mem_dir), "%s", sb->cpu_dir);
        }
        int ready[2];
        if (pipe(ready) < 0)
                abort();
        pid_t pid = fork();
        if (pid == 0) {
                close(ready[0]);
                char procs[600];
                snprintf(procs, sizeof(procs), "%s/cgroup.procs", sb->cpu_dir);
                write_str(procs, "0");
                if (version == 1) {
                        snprintf(procs, sizeof(procs), "%s/cgroup.procs", sb->mem_dir);
                        write_str(procs, "0");
                }
                /* Counted from joining: the cgroup sees everything from here on. */
                burn(burn_ms);
                if (write(ready[1], "x", 1) < 0)
                        _exit(1);
                for (;;)
                        pause();
        }
        close(ready[1]);
        char x;
        if (read(ready[0], &x, 1) != 1) {
                fprintf(stderr, "FAIL: burner for %s died\n", id);
                exit(1);
        }
        close(ready[0]);
        sb->child = pid;

        struct sandbox_record *r = &sb->rec;
        snprintf(r->id, sizeof(r->id), "%s", id);
        snprintf(r->account, sizeof(r->account), "%s", account);
        snprintf(r->key, sizeof(r->key), "key_%s", account);
        snprintf(r->host, sizeof(r->host), "testhost");
        snprintf(r->backend, sizeof(r->backend), "process");
        r->state = STATE_RUNNING;
        r->vcpus = 2;
        r->mem_size_bytes = UINT64_C(4) << 30;
        r->epoch = 1;
        /* Held time as the vmm keeps it: running from this moment, on the boot clock. */
        time_now3(&sb->created_wall, &sb->created_mono, &sb->created_boot);
        r->created_ns = sb->created_wall;
        r->running_ns = r->paused_ns = 0;
        r->state_since_boot_ns = sb->created_boot;
        r->cgroup_version = version;
        snprintf(r->cgroup_cpu, sizeof(r->cgroup_cpu), "%s", sb->cpu_dir);
        snprintf(r->cgroup_memory, sizeof(r->cgroup_memory), "%s", sb->mem_dir);
        r->pid = pid;
        int rc = registry_write(state_dir, r);
        CHECK(rc == 0, "registry_write %s: %s", id, strerror(-rc));
}

uint64_t tsb_read_cpu(const struct test_sandbox *sb)
{
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", sb->cpu_dir, sb->version == 1 ? "cpuacct.usage" : "cpu.stat");
        char *text = test_read_file(path);
        if (!text)
                die("could not read", path);
        uint64_t v = 0;
        if (sb->version == 1) {
                v = strtoull(text, NULL, 10);
        } else {
                const char *p = strstr(text, "usage_usec ");
                v = p ? strtoull(p + 11, NULL, 10) * 1000 : 0;
        }
        free(text);
        return v;
}

void tsb_stop(struct test_sandbox *sb, const char *state_dir)
{
        if (sb->child > 0) {
                kill(sb->child, SIGKILL);
                waitpid(sb->child, NULL, 0);
                sb->child = 0;
        }
        time_now3(&sb->stopped_wall, NULL, &sb->stopped_boot);
        /* By hand, not with registry_set_state: the time in the state it leaves goes to that state's total. */
        if (sb->rec.state == STATE_PAUSED)
                sb->rec.paused_ns += (uint64_t)(sb->stopped_boot - sb->rec.state_since_boot_ns);
        else
                sb->rec.running_ns += (uint64_t)(sb->stopped_boot - sb->rec.state_since_boot_ns);
        sb->rec.state_since_boot_ns = sb->stopped_boot;
        sb->rec.state = STATE_STOPPED;
        sb->rec.final_cpu_ns = 0; /* the collector measures it from the cgroup */
        int rc = registry_write(state_dir, &sb->rec);
        CHECK(rc == 0, "registry_write stopped %s: %s", sb->rec.id, strerror(-rc));
        sb->stopped = true;
}

bool tsb_final_marked(const struct test_sandbox *sb, const char *state_dir)
{
        char path[1024];
        snprintf(path, sizeof(path), "%s/" REGISTRY_DIR "/%s.final", state_dir, sb->rec.id);
        return access(path, F_OK) == 0;
}

void tsb_remove(struct test_sandbox *sb, const char *state_dir)
{
        if (sb->child > 0) {
                kill(sb->child, SIGKILL);
                waitpid(sb->child, NULL, 0);
                sb->child = 0;
        }
        if (access(sb->cpu_dir, F_OK) == 0)
                sb->truth_cpu_ns = tsb_read_cpu(sb);
        registry_remove(state_dir, sb->rec.id);
        rmdir(sb->cpu_dir);
        if (sb->version == 1)
                rmdir(sb->mem_dir);
        free(sb->rec.labels); /* the ids stay: tests look up what was published */
        sb->rec.labels = NULL;
        sb->rec.nlabels = 0;
        sb->removed = true;
}

struct announced {
        char sandbox[EVENT_ID_MAX + 1];
        uint64_t epoch, order;
        char reason[EVENT_REASON_MAX + 1];
};

struct consumer {
        rd_kafka_t *rk;
        struct published *items;
        size_t n, cap;
        struct announced *restarts;
        size_t nrestarts, caprestarts;
        uint64_t order;
};

struct consumer *consumer_new(const char *brokers)
{
        static int counter;
        char group[64], err[512];
        snprintf(group, sizeof(group), "collector-test-%d-%d", (int)getpid(), counter++);
        struct consumer *c = calloc(1, sizeof(*c));
        c->rk = kafka_consumer_new(brokers, group, test_kafka_conf(NULL), NULL, err, sizeof(err));
        if (!c->rk) {
                fprintf(stderr, "FAIL: consumer: %s\n", err);
                exit(1);
        }
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, TOPIC_USAGE, RD_KAFKA_PARTITION_UA);
        rd_kafka_subscribe(c->rk, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        return c;
}

void consumer_poll(struct consumer *c, const char *prefix, int ms)
{
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        for (;;) {
                clock_gettime(CLOCK_MONOTONIC, &now);
                int elapsed = (int)((now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000);
                if (elapsed >= ms)
                        return;
                rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, ms - elapsed < 100 ? ms - elapsed : 100);
                if (!m)
                        continue;
                if (!m->err) {
                        struct usage_event ev = { 0 };
                        char why[256];
                        int r = event_decode(m->payload, m->len, &ev, why, sizeof(why));
                        if (r == 0 && ev.type == EVENT_SAMPLE && strncmp(ev.sandbox, prefix, strlen(prefix)) == 0) {
                                CHECK(m->key_len == strlen(ev.account) && memcmp(m->key, ev.account, m->key_len) == 0,
                                      "sample of %s is not keyed by its account", ev.sandbox);
                                if (c->n == c->cap) {
                                        c->cap = c->cap ? c->cap * 2 : 256;
                                        c->items = realloc(c->items, c->cap * sizeof(*c->items));
                                }
                                struct published *p = &c->items[c->n++];
                                memcpy(p->sandbox, ev.sandbox, sizeof(p->sandbox));
                                p->epoch = ev.epoch;
                                p->seq = ev.seq;
                                p->cpu_ns = ev.cpu_ns;
                                p->wall_ns = ev.wall_ns;
                                p->mono_ns = ev.mono_ns;
                                p->held_known = ev.held_known;
                                p->running_ns = ev.running_ns;
                                p->paused_ns = ev.paused_ns;
                                p->state = ev.state;
                                p->final = ev.final;
                                p->mem_bytes = ev.mem_bytes;
                                p->mem_peak_bytes = ev.mem_peak_bytes;
                                p->order = c->order++;
                        } else if (r == 0 && ev.type == EVENT_RESTARTED && strncmp(ev.sandbox, prefix, strlen(prefix)) == 0) {
                                if (c->nrestarts == c->caprestarts) {
                                        c->caprestarts = c->caprestarts ? c->caprestarts * 2 : 16;
                                        c->restarts = realloc(c->restarts, c->caprestarts * sizeof(*c->restarts));
                                }
                                struct announced *a = &c->restarts[c->nrestarts++];
                                memcpy(a->sandbox, ev.sandbox, sizeof(a->sandbox));
                                memcpy(a->reason, ev.reason, sizeof(a->reason));
                                a->epoch = ev.epoch;
                                a->order = c->order++;
                        } else if (r < 0 && strstr((const char *)m->payload, prefix)) {
                                CHECK(0, "a message the collector published does not decode: %s", why);
                        }
                        event_clear(&ev);
                }
                rd_kafka_message_destroy(m);
        }
}

bool published_restart(struct consumer *c, const char *sandbox, uint64_t epoch, char *reason, size_t size,
                       uint64_t *ret_order)
{
        for (size_t i = 0; i < c->nrestarts; i++)
                if (strcmp(c->restarts[i].sandbox, sandbox) == 0 && c->restarts[i].epoch == epoch) {
                        snprintf(reason, size, "%s", c->restarts[i].reason);
                        *ret_order = c->restarts[i].order;
                        return true;
                }
        return false;
}

const struct published *consumer_items(struct consumer *c, size_t *ret_n)
{
        *ret_n = c->n;
        return c->items;
}

int published_finals(struct consumer *c, const char *sandbox, uint64_t *ret_cpu_ns)
{
        int finals = 0;
        for (size_t i = 0; i < c->n; i++)
                if (c->items[i].final && strcmp(c->items[i].sandbox, sandbox) == 0) {
                        finals++;
                        *ret_cpu_ns = c->items[i].cpu_ns;
                }
        return finals;
}

void consumer_free(struct consumer *c)
{
        if (!c)
                return;
        rd_kafka_consumer_close(c->rk);
        rd_kafka_destroy(c->rk);
        free(c->items);
        free(c->restarts);
        free(c);
}

pid_t collector_start(const char *state_dir, const char *brokers, const char *log_path, const char *const *extra)
{
        char *argv[32];
        int n = 0;
        argv[n++] = (char *)test_env("TALLY_COLLECTOR_BIN");
        argv[n++] = "--kafka-brokers";
        argv[n++] = (char *)brokers;
        argv[n++] = "--state-dir";
        argv[n++] = (char *)state_dir;
        argv[n++] = "--log-level";
        argv[n++] = "debug";
        for (; extra && *extra && n < 30; extra++)
                argv[n++] = (char *)*extra;
        argv[n] = NULL;
        return test_spawn(argv, NULL, log_path);
}

int collector_stop(pid_t pid)
{
        kill(pid, SIGTERM);
        int st = 0;
        waitpid(pid, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void private_broker_start(struct private_broker *b, const char *dir)
{
        char file[512], log[512];
        snprintf(file, sizeof(file), "%s/broker.bootstrap", dir);
        snprintf(b->sock, sizeof(b->sock), "%s/broker.sock", dir);
        snprintf(log, sizeof(log), "%s/broker.log", dir);
        char *argv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--port", "0", "--partitions", "3",
                         "--bootstrap-file", file, "--control-socket", b->sock, NULL };
        b->pid = test_spawn(argv, NULL, log);
        if (test_wait_file(file, 10000) < 0) {
                fprintf(stderr, "FAIL: private broker did not start (log %s)\n", log);
                exit(1);
        }
        char *s = test_read_file(file);
        snprintf(b->bootstrap, sizeof(b->bootstrap), "%s", s);
        free(s);
}

void private_broker_ctl(struct private_broker *b, const char *cmd)
{
        char *out = NULL;
        char *argv[] = { (char *)test_env("TALLY_BROKER_BIN"), "--control-socket", b->sock, "ctl", (char *)cmd, NULL };
        int rc = test_run(argv, &out, NULL);
        CHECK(rc == 0 && out && strncmp(out, "ok", 2) == 0, "broker ctl %s: rc=%d reply=%s", cmd, rc, out ? out : "");
        free(out);
}

void private_broker_stop(struct private_broker *b)
{
        kill(b->pid, SIGTERM);
        waitpid(b->pid, NULL, 0);
}

char *http_get_metrics(int port)
{
        return test_get_metrics(port);
}

uint64_t metric_value(const char *metrics, const char *name)
{
        char key[96];
        snprintf(key, sizeof(key), "\ntally_collector_%s ", name);
        const char *at = metrics ? strstr(metrics, key) : NULL;
        return at ? strtoull(at + strlen(key), NULL, 10) : 0;
}

bool write_file(const char *path, const char *text)
{
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
                return false;
        bool ok = write(fd, text, strlen(text)) == (ssize_t)strlen(text);
        close(fd);
        return ok;
}

