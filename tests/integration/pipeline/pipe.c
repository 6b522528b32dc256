/* pipe.c — see pipe.h. */
#include "pipe.h"

#include "kafka.h"
#include "support.h"
#include "timeutil.h"

#include <curl/curl.h>
#include <dirent.h>
#include <ftw.h>
#include <errno.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

char *pipe_query(struct pipeline *p, const char *sql)
{
        PGconn *c = PQconnectdb(p->db_url);
        PGresult *r = PQexec(c, sql);
        char *v = NULL;
        if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
                v = strdup(PQgetvalue(r, 0, 0));
        else if (PQresultStatus(r) != PGRES_TUPLES_OK)
                CHECK(0, "%s: %s", sql, PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
        return v;
}

void pipe_exec_sql(struct pipeline *p, const char *sql)
{
        PGconn *c = PQconnectdb(p->db_url);
        PGresult *r = PQexec(c, sql);
        CHECK(PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK, "%s: %s", sql,
              PQerrorMessage(c));
        PQclear(r);
        PQfinish(c);
}

static pid_t spawn_logged(struct pipeline *p, const char *name, char *const argv[])
{
        char log[700];
        snprintf(log, sizeof(log), "%s/%s.log", p->state_dir, name);
        return test_spawn(argv, NULL, log);
}

void pipe_daemon_stop(pid_t pid)
{
        if (pid <= 0)
                return;
        kill(pid, SIGTERM);
        for (int i = 0; i < 100; i++) {
                if (waitpid(pid, NULL, WNOHANG) == pid)
                        return;
                test_sleep_ms(100);
        }
        CHECK(0, "pid %d did not stop within 10 s of SIGTERM", (int)pid);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
}

void pipe_collector_start(struct pipeline *p)
{
        char tick[16], name[32];
        snprintf(tick, sizeof(tick), "%d", p->tick_ms);
        snprintf(name, sizeof(name), "collector.%d", p->collectors++);
        char *argv[16] = { (char *)test_env("TALLY_COLLECTOR_BIN"), "--state-dir", p->state_dir, "--kafka-brokers",
                           p->brokers, "--tick-ms", tick, "--metrics-port", "0" };
        int n = 9;
        if (*p->host_id) {
                argv[n++] = "--host-id";
                argv[n++] = p->host_id;
        }
        if (p->collector_format) {
                argv[n++] = "--usage-format";
                argv[n++] = (char *)p->collector_format;
        }
        argv[n] = NULL;
        p->collector = spawn_logged(p, name, argv);
}

/* Starts p's tally-vmm on p's state folder, cgroup parent, broker and database. */
static void vmm_start(struct pipeline *p, const char *const *vmm_extra)
{
        const char *vmmd[40] = { test_env("TALLY_VMM_BIN"), "--state-dir", p->state_dir, "--kafka-brokers", p->brokers,
                                 "--cgroup-parent", p->cgroup_parent, "--backend", "process",
                                 "--limits-database-url", p->db_url };
        int n = 11;
        if (*p->host_id) {
                vmmd[n++] = "--host-id";
                vmmd[n++] = p->host_id;
        }
        for (; vmm_extra && *vmm_extra && n < 39; vmm_extra++)
                vmmd[n++] = *vmm_extra;
        vmmd[n] = NULL;
        p->vmm = spawn_logged(p, "vmm", (char *const *)vmmd);
}

static void wait_vmm_socket(struct pipeline *p)
{
        if (test_wait_file(p->sock, 15000) < 0 && access(p->sock, F_OK) != 0) {
                fprintf(stderr, "FAIL: tally-vmm did not open its socket %s\n", p->sock);
                exit(1);
        }
}

void pipe_start(struct pipeline *p, const char *name, int tick_ms, const char *const *vmm_extra)
{
        struct pipe_options o = { .vmm_extra = vmm_extra };
        pipe_start_with(p, name, tick_ms, &o);
}

void pipe_start_with(struct pipeline *p, const char *name, int tick_ms, const struct pipe_options *o)
{
        memset(p, 0, sizeof(*p));
        p->tick_ms = tick_ms;
        if (o->host_id)
                snprintf(p->host_id, sizeof(p->host_id), "%s", o->host_id);
        curl_global_init(CURL_GLOBAL_DEFAULT);
        p->dir = test_tmpdir(name);
        snprintf(p->state_dir, sizeof(p->state_dir), "%s/state", p->dir);
        snprintf(p->sock, sizeof(p->sock), "%s/vmm.sock", p->state_dir);
        snprintf(p->cgroup_parent, sizeof(p->cgroup_parent), "tally-test-%s-%d", name, (int)getpid());
        mkdir(p->state_dir, 0755);
        p->db_url = test_db_create(name);
        char *migrate[] = { (char *)test_env("TALLY_MIGRATE_BIN"), "--database-url", p->db_url, NULL };
        char *err = NULL;
        if (test_run(migrate, NULL, &err) != 0) {
                fprintf(stderr, "FAIL: tally-migrate: %s\n", err);
                exit(1);
        }
        free(err);
        pipe_exec_sql(p, "INSERT INTO accounts (id, name) VALUES ('acct_pipe', 'pipeline');"
                         "INSERT INTO api_keys (id, account_id, key_hash) VALUES ('key_free', 'acct_pipe', sha256('key_free'))");

        /* The development broker, or Apache Kafka under TALLY_TEST_KAFKA=apache. */
        test_kafka_start(&p->kafka, p->dir, 2, 1);
        p->broker = p->kafka.pid;
        snprintf(p->brokers, sizeof(p->brokers), "%s", p->kafka.bootstrap);

        const char *aggregator[40] = { test_env("TALLY_AGGREGATOR_BIN"), "--database-url", p->db_url,
                                       "--kafka-brokers", p->brokers, "--batch-ms", "100" };
        int n = 7;
        for (const char *const *a = o->aggregator_extra; a && *a && n < 39; a++)
                aggregator[n++] = *a;
        aggregator[n] = NULL;
        vmm_start(p, o->vmm_extra);
        pipe_collector_start(p);
        p->aggregator = spawn_logged(p, "aggregator", (char *const *)aggregator);
        wait_vmm_socket(p);
        /* The consumers join their groups (the aggregator's assignment is logged). */
        char agglog[700];
        snprintf(agglog, sizeof(agglog), "%s/aggregator.log", p->state_dir);
        bool assigned = false;
        for (int i = 0; i < 300 && !assigned; i++) {
                char *l = test_read_file(agglog);
                assigned = l && strstr(l, "partition assigned");
                free(l);
                if (!assigned)
                        test_sleep_ms(50);
        }
        if (!assigned) {
                fprintf(stderr, "FAIL: the aggregator was not assigned its partitions within 15 s\n");
                exit(1);
        }
}

static void tail_log(struct pipeline *p, const char *name)
{
        char path[700];
        snprintf(path, sizeof(path), "%s/%s.log", p->state_dir, name);
        char *l = test_read_file(path);
        if (!l)
                return;
        size_t n = strlen(l);
        fprintf(stderr, "---- %s log (tail)\n%s\n", name, n > 4000 ? l + n - 4000 : l);
        free(l);
}

void pipe_add_host(struct pipeline *base, struct pipeline *h, const char *host_id, const char *const *vmm_extra)
{
        memset(h, 0, sizeof(*h));
        h->shares = true;
        h->tick_ms = base->tick_ms;
        h->collector_format = base->collector_format;
        snprintf(h->host_id, sizeof(h->host_id), "%s", host_id);
        h->dir = test_tmpdir(host_id);
        snprintf(h->state_dir, sizeof(h->state_dir), "%s/state", h->dir);
        snprintf(h->sock, sizeof(h->sock), "%s/vmm.sock", h->state_dir);
        snprintf(h->cgroup_parent, sizeof(h->cgroup_parent), "%.60s-%.60s", base->cgroup_parent, host_id);
        snprintf(h->brokers, sizeof(h->brokers), "%s", base->brokers);
        mkdir(h->state_dir, 0755);
        h->db_url = base->db_url;
        vmm_start(h, vmm_extra);
        pipe_collector_start(h);
        wait_vmm_socket(h);
}

int pipe_finish(struct pipeline *p)
{
        if (!p->dir) /* never started, or finished already */
                return test_result();
        pipe_daemon_stop(p->aggregator);
        pipe_daemon_stop(p->collector);
        pipe_daemon_stop(p->vmm);
        p->aggregator = p->collector = p->vmm = 0;
        if (!p->shares)
                test_kafka_stop(&p->kafka);
        if (test_failures) {
                if (*p->host_id)
                        fprintf(stderr, "---- host %s\n", p->host_id);
                tail_log(p, "vmm");
                for (int i = 0; i < p->collectors; i++) {
                        char name[32];
                        snprintf(name, sizeof(name), "collector.%d", i);
                        tail_log(p, name);
                }
                if (!p->shares)
                        tail_log(p, "aggregator");
        }
        /* Whatever is left (a failed run) goes with its processes. */
        test_cgroup_remove(p->cgroup_parent, 0);
        if (!p->shares) {
                test_db_drop(p->db_url);
                curl_global_cleanup();
        }
        p->db_url = NULL;
        free(p->dir);
        p->dir = NULL;
        return test_result();
}

/* ---- the local API ---- */

struct buf {
        char *p;
        size_t n;
};

static size_t on_data(char *d, size_t size, size_t nmemb, void *u)
{
        struct buf *b = u;
        size_t len = size * nmemb;
        char *q = realloc(b->p, b->n + len + 1);
        if (!q)
                return 0;
        memcpy(q + b->n, d, len);
        b->p = q;
        b->n += len;
        b->p[b->n] = '\0';
        return len;
}

json_t *pipe_api(struct pipeline *p, const char *method, const char *path, const char *body, struct call *c)
{
        struct call local;
        if (!c)
                c = &local;
        CURL *h = curl_easy_init();
        struct buf b = { 0 };
        char url[512];
        snprintf(url, sizeof(url), "http://localhost%s", path);
        struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, p->sock);
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
        if (body)
                curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        c->start = time_boot_ns();
        CURLcode e = curl_easy_perform(h);
        c->end = time_boot_ns();
        c->status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
        curl_slist_free_all(headers);
        curl_easy_cleanup(h);
        CHECK(e == CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(e));
        json_t *j = b.p ? json_loads(b.p, 0, NULL) : NULL;
        if (c->status / 100 != 2)
                fprintf(stderr, "%s %s: HTTP %ld: %s\n", method, path, c->status, b.p ? b.p : "");
        free(b.p);
        return j;
}

char *pipe_http_get(const char *url, long *ret_status)
{
        CURL *h = curl_easy_init();
        struct buf b = { 0 };
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
        curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
        CURLcode e = curl_easy_perform(h);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(h);
        if (e != CURLE_OK) {
                free(b.p);
                return NULL;
        }
        if (ret_status)
                *ret_status = status;
        return b.p ? b.p : strdup("");
}

int pipe_create(struct pipeline *p, struct sb *s, const char *body)
{
        memset(s, 0, sizeof(*s));
        json_t *j = pipe_api(p, "POST", "/v1/sandboxes", body, &s->create);
        const char *id = j ? json_string_value(json_object_get(j, "id")) : NULL;
        const char *cg = j ? json_string_value(json_object_get(j, "cgroup_cpu")) : NULL;
        CHECK(s->create.status == 201 && id && cg, "create %s: HTTP %ld", body, s->create.status);
        if (id && cg) {
                snprintf(s->id, sizeof(s->id), "%s", id);
                snprintf(s->cpu_dir, sizeof(s->cpu_dir), "%s", cg);
        }
        json_decref(j);
        return id && cg ? 0 : -1;
}

int pipe_exec(struct pipeline *p, const struct sb *s, const char *const *argv)
{
        json_t *cmd = json_array();
        for (; *argv; argv++)
                json_array_append_new(cmd, json_string(*argv));
        json_t *req = json_pack("{s:o, s:i}", "command", cmd, "timeout_ms", 60000);
        char *body = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        char path[200];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", s->id);
        struct call c;
        json_t *j = pipe_api(p, "POST", path, body, &c);
        free(body);
        json_t *code = j ? json_object_get(j, "exit_code") : NULL;
        int rc = json_is_integer(code) ? (int)json_integer_value(code) : -1;
        CHECK(c.status == 200 && rc >= 0, "exec in %s: HTTP %ld", s->id, c.status);
        json_decref(j);
        return rc;
}

int pipe_action(struct pipeline *p, const struct sb *s, const char *action, struct call *c)
{
        char path[200];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/%s", s->id, action);
        struct call local;
        if (!c)
                c = &local;
        json_decref(pipe_api(p, "POST", path, "{}", c));
        CHECK(c->status == 200, "%s of %s: HTTP %ld", action, s->id, c->status);
        return c->status == 200 ? 0 : -1;
}

/* ---- the kernel's counters ---- */

int64_t pipe_cgroup_cpu_ns(const char *cpu_dir)
{
        char path[700];
        snprintf(path, sizeof(path), "%s/cpuacct.usage", cpu_dir);
        char *v = test_read_file(path);
        if (v) {
                int64_t ns = strtoll(v, NULL, 10);
                free(v);
                return ns;
        }
        snprintf(path, sizeof(path), "%s/cpu.stat", cpu_dir);
        if (!(v = test_read_file(path)))
                return -1;
        const char *u = strstr(v, "usage_usec ");
        int64_t ns = u ? strtoll(u + strlen("usage_usec "), NULL, 10) * 1000 : -1;
        free(v);
        return ns;
}

static int procs_in(const char *dir)
{
        char path[700];
        snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
        char *v = test_read_file(path);
        if (!v)
                return -1;
        int n = 0;
        for (char *q = v; *q; q++)
                n += *q == '\n';
        n += *v != '\0';
        free(v);
        return n;
}

int pipe_hold(struct sb *s)
{
        snprintf(s->hold, sizeof(s->hold), "%s/tally-test-hold", s->cpu_dir);
        int r = mkdir(s->hold, 0755);
        CHECK(r == 0, "could not make %s: %s", s->hold, strerror(errno));
        return r == 0 ? 0 : -1;
}

int pipe_stop_with_truth(struct pipeline *p, struct sb *s)
{
        if (!*s->hold && pipe_hold(s) < 0)
                return -1;
        int r = pipe_action(p, s, "stop", &s->stop);
        int t = pipe_read_truth(s);
        return r == 0 && t == 0 ? 0 : -1;
}

int pipe_read_truth(struct sb *s)
{
        /* The processes are gone once cgroup.procs is empty; a dying task is
         * charged its last slice before it leaves, so the counter then stays. */
        int left = -1;
        for (int i = 0; i < 500; i++) {
                if ((left = procs_in(s->cpu_dir)) == 0)
                        break;
                test_sleep_ms(10);
        }
        CHECK(left == 0, "sandbox %s: %d process(es) still in its cgroup 5 s after stop", s->id, left);
        int64_t a = pipe_cgroup_cpu_ns(s->cpu_dir);
        test_sleep_ms(20);
        int64_t b = pipe_cgroup_cpu_ns(s->cpu_dir);
        CHECK(a >= 0 && a == b, "sandbox %s: the CPU counter of a cgroup without processes moved: %" PRId64
              " then %" PRId64 " ns", s->id, a, b);
        s->truth_cpu_ns = (uint64_t)(b >= 0 ? b : 0);
        s->have_truth = left == 0 && a >= 0 && a == b;
        CHECK(rmdir(s->hold) == 0, "could not remove %s: %s", s->hold, strerror(errno));
        return s->have_truth ? 0 : -1;
}

/* ---- waiting for the pipeline ---- */

int pipe_wait_removed(struct pipeline *p, const char *id, int timeout_ms)
{
        char path[800];
        char spool[800];
        snprintf(path, sizeof(path), "%s/sandboxes/%s.json", p->state_dir, id);
        snprintf(spool, sizeof(spool), "%s/collector/spool/%s.json", p->state_dir, id);
        for (int waited = 0; waited <= timeout_ms; waited += 20) {
                if (access(path, F_OK) != 0 && access(spool, F_OK) != 0)
                        return 0;
                test_sleep_ms(20);
        }
        CHECK(0, "%d ms after its stop, sandbox %s's record is %s and the collector's final sample %s", timeout_ms, id,
              access(path, F_OK) == 0 ? "still there" : "gone",
              access(spool, F_OK) == 0 ? "not yet delivered" : "delivered (or never taken)");
        return -1;
}

static int64_t topic_end(struct pipeline *p)
{
        char err[512];
        rd_kafka_t *k = kafka_producer_new(p->brokers, test_kafka_conf(NULL), NULL, err, sizeof(err));
        if (!k) {
                CHECK(0, "producer: %s", err);
                return -1;
        }
        const struct rd_kafka_metadata *md;
        rd_kafka_topic_t *topic = rd_kafka_topic_new(k, TOPIC_USAGE, NULL);
        int64_t total = -1;
        if (rd_kafka_metadata(k, 0, topic, &md, 10000) == 0) {
                total = 0;
                for (int i = 0; i < md->topics[0].partition_cnt; i++) {
                        int64_t lo, hi;
                        if (rd_kafka_query_watermark_offsets(k, TOPIC_USAGE, md->topics[0].partitions[i].id, &lo, &hi,
                                                             10000) != 0) {
                                total = -1;
                                break;
                        }
                        total += hi;
                }
                rd_kafka_metadata_destroy(md);
        }
        rd_kafka_topic_destroy(topic);
        rd_kafka_destroy(k);
        return total;
}

int pipe_wait_caught_up(struct pipeline *p, int timeout_ms)
{
        int64_t end = topic_end(p), done = -1;
        for (int waited = 0; end >= 0 && waited <= timeout_ms; waited += 100) {
                char *v = pipe_query(p, "SELECT coalesce(sum(next_offset), 0)::text FROM consumer_offsets"
                                        " WHERE group_id = 'tally-aggregator' AND topic = 'usage'");
                done = v ? strtoll(v, NULL, 10) : -1;
                free(v);
                if (done >= end)
                        return 0;
                test_sleep_ms(100);
        }
        CHECK(0, "the aggregator committed %" PRId64 " of the usage topic's %" PRId64 " messages in %d ms", done, end,
              timeout_ms);
        return -1;
}

struct billed pipe_billed(struct pipeline *p, const char *id, uint64_t mem_size_bytes, uint64_t storage_bytes)
{
        struct billed b = { 0 };
        char sql[800];
        snprintf(sql, sizeof(sql),
                 "SELECT count(*) || ' ' || coalesce(sum(cpu_ns), 0) || ' ' || div(coalesce(sum(mem_byte_ns), 0), %" PRIu64
                 ") || ' ' || mod(coalesce(sum(mem_byte_ns), 0), %" PRIu64 ") || ' ' || div(coalesce(sum(storage_byte_ns), 0), %" PRIu64
                 ") || ' ' || mod(coalesce(sum(storage_byte_ns), 0), %" PRIu64 ") FROM usage_hourly WHERE sandbox_id = '%s'",
                 mem_size_bytes, mem_size_bytes, storage_bytes, storage_bytes, id);
        char *v = pipe_query(p, sql);
        long long rows = 0;
        if (v && sscanf(v, "%lld %" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64 " %" SCNd64, &rows, &b.cpu_ns, &b.mem_ns,
                        &b.mem_rem, &b.storage_ns, &b.storage_rem) == 6)
                b.found = rows > 0;
        free(v);
        return b;
}

static uint64_t blocks_total;
static int add_blocks(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
        (void)path, (void)ftw;
        if (type == FTW_F)
                blocks_total += (uint64_t)st->st_blocks * 512;
        return 0;
}

int64_t pipe_disk_bytes(struct pipeline *p, const char *id)
{
        char path[800];
        snprintf(path, sizeof(path), "%s/sandboxes/%s.json", p->state_dir, id);
        json_t *rec = json_load_file(path, 0, NULL);
        const char *disk = rec ? json_string_value(json_object_get(rec, "disk_path")) : NULL;
        struct stat st;
        int64_t bytes = -1;
        if (disk && *disk && lstat(disk, &st) == 0) {
                if (S_ISREG(st.st_mode))
                        bytes = (int64_t)st.st_blocks * 512;
                else if (S_ISDIR(st.st_mode)) {
                        blocks_total = 0;
                        bytes = nftw(disk, add_blocks, 16, FTW_PHYS) == 0 ? (int64_t)blocks_total : -1;
                }
        }
        CHECK(bytes >= 0, "could not measure sandbox %s's disk (%s)", id, disk ? disk : "no disk_path in its record");
        json_decref(rec);
        return bytes;
}
