/* notifier.c — the sender's loop: wait for a wake-up (LISTEN
 * tally_alert_deliveries, sent by sql/009's trigger at the alert's commit)
 * or the poll interval, claim due deliveries, send, record, commit.
 *
 * The claim and the record are one transaction that is open while the batch
 * is sent: the row lock is what keeps two notifiers from sending one row
 * twice, and a notifier killed between a send and its commit leaves the row
 * pending, to be sent again with the same event id (receivers deduplicate).
 * It must never mark a row delivered that it did not see answered 2xx. */
#include "notifier.h"
#include "db.h"
#include "log.h"
#include "metrics_http.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* The shortest sleep of a worker that found nothing to claim. */
#define IDLE_MIN_MS 50

struct notifier_metrics {
        _Atomic int64_t pending, delivered, failed, oldest_pending_s;
        _Atomic uint64_t sent, send_errors, gave_up;
        _Atomic int64_t db_up;
};

int64_t notifier_backoff_ms(const struct notifier_config *cfg, int attempts, uint64_t rnd)
{
        int64_t d = cfg->retry_base_ms;
        for (int i = 1; i < attempts && d < cfg->retry_max_ms; i++)
                d *= 2;
        if (d > cfg->retry_max_ms)
                d = cfg->retry_max_ms;
        int64_t half = d / 2;
        return d - (half > 0 ? (int64_t)(rnd % (uint64_t)(half + 1)) : 0);
}

static int metrics_page(const void *arg, char *buf, size_t size)
{
        const struct notifier_metrics *m = arg;
        int n = snprintf(
                buf, size,
                "# HELP tally_notifier_deliveries Alert deliveries in the outbox by state.\n"
                "# TYPE tally_notifier_deliveries gauge\n"
                "tally_notifier_deliveries{state=\"pending\"} %" PRId64 "\n"
                "tally_notifier_deliveries{state=\"delivered\"} %" PRId64 "\n"
                "tally_notifier_deliveries{state=\"failed\"} %" PRId64 "\n"
                "# HELP tally_notifier_oldest_pending_seconds Age of the oldest pending delivery (0: none).\n"
                "# TYPE tally_notifier_oldest_pending_seconds gauge\n"
                "tally_notifier_oldest_pending_seconds %" PRId64 "\n"
                "# HELP tally_notifier_sent_total Attempts answered 2xx (or accepted by the SMTP relay).\n"
                "# TYPE tally_notifier_sent_total counter\n"
                "tally_notifier_sent_total %" PRIu64 "\n"
                "# HELP tally_notifier_send_errors_total Attempts that failed (retried later).\n"
                "# TYPE tally_notifier_send_errors_total counter\n"
                "tally_notifier_send_errors_total %" PRIu64 "\n"
                "# HELP tally_notifier_gave_up_total Deliveries marked failed after the retry period.\n"
                "# TYPE tally_notifier_gave_up_total counter\n"
                "tally_notifier_gave_up_total %" PRIu64 "\n"
                "# HELP tally_notifier_database_up Whether the last database round trip worked.\n"
                "# TYPE tally_notifier_database_up gauge\n"
                "tally_notifier_database_up %" PRId64 "\n",
                atomic_load(&m->pending), atomic_load(&m->delivered), atomic_load(&m->failed),
                atomic_load(&m->oldest_pending_s), atomic_load(&m->sent), atomic_load(&m->send_errors),
                atomic_load(&m->gave_up), atomic_load(&m->db_up));
        if (n < 0 || (size_t)n >= size)
                return -ENOBUFS;
        return n;
}

struct notifier {
        const struct notifier_config *cfg;
        struct send_config send;
        struct notifier_metrics *m;
        PGconn *db;
};

static int listen_deliveries(PGconn *conn, void *arg, char *err, size_t errlen)
{
        return db_exec(conn, "LISTEN tally_alert_deliveries", err, errlen);
}

static int db_ensure(struct notifier *n)
{
        char err[1024];
        if (n->db && PQstatus(n->db) == CONNECTION_OK)
                return 0;
        int r = db_ensure_conn(&n->db, n->cfg->database_url, listen_deliveries, NULL, err, sizeof(err));
        atomic_store(&n->m->db_up, n->db ? 1 : 0);
        if (r < 0) {
                log_error("could not connect to the database", "error=\"%s\"", err);
                return r;
        }
        log_info("database connected", NULL);
        return 0;
}

static void refresh_metrics(struct notifier *n)
{
        PGresult *res = PQexec(n->db, "SELECT count(*) FILTER (WHERE state = 'pending'),"
                                      " count(*) FILTER (WHERE state = 'delivered'),"
                                      " count(*) FILTER (WHERE state = 'failed'),"
                                      " coalesce(extract(epoch FROM now() - min(created_at) FILTER"
                                      "  (WHERE state = 'pending'))::bigint, 0)"
                                      " FROM alert_deliveries");
        if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
                atomic_store(&n->m->pending, strtoll(PQgetvalue(res, 0, 0), NULL, 10));
                atomic_store(&n->m->delivered, strtoll(PQgetvalue(res, 0, 1), NULL, 10));
                atomic_store(&n->m->failed, strtoll(PQgetvalue(res, 0, 2), NULL, 10));
                atomic_store(&n->m->oldest_pending_s, strtoll(PQgetvalue(res, 0, 3), NULL, 10));
        }
        PQclear(res);
}

/* Claims, sends and records one batch. Returns how many rows it claimed, or
 * -EIO when the database failed (nothing recorded: the rows stay pending). */
static int run_batch(struct notifier *n)
{
        if (!db_exec_logged(n->db, "BEGIN"))
                return -EIO;
        char lim[24];
        snprintf(lim, sizeof(lim), "%" PRId64, n->cfg->batch);
        const char *p1[] = { lim };
        /* The oldest due row of each destination, oldest first: the batch is
         * sent at once, and one destination's events still go in order (the
         * warning before the thresholds that follow it). A row another
         * notifier holds is skipped, and so is its destination's next. */
        PGresult *res = PQexecParams(
                n->db,
                "SELECT d.id, d.event_id::text, d.type, d.payload::text, d.attempts,"
                "       extract(epoch FROM now() - d.created_at)::bigint, t.kind, t.url, t.email, t.secret,"
                "       t.enabled, d.destination_id"
                "  FROM alert_deliveries d JOIN alert_destinations t ON t.id = d.destination_id"
                " WHERE d.id IN (SELECT DISTINCT ON (destination_id) id FROM alert_deliveries"
                "                 WHERE state = 'pending' ORDER BY destination_id, id)"
                "   AND d.state = 'pending' AND d.next_attempt_at <= now()"
                " ORDER BY d.id LIMIT $1::int FOR UPDATE OF d SKIP LOCKED",
                1, NULL, p1, NULL, NULL, 0);
        if (PQresultStatus(res) != PGRES_TUPLES_OK) {
                log_error("could not claim deliveries", "error=\"%s\"", PQerrorMessage(n->db));
                PQclear(res);
                db_exec_logged(n->db, "ROLLBACK");
                return -EIO;
        }
        int rows = PQntuples(res);
        struct send_job *jobs = rows ? calloc((size_t)rows, sizeof(*jobs)) : NULL;
        if (rows && !jobs) {
                PQclear(res);
                db_exec_logged(n->db, "ROLLBACK");
                return -ENOMEM;
        }
        for (int i = 0; i < rows; i++) {
                const char *event_id = PQgetvalue(res, i, 1), *type = PQgetvalue(res, i, 2);
                const char *body = PQgetvalue(res, i, 3), *kind = PQgetvalue(res, i, 6);
                if (PQgetvalue(res, i, 10)[0] != 't') {
                        jobs[i].result = -ECANCELED;
                        snprintf(jobs[i].err, sizeof(jobs[i].err), "destination disabled");
                } else if (strcmp(kind, "webhook") == 0) {
                        send_job_webhook(&jobs[i], &n->send, PQgetvalue(res, i, 7), PQgetvalue(res, i, 9), event_id,
                                         type, body);
                } else {
                        send_job_email(&jobs[i], &n->send, PQgetvalue(res, i, 8), event_id, body);
                }
        }
        if (rows)
                send_jobs_run(jobs, (size_t)rows);
        bool db_ok = true;
        json_t *outcomes = json_array();
        for (int i = 0; i < rows; i++) {
                const char *id = PQgetvalue(res, i, 0), *event_id = PQgetvalue(res, i, 1), *type = PQgetvalue(res, i, 2);
                const char *dest = PQgetvalue(res, i, 11);
                int attempts = atoi(PQgetvalue(res, i, 4)) + 1;
                int64_t age_s = strtoll(PQgetvalue(res, i, 5), NULL, 10);
                int r = jobs[i].result;
                const char *err = jobs[i].err;
                const char *state = "delivered";
                char delay[24] = "0";
                if (r < 0) {
                        uint64_t rnd = 0;
                        if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd))
                                rnd = (uint64_t)time(NULL);
                        int64_t d = notifier_backoff_ms(n->cfg, attempts, rnd);
                        bool give_up = r == -ECANCELED || age_s + d / 1000 > n->cfg->give_up_after_s;
                        state = give_up ? "failed" : "pending";
                        snprintf(delay, sizeof(delay), "%" PRId64, d);
                        atomic_fetch_add(&n->m->send_errors, 1);
                        if (give_up)
                                atomic_fetch_add(&n->m->gave_up, 1);
                        log_warn("could not deliver an alert",
                                 "delivery=%s destination=%s event=%s attempt=%d next=%s retry_ms=%s error=\"%s\"", id,
                                 dest, event_id, attempts, state, delay, err);
                } else {
                        atomic_fetch_add(&n->m->sent, 1);
                        log_info("alert delivered", "delivery=%s destination=%s event=%s type=%s attempt=%d", id, dest,
                                 event_id, type, attempts);
                }
                /* libcurl's messages are ASCII; anything else becomes '?' (JSON needs UTF-8). */
                for (char *c = jobs[i].err; *c; c++)
                        if ((unsigned char)*c >= 0x80)
                                *c = '?';
                json_t *o = json_pack("{s:I, s:s, s:I, s:s}", "id", (json_int_t)strtoll(id, NULL, 10), "state", state,
                                      "delay_ms", (json_int_t)strtoll(delay, NULL, 10), "err", r < 0 ? err : "");
                if (!o || json_array_append_new(outcomes, o) < 0)
                        db_ok = false;
        }
        /* Every outcome in one statement; the alert itself is delivered once
         * any destination has it. */
        char *js = db_ok ? json_dumps(outcomes, JSON_COMPACT) : NULL;
        if (rows && js) {
                const char *p2[] = { js };
                PGresult *u = PQexecParams(
                        n->db,
                        "WITH o AS (SELECT * FROM jsonb_to_recordset($1::jsonb)"
                        "            AS o(id bigint, state text, delay_ms bigint, err text)),"
                        " d AS (UPDATE alert_deliveries x SET state = o.state, attempts = x.attempts + 1,"
                        "  last_error = nullif(o.err, ''),"
                        "  next_attempt_at = CASE WHEN o.state = 'pending'"
                        "   THEN clock_timestamp() + o.delay_ms * interval '1 ms' ELSE x.next_attempt_at END,"
                        "  delivered_at = CASE WHEN o.state = 'delivered' THEN clock_timestamp() END"
                        "  FROM o WHERE x.id = o.id RETURNING x.alert_id, x.state)"
                        " UPDATE alerts a SET delivered_at = clock_timestamp() FROM d"
                        "  WHERE d.state = 'delivered' AND a.id = d.alert_id AND a.delivered_at IS NULL",
                        1, NULL, p2, NULL, NULL, 0);
                if (PQresultStatus(u) != PGRES_COMMAND_OK) {
                        log_error("could not record deliveries", "rows=%d error=\"%s\"", rows, PQerrorMessage(n->db));
                        db_ok = false;
                }
                PQclear(u);
        } else if (rows) {
                db_ok = false;
        }
        free(js);
        json_decref(outcomes);
        for (int i = 0; i < rows; i++)
                send_job_free(&jobs[i]);
        free(jobs);
        PQclear(res);
        if (!db_ok || !db_exec_logged(n->db, "COMMIT")) {
                db_exec_logged(n->db, "ROLLBACK");
                return -EIO;
        }
        return rows;
}

/* Milliseconds until the next pending delivery is due (capped at max_ms). */
static int64_t next_due_ms(struct notifier *n, int64_t max_ms)
{
        PGresult *res = PQexec(n->db, "SELECT ceil(extract(epoch FROM min(next_attempt_at) - now()) * 1000)::bigint"
                                      " FROM alert_deliveries WHERE state = 'pending'");
        int64_t ms = max_ms;
        if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && !PQgetisnull(res, 0, 0)) {
                ms = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
                if (ms < 0)
                        ms = 0;
                if (ms > max_ms)
                        ms = max_ms;
        }
        PQclear(res);
        return ms;
}

/* Sleeps up to ms, waking early on a notification or a stop. */
static void wait_wake(struct notifier *n, int64_t ms, volatile sig_atomic_t *stop)
{
        int64_t slice = 200; /* a stop is seen within this */
        bool queued = false; /* notifications libpq read during the batch */
        PGnotify *q;
        while ((q = PQnotifies(n->db))) {
                queued = true;
                PQfreemem(q);
        }
        if (queued)
                return;
        while (ms > 0 && !*stop) {
                struct pollfd pfd = { .fd = PQsocket(n->db), .events = POLLIN };
                int r = poll(&pfd, 1, (int)(ms < slice ? ms : slice));
                ms -= ms < slice ? ms : slice;
                if (r > 0) {
                        if (!PQconsumeInput(n->db))
                                return;
                        bool woke = false;
                        PGnotify *nt;
                        while ((nt = PQnotifies(n->db))) {
                                woke = true;
                                PQfreemem(nt);
                        }
                        if (woke)
                                return;
                }
        }
}

struct worker {
        struct notifier n;
        volatile sig_atomic_t *stop;
        int index;
        pthread_t thread;
        bool started;
};

/* One sender: its own connection (LISTEN, claim, record). Several in one
 * process share the outbox the way several processes do (SKIP LOCKED), so a
 * receiver that holds a request until the timeout holds up one worker. */
static void *worker_loop(void *arg)
{
        struct worker *w = arg;
        struct notifier *n = &w->n;
        const struct notifier_config *cfg = n->cfg;
        struct timespec last = { 0 }, pruned = { 0 };
        while (!*w->stop) {
                if (db_ensure(n) < 0) {
                        for (int i = 0; i < 10 && !*w->stop; i++)
                                nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
                        continue;
                }
                int got = run_batch(n);
                if (got < 0) {
                        atomic_store(&n->m->db_up, PQstatus(n->db) == CONNECTION_OK);
                        nanosleep(&(struct timespec){ 0, 200000000 }, NULL);
                        continue;
                }
                if (w->index == 0) {
                        struct timespec now;
                        clock_gettime(CLOCK_MONOTONIC, &now);
                        if (now.tv_sec - last.tv_sec >= 2 || got > 0) {
                                refresh_metrics(n);
                                last = now;
                        }
                        /* The projection's reference points (sql/009) matter only today. */
                        if (pruned.tv_sec == 0 || now.tv_sec - pruned.tv_sec >= 600) {
                                db_exec_logged(n->db,
                                        "DELETE FROM spend_rate_points WHERE day < (now() AT TIME ZONE 'UTC')::date - 1");
                                pruned = now;
                        }
                }
                if (got > 0)
                        continue; /* the destinations just sent may have their next event due */
                /* Nothing claimable: what is due is held by another worker (or
                 * waits behind its destination's earlier event). Sleep until a
                 * new alert's NOTIFY, the next due time, or a short while. */
                int64_t due = next_due_ms(n, cfg->poll_ms);
                wait_wake(n, due < IDLE_MIN_MS ? IDLE_MIN_MS : due, w->stop);
        }
        PQfinish(n->db);
        n->db = NULL;
        return NULL;
}

int notifier_run(const struct notifier_config *cfg, volatile sig_atomic_t *stop)
{
        if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
                log_error("could not start libcurl", NULL);
                return -EIO;
        }
        struct notifier_metrics *m = calloc(1, sizeof(*m));
        struct worker *ws = calloc((size_t)cfg->workers, sizeof(*ws));
        if (!m || !ws) {
                free(m);
                free(ws);
                curl_global_cleanup();
                return -ENOMEM;
        }
        struct metrics_http *ms = NULL;
        int r = metrics_http_start(cfg->metrics_address, (int)cfg->metrics_port, metrics_page, m, 4096, &ms);
        if (r < 0) {
                log_error("could not serve /metrics", "port=%" PRId64 " error=\"%s\"", cfg->metrics_port, strerror(-r));
                free(m);
                free(ws);
                curl_global_cleanup();
                return -EIO;
        }
        /* A database of another schema than this notifier was built for stops it here; one
         * that cannot be reached yet is waited for by the workers. */
        char err[1024];
        PGconn *probe = NULL;
        if ((r = db_ensure_conn(&probe, cfg->database_url, NULL, NULL, err, sizeof(err))) == -EPROTO) {
                log_error("refusing the database", "error=\"%s\"", err);
                metrics_http_stop(ms);
                free(m);
                free(ws);
                curl_global_cleanup();
                return r;
        }
        PQfinish(probe);
        log_info("notifier started", "workers=%" PRId64 " batch=%" PRId64 " allow_http=\"%s\" metrics_port=%" PRId64,
                 cfg->workers, cfg->batch, cfg->allow_http, cfg->metrics_port);
        r = 0;
        for (int64_t i = 0; i < cfg->workers; i++) {
                ws[i] = (struct worker){
                        .n = { .cfg = cfg,
                               .m = m,
                               .send = { .allow_http = cfg->allow_http, .timeout_ms = cfg->timeout_ms,
                                         .ca_file = cfg->ca_file, .smtp_url = cfg->smtp_url,
                                         .smtp_from = cfg->smtp_from, .smtp_username = cfg->smtp_username,
                                         .smtp_password = cfg->smtp_password, .dashboard_url = cfg->dashboard_url } },
                        .stop = stop,
                        .index = (int)i,
                };
                int e = pthread_create(&ws[i].thread, NULL, worker_loop, &ws[i]);
                if (e != 0) {
                        log_error("could not start a worker", "error=\"%s\"", strerror(e));
                        r = -e;
                        break;
                }
                ws[i].started = true;
        }
        /* The workers see the stop flag within a wait slice (200 ms) or an attempt's timeout. */
        while (!*stop && r == 0)
                nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
        *stop = 1;
        for (int64_t i = 0; i < cfg->workers; i++)
                if (ws[i].started)
                        pthread_join(ws[i].thread, NULL);
        log_info("notifier stopping", NULL);
        metrics_http_stop(ms);
        free(ws);
        free(m);
        curl_global_cleanup();
        return r;
}
