/* host_registry.c — see host_registry.h. */
#include "host_registry.h"
#include "db.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A failure is logged once, then at most once in this long. */
#define LOG_EVERY_NS (60 * NS_PER_SEC)

#define MiB (UINT64_C(1) << 20)

struct host_registry {
        char *url, *host_id, *address;
        host_registry_sample_fn sample;
        void *arg;
        pthread_t thread;
        pthread_mutex_t lock; /* quit, and the call to sample */
        pthread_cond_t wake;
        bool quit;
        PGconn *db;           /* the thread's alone */
        int64_t failures;     /* in a row */
        int64_t last_log_ns;  /* of a failure */
        bool registered;      /* a beat has succeeded since the start */
};

/* The upsert: registers the host, or beats. heartbeat_at = now() is dated by
 * the database whatever is written (sql/021's trigger); state is never named. */
static const char UPSERT[] =
        "INSERT INTO host_registry AS h (host_id, address, capacity_vcpus, capacity_memory_mib, capacity_disk_mib,"
        "  vcpu_overcommit_percent, memory_overcommit_percent, disk_overcommit_percent,"
        "  promised_vcpus, promised_memory_mib, promised_disk_mib, live_sandboxes)"
        " VALUES ($1, nullif($2, ''), $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        " ON CONFLICT (host_id) DO UPDATE SET address = EXCLUDED.address,"
        "  capacity_vcpus = EXCLUDED.capacity_vcpus, capacity_memory_mib = EXCLUDED.capacity_memory_mib,"
        "  capacity_disk_mib = EXCLUDED.capacity_disk_mib,"
        "  vcpu_overcommit_percent = EXCLUDED.vcpu_overcommit_percent,"
        "  memory_overcommit_percent = EXCLUDED.memory_overcommit_percent,"
        "  disk_overcommit_percent = EXCLUDED.disk_overcommit_percent,"
        "  promised_vcpus = EXCLUDED.promised_vcpus, promised_memory_mib = EXCLUDED.promised_memory_mib,"
        "  promised_disk_mib = EXCLUDED.promised_disk_mib, live_sandboxes = EXCLUDED.live_sandboxes,"
        "  heartbeat_at = now()";

/* A connection whose every wait is bounded: connecting (connect_timeout), a
 * database gone silent (TCP keepalives, tcp_user_timeout), a statement
 * (statement_timeout). Settings the URL gives win over these (they come first
 * in the list libpq expands the URL into). */
static int connect_bounded(struct host_registry *r, char *err, size_t errlen)
{
        static const char *const keys[] = { "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
                                            "keepalives_count", "tcp_user_timeout", "application_name", "dbname",
                                            NULL };
        const char *values[] = { "5", "1", "5", "2", "3", "10000", "tally-vmm host registry", r->url, NULL };
        PGconn *c = PQconnectdbParams(keys, values, 1);
        if (!c || PQstatus(c) != CONNECTION_OK) {
                snprintf(err, errlen, "could not connect to PostgreSQL: %s", c ? PQerrorMessage(c) : "out of memory");
                size_t n = strlen(err);
                while (n && (err[n - 1] == '\n' || err[n - 1] == ' '))
                        err[--n] = '\0';
                PQfinish(c);
                return -EIO;
        }
        int rc = db_check_schema(c, err, errlen);
        if (rc == 0)
                rc = db_exec(c, "SET statement_timeout = '5s'", err, errlen);
        if (rc < 0) {
                PQfinish(c);
                return rc;
        }
        r->db = c;
        return 0;
}

/* One beat. 0, or negative with the reason in err. */
static int beat(struct host_registry *r, const struct host_registry_report *rep, char *err, size_t errlen)
{
        if (r->db && PQstatus(r->db) != CONNECTION_OK) {
                PQfinish(r->db);
                r->db = NULL;
        }
        int rc;
        if (!r->db && (rc = connect_bounded(r, err, errlen)) < 0)
                return rc;
        char v[10][24];
        const uint64_t nums[10] = {
                rep->capacity.host.vcpus,
                rep->capacity.host.mem_bytes / MiB,
                rep->capacity.host.disk_bytes / MiB,
                (uint64_t)rep->capacity.vcpu_pct,
                (uint64_t)rep->capacity.memory_pct,
                (uint64_t)rep->capacity.disk_pct,
                rep->promised.vcpus,
                (rep->promised.mem_bytes + MiB - 1) / MiB, /* sizes are whole MiB; never under-report */
                (rep->promised.disk_bytes + MiB - 1) / MiB,
                (uint64_t)(rep->live > 0 ? rep->live : 0),
        };
        for (int i = 0; i < 10; i++)
                snprintf(v[i], sizeof(v[i]), "%" PRIu64, nums[i]);
        const char *params[12] = { r->host_id, r->address, v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9] };
        PGresult *res = PQexecParams(r->db, UPSERT, 12, NULL, params, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_COMMAND_OK) {
                snprintf(err, errlen, "%s", PQresultErrorMessage(res));
                size_t n = strlen(err);
                while (n && (err[n - 1] == '\n' || err[n - 1] == ' '))
                        err[--n] = '\0';
                PQclear(res);
                return -EIO;
        }
        PQclear(res);
        return 0;
}

/* Logs the outcome of a beat: each change of state, a failure at most once a minute. */
static void note(struct host_registry *r, int rc, const char *err)
{
        int64_t now = time_mono_ns();
        if (rc == 0) {
                if (!r->registered)
                        log_info("host registered", "host=%s address=%s", r->host_id,
                                 *r->address ? r->address : "(none)");
                else if (r->failures > 0)
                        log_info("host registry heartbeat back", "host=%s failed_beats=%" PRId64, r->host_id,
                                 r->failures);
                r->registered = true;
                r->failures = 0;
                r->last_log_ns = 0;
                return;
        }
        r->failures++;
        if (r->failures == 1 || now - r->last_log_ns >= LOG_EVERY_NS) {
                if (rc == -EPROTO)
                        log_error("refusing the host registry's database", "host=%s error=\"%s\"", r->host_id, err);
                else
                        log_warn("could not beat into the host registry", "host=%s failed_beats=%" PRId64
                                 " error=\"%s\"", r->host_id, r->failures, err);
                r->last_log_ns = now;
        }
}

static int64_t pause_ms(const struct host_registry *r)
{
        if (r->failures == 0)
                return HOST_REGISTRY_INTERVAL_MS;
        int64_t ms = 1000;
        for (int64_t i = 1; i < r->failures && ms < HOST_REGISTRY_BACKOFF_MAX_MS; i++)
                ms *= 2;
        return ms < HOST_REGISTRY_BACKOFF_MAX_MS ? ms : HOST_REGISTRY_BACKOFF_MAX_MS;
}

static void *run(void *arg)
{
        struct host_registry *r = arg;
        pthread_mutex_lock(&r->lock);
        while (!r->quit) {
                struct host_registry_report rep = { 0 };
                r->sample(r->arg, &rep); /* under the lock: never after stop */
                pthread_mutex_unlock(&r->lock);
                char err[1024] = "";
                int rc = beat(r, &rep, err, sizeof(err));
                note(r, rc, err);
                struct timespec until;
                clock_gettime(CLOCK_MONOTONIC, &until);
                int64_t ns = until.tv_nsec + pause_ms(r) * NS_PER_MS;
                until.tv_sec += ns / NS_PER_SEC;
                until.tv_nsec = ns % NS_PER_SEC;
                pthread_mutex_lock(&r->lock);
                while (!r->quit && pthread_cond_timedwait(&r->wake, &r->lock, &until) != ETIMEDOUT)
                        ;
        }
        pthread_mutex_unlock(&r->lock);
        PQfinish(r->db);
        r->db = NULL;
        return NULL;
}

static void registry_free(struct host_registry *r)
{
        pthread_cond_destroy(&r->wake);
        pthread_mutex_destroy(&r->lock);
        free(r->url);
        free(r->host_id);
        free(r->address);
        free(r);
}

int host_registry_start(const struct host_registry_settings *s, host_registry_sample_fn sample, void *arg,
                        struct host_registry **ret)
{
        struct host_registry *r = calloc(1, sizeof(*r));
        if (!r)
                return -ENOMEM;
        r->url = strdup(s->database_url);
        r->host_id = strdup(s->host_id);
        r->address = strdup(s->address ? s->address : "");
        r->sample = sample;
        r->arg = arg;
        pthread_mutex_init(&r->lock, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&r->wake, &ca);
        pthread_condattr_destroy(&ca);
        if (!r->url || !r->host_id || !r->address) {
                registry_free(r);
                return -ENOMEM;
        }
        int e = pthread_create(&r->thread, NULL, run, r);
        if (e) {
                registry_free(r);
                return -e;
        }
        *ret = r;
        return 0;
}

void host_registry_stop(struct host_registry *r, int64_t deadline_mono_ns)
{
        if (!r)
                return;
        pthread_mutex_lock(&r->lock);
        r->quit = true;
        pthread_cond_signal(&r->wake);
        pthread_mutex_unlock(&r->lock);
        /* pthread_timedjoin_np waits on CLOCK_REALTIME: the monotonic deadline as a wall one. */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        int64_t left = deadline_mono_ns - time_mono_ns();
        int64_t ns = until.tv_nsec + (left > 0 ? left : 0);
        until.tv_sec += ns / NS_PER_SEC;
        until.tv_nsec = ns % NS_PER_SEC;
        if (pthread_timedjoin_np(r->thread, NULL, &until) != 0) {
                log_warn("leaving the host registry's heartbeat in its database call", "host=%s", r->host_id);
                pthread_detach(r->thread);
                return; /* its memory stays: the thread still uses it */
        }
        registry_free(r);
}

const char *host_registry_address(const char *setting, const char *tls_listen, char *buf, size_t size)
{
        buf[0] = '\0';
        if (setting && *setting) {
                snprintf(buf, size, "%s", setting);
                return buf;
        }
        if (!tls_listen || !*tls_listen)
                return buf;
        /* ADDRESS:PORT or [IPV6]:PORT: a wildcard address says nothing of where to dial. */
        const char *colon = strrchr(tls_listen, ':');
        size_t hostlen = colon ? (size_t)(colon - tls_listen) : 0;
        static const char *const wild[] = { "", "0.0.0.0", "[::]", "*", "[::0]" };
        for (size_t i = 0; i < sizeof(wild) / sizeof(wild[0]); i++)
                if (strlen(wild[i]) == hostlen && strncmp(tls_listen, wild[i], hostlen) == 0)
                        return buf;
        snprintf(buf, size, "https://%s", tls_listen);
        return buf;
}
