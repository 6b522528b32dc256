/* vmm.c — see vmm.h.
 *
 * Locking: v->lock guards the list and every sandbox's record and flags; it is
 * never held across a backend call, a cgroup wait or a Kafka call that may
 * block. A sandbox's op mutex serialises its lifecycle changes (pause, resume,
 * stop, fork); exec takes a reference and runs beside them. */
#include "vmm.h"
#include "beneath.h"
#include "kafka.h"
#include "log.h"
#include "registry.h"
#include "timeutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SANDBOX_DIR   "vmm"        /* <state_dir>/vmm/<id>/: the sandbox's own folder */
#define FORK_MAX      10
#define FREEZE_WAIT_MS 5000
#define KILL_WAIT_MS   5000
#define RELEASE_WAIT_MS 2000 /* for a stopped sandbox's dying tasks to be released */
#define RECORD_TRIES   3           /* immediate attempts at a record write before the tick takes over */

/* A lifecycle moment (created, paused, resumed, stopped) on the three clocks:
 * wall for the event's wall_ns, mono for its mono_ns, boot for held time
 * (docs/events.md, "Held time"). */
struct moment {
        int64_t wall, mono, boot;
};

static struct moment moment_now(void)
{
        struct moment m;
        time_now3(&m.wall, &m.mono, &m.boot); /* one instant: a lease's end is worked out across them */
        return m;
}

/* Takes the registry's moment lock (registry.h) before a moment's clocks are
 * read; moment_end releases it once the record carrying the moment is renamed
 * into place. Then no collector tick stamped after the moment can miss its
 * record, and none extrapolates the old state past it (docs/registry.md,
 * "Moments and ticks"). Never held across a backend call or a wait for the
 * sandbox: only the clock read, the record's write and what lies between.
 * A lock not had within REGISTRY_MOMENT_WAIT_MS (a wedged collector holding
 * it) is logged and the moment goes on without: the vmm never stops for it. */
static int moment_begin(const char *state_dir, const char *id)
{
        int64_t asked = time_mono_ns();
        int fd = registry_moment_begin(state_dir, REGISTRY_MOMENT_WAIT_MS);
        int64_t waited_ms = (time_mono_ns() - asked) / NS_PER_MS;
        if (fd < 0)
                log_warn("could not take the registry's moment lock: a collector tick may run past this moment "
                         "until it reads the record", "sandbox=%s error=\"%s\"", id, strerror(-fd));
        else if (waited_ms >= 100)
                log_warn("waited for the registry's moment lock", "sandbox=%s waited_ms=%lld", id, (long long)waited_ms);
        return fd;
}

static void moment_end(int fd)
{
        registry_moment_end(fd);
}

/* The moment the record's current state began, seen from now (for a record a
 * previous run wrote); now itself if the boot clock says it was another boot. */
static struct moment moment_of_record(const struct sandbox_record *rec)
{
        struct moment m = moment_now();
        int64_t ago = m.boot - rec->state_since_boot_ns;
        if (rec->state_since_boot_ns <= 0 || ago < 0)
                return m;
        m.wall -= ago;
        m.mono -= ago;
        m.boot = rec->state_since_boot_ns;
        return m;
}

struct sandbox {
        struct sandbox *next;
        int refs;                        /* the list holds one; each caller one more */
        pthread_mutex_t op;              /* serialises lifecycle changes */
        pthread_mutex_t exec_lock;       /* for backends without concurrent exec */
        struct sandbox_record rec;       /* guarded by v->lock */
        const struct backend_ops *ops;
        struct backend_sandbox *bs;      /* NULL once stopped */
        struct sandbox_cgroup cg;
        char dir[PATH_MAX];
        struct net_policy net;           /* as asked for at create; forks keep it */
        struct egress *egress;           /* the proxy while it runs with internet, else NULL */
        int64_t remaining_ns;            /* while paused: what was left of the lease */
        uint32_t pids_max;               /* as asked for at create (0: the backend's default); forks keep it */
        struct moment moment;            /* the last lifecycle moment: its event's time */
        bool record_dirty;               /* the record on disk is behind rec: the tick retries */
        int pidfd;                       /* the main process's pidfd (-1: none): readable once it ended */
        bool stop_published;             /* the stopped event is with the producer */
        bool stop_acked;                 /* ... and the broker acknowledged it */
        int64_t stopped_mono;
        bool removed;                    /* no longer in the list */
};

struct vmm {
        struct vmm_settings s;           /* strings owned by the caller */
        struct cgroup_host cgroups;
        struct vmm_limits limits;
        const struct backend_ops *default_backend;
        const char *default_reason;
        pthread_mutex_t lock;
        struct sandbox *list;
        rd_kafka_t *producer;
        rd_kafka_t *consumer;
        pthread_t thread, control_thread;
        volatile bool quit;
        volatile int stopping;           /* set by vmm_begin_shutdown: running execs end */
        bool control_ready;
        pthread_mutex_t db_lock;
        PGconn *db;
        struct capacity capacity;
        struct capacity_use reserved;    /* creates and fork copies under way (under lock) */
};

/* ---- sandboxes ---- */

static void sandbox_unref(struct vmm *v, struct sandbox *sb)
{
        pthread_mutex_lock(&v->lock);
        bool last = --sb->refs == 0;
        pthread_mutex_unlock(&v->lock);
        if (!last)
                return;
        egress_close(sb->egress);
        if (sb->bs && sb->ops)
                sb->ops->free(sb->bs);
        sandbox_record_clear(&sb->rec);
        if (sb->pidfd >= 0)
                close(sb->pidfd);
        pthread_mutex_destroy(&sb->op);
        pthread_mutex_destroy(&sb->exec_lock);
        free(sb);
}

/* A reference to the sandbox id, or NULL. */
static struct sandbox *sandbox_get(struct vmm *v, const char *id)
{
        pthread_mutex_lock(&v->lock);
        struct sandbox *sb = v->list;
        while (sb && strcmp(sb->rec.id, id) != 0)
                sb = sb->next;
        if (sb)
                sb->refs++;
        pthread_mutex_unlock(&v->lock);
        return sb;
}

static struct sandbox *sandbox_new(void)
{
        struct sandbox *sb = calloc(1, sizeof(*sb));
        if (!sb)
                return NULL;
        sb->refs = 1;
        sb->pidfd = -1;
        pthread_mutex_init(&sb->op, NULL);
        pthread_mutex_init(&sb->exec_lock, NULL);
        return sb;
}

/* Watches the main process: the tick learns it ended within one turn (50 ms),
 * so a sandbox that ends on its own stops, and stops holding, then. Without a
 * pidfd the once-a-second look at /proc remains. */
static void watch_main(struct sandbox *sb)
{
        if (sb->pidfd < 0 && sb->rec.pid > 0)
                sb->pidfd = (int)syscall(SYS_pidfd_open, sb->rec.pid, 0);
}

static void sandbox_insert(struct vmm *v, struct sandbox *sb)
{
        pthread_mutex_lock(&v->lock);
        sb->next = v->list;
        v->list = sb;
        pthread_mutex_unlock(&v->lock);
}

static void sandbox_unlink(struct vmm *v, struct sandbox *sb)
{
        bool found = false;
        pthread_mutex_lock(&v->lock);
        for (struct sandbox **p = &v->list; *p; p = &(*p)->next)
                if (*p == sb) {
                        *p = sb->next;
                        sb->removed = true;
                        found = true;
                        break;
                }
        pthread_mutex_unlock(&v->lock);
        if (found)
                sandbox_unref(v, sb);
}

static int new_id(char *buf, size_t size)
{
        unsigned char b[8];
        if (RAND_bytes(b, sizeof(b)) != 1)
                return -EIO;
        snprintf(buf, size, "sbx-%02x%02x%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3], b[4], b[5], b[6],
                 b[7]);
        return 0;
}

/* The sandbox's folder may hold what a jailed QEMU made: removed by
 * descriptor, never following a link or leaving its file system. */
static void remove_tree(const char *path)
{
        int r = beneath_remove_tree(path);
        if (r < 0 && r != -ENOENT)
                log_warn("could not remove a sandbox's folder", "path=%s error=\"%s\"", path, strerror(-r));
}

static void sandbox_dir(const struct vmm *v, const char *id, char *buf, size_t size)
{
        snprintf(buf, size, "%s/" SANDBOX_DIR "/%s", v->s.state_dir, id);
}

/* The few spec fields the registry record does not hold, kept in the sandbox's
 * folder: the network policy (a restarted vmm keeps enforcing its allow-list,
 * a fork copies it) and pids_max. */
static int write_spec_file(const char *dir, const struct net_policy *net, uint32_t pids_max)
{
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/spec.json", dir);
        json_t *j = json_pack("{s:o, s:I}", "network", net_policy_json(net), "pids_max", (json_int_t)pids_max);
        int r = j && json_dump_file(j, path, 0) == 0 ? 0 : -EIO;
        json_decref(j);
        return r;
}

/* What spec.json kept of a sandbox's request (a restarted daemon forks with it).
 * A file that cannot be read or parsed gives loopback only: never more network. */
static void read_spec_file(const char *dir, struct net_policy *ret_net, uint32_t *ret_pids_max)
{
        char path[PATH_MAX + 16], why[256];
        snprintf(path, sizeof(path), "%s/spec.json", dir);
        json_t *j = json_load_file(path, 0, NULL);
        if (!j || net_policy_parse(json_object_get(j, "network"), ret_net, why, sizeof(why)) < 0)
                memset(ret_net, 0, sizeof(*ret_net));
        json_t *pids = j ? json_object_get(j, "pids_max") : NULL;
        *ret_pids_max = json_is_integer(pids) && json_integer_value(pids) > 0 &&
                                        json_integer_value(pids) <= UINT32_MAX
                                ? (uint32_t)json_integer_value(pids)
                                : 0;
        json_decref(j);
}

/* Starts the sandbox's egress proxy if it has internet (its init is pid). */
static int open_egress(struct vmm *v, struct sandbox *sb, pid_t pid, char *why, size_t whylen)
{
        if (!sb->net.internet || sb->egress)
                return 0;
        return egress_open(&v->s.egress, sb->rec.id, pid, sb->dir, &sb->net, &sb->egress, why, whylen);
}

/* ---- events ---- */

struct delivery {
        char id[EVENT_ID_MAX + 1];       /* set for a stopped event: who waits for the acknowledgement */
};

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
        struct vmm *v = opaque;
        struct delivery *d = m->_private;
        if (m->err)
                log_warn("could not deliver a lifecycle event", "error=\"%s\"", rd_kafka_err2str(m->err));
        if (!d)
                return;
        struct sandbox *sb = sandbox_get(v, d->id);
        if (sb) {
                pthread_mutex_lock(&v->lock);
                if (m->err)
                        sb->stop_published = false; /* the tick publishes it again */
                else
                        sb->stop_acked = true;
                pthread_mutex_unlock(&v->lock);
                sandbox_unref(v, sb);
        }
        free(d);
        (void)rk;
}

/* Fills the fields every lifecycle event of rec shares; its time is the moment m. */
static void event_from_record(struct usage_event *ev, enum event_type type, const struct sandbox_record *rec,
                              const struct moment *m)
{
        memset(ev, 0, sizeof(*ev));
        ev->type = type;
        snprintf(ev->host, sizeof(ev->host), "%s", rec->host);
        snprintf(ev->sandbox, sizeof(ev->sandbox), "%s", rec->id);
        snprintf(ev->account, sizeof(ev->account), "%s", rec->account);
        snprintf(ev->key, sizeof(ev->key), "%s", rec->key);
        ev->wall_ns = m->wall;
        ev->mono_ns = m->mono;
        ev->state = rec->state;
        ev->vcpus = rec->vcpus;
        ev->mem_size_bytes = rec->mem_size_bytes;
        ev->epoch = rec->epoch;
}

/* Queues ev keyed by its account. For a stopped event, the sandbox's
 * stop_acked is set when the broker acknowledges it. */
static int publish(struct vmm *v, const struct usage_event *ev, bool track_stop)
{
        /* Room for 32 labels at their longest, every byte escaped. */
        size_t size = 128 * 1024;
        char *buf = malloc(size);
        if (!buf)
                return -ENOMEM;
        int n = event_encode(ev, buf, size);
        if (n < 0) {
                free(buf);
                log_error("could not encode a lifecycle event", "sandbox=%s type=%s", ev->sandbox,
                          event_type_name(ev->type));
                return n;
        }
        struct delivery *d = NULL;
        if (track_stop) {
                if (!(d = calloc(1, sizeof(*d))))
                        return -ENOMEM;
                snprintf(d->id, sizeof(d->id), "%s", ev->sandbox);
        }
        for (int tries = 0;; tries++) {
                rd_kafka_resp_err_t e = rd_kafka_producev(
                        v->producer, RD_KAFKA_V_TOPIC(TOPIC_USAGE), RD_KAFKA_V_KEY(ev->account, strlen(ev->account)),
                        RD_KAFKA_V_VALUE(buf, (size_t)n), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                        RD_KAFKA_V_OPAQUE(d), RD_KAFKA_V_END);
                if (e == RD_KAFKA_RESP_ERR_NO_ERROR) {
                        free(buf);
                        return 0;
                }
                if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL || tries > 100) {
                        log_error("could not queue a lifecycle event", "sandbox=%s type=%s error=\"%s\"",
                                  ev->sandbox, event_type_name(ev->type), rd_kafka_err2str(e));
                        free(d);
                        free(buf);
                        return -EIO;
                }
                rd_kafka_poll(v->producer, 10);
        }
}

static void publish_simple(struct vmm *v, struct sandbox *sb, enum event_type type)
{
        struct usage_event ev;
        pthread_mutex_lock(&v->lock);
        event_from_record(&ev, type, &sb->rec, &sb->moment);
        pthread_mutex_unlock(&v->lock);
        publish(v, &ev, false);
}

static void publish_created(struct vmm *v, struct sandbox *sb)
{
        struct usage_event ev;
        pthread_mutex_lock(&v->lock);
        event_from_record(&ev, EVENT_CREATED, &sb->rec, &sb->moment);
        if (sb->rec.created_ns > 0)
                ev.wall_ns = sb->rec.created_ns; /* the created moment, also when published again */
        snprintf(ev.parent, sizeof(ev.parent), "%s", sb->rec.parent);
        snprintf(ev.backend, sizeof(ev.backend), "%s", sb->rec.backend);
        ev.disk_size_bytes = sb->rec.disk_size_bytes;
        for (size_t i = 0; i < sb->rec.nlabels; i++)
                event_add_label(&ev, sb->rec.labels[i].key, sb->rec.labels[i].value);
        pthread_mutex_unlock(&v->lock);
        publish(v, &ev, false);
        event_clear(&ev);
}

static void publish_stopped(struct vmm *v, struct sandbox *sb)
{
        struct usage_event ev;
        pthread_mutex_lock(&v->lock);
        event_from_record(&ev, EVENT_STOPPED, &sb->rec, &sb->moment);
        /* Everything the aggregator needs to close the bill without the
         * collector: the final counter, its epoch, and the final held totals. */
        ev.cpu_ns = sb->rec.final_cpu_ns;
        ev.final = true;
        ev.held_known = true;
        registry_held_at(&sb->rec, sb->moment.boot, &ev.running_ns, &ev.paused_ns);
        sb->stop_published = true;
        pthread_mutex_unlock(&v->lock);
        if (publish(v, &ev, true) < 0) {
                pthread_mutex_lock(&v->lock);
                sb->stop_published = false;
                pthread_mutex_unlock(&v->lock);
        }
}

/* ---- the spend-limit check ---- */

/* 0: the key may start sandboxes; -EACCES: blocked for today; -EAGAIN: unknown. */
static int check_key(struct vmm *v, const char *account, const char *key, char *why, size_t whylen)
{
        if (!v->s.limits_database_url || !*v->s.limits_database_url)
                return 0;
        int r = 0;
        pthread_mutex_lock(&v->db_lock);
        for (int attempt = 0; attempt < 2; attempt++) {
                if (!v->db || PQstatus(v->db) != CONNECTION_OK) {
                        PQfinish(v->db);
                        v->db = PQconnectdb(v->s.limits_database_url);
                        if (PQstatus(v->db) != CONNECTION_OK)
                                continue;
                }
                const char *params[2] = { account, key };
                PGresult *res = PQexecParams(v->db, v->s.blocked_key_query, 2, NULL, params, NULL, NULL, 0);
                ExecStatusType st = PQresultStatus(res);
                if (st == PGRES_TUPLES_OK) {
                        r = PQntuples(res) > 0 ? -EACCES : 0;
                        PQclear(res);
                        goto out;
                }
                log_warn("could not check the key's spend limit", "error=\"%s\"", PQresultErrorMessage(res));
                PQclear(res);
                if (PQstatus(v->db) == CONNECTION_OK) {
                        r = -EAGAIN;
                        snprintf(why, whylen, "could not check the key's spend limit (the query failed)");
                        goto out;
                }
        }
        r = -EAGAIN;
        snprintf(why, whylen, "could not check the key's spend limit: the limits database is unreachable");
out:
        pthread_mutex_unlock(&v->db_lock);
        if (r == -EACCES)
                snprintf(why, whylen, "key %s has reached its daily spend limit: no sandbox starts or resumes for it "
                         "today (UTC)", key);
        return r;
}

/* ---- records and leases ---- */

/* When a running sandbox found already ended (its main process gone) had
 * ended: at its lease's end if that has passed — its own init ended it then
 * (set_lease), also while no tally-vmm ran — else unknown (false: now). */
static bool lease_end_moment(const struct sandbox_record *rec, struct moment *ret)
{
        struct moment now = moment_now();
        int64_t past = now.wall - rec->timeout_ns;
        if (rec->state != STATE_RUNNING || rec->timeout_ns <= 0 || past <= 0 || rec->state_since_boot_ns <= 0 ||
            now.boot - past < rec->state_since_boot_ns)
                return false;
        *ret = (struct moment){ rec->timeout_ns, now.mono - past, now.boot - past };
        return true;
}

/* Writes sb's record (v->lock held), retrying at once a few times. A record
 * that still cannot be written is never left silently behind the sandbox: the
 * failure is logged at error, the sandbox is marked so the tick rewrites the
 * record every second until it succeeds (and its clean-up waits for that), and
 * the caller fails the request that changed it. Returns 0 or -errno. */
static int save_record(struct vmm *v, struct sandbox *sb)
{
        int r = 0;
        for (int i = 0; i < RECORD_TRIES; i++)
                if ((r = registry_write(v->s.state_dir, &sb->rec)) == 0)
                        break;
        if (r < 0 && !sb->record_dirty)
                log_error("could not write a sandbox's record; retrying every second", "sandbox=%s state=%s error=\"%s\"",
                          sb->rec.id, sandbox_state_name(sb->rec.state), strerror(-r));
        else if (r == 0 && sb->record_dirty)
                log_info("sandbox's record written after an earlier failure", "sandbox=%s state=%s", sb->rec.id,
                         sandbox_state_name(sb->rec.state));
        sb->record_dirty = r < 0;
        return r;
}

/* The error for a request whose change took effect but whose record could not
 * be written: -EIO whatever the write's errno (an EACCES must not read as "the
 * key is blocked"), with the write's reason in the sentence. */
static int record_failed(const struct sandbox *sb, int r, const char *done, char *why, size_t whylen)
{
        if (why)
                snprintf(why, whylen, "sandbox %s is %s, but its registry record could not be written (%s); "
                         "tally-vmm keeps retrying", sb->rec.id, done, strerror(-r));
        return -EIO;
}

/* Hands the sandbox's deadline to the backend, so the sandbox ends then even
 * with no tally-vmm running (0: no lease). Backends without the op rely on the
 * tick alone. Never called with v->lock held (it may talk to the sandbox). */
static int set_lease(struct sandbox *sb, int64_t deadline_wall_ns)
{
        if (!sb->ops->set_lease || !sb->bs)
                return 0;
        int r = sb->ops->set_lease(sb->bs, deadline_wall_ns);
        if (r < 0)
                log_error("could not set a sandbox's lease", "sandbox=%s deadline_ns=%lld error=\"%s\"", sb->rec.id,
                          (long long)deadline_wall_ns, strerror(-r));
        return r;
}

/* ---- lifecycle ---- */

/* The counters the egress proxy left in the sandbox's folder; 0 if none. */
static void read_net_counters(const char *dir, uint64_t *ret_rx, uint64_t *ret_tx)
{
        char path[PATH_MAX + 16];
        snprintf(path, sizeof(path), "%s/" SANDBOX_NET_FILE, dir);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        *ret_rx = *ret_tx = 0;
        if (fd >= 0) {
                sandbox_net_read(fd, ret_rx, ret_tx);
                close(fd);
        }
}

static json_t *describe(struct vmm *v, struct sandbox *sb)
{
        pthread_mutex_lock(&v->lock);
        const struct sandbox_record *r = &sb->rec;
        json_t *labels = json_object();
        for (size_t i = 0; i < r->nlabels; i++)
                json_object_set_new(labels, r->labels[i].key, json_string(r->labels[i].value));
        json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:o, s:i, s:s, s:s, "
                              "s:i, s:s, s:o}",
                              "id", r->id, "account", r->account, "key", r->key, "host", r->host, "backend",
                              r->backend, "state", sandbox_state_name(r->state), "vcpus", (json_int_t)r->vcpus,
                              "memory_mib", (json_int_t)(r->mem_size_bytes >> 20), "disk_mib",
                              (json_int_t)(r->disk_size_bytes >> 20), "created_ns", (json_int_t)r->created_ns,
                              "deadline_ns", (json_int_t)r->timeout_ns, "network", net_policy_json(&sb->net), "cgroup_version",
                              r->cgroup_version, "cgroup_cpu", r->cgroup_cpu, "cgroup_memory", r->cgroup_memory,
                              "pid", (int)r->pid, "dir", sb->dir, "labels", labels);
        if (*r->parent)
                json_object_set_new(j, "parent", json_string(r->parent));
        bool stopped = r->state == STATE_STOPPED;
        uint64_t final = r->final_cpu_ns, running, paused;
        registry_held_at(r, time_boot_ns(), &running, &paused);
        json_object_set_new(j, "running_ns", json_integer((json_int_t)running));
        json_object_set_new(j, "paused_ns", json_integer((json_int_t)paused));
        if (sb->record_dirty)
                json_object_set_new(j, "record_pending", json_true());
        uint64_t rx, tx;
        egress_counts(sb->egress, &rx, &tx);
        if (sb->net.internet && !sb->egress)
                read_net_counters(sb->dir, &rx, &tx); /* stopped: what the proxy counted in all */
        json_object_set_new(j, "net_rx_bytes", json_integer((json_int_t)rx));
        json_object_set_new(j, "net_tx_bytes", json_integer((json_int_t)tx));
        pthread_mutex_unlock(&v->lock);
        uint64_t cpu = final;
        if (stopped || cgroup_cpu_ns(&sb->cg, &cpu) == 0)
                json_object_set_new(j, "cpu_ns", json_integer((json_int_t)cpu));
        if (stopped)
                json_object_set_new(j, "final_cpu_ns", json_integer((json_int_t)final));
        return j;
}

/* ---- admission ---- */

/* Reserves what req asks of this host's capacity, or refuses it (-ENOSPC,
 * why names what is short). Promised = the live sandboxes' (memory and disk of
 * running and paused ones, vCPUs of running ones) + the reservations of
 * creates under way, so two creates at once cannot both take the last room.
 * The caller releases the reservation once the sandbox is in the list (or
 * failed). */
static int admit(struct vmm *v, const struct create_request *req, char *why, size_t whylen)
{
        int r = capacity_check_free(v->s.state_dir, req->disk_bytes, why, whylen);
        if (r < 0) {
                if (r != -ENOSPC)
                        snprintf(why, whylen, "could not read the free space for sandboxes' disks");
                return r;
        }
        struct capacity_use want = { req->mem_bytes, req->vcpus, req->disk_bytes };
        pthread_mutex_lock(&v->lock);
        struct capacity_use promised = v->reserved;
        for (struct sandbox *sb = v->list; sb; sb = sb->next) {
                if (sb->rec.state == STATE_STOPPED)
                        continue;
                promised.mem_bytes += sb->rec.mem_size_bytes;
                promised.disk_bytes += sb->rec.disk_size_bytes;
                if (sb->rec.state == STATE_RUNNING)
                        promised.vcpus += sb->rec.vcpus;
        }
        r = capacity_check(&v->capacity, &promised, &want, why, whylen);
        if (r == 0) {
                v->reserved.mem_bytes += want.mem_bytes;
                v->reserved.vcpus += want.vcpus;
                v->reserved.disk_bytes += want.disk_bytes;
        }
        pthread_mutex_unlock(&v->lock);
        if (r < 0)
                log_info("sandbox refused", "account=%s key=%s reason=\"%s\"", req->account, req->key, why);
        return r;
}

static void admit_release(struct vmm *v, const struct create_request *req)
{
        pthread_mutex_lock(&v->lock);
        v->reserved.mem_bytes -= req->mem_bytes;
        v->reserved.vcpus -= req->vcpus;
        v->reserved.disk_bytes -= req->disk_bytes;
        pthread_mutex_unlock(&v->lock);
}

/* Creates one sandbox: cgroup, record, backend start (or fork of src), and its created event.
 * *ret_sb holds a reference. */
static int start_sandbox(struct vmm *v, const struct create_request *req, const struct backend_ops *ops,
                         struct sandbox *src, bool *ret_copied, struct sandbox **ret_sb, char *why, size_t whylen)
{
        struct sandbox_spec spec = { 0 };
        bool cgroup_made = false, dir_made = false, record_made = false;
        int r = admit(v, req, why, whylen);
        if (r < 0)
                return r;
        struct sandbox *sb = sandbox_new();
        if (!sb) {
                admit_release(v, req);
                return -ENOMEM;
        }
        struct sandbox_record *rec = &sb->rec;
        if ((r = new_id(rec->id, sizeof(rec->id))) < 0)
                goto fail;
        snprintf(rec->account, sizeof(rec->account), "%s", req->account);
        snprintf(rec->key, sizeof(rec->key), "%s", req->key);
        snprintf(rec->host, sizeof(rec->host), "%s", v->s.host_id);
        snprintf(rec->backend, sizeof(rec->backend), "%s", ops->name);
        if (src)
                snprintf(rec->parent, sizeof(rec->parent), "%s", src->rec.id);
        rec->state = STATE_RUNNING;
        rec->vcpus = req->vcpus;
        rec->mem_size_bytes = req->mem_bytes;
        rec->disk_size_bytes = req->disk_bytes;
        rec->epoch = 1;
        rec->created_ns = time_wall_ns();
        rec->timeout_ns = rec->created_ns + req->timeout_s * NS_PER_SEC;
        rec->cgroup_version = v->cgroups.version;
        if (req->nlabels) {
                if (!(rec->labels = malloc(req->nlabels * sizeof(*rec->labels)))) {
                        r = -ENOMEM;
                        goto fail;
                }
                memcpy(rec->labels, req->labels, req->nlabels * sizeof(*rec->labels));
                rec->nlabels = req->nlabels;
        }
        sb->ops = ops;
        sb->net = req->net;
        sandbox_dir(v, rec->id, sb->dir, sizeof(sb->dir));
        if (snprintf(rec->disk_path, sizeof(rec->disk_path), "%s/disk", sb->dir) >= (int)sizeof(rec->disk_path)) {
                r = -ENAMETOOLONG;
                snprintf(why, whylen, "the state folder's path is too long");
                goto fail;
        }

        /* The cgroup first: nothing of the sandbox may run outside it. */
        if ((r = cgroup_create(&v->cgroups, rec->id, rec->vcpus, rec->mem_size_bytes + ops->memory_overhead_bytes,
                               &sb->cg)) < 0) {
                snprintf(why, whylen, "could not create the sandbox's cgroup: %s", strerror(-r));
                goto fail;
        }
        cgroup_made = true;
        snprintf(rec->cgroup_cpu, sizeof(rec->cgroup_cpu), "%s", sb->cg.cpuacct);
        snprintf(rec->cgroup_memory, sizeof(rec->cgroup_memory), "%s", sb->cg.memory);
        char parent_dir[PATH_MAX];
        snprintf(parent_dir, sizeof(parent_dir), "%s/" SANDBOX_DIR, v->s.state_dir);
        if ((mkdir(parent_dir, 0700) < 0 && errno != EEXIST) || mkdir(sb->dir, 0755) < 0) {
                r = -errno;
                snprintf(why, whylen, "could not create the sandbox's folder: %s", strerror(-r));
                goto fail;
        }
        dir_made = true;
        /* Written before the start (a restarted vmm finds the cgroup by it), marked starting: the
         * collector samples it only once the record with the start's moment replaces it, so no
         * sample without held time falls between the two (docs/registry.md, "Moments and ticks"). */
        rec->starting = true;
        if ((r = write_spec_file(sb->dir, &req->net, req->pids_max)) < 0 || (r = registry_write(v->s.state_dir, rec)) < 0) {
                snprintf(why, whylen, "could not write the sandbox's record: %s", strerror(-r));
                goto fail;
        }
        record_made = true;

        snprintf(spec.id, sizeof(spec.id), "%s", rec->id);
        snprintf(spec.account, sizeof(spec.account), "%s", rec->account);
        snprintf(spec.key, sizeof(spec.key), "%s", rec->key);
        spec.vcpus = rec->vcpus;
        spec.mem_bytes = rec->mem_size_bytes;
        spec.disk_bytes = rec->disk_size_bytes;
        spec.internet = req->net.internet;
        spec.pids_max = req->pids_max;
        sb->pids_max = req->pids_max;
        spec.command = req->command;
        spec.image = req->image;
        pid_t pid = 0;
        int64_t start_mono = time_mono_ns();
        /* The moment the sandbox may first run: held time starts here, and the
         * lease counts from here. */
        sb->moment = moment_now();
        rec->created_ns = sb->moment.wall;
        rec->timeout_ns = rec->created_ns + req->timeout_s * NS_PER_SEC;
        registry_set_state(rec, STATE_RUNNING, sb->moment.boot);
        spec.lease_deadline_wall_ns = rec->timeout_ns;
        if (src) {
                if (!ops->fork) {
                        r = -EOPNOTSUPP;
                        snprintf(why, whylen, "the %s backend cannot fork a sandbox", ops->name);
                } else {
                        r = ops->fork(src->bs, &spec, &sb->cg, sb->dir, &sb->bs, &pid, ret_copied, why, whylen);
                }
        } else {
                r = ops->start(&spec, &sb->cg, sb->dir, &sb->bs, &pid, why, whylen);
        }
        if (r < 0)
                goto fail;
        rec->pid = pid;
        if ((r = open_egress(v, sb, pid, why, whylen)) < 0)
                goto fail;
        if ((r = set_lease(sb, rec->timeout_ns)) < 0) {
                snprintf(why, whylen, "could not set the sandbox's lease: %s", strerror(-r));
                goto fail;
        }
        if ((r = registry_write(v->s.state_dir, rec)) < 0) {
                snprintf(why, whylen, "could not write the sandbox's record: %s", strerror(-r));
                goto fail;
        }
        sb->refs++; /* the list's and the caller's */
        watch_main(sb);
        sandbox_insert(v, sb);
        admit_release(v, req); /* it is in the list now: counted there */
        publish_created(v, sb);
        log_info("sandbox created", "sandbox=%s account=%s key=%s backend=%s vcpus=%u memory_mib=%" PRIu64
                 " pid=%d parent=%s start_us=%lld", rec->id, rec->account, rec->key, rec->backend, rec->vcpus,
                 rec->mem_size_bytes >> 20, (int)pid, *rec->parent ? rec->parent : "-",
                 (long long)((time_mono_ns() - start_mono) / NS_PER_US));
        *ret_sb = sb;
        return 0;
fail:
        egress_close(sb->egress);
        sb->egress = NULL;
        if (sb->bs) {
                ops->stop(sb->bs);
                ops->free(sb->bs);
                sb->bs = NULL;
        }
        if (cgroup_made) {
                cgroup_kill_all(&sb->cg, KILL_WAIT_MS);
                cgroup_remove(&v->cgroups, &sb->cg);
        }
        if (record_made)
                registry_remove(v->s.state_dir, rec->id);
        if (dir_made)
                remove_tree(sb->dir);
        sandbox_unref(v, sb);
        admit_release(v, req);
        return r;
}

int vmm_create(struct vmm *v, const struct create_request *req, json_t **ret, char *why, size_t whylen)
{
        const char *reason = NULL;
        const struct backend_ops *ops =
                strcmp(req->backend, "auto") == 0 ? v->default_backend : backend_resolve(req->backend, &reason, why,
                                                                                         whylen);
        if (!ops)
                return -EINVAL;
        int r = check_key(v, req->account, req->key, why, whylen);
        if (r < 0)
                return r;
        struct sandbox *sb;
        if ((r = start_sandbox(v, req, ops, NULL, NULL, &sb, why, whylen)) < 0)
                return r;
        *ret = describe(v, sb);
        sandbox_unref(v, sb);
        return 0;
}

static struct sandbox *find(struct vmm *v, const char *id, char *why, size_t whylen)
{
        struct sandbox *sb = event_id_valid(id) ? sandbox_get(v, id) : NULL;
        if (!sb)
                snprintf(why, whylen, "no sandbox %.64s on this host", id);
        return sb;
}

int vmm_exec(struct vmm *v, const char *id, const struct exec_request *req, struct exec_result *ret, char *why,
             size_t whylen)
{
        struct sandbox *sb = find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        pthread_mutex_lock(&v->lock);
        enum sandbox_state st = sb->rec.state;
        pthread_mutex_unlock(&v->lock);
        int r;
        if (st != STATE_RUNNING) {
                snprintf(why, whylen, "sandbox %s is %s: %s", id, sandbox_state_name(st),
                         st == STATE_PAUSED ? "resume it first" : "it cannot run commands any more");
                r = -EBUSY;
                goto out;
        }
        struct exec_request mine = *req;
        mine.cancel = &v->stopping;
        if (!sb->ops->concurrent_exec)
                pthread_mutex_lock(&sb->exec_lock);
        r = sb->ops->exec(sb->bs, &mine, ret, why, whylen);
        if (!sb->ops->concurrent_exec)
                pthread_mutex_unlock(&sb->exec_lock);
out:
        sandbox_unref(v, sb);
        return r;
}

static int pause_locked(struct vmm *v, struct sandbox *sb, const char *reason, char *why, size_t whylen)
{
        pthread_mutex_lock(&v->lock);
        enum sandbox_state st = sb->rec.state;
        pthread_mutex_unlock(&v->lock);
        if (st == STATE_PAUSED)
                return 0;
        if (st == STATE_STOPPED) {
                snprintf(why, whylen, "sandbox %s is stopped", sb->rec.id);
                return -EBUSY;
        }
        int r = sb->ops->pause ? sb->ops->pause(sb->bs) : 0;
        if (r == 0)
                r = cgroup_freeze(&sb->cg, FREEZE_WAIT_MS);
        if (r < 0) {
                snprintf(why, whylen, "could not freeze sandbox %s: %s", sb->rec.id, strerror(-r));
                cgroup_thaw(&sb->cg, FREEZE_WAIT_MS);
                if (sb->ops->resume)
                        sb->ops->resume(sb->bs);
                return r;
        }
        /* The freeze has completed: from here on the sandbox is paused. */
        int lock = moment_begin(v->s.state_dir, sb->rec.id);
        struct moment m = moment_now();
        pthread_mutex_lock(&v->lock);
        registry_set_state(&sb->rec, STATE_PAUSED, m.boot);
        sb->moment = m;
        sb->remaining_ns = sb->rec.timeout_ns - m.wall;
        if (sb->remaining_ns < 0)
                sb->remaining_ns = 0;
        r = save_record(v, sb);
        pthread_mutex_unlock(&v->lock);
        moment_end(lock);
        publish_simple(v, sb, EVENT_PAUSED);
        log_info("sandbox paused", "sandbox=%s reason=%s", sb->rec.id, reason ? reason : "request");
        return r < 0 ? record_failed(sb, r, "paused", why, whylen) : 0;
}

int vmm_pause(struct vmm *v, const char *id, const char *reason, char *why, size_t whylen)
{
        struct sandbox *sb = find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        pthread_mutex_lock(&sb->op);
        int r = pause_locked(v, sb, reason, why, whylen);
        pthread_mutex_unlock(&sb->op);
        sandbox_unref(v, sb);
        return r;
}

int vmm_resume(struct vmm *v, const char *id, char *why, size_t whylen)
{
        struct sandbox *sb = find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        int r = 0;
        char account[EVENT_ID_MAX + 1], key[EVENT_ID_MAX + 1];
        pthread_mutex_lock(&sb->op);
        pthread_mutex_lock(&v->lock);
        enum sandbox_state st = sb->rec.state;
        snprintf(account, sizeof(account), "%s", sb->rec.account);
        snprintf(key, sizeof(key), "%s", sb->rec.key);
        int64_t remaining = sb->remaining_ns > 0 ? sb->remaining_ns : 60 * NS_PER_SEC;
        pthread_mutex_unlock(&v->lock);
        if (st == STATE_RUNNING)
                goto out;
        if (st == STATE_STOPPED) {
                snprintf(why, whylen, "sandbox %s is stopped", id);
                r = -EBUSY;
                goto out;
        }
        /* A resume starts the sandbox burning again: refused like a create while
         * the key is blocked for today (invariant 5). */
        if ((r = check_key(v, account, key, why, whylen)) < 0)
                goto out;
        /* The lease did not run down while paused. It is handed to the sandbox
         * before it thaws, so its own init never acts on the old deadline. */
        int64_t deadline = time_wall_ns() + remaining;
        if ((r = set_lease(sb, deadline)) < 0) {
                snprintf(why, whylen, "could not renew sandbox %s's lease: %s", id, strerror(-r));
                goto out;
        }
        if ((r = cgroup_thaw(&sb->cg, FREEZE_WAIT_MS)) < 0) {
                snprintf(why, whylen, "could not resume sandbox %s: %s", id, strerror(-r));
                goto out;
        }
        /* Thawed: from here on the sandbox runs. The record is written before the backend's own
         * resume (a QMP round trip for qemu), so the moment lock is never held across it. */
        int lock = moment_begin(v->s.state_dir, id);
        struct moment m = moment_now();
        pthread_mutex_lock(&v->lock);
        registry_set_state(&sb->rec, STATE_RUNNING, m.boot);
        sb->moment = m;
        sb->rec.timeout_ns = deadline;
        r = save_record(v, sb);
        pthread_mutex_unlock(&v->lock);
        moment_end(lock);
        int rb;
        if (sb->ops->resume && (rb = sb->ops->resume(sb->bs)) < 0)
                log_error("could not resume a sandbox's backend after the thaw", "sandbox=%s error=\"%s\"", id,
                          strerror(-rb));
        publish_simple(v, sb, EVENT_RESUMED);
        log_info("sandbox resumed", "sandbox=%s", id);
        if (r < 0)
                r = record_failed(sb, r, "running", why, whylen);
out:
        pthread_mutex_unlock(&sb->op);
        sandbox_unref(v, sb);
        return r;
}

/* Ends the sandbox's processes, records the final counter and held time, and
 * publishes them. The stop's moment is when the processes are gone, or at, if
 * given (a sandbox found ended after a restart: when its lease ran out). The
 * cgroup and record are removed later by the tick (docs/registry.md). why may
 * be NULL. */
static int stop_locked(struct vmm *v, struct sandbox *sb, const char *reason, const struct moment *at, char *why,
                       size_t whylen)
{
        pthread_mutex_lock(&v->lock);
        enum sandbox_state st = sb->rec.state;
        pid_t init = sb->rec.pid;
        pthread_mutex_unlock(&v->lock);
        if (st == STATE_STOPPED)
                return 0;
        int r;
        /* A frozen process cannot die, so a backend waiting for it would wait forever:
         * a paused sandbox is killed through its cgroup (which thaws it) first. */
        if (st == STATE_PAUSED && (r = cgroup_kill_all(&sb->cg, KILL_WAIT_MS)) < 0)
                log_error("could not empty a paused sandbox's cgroup", "sandbox=%s error=\"%s\"", sb->rec.id,
                          strerror(-r));
        if (sb->bs)
                sb->ops->stop(sb->bs);
        /* Its proxy's last counters are in the folder before the record says stopped (the
         * collector's final sample reads them). */
        pthread_mutex_lock(&v->lock);
        struct egress *eg = sb->egress;
        sb->egress = NULL;
        pthread_mutex_unlock(&v->lock);
        egress_close(eg);
        r = cgroup_kill_all(&sb->cg, KILL_WAIT_MS);
        if (r < 0)
                log_error("could not empty a sandbox's cgroup", "sandbox=%s error=\"%s\"", sb->rec.id, strerror(-r));
        /* Gone from cgroup.procs is not gone: a dying task is charged the rest of
         * its exit until it is released. The daemon that started the sandbox
         * waited for its init, and so for its whole pid namespace; a restarted
         * one cannot, and saw cgroup.procs empty up to 3 ms of CPU before the
         * kernel's final counter. So the final counter is read once every task
         * is released, and that is the stop's moment: from here on the sandbox
         * holds nothing. (Not under the moment lock: the collector's tick must
         * not wait for it.) */
        uint64_t cpu = 0;
        if ((r = cgroup_cpu_final(&sb->cg, init, RELEASE_WAIT_MS, &cpu)) == -EAGAIN)
                log_warn("a stopped sandbox's tasks were not seen released; its final CPU counter is the one that held "
                         "still", "sandbox=%s cpu_ns=%" PRIu64, sb->rec.id, cpu);
        else if (r < 0)
                log_error("could not read a stopped sandbox's CPU counter", "sandbox=%s error=\"%s\"", sb->rec.id,
                          strerror(-r));
        int lock = moment_begin(v->s.state_dir, sb->rec.id);
        struct moment m = at ? *at : moment_now();
        pthread_mutex_lock(&v->lock);
        registry_set_state(&sb->rec, STATE_STOPPED, m.boot);
        sb->moment = m;
        if (cpu > sb->rec.final_cpu_ns)
                sb->rec.final_cpu_ns = cpu;
        sb->stopped_mono = time_mono_ns();
        r = save_record(v, sb);
        pthread_mutex_unlock(&v->lock);
        moment_end(lock);
        publish_stopped(v, sb);
        log_info("sandbox stopped", "sandbox=%s reason=%s final_cpu_ns=%" PRIu64 " running_ns=%" PRIu64
                 " paused_ns=%" PRIu64, sb->rec.id, reason, sb->rec.final_cpu_ns, sb->rec.running_ns,
                 sb->rec.paused_ns);
        return r < 0 ? record_failed(sb, r, "stopped", why, whylen) : 0;
}

int vmm_stop(struct vmm *v, const char *id, const char *reason, char *why, size_t whylen)
{
        struct sandbox *sb = find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        pthread_mutex_lock(&sb->op);
        int r = stop_locked(v, sb, reason ? reason : "request", NULL, why, whylen);
        pthread_mutex_unlock(&sb->op);
        sandbox_unref(v, sb);
        return r;
}

int vmm_fork(struct vmm *v, const char *id, int count, json_t **ret, char *why, size_t whylen)
{
        if (count < 1 || count > FORK_MAX) {
                snprintf(why, whylen, "count must be from 1 to %d", FORK_MAX);
                return -EINVAL;
        }
        struct sandbox *src = find(v, id, why, whylen);
        if (!src)
                return -ENOENT;
        struct sandbox *copies[FORK_MAX] = { 0 };
        int made = 0, r = 0;
        bool copied = false;
        pthread_mutex_lock(&src->op);
        struct create_request req = { 0 };
        pthread_mutex_lock(&v->lock);
        enum sandbox_state st = src->rec.state;
        snprintf(req.account, sizeof(req.account), "%s", src->rec.account);
        snprintf(req.key, sizeof(req.key), "%s", src->rec.key);
        req.vcpus = src->rec.vcpus;
        req.mem_bytes = src->rec.mem_size_bytes;
        req.disk_bytes = src->rec.disk_size_bytes;
        req.net = src->net;
        req.pids_max = src->pids_max;
        int64_t left = src->rec.timeout_ns - time_wall_ns();
        req.timeout_s = left > NS_PER_SEC ? left / NS_PER_SEC : 1;
        req.labels = src->rec.labels;
        req.nlabels = src->rec.nlabels;
        pthread_mutex_unlock(&v->lock);
        if (st != STATE_RUNNING) {
                snprintf(why, whylen, "sandbox %s is %s: only a running sandbox can be forked", id,
                         sandbox_state_name(st));
                r = -EBUSY;
                goto out;
        }
        if ((r = check_key(v, req.account, req.key, why, whylen)) < 0)
                goto out;
        for (; made < count; made++) {
                bool c = false;
                if ((r = start_sandbox(v, &req, src->ops, src, &c, &copies[made], why, whylen)) < 0)
                        break;
                copied = c;
        }
        if (r < 0) {
                /* All or nothing: a fork that could not make every copy makes none. */
                for (int i = 0; i < made; i++) {
                        pthread_mutex_lock(&copies[i]->op);
                        stop_locked(v, copies[i], "fork_failed", NULL, NULL, 0);
                        pthread_mutex_unlock(&copies[i]->op);
                        sandbox_unref(v, copies[i]);
                }
                goto out;
        }
        struct usage_event ev;
        struct moment now = moment_now();
        pthread_mutex_lock(&v->lock);
        event_from_record(&ev, EVENT_FORKED, &src->rec, &now);
        pthread_mutex_unlock(&v->lock);
        ev.fork_count = (uint32_t)count;
        publish(v, &ev, false);
        json_t *list = json_array();
        for (int i = 0; i < made; i++) {
                json_array_append_new(list, describe(v, copies[i]));
                sandbox_unref(v, copies[i]);
        }
        *ret = json_pack("{s:o, s:b, s:s}", "sandboxes", list, "processes_copied", copied, "note",
                         copied ? "each copy continues the source's processes"
                                : "each copy has the source's files and spec and started its main program afresh; "
                                  "the source's running processes were not copied (the process backend cannot)");
        log_info("sandbox forked", "sandbox=%s copies=%d processes_copied=%s", id, count, copied ? "yes" : "no");
out:
        pthread_mutex_unlock(&src->op);
        sandbox_unref(v, src);
        return r;
}

int vmm_set_timeout(struct vmm *v, const char *id, int64_t timeout_s, char *why, size_t whylen)
{
        if (timeout_s < 1 || timeout_s > v->s.timeout_max_s) {
                snprintf(why, whylen, "timeout_s must be from 1 to %lld", (long long)v->s.timeout_max_s);
                return -EINVAL;
        }
        struct sandbox *sb = find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        int r = 0;
        pthread_mutex_lock(&sb->op);
        pthread_mutex_lock(&v->lock);
        enum sandbox_state st = sb->rec.state;
        pthread_mutex_unlock(&v->lock);
        int64_t deadline = time_wall_ns() + timeout_s * NS_PER_SEC;
        if (st == STATE_STOPPED) {
                snprintf(why, whylen, "sandbox %s is stopped", id);
                r = -EBUSY;
                goto out;
        }
        /* A paused sandbox gets its lease when it resumes (it does not run down meanwhile). */
        if (st == STATE_RUNNING && (r = set_lease(sb, deadline)) < 0) {
                snprintf(why, whylen, "could not set sandbox %s's lease: %s", id, strerror(-r));
                goto out;
        }
        pthread_mutex_lock(&v->lock);
        sb->rec.timeout_ns = deadline;
        sb->remaining_ns = timeout_s * NS_PER_SEC;
        r = save_record(v, sb);
        pthread_mutex_unlock(&v->lock);
        if (r < 0) {
                snprintf(why, whylen, "sandbox %s's lease was changed, but its registry record could not be written "
                         "(%s); tally-vmm keeps retrying", id, strerror(-r));
                r = -EIO;
        }
out:
        pthread_mutex_unlock(&sb->op);
        sandbox_unref(v, sb);
        return r;
}

int vmm_show(struct vmm *v, const char *id, json_t **ret, char *why, size_t whylen)
{
        struct sandbox *sb = find(v, id, why, whylen);
        if (!sb)
                return -ENOENT;
        *ret = describe(v, sb);
        sandbox_unref(v, sb);
        return 0;
}

/* References to every sandbox (malloc'd array), for work outside the lock. */
static int snapshot(struct vmm *v, struct sandbox ***ret)
{
        pthread_mutex_lock(&v->lock);
        int n = 0;
        for (struct sandbox *sb = v->list; sb; sb = sb->next)
                n++;
        struct sandbox **all = calloc((size_t)n + 1, sizeof(*all));
        if (!all) {
                pthread_mutex_unlock(&v->lock);
                return -ENOMEM;
        }
        n = 0;
        for (struct sandbox *sb = v->list; sb; sb = sb->next) {
                sb->refs++;
                all[n++] = sb;
        }
        pthread_mutex_unlock(&v->lock);
        *ret = all;
        return n;
}

static void snapshot_free(struct vmm *v, struct sandbox **all, int n)
{
        for (int i = 0; i < n; i++)
                sandbox_unref(v, all[i]);
        free(all);
}

json_t *vmm_list(struct vmm *v, const char *account)
{
        json_t *list = json_array();
        struct sandbox **all;
        int n = snapshot(v, &all);
        if (n < 0)
                return list;
        for (int i = 0; i < n; i++)
                if (!account || strcmp(all[i]->rec.account, account) == 0)
                        json_array_append_new(list, describe(v, all[i]));
        snapshot_free(v, all, n);
        return list;
}

json_t *vmm_status(struct vmm *v)
{
        pthread_mutex_lock(&v->lock);
        int n = 0;
        for (struct sandbox *sb = v->list; sb; sb = sb->next)
                n++;
        bool ready = v->control_ready;
        pthread_mutex_unlock(&v->lock);
        return json_pack("{s:s, s:i, s:s, s:s, s:s, s:b, s:i, s:b}", "host", v->s.host_id, "cgroup_version",
                         v->cgroups.version, "cgroup_parent", v->cgroups.parent, "backend_default",
                         v->default_backend->name, "backend_reason", v->default_reason, "control_ready", ready,
                         "sandboxes", n, "spend_limit_check",
                         v->s.limits_database_url && *v->s.limits_database_url);
}

int vmm_apply_control(struct vmm *v, const struct control_command *c)
{
        struct sandbox **all;
        int n = snapshot(v, &all), changed = 0;
        if (n < 0)
                return n;
        for (int i = 0; i < n; i++) {
                struct sandbox *sb = all[i];
                pthread_mutex_lock(&v->lock);
                bool match = strcmp(sb->rec.account, c->account) == 0 &&
                             (*c->sandbox ? strcmp(sb->rec.id, c->sandbox) == 0 : strcmp(sb->rec.key, c->key) == 0) &&
                             sb->rec.state != STATE_STOPPED &&
                             /* A command decided before the sandbox existed is not about it. */
                             (c->issued_ns == 0 || *c->sandbox || c->issued_ns >= sb->rec.created_ns);
                enum sandbox_state st = sb->rec.state;
                pthread_mutex_unlock(&v->lock);
                if (!match || (c->action == CONTROL_PAUSE && st == STATE_PAUSED))
                        continue;
                char why[256] = "";
                const char *reason = *c->reason ? c->reason : "control";
                pthread_mutex_lock(&sb->op);
                int r = c->action == CONTROL_PAUSE ? pause_locked(v, sb, reason, why, sizeof(why))
                                                   : stop_locked(v, sb, reason, NULL, why, sizeof(why));
                pthread_mutex_unlock(&sb->op);
                if (r == 0)
                        changed++;
                else
                        log_warn("could not carry out a control command", "sandbox=%s action=%s error=\"%s\"",
                                 sb->rec.id, control_action_name(c->action), why);
        }
        snapshot_free(v, all, n);
        if (changed)
                log_info("control command carried out", "action=%s account=%s key=%s sandbox=%s reason=%s changed=%d "
                         "latency_ms=%lld", control_action_name(c->action), c->account, *c->key ? c->key : "-",
                         *c->sandbox ? c->sandbox : "-", *c->reason ? c->reason : "-", changed,
                         c->issued_ns ? (long long)((time_wall_ns() - c->issued_ns) / NS_PER_MS) : -1LL);
        return changed;
}

/* ---- background work ---- */

/* False once pid has exited (gone, or a zombie not yet reaped). */
static bool process_alive(pid_t pid)
{
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "re");
        if (!f)
                return false;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        const char *paren = strrchr(buf, ')');
        return !paren || (paren[1] == ' ' && paren[2] != 'Z' && paren[2] != 'X');
}

/* Stops sandboxes whose lease ran out or whose main process ended on its own;
 * removes stopped ones whose final counter is safe. */
static void tick(struct vmm *v)
{
        struct sandbox **all;
        int n = snapshot(v, &all);
        if (n < 0)
                return;
        int64_t now = time_wall_ns(), mono = time_mono_ns();
        /* Liveness once a second is plenty: a dead sandbox burns nothing. */
        static int64_t last_alive_check;
        bool check_alive = mono - last_alive_check >= NS_PER_SEC;
        if (check_alive)
                last_alive_check = mono;
        /* Which main processes ended: one poll over every pidfd. */
        struct pollfd *ended = calloc((size_t)n + 1, sizeof(*ended));
        if (ended) {
                pthread_mutex_lock(&v->lock);
                for (int i = 0; i < n; i++)
                        ended[i] = (struct pollfd){ all[i]->rec.state == STATE_STOPPED ? -1 : all[i]->pidfd, POLLIN, 0 };
                pthread_mutex_unlock(&v->lock);
                if (poll(ended, (nfds_t)n, 0) < 0)
                        memset(ended, 0, ((size_t)n + 1) * sizeof(*ended));
        }
        for (int i = 0; i < n; i++) {
                struct sandbox *sb = all[i];
                bool gone = ended && (ended[i].revents & (POLLIN | POLLHUP));
                pthread_mutex_lock(&v->lock);
                enum sandbox_state st = sb->rec.state;
                bool expired = st == STATE_RUNNING && sb->rec.timeout_ns > 0 && sb->rec.timeout_ns <= now;
                pid_t pid = sb->rec.pid;
                bool republish = st == STATE_STOPPED && !sb->stop_published;
                bool acked = sb->stop_acked;
                int64_t since = mono - sb->stopped_mono;
                /* A record behind its sandbox is rewritten once a second until it holds. */
                if (sb->record_dirty && check_alive)
                        save_record(v, sb);
                bool dirty = sb->record_dirty;
                pthread_mutex_unlock(&v->lock);
                if (expired || (st != STATE_STOPPED && pid > 0 && (gone || (check_alive && !process_alive(pid))))) {
                        /* A sandbox still running at its deadline is stopped now; one
                         * found already ended after it was ended by its lease then. */
                        pthread_mutex_lock(&sb->op);
                        pthread_mutex_lock(&v->lock);
                        struct sandbox_record rec = sb->rec;
                        pthread_mutex_unlock(&v->lock);
                        bool alive = pid > 0 && process_alive(pid);
                        struct moment deadline;
                        bool at_deadline = !alive && lease_end_moment(&rec, &deadline);
                        if (rec.state == STATE_RUNNING && rec.timeout_ns > 0 && rec.timeout_ns <= now)
                                stop_locked(v, sb, "timeout", at_deadline ? &deadline : NULL, NULL, 0);
                        else if (rec.state != STATE_STOPPED && !alive)
                                stop_locked(v, sb, "main_process_ended", at_deadline ? &deadline : NULL, NULL, 0);
                        pthread_mutex_unlock(&sb->op);
                        continue;
                }
                if (republish) {
                        publish_stopped(v, sb);
                        continue;
                }
                /* The collector takes its final sample when the record says stopped. */
                if (st != STATE_STOPPED || !acked || dirty)
                        continue;
                char final[PATH_MAX];
                snprintf(final, sizeof(final), "%s/" REGISTRY_DIR "/%s.final", v->s.state_dir, sb->rec.id);
                bool collected = access(final, F_OK) == 0;
                if (!collected && since < v->s.final_wait_ms * NS_PER_MS)
                        continue;
                int r = cgroup_remove(&v->cgroups, &sb->cg);
                if (r < 0) {
                        log_warn("could not remove a stopped sandbox's cgroup", "sandbox=%s error=\"%s\"", sb->rec.id,
                                 strerror(-r));
                        continue;
                }
                registry_remove(v->s.state_dir, sb->rec.id);
                unlink(final);
                remove_tree(sb->dir);
                log_info("sandbox removed", "sandbox=%s collector=%s", sb->rec.id, collected ? "yes" : "timed_out");
                sandbox_unlink(v, sb);
        }
        free(ended);
        snapshot_free(v, all, n);
}

static void *background(void *arg)
{
        struct vmm *v = arg;
        while (!v->quit) {
                rd_kafka_poll(v->producer, 50);
                tick(v);
        }
        return NULL;
}

static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t *parts, void *opaque)
{
        struct vmm *v = opaque;
        if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
                rd_kafka_assign(rk, parts);
                pthread_mutex_lock(&v->lock);
                v->control_ready = true;
                pthread_mutex_unlock(&v->lock);
                log_info("control topic assigned", "partitions=%d", parts->cnt);
        } else {
                rd_kafka_assign(rk, NULL);
                pthread_mutex_lock(&v->lock);
                v->control_ready = false;
                pthread_mutex_unlock(&v->lock);
        }
}

static void *control_loop(void *arg)
{
        struct vmm *v = arg;
        while (!v->quit) {
                rd_kafka_message_t *m = rd_kafka_consumer_poll(v->consumer, 100);
                if (!m)
                        continue;
                if (m->err) {
                        if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                                log_warn("control topic error", "error=\"%s\"", rd_kafka_message_errstr(m));
                        rd_kafka_message_destroy(m);
                        continue;
                }
                struct control_command c;
                char why[256];
                if (control_decode(m->payload, m->len, &c, why, sizeof(why)) < 0)
                        log_warn("refusing a control message", "partition=%d offset=%lld reason=\"%s\"",
                                 (int)m->partition, (long long)m->offset, why);
                else
                        vmm_apply_control(v, &c);
                rd_kafka_topic_partition_list_t *pos = rd_kafka_topic_partition_list_new(1);
                rd_kafka_topic_partition_list_add(pos, rd_kafka_topic_name(m->rkt), m->partition)->offset =
                        m->offset + 1;
                rd_kafka_commit(v->consumer, pos, 1);
                rd_kafka_topic_partition_list_destroy(pos);
                rd_kafka_message_destroy(m);
        }
        return NULL;
}

/* ---- start-up and recovery ---- */

static int unknown_recover(const struct sandbox_record *rec, const struct sandbox_cgroup *cg, const char *dir,
                           struct backend_sandbox **ret)
{
        return -ESRCH;
}
static int unknown_stop(struct backend_sandbox *sb) { return 0; }
static void unknown_free(struct backend_sandbox *sb) {}

/* For records of a backend this build lacks: the cgroup alone ends the sandbox. */
static const struct backend_ops unknown_backend = {
        .name = "unknown",
        .recover = unknown_recover,
        .stop = unknown_stop,
        .free = unknown_free,
};

/* Takes over what a previous run left: live sandboxes, stopped ones whose
 * clean-up was pending, sandboxes that died meanwhile, and cgroups without a record. */
static void recover(struct vmm *v)
{
        struct sandbox_record *recs = NULL;
        int n = registry_list(v->s.state_dir, &recs);
        if (n < 0) {
                log_error("could not read the registry", "error=\"%s\"", strerror(-n));
                n = 0;
        }
        int found = 0, died = 0;
        for (int i = 0; i < n; i++) {
                struct sandbox_record *rec = &recs[i];
                if (*rec->host && strcmp(rec->host, v->s.host_id) != 0) {
                        log_warn("registry record of another host left alone", "sandbox=%s host=%s", rec->id, rec->host);
                        continue;
                }
                struct sandbox *sb = sandbox_new();
                if (!sb)
                        break;
                sb->rec = *rec;
                memset(rec, 0, sizeof(*rec)); /* the labels move to sb */
                sandbox_dir(v, sb->rec.id, sb->dir, sizeof(sb->dir));
                read_spec_file(sb->dir, &sb->net, &sb->pids_max);
                sb->ops = backend_find(sb->rec.backend);
                if (!sb->ops) {
                        log_warn("sandbox of a backend this build lacks: ending it", "sandbox=%s backend=%s",
                                 sb->rec.id, sb->rec.backend);
                        sb->ops = &unknown_backend;
                }
                cgroup_paths(&v->cgroups, sb->rec.id, &sb->cg);
                /* The held totals and the moment the state began are in the record. */
                sb->moment = moment_of_record(&sb->rec);
                /* Its `created` event again: one still queued when the last tally-vmm ended was
                 * lost with it, and an aggregator bills no reading of a sandbox without it
                 * (docs/events.md, "Provenance"). Aggregators take a repeat as nothing new. */
                publish_created(v, sb);
                if (sb->rec.state != STATE_STOPPED) {
                        int r = sb->ops->recover(&sb->rec, &sb->cg, sb->dir, &sb->bs);
                        char why[256];
                        if (r == 0 && open_egress(v, sb, sb->rec.pid, why, sizeof(why)) < 0)
                                log_error("could not restart a sandbox's egress proxy: it has no internet until it "
                                          "is stopped", "sandbox=%s reason=\"%s\"", sb->rec.id, why);
                        if (r == 0) {
                                /* What was left of the lease when it paused. */
                                if (sb->rec.state == STATE_PAUSED) {
                                        sb->remaining_ns = sb->rec.timeout_ns - sb->moment.wall;
                                        if (sb->rec.state_since_boot_ns <= 0 || sb->remaining_ns <= 0 ||
                                            sb->remaining_ns > v->s.timeout_max_s * NS_PER_SEC)
                                                sb->remaining_ns = 60 * NS_PER_SEC;
                                }
                                watch_main(sb);
                                sandbox_insert(v, sb);
                                found++;
                                log_info("sandbox found again", "sandbox=%s state=%s pid=%d", sb->rec.id,
                                         sandbox_state_name(sb->rec.state), (int)sb->rec.pid);
                                continue;
                        }
                        /* It ended while no tally-vmm watched: its counter is still in the cgroup. */
                        died++;
                        sandbox_insert(v, sb);
                        /* A running sandbox whose lease ran out meanwhile was ended by its
                         * own init at the deadline (set_lease): it held nothing after it. */
                        struct moment deadline;
                        bool at_deadline = lease_end_moment(&sb->rec, &deadline);
                        pthread_mutex_lock(&sb->op);
                        stop_locked(v, sb, "ended_while_vmm_was_down", at_deadline ? &deadline : NULL, NULL, 0);
                        pthread_mutex_unlock(&sb->op);
                        continue;
                }
                sb->stopped_mono = time_mono_ns();
                sandbox_insert(v, sb); /* the tick publishes its stopped event again, then cleans up */
        }
        registry_list_free(recs, n);

        char **ids = NULL;
        int m = cgroup_list_ids(&v->cgroups, &ids);
        for (int i = 0; i < m; i++) {
                struct sandbox *sb = sandbox_get(v, ids[i]);
                if (sb) {
                        sandbox_unref(v, sb);
                        continue;
                }
                struct sandbox_cgroup cg;
                if (cgroup_paths(&v->cgroups, ids[i], &cg) < 0)
                        continue;
                cgroup_kill_all(&cg, KILL_WAIT_MS);
                int r = cgroup_remove(&v->cgroups, &cg);
                log_info("orphaned cgroup removed", "cgroup=%s result=%s", ids[i], r == 0 ? "ok" : strerror(-r));
        }
        cgroup_ids_free(ids, m);
        log_info("registry recovered", "sandboxes=%d ended_meanwhile=%d records=%d", found, died, n);
}

static uint64_t host_memory(void)
{
        long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

const struct vmm_settings *vmm_get_settings(const struct vmm *v)
{
        return &v->s;
}

const struct vmm_limits *vmm_get_limits(const struct vmm *v)
{
        return &v->limits;
}

int vmm_open(const struct vmm_settings *s, struct vmm **ret, char *err, size_t errlen)
{
        struct vmm *v = calloc(1, sizeof(*v));
        int r;
        if (!v)
                return -ENOMEM;
        v->s = *s;
        pthread_mutex_init(&v->lock, NULL);
        pthread_mutex_init(&v->db_lock, NULL);
        v->limits.host_mem_bytes = host_memory();
        v->limits.timeout_max_s = s->timeout_max_s;
        if (!event_id_valid(s->host_id)) {
                snprintf(err, errlen, "host_id \"%s\" is not an id (1 to 64 of A-Z a-z 0-9 _ . : -)", s->host_id);
                r = -EINVAL;
                goto fail;
        }
        if (!(v->default_backend = backend_resolve(s->backend, &v->default_reason, err, errlen))) {
                r = -EINVAL;
                goto fail;
        }
        if ((r = cgroup_host_detect(s->cgroup_mount, s->cgroup_parent, &v->cgroups)) < 0) {
                snprintf(err, errlen, "could not set up the cgroup parent \"%s\" under %s: %s", s->cgroup_parent,
                         *s->cgroup_mount ? s->cgroup_mount : "/sys/fs/cgroup", strerror(-r));
                goto fail;
        }
        /* The meter's inputs are root's alone: the registry (tenants' account and
         * key ids) and the sandboxes' folders are 0700, also when an older
         * tally-vmm made them 0755. A state folder tally-vmm creates is 0700; one
         * that exists keeps its mode (scripts/up shares it with PostgreSQL's data). */
        if (mkdir(s->state_dir, 0700) < 0 && errno != EEXIST) {
                r = -errno;
                snprintf(err, errlen, "could not create the state folder %s: %s", s->state_dir, strerror(errno));
                goto fail;
        }
        static const char *const private_dirs[] = { REGISTRY_DIR, SANDBOX_DIR };
        for (size_t i = 0; i < sizeof(private_dirs) / sizeof(private_dirs[0]); i++) {
                char path[PATH_MAX];
                snprintf(path, sizeof(path), "%s/%s", s->state_dir, private_dirs[i]);
                if ((mkdir(path, 0700) < 0 && errno != EEXIST) || chmod(path, 0700) < 0) {
                        r = -errno;
                        snprintf(err, errlen, "could not make %s private: %s", path, strerror(errno));
                        goto fail;
                }
        }
        if ((r = capacity_init(&v->capacity, &s->capacity, s->state_dir, err, errlen)) < 0)
                goto fail;
        log_info("capacity", "memory_mib=%" PRIu64 " vcpus=%" PRIu64 " disk_mib=%" PRIu64 " memory_promise_mib=%" PRIu64
                 " vcpu_promise=%" PRIu64 " disk_promise_mib=%" PRIu64,
                 v->capacity.host.mem_bytes >> 20, v->capacity.host.vcpus, v->capacity.host.disk_bytes >> 20,
                 v->capacity.limit.mem_bytes >> 20, v->capacity.limit.vcpus, v->capacity.limit.disk_bytes >> 20);
        char kerr[512];
        rd_kafka_conf_t *conf = rd_kafka_conf_new();
        rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
        rd_kafka_conf_set_opaque(conf, v);
        /* Partitions added to usage or control are followed within 30 s (a pause
         * command on a new control partition must not wait 5 min). */
        static const char *const refresh[] = { KAFKA_METADATA_REFRESH, NULL };
        if (kafka_conf_set_all(conf, refresh, kerr, sizeof(kerr)) < 0 ||
            kafka_conf_set_client(conf, s->kafka, kerr, sizeof(kerr)) < 0) {
                rd_kafka_conf_destroy(conf);
                snprintf(err, errlen, "could not apply kafka_settings: %s", kerr);
                r = -EINVAL;
                goto fail;
        }
        /* Lifecycle events are never given up on: delivery retries until the broker takes them. */
        static const char *const producer_pairs[] = { "message.timeout.ms=0", "linger.ms=1", NULL };
        if (!(v->producer = kafka_producer_new(s->kafka_brokers, conf, producer_pairs, kerr, sizeof(kerr)))) {
                snprintf(err, errlen, "could not create the Kafka producer: %s", kerr);
                r = -EINVAL;
                goto fail;
        }
        char group[128];
        snprintf(group, sizeof(group), "tally-vmm-%s", s->host_id);
        conf = rd_kafka_conf_new();
        rd_kafka_conf_set_rebalance_cb(conf, on_rebalance);
        rd_kafka_conf_set_opaque(conf, v);
        if (kafka_conf_set_all(conf, refresh, kerr, sizeof(kerr)) < 0 ||
            kafka_conf_set_client(conf, s->kafka, kerr, sizeof(kerr)) < 0) {
                rd_kafka_conf_destroy(conf);
                snprintf(err, errlen, "could not apply kafka_settings: %s", kerr);
                r = -EINVAL;
                goto fail;
        }
        static const char *const consumer_pairs[] = { "session.timeout.ms=6000", "heartbeat.interval.ms=500",
                                                      "fetch.wait.max.ms=50", NULL };
        if (!(v->consumer = kafka_consumer_new(s->kafka_brokers, group, conf, consumer_pairs, kerr, sizeof(kerr)))) {
                snprintf(err, errlen, "could not create the Kafka consumer: %s", kerr);
                r = -EINVAL;
                goto fail;
        }
        rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
        rd_kafka_topic_partition_list_add(topics, TOPIC_CONTROL, RD_KAFKA_PARTITION_UA);
        rd_kafka_resp_err_t ke = rd_kafka_subscribe(v->consumer, topics);
        rd_kafka_topic_partition_list_destroy(topics);
        if (ke) {
                snprintf(err, errlen, "could not subscribe to the control topic: %s", rd_kafka_err2str(ke));
                r = -EIO;
                goto fail;
        }
        log_info("tally-vmm starting", "host=%s cgroup_version=%d cgroup_parent=%s backend=%s backend_reason=\"%s\" "
                 "spend_limit_check=%s", s->host_id, v->cgroups.version, v->cgroups.parent, v->default_backend->name,
                 v->default_reason, s->limits_database_url && *s->limits_database_url ? "on" : "off");
        recover(v);
        if (pthread_create(&v->thread, NULL, background, v) != 0) {
                r = -EAGAIN;
                goto fail;
        }
        if (pthread_create(&v->control_thread, NULL, control_loop, v) != 0) {
                v->quit = true;
                pthread_join(v->thread, NULL);
                r = -EAGAIN;
                goto fail;
        }
        *ret = v;
        return 0;
fail:
        if (v->consumer) {
                rd_kafka_consumer_close(v->consumer);
                rd_kafka_destroy(v->consumer);
        }
        if (v->producer)
                rd_kafka_destroy(v->producer);
        /* Sandboxes recover() took over keep running; only the memory goes. */
        while (v->list)
                sandbox_unlink(v, v->list);
        free(v);
        return r;
}

void vmm_begin_shutdown(struct vmm *v)
{
        v->stopping = 1;
}

void vmm_flush(struct vmm *v, int64_t timeout_ms)
{
        int r = rd_kafka_flush(v->producer, timeout_ms > 0 ? (int)timeout_ms : 0);
        if (r != RD_KAFKA_RESP_ERR_NO_ERROR)
                log_warn("lifecycle events still queued at exit", "count=%d", rd_kafka_outq_len(v->producer));
}

void vmm_close(struct vmm *v, int64_t deadline_mono_ns)
{
        if (!v)
                return;
        v->quit = true;
        pthread_join(v->control_thread, NULL);
        pthread_join(v->thread, NULL);
        rd_kafka_consumer_close(v->consumer);
        rd_kafka_destroy(v->consumer);
        int64_t left_ms = (deadline_mono_ns - time_mono_ns()) / NS_PER_MS - 200;
        if (rd_kafka_flush(v->producer, left_ms > 0 ? (int)left_ms : 0) != RD_KAFKA_RESP_ERR_NO_ERROR) {
                /* A stopped event lost here is published again by the next run (its record says stopped). */
                log_warn("lifecycle events still queued at exit", "count=%d", rd_kafka_outq_len(v->producer));
                rd_kafka_purge(v->producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
                rd_kafka_poll(v->producer, 0);
        }
        while (v->list)
                sandbox_unlink(v, v->list);
        rd_kafka_destroy(v->producer);
        PQfinish(v->db);
        pthread_mutex_destroy(&v->lock);
        pthread_mutex_destroy(&v->db_lock);
        free(v);
}
