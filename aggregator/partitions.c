/* partitions.c — see partitions.h. */
#include "partitions.h"

#include "event.h"
#include "kafka.h"
#include "log.h"
#include "timeutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct partition *part(struct partitions *ps, int32_t p)
{
        if (p < 0 || p > 65535)
                return NULL;
        if (p >= ps->nparts) {
                int32_t n = p + 1;
                struct partition *q = realloc(ps->parts, (size_t)n * sizeof(*q));
                if (!q)
                        return NULL;
                memset(q + ps->nparts, 0, (size_t)(n - ps->nparts) * sizeof(*q));
                ps->parts = q;
                ps->nparts = n;
        }
        return &ps->parts[p];
}

/* The next offset the ledger holds for partition pn (pos) against what the
 * broker still has [lo, hi): when it is outside, messages were lost never
 * billed (retention, or a broker's memory limit). That is recorded in
 * offset_gaps with the range, in the same transaction that moves the offset
 * to lo, logged (at error when messages were skipped) and counted; never a
 * silent reset. Fills *ret_next with where to consume from. Returns 0, or
 * -errno when nothing moved (fenced, or the ledger refused). */
static int record_gap(struct partitions *ps, int32_t pn, int64_t generation, int64_t pos, int64_t lo, int64_t hi,
                      const char *found, int64_t *ret_next)
{
        const char *kind = pos < lo ? "behind" : pos > hi ? "ahead" : NULL;
        if (!kind) {
                *ret_next = pos;
                return 0;
        }
        int64_t from = pos < lo ? pos : hi, to = pos < lo ? lo - 1 : pos - 1;
        char g[32], pnum[16], f[32], t[32], next[32], cur[32];
        snprintf(pnum, sizeof(pnum), "%d", pn);
        snprintf(g, sizeof(g), "%" PRId64, generation);
        snprintf(f, sizeof(f), "%" PRId64, from);
        snprintf(t, sizeof(t), "%" PRId64, to);
        snprintf(next, sizeof(next), "%" PRId64, lo);
        snprintf(cur, sizeof(cur), "%" PRId64, pos);
        const char *params[] = { ps->group, pnum, f, t, kind, next, cur, g };
        /* One statement, one transaction: the gap row only if the offset moved. */
        PGresult *res = PQexecParams(ps->ledger->db,
                                     "WITH moved AS (UPDATE consumer_offsets SET next_offset = $6, updated_at = now()"
                                     "  WHERE group_id = $1 AND topic = 'usage' AND partition = $2"
                                     "    AND next_offset = $7 AND generation = $8 RETURNING 1)"
                                     " INSERT INTO offset_gaps (group_id, topic, partition, from_offset, to_offset, kind)"
                                     " SELECT $1, 'usage', $2, $3, $4, $5 FROM moved",
                                     8, NULL, params, NULL, NULL, 0);
        int r = query_ok(ps->ledger, res, PGRES_COMMAND_OK, "offset gap");
        if (r == 0 && atoi(PQcmdTuples(res)) != 1)
                r = -ESTALE;
        PQclear(res);
        if (r < 0)
                return r;
        uint64_t lost = pos < lo ? (uint64_t)(lo - pos) : 0;
        atomic_fetch_add_explicit(&ps->metrics->offset_gaps, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&ps->metrics->offsets_lost, lost, memory_order_relaxed);
        /* Past the partition's end (the topic was made again, as a restarted development
         * broker's is): no message the broker has was skipped, so nothing is said at error. */
        if (lost == 0)
                log_info("offsets moved back: the stored offset is past the partition's end; consuming from its start",
                         "partition=%d kind=%s from_offset=%" PRId64 " to_offset=%" PRId64 " lost=0 next_offset=%" PRId64
                         " found=%s",
                         pn, kind, from, to, lo, found);
        else
                log_error("offsets lost: the stored offset is no longer in the broker; messages never billed",
                          "partition=%d kind=%s from_offset=%" PRId64 " to_offset=%" PRId64 " lost=%" PRIu64
                          " next_offset=%" PRId64 " found=%s",
                          pn, kind, from, to, lost, lo, found);
        *ret_next = lo;
        return 0;
}

/* Claims partitions: bumps their generation and reads their next offsets.
 * Fold state is not read here: it follows each sandbox, read by id when one
 * of its messages arrives. What memory holds of sandboxes last seen on these
 * partitions is dropped (another owner may have billed them since). */
int claim(struct partitions *ps, rd_kafka_topic_partition_list_t *parts)
{
        int r = db_ensure(ps->ledger);
        if (r < 0)
                return r;
        ps->seek_gen++;
        bool *load = calloc(65536, sizeof(bool));
        if (!load)
                return -ENOMEM;
        for (int i = 0; i < parts->cnt; i++) {
                rd_kafka_topic_partition_t *tp = &parts->elems[i];
                struct partition *p = part(ps, tp->partition);
                if (!p) {
                        r = -ENOMEM;
                        goto out;
                }
                char pn[16];
                snprintf(pn, sizeof(pn), "%d", tp->partition);
                const char *params[] = { ps->group, tp->topic, pn };
                PGresult *res = PQexecParams(ps->ledger->db,
                                             "INSERT INTO consumer_offsets (group_id, topic, partition, next_offset, generation)"
                                             " VALUES ($1, $2, $3, 0, 1) ON CONFLICT (group_id, topic, partition)"
                                             " DO UPDATE SET generation = consumer_offsets.generation + 1, updated_at = now()"
                                             " RETURNING next_offset, generation",
                                             3, NULL, params, NULL, NULL, 0);
                r = query_ok(ps->ledger, res, PGRES_TUPLES_OK, "claim");
                if (r == 0) {
                        p->owned = true;
                        p->position = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
                        p->generation = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
                        /* Offsets lost while nobody consumed: found before
                         * fetching (else the fetch reports them, offset_reset). */
                        int64_t lo, hi, next;
                        if (rd_kafka_query_watermark_offsets(ps->consumer, tp->topic, tp->partition, &lo, &hi, 5000) ==
                                    0 &&
                            record_gap(ps, tp->partition, p->generation, p->position, lo, hi, "at_assignment",
                                       &next) == 0)
                                p->position = next;
                        tp->offset = p->position;
                        load[tp->partition] = true;
                        log_info("partition assigned", "partition=%d next_offset=%" PRId64 " generation=%" PRId64,
                                 tp->partition, p->position, p->generation);
                }
                PQclear(res);
                if (r < 0)
                        goto out;
        }
        bool *drop = calloc((size_t)ps->nparts + 1, sizeof(bool));
        if (!drop) {
                r = -ENOMEM;
                goto out;
        }
        for (int32_t p = 0; p < ps->nparts; p++)
                drop[p] = load[p];
        sandboxes_drop(ps->cache, drop, ps->nparts);
        free(drop);
out:
        free(load);
        return r;
}

/* After a failed commit: read back the positions of what we still own and
 * forget every sandbox (each is read again by id when it next appears). */
int resync(struct partitions *ps)
{
        sandboxes_drop(ps->cache, NULL, 0);
        ps->seek_gen++;
        while (!*ps->stop) {
                if (db_ensure(ps->ledger) < 0) {
                        time_sleep_ns(NS_PER_SEC);
                        continue;
                }
                rd_kafka_topic_partition_list_t *seek = rd_kafka_topic_partition_list_new(8);
                int r = 0;
                for (int32_t p = 0; r == 0 && p < ps->nparts; p++) {
                        if (!ps->parts[p].owned)
                                continue;
                        char pn[16];
                        snprintf(pn, sizeof(pn), "%d", p);
                        const char *params[] = { ps->group, pn };
                        PGresult *res = PQexecParams(ps->ledger->db,
                                                     "SELECT next_offset, generation FROM consumer_offsets"
                                                     " WHERE group_id = $1 AND topic = 'usage' AND partition = $2",
                                                     2, NULL, params, NULL, NULL, 0);
                        r = query_ok(ps->ledger, res, PGRES_TUPLES_OK, "resync");
                        if (r == 0 && PQntuples(res) == 1 &&
                            strtoll(PQgetvalue(res, 0, 1), NULL, 10) == ps->parts[p].generation) {
                                ps->parts[p].position = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
                                rd_kafka_topic_partition_list_add(seek, TOPIC_USAGE, p)->offset = ps->parts[p].position;
                        } else if (r == 0) {
                                ps->parts[p].owned = false; /* fenced: the group will revoke it */
                        }
                        PQclear(res);
                }
                if (r == 0 && seek->cnt) {
                        rd_kafka_error_t *e = rd_kafka_seek_partitions(ps->consumer, seek, 10000);
                        if (e) {
                                log_error("could not seek", "error=\"%s\"", rd_kafka_error_string(e));
                                rd_kafka_error_destroy(e);
                                r = -EIO;
                        }
                }
                rd_kafka_topic_partition_list_destroy(seek);
                if (r == 0)
                        return 0;
                time_sleep_ns(NS_PER_SEC);
        }
        return -ECANCELED;
}

void release(struct partitions *ps, const rd_kafka_topic_partition_list_t *parts)
{
        bool *drop = calloc((size_t)ps->nparts + 1, sizeof(bool));
        for (int i = 0; i < parts->cnt; i++) {
                int32_t p = parts->elems[i].partition;
                if (p >= 0 && p < ps->nparts) {
                        ps->parts[p].owned = false;
                        if (drop)
                                drop[p] = true;
                        log_info("partition released", "partition=%d", p);
                }
        }
        ps->seek_gen++;
        sandboxes_drop(ps->cache, drop, ps->nparts); /* without memory for the list: all of them */
        free(drop);
}

/* While consuming, the stored position was no longer in the broker
 * (auto.offset.reset=error reports it): record the gap and go on from the
 * partition's first offset. (At assignment, claim checks first.) The caller
 * committed the batch first; had that failed, it resynced, and the error
 * comes again from the ledger's position. */
void offset_reset(struct partitions *ps, int32_t pn)
{
        struct partition *p = part(ps, pn);
        if (!p || !p->owned)
                return;
        int64_t lo = -1, hi = -1, next;
        rd_kafka_resp_err_t e = rd_kafka_query_watermark_offsets(ps->consumer, TOPIC_USAGE, pn, &lo, &hi, 10000);
        if (e) {
                log_error("could not read a partition's offsets", "partition=%d error=\"%s\"", pn, rd_kafka_err2str(e));
                resync(ps);
                return;
        }
        if (record_gap(ps, pn, p->generation, p->position, lo, hi, "while_consuming", &next) < 0) {
                resync(ps);
                return;
        }
        p->position = next;
        /* After the error the partition fetches nothing until assigned again
         * (a seek does not restart it): assign what we own at our positions,
         * which equal the ledger's (the batch was committed above). */
        rd_kafka_topic_partition_list_t *assign = rd_kafka_topic_partition_list_new(ps->nparts > 0 ? ps->nparts : 1);
        for (int32_t i = 0; i < ps->nparts; i++)
                if (ps->parts[i].owned)
                        rd_kafka_topic_partition_list_add(assign, TOPIC_USAGE, i)->offset = ps->parts[i].position;
        rd_kafka_resp_err_t ae = rd_kafka_assign(ps->consumer, assign);
        rd_kafka_topic_partition_list_destroy(assign);
        ps->seek_gen++;
        if (ae)
                log_error("could not resume the partitions", "partition=%d error=\"%s\"", pn, rd_kafka_err2str(ae));
}

/* The metering_gaps view's rows: hosts with running sandboxes and no
 * recent sample, logged at warning and counted at each check. */
static void read_metering_gaps(struct partitions *ps, PGresult *res)
{
        int n = PQntuples(res);
        /* A line per host when the set of gaps grows, then once a minute. */
        uint64_t before = atomic_load_explicit(&ps->metrics->metering_gap_hosts, memory_order_relaxed);
        bool say = (uint64_t)n > before || time_mono_ns() - ps->last_gap_log_ns >= 60 * NS_PER_SEC;
        if (say && n)
                ps->last_gap_log_ns = time_mono_ns();
        for (int i = 0; say && i < n; i++)
                log_warn("metering gap: a host with running sandboxes sends no samples",
                         "host=%s running_sandboxes=%s silent_s=%s last_sample=%s", PQgetvalue(res, i, 0),
                         PQgetvalue(res, i, 1), PQgetvalue(res, i, 2), PQgetvalue(res, i, 3));
        atomic_store_explicit(&ps->metrics->metering_gap_hosts, (uint64_t)n, memory_order_relaxed);
        atomic_fetch_add_explicit(&ps->metrics->metering_gaps_seen, (uint64_t)n, memory_order_relaxed);
}

void check_metering_gaps(struct partitions *ps, bool due)
{
        struct ledger *l = ps->watch;
        if (ps->gaps_asked) {
                if (PQconsumeInput(l->db) != 1) {
                        log_warn("lost the connection that watches for metering gaps; opening it again", "error=\"%s\"",
                                 PQerrorMessage(l->db));
                        ledger_close(l);
                        ps->gaps_asked = false;
                        return;
                }
                for (;;) {
                        if (PQisBusy(l->db))
                                return; /* (not all there yet: looked at again on the next pass) */
                        PGresult *res = PQgetResult(l->db);
                        if (!res)
                                break;
                        if (query_ok(l, res, PGRES_TUPLES_OK, "metering gaps") == 0)
                                read_metering_gaps(ps, res);
                        PQclear(res);
                }
                ps->gaps_asked = false;
        }
        if (!due || db_ensure(l) < 0)
                return;
        if (PQsendQuery(l->db, "SELECT host, running_sandboxes, extract(epoch FROM silent_for)::bigint,"
                               " coalesce(to_char(last_sample_at AT TIME ZONE 'UTC',"
                               " 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), 'never')"
                               " FROM metering_gaps ORDER BY host") != 1) {
                log_warn("could not ask for the metering gaps; the connection is opened again", "error=\"%s\"",
                         PQerrorMessage(l->db));
                ledger_close(l);
                return;
        }
        ps->gaps_asked = true;
}

/* Messages the broker holds beyond those taken, in the partitions owned: the
 * consumer's high watermarks as its last fetches saw them (no request to the
 * broker), less each partition's next offset. */
int64_t backlog(struct partitions *ps, int group)
{
        int64_t lag = 0;
        for (int32_t p = 0; p < ps->nparts; p++) {
                int64_t lo = -1, hi = -1;
                if (ps->parts[p].owned && (group == PARTITION_GROUP_ALL || ps->parts[p].group == group) &&
                    rd_kafka_get_watermark_offsets(ps->consumer, TOPIC_USAGE, p, &lo, &hi) == RD_KAFKA_RESP_ERR_NO_ERROR &&
                    hi > ps->parts[p].position)
                        lag += hi - ps->parts[p].position;
        }
        return lag;
}

void partitions_group(struct partitions *ps, int ngroups)
{
        int n = 0;
        for (int32_t p = 0; p < ps->nparts; p++)
                ps->parts[p].group = ps->parts[p].owned ? n++ % ngroups : 0;
}

void partitions_untouch(struct partitions *ps)
{
        for (int32_t p = 0; p < ps->nparts; p++)
                ps->parts[p].touched = false;
}

void partitions_free(struct partitions *ps)
{
        free(ps->parts);
        ps->parts = NULL;
        ps->nparts = 0;
}
